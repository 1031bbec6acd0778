//! Create-or-update of single objects for the controllers' steps: an object is created when
//! missing and replaced only when the caller says the stored one differs, so a steady state costs
//! reads only.

use kube::api::{Api, DynamicObject, PostParams};
use serde_json::Value;

use crate::runtime::{kube_error_is_transient, ReconcileError};

/// Why [`ensure`] failed.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    /// The wanted object is not an object of the Kubernetes API (a bug of the caller).
    #[error("{0}")]
    Invalid(#[source] serde_json::Error),
    /// Reading the stored object failed.
    #[error("reading {kind} {name}: {source}")]
    Read {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating the object failed.
    #[error("creating {kind} {name}: {source}")]
    Create {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Replacing the stored object failed.
    #[error("updating {kind} {name}: {source}")]
    Update {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

impl EnsureError {
    /// The client error, when the API server answered or could not be reached.
    pub fn kube(&self) -> Option<&kube::Error> {
        match self {
            EnsureError::Invalid(_) => None,
            EnsureError::Read { source, .. }
            | EnsureError::Create { source, .. }
            | EnsureError::Update { source, .. } => Some(source),
        }
    }

    /// Whether the API server answered 404: the kind is not served there (yet) or the
    /// namespace or workspace does not exist (yet).
    pub fn is_not_found(&self) -> bool {
        matches!(self.kube(), Some(kube::Error::Api(s)) if s.code == 404)
    }
}

impl ReconcileError for EnsureError {
    /// An invalid object is fatal; a client error as [`kube_error_is_transient`] says.
    fn is_transient(&self) -> bool {
        self.kube().is_some_and(kube_error_is_transient)
    }
}

/// Creates `obj` with `api`, or replaces the stored one when `differs(stored)` says so (keeping
/// its metadata). Returns the object as stored.
pub async fn ensure(
    api: &Api<DynamicObject>,
    obj: Value,
    differs: impl Fn(&DynamicObject) -> Option<DynamicObject>,
) -> Result<DynamicObject, EnsureError> {
    ensure_written(api, obj, differs).await.map(|(o, _)| o)
}

/// [`ensure`], also telling whether it wrote.
pub async fn ensure_written(
    api: &Api<DynamicObject>,
    obj: Value,
    differs: impl Fn(&DynamicObject) -> Option<DynamicObject>,
) -> Result<(DynamicObject, bool), EnsureError> {
    let wanted: DynamicObject = serde_json::from_value(obj).map_err(EnsureError::Invalid)?;
    let name = wanted.metadata.name.clone().unwrap_or_default();
    let kind = wanted
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    let read = |source| EnsureError::Read {
        kind: kind.clone(),
        name: name.clone(),
        source,
    };
    match api.get_opt(&name).await.map_err(read)? {
        None => match api.create(&PostParams::default(), &wanted).await {
            Ok(o) => Ok((o, true)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                api.get(&name).await.map(|o| (o, true)).map_err(read)
            }
            Err(source) => Err(EnsureError::Create {
                kind: kind.clone(),
                name: name.clone(),
                source,
            }),
        },
        Some(stored) => match differs(&stored) {
            None => Ok((stored, false)),
            Some(updated) => api
                .replace(&name, &PostParams::default(), &updated)
                .await
                .map(|o| (o, true))
                .map_err(|source| EnsureError::Update {
                    kind: kind.clone(),
                    name: name.clone(),
                    source,
                }),
        },
    }
}
