//! The resource broker: consumers ask for a resource ("a certificate for app.internal.corp"),
//! providers say what they accept (AcceptAPIs), and the broker copies each consumer object to
//! an accepting provider, brings the provider's status and related resources (the Secret of a
//! certificate) back, moves objects when the accepting provider changes, and runs staged
//! migrations for those moves.
//!
//! Clusters have roles: consumers (where objects are asked for), providers (where they are
//! fulfilled, holding AcceptAPIs) and one coordination cluster (holding MigrationConfigurations
//! and Migrations). Each role has its own [`Manager`](crate::runtime::Manager) and cluster
//! provider, so a cluster only needs the APIs of its role.
//!
//! - [`accept`]: filters, the registry of AcceptAPIs and the choice among providers;
//! - [`generic`]: the brokering reconciler, for any kind;
//! - [`copy`]: how objects are copied between clusters;
//! - [`migration`]: MigrationConfigurations and the staged Migration state machine;
//! - [`wiring`]: the managers and their controllers;
//! - [`kcp`]: the roles over kcp workspaces (consumers bind the brokered APIExport, providers
//!   hold AcceptAPIs);
//! - [`staging`]: on kcp without entering provider workspaces, the staging workspaces provider
//!   copies go to.

pub mod accept;
pub mod copy;
pub mod generic;
pub mod kcp;
pub mod migration;
pub mod staging;
pub mod wiring;

use api::common::GroupVersionKind;
use kube::api::{Api, Patch, PatchParams};

use crate::runtime::{kube_error_is_transient, CacheError, ReconcileError};
use kube::ResourceExt;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Finalizer on consumer objects and their provider copies.
pub const GENERIC_FINALIZER: &str = "broker.platform-mesh.io/generic-finalizer";
/// Consumer annotation: the provider cluster holding the object.
pub const PROVIDER_CLUSTER: &str = "broker.platform-mesh.io/provider-cluster";
/// Consumer annotation: the provider cluster the object is moving to.
pub const NEW_PROVIDER_CLUSTER: &str = "broker.platform-mesh.io/new-provider-cluster";
/// Consumer annotation: the related resources copied to the consumer, as JSON.
pub const RELATED_RESOURCES: &str = "broker.platform-mesh.io/related-resources";
/// Provider-copy (and Migration) annotation: the consumer cluster of the object.
pub const CONSUMER_CLUSTER: &str = "broker.platform-mesh.io/consumer-cluster";
/// Provider-copy (and Migration) annotation: the consumer object's name.
pub const CONSUMER_NAME: &str = "broker.platform-mesh.io/consumer-name";

/// Prefix of consumer cluster names, as hashed into provider-side names.
pub const CONSUMER_PREFIX: &str = "consumer#";
/// Prefix of provider cluster names.
pub const PROVIDER_PREFIX: &str = "provider#";

/// The first 12 hex digits of the SHA-256 of `name`: the prefix that keeps objects of different
/// consumers apart on a provider (upstream's `SanitizeClusterName`).
///
/// ```
/// use controllers::broker::cluster_hash;
/// assert_eq!(cluster_hash("consumer#/kubeconfigs/consumer/kubeconfig+default"), "d480f64dc494");
/// ```
pub fn cluster_hash(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The provider-side name of consumer object `name` of `consumer` (a cluster name with its
/// `consumer#` prefix).
pub fn provider_name(consumer: &str, name: &str) -> String {
    format!("{}-{name}", cluster_hash(consumer))
}

/// Parses `Kind.version.group` (`Kind.v1.core` for the core group), as `--watch-kind` takes it.
///
/// ```
/// use controllers::broker::parse_kind;
/// let gvk = parse_kind("Certificate.v1alpha1.example.platform-mesh.io").unwrap();
/// assert_eq!((gvk.kind.as_str(), gvk.version.as_str(), gvk.group.as_str()),
///            ("Certificate", "v1alpha1", "example.platform-mesh.io"));
/// assert_eq!(parse_kind("ConfigMap.v1.core").unwrap().group, "");
/// assert!(parse_kind("ConfigMap").is_err());
/// ```
pub fn parse_kind(text: &str) -> Result<GroupVersionKind, String> {
    let mut parts = text.splitn(3, '.');
    let (kind, version, group) = (parts.next(), parts.next(), parts.next());
    match (kind, version, group) {
        (Some(k), Some(v), Some(g)) if !k.is_empty() && !v.is_empty() && !g.is_empty() => {
            Ok(GroupVersionKind {
                group: if g == "core" { String::new() } else { g.into() },
                version: v.into(),
                kind: k.into(),
            })
        }
        _ => Err(format!(
            "{text:?} is not Kind.version.group (for example Certificate.v1alpha1.example.platform-mesh.io, or ConfigMap.v1.core for the core group)"
        )),
    }
}

/// Why a reconciler of the broker failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A call to an API server failed; `context` says which.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Reading an object failed.
    #[error("{0}")]
    Read(#[source] kube::Error),
    /// Discovery did not find the API of a kind (it may be installed later).
    #[error("finding the API of {kind}: {source}")]
    Discovery {
        /// `Kind.version.group`.
        kind: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The shared cache of the brokered kind is not usable.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An object could not be built from JSON (a bug).
    #[error("building object: {0}")]
    Build(#[source] serde_json::Error),
    /// JSON could not be encoded or decoded (a bug).
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// The provider cluster of an object is not engaged.
    #[error("provider cluster {0} is not connected")]
    NotConnected(String),
    /// No engaged provider accepts the object (yet); `reasons` says why per provider.
    #[error("no provider accepts {gvr} {name}: {reasons}")]
    NobodyAccepts {
        /// The brokered API.
        gvr: String,
        /// The consumer object.
        name: String,
        /// Each provider's denials.
        reasons: String,
    },
    /// A provider object names related resources badly.
    #[error("{0}")]
    RelatedResources(String),
    /// Some related resources could not be copied to the consumer.
    #[error("{}", join(.0))]
    Related(Vec<RelatedError>),
    /// A stage template of a MigrationConfiguration has no apiVersion or kind.
    #[error("a template needs apiVersion and kind")]
    Template,
}

/// Why one related resource was not copied.
#[derive(Debug, thiserror::Error)]
pub enum RelatedError {
    /// It is not on the provider (yet).
    #[error("{kind} {name} is not on {provider} yet")]
    Missing {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// The provider cluster.
        provider: String,
    },
    /// Reading it on the provider failed.
    #[error("reading {kind} {name} on {provider}: {source}")]
    Read {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// The provider cluster.
        provider: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Writing the copy in the consumer cluster failed.
    #[error("copying {kind} {name} to the consumer: {source}")]
    Copy {
        /// Its kind.
        kind: String,
        /// The copy's name.
        name: String,
        /// Why.
        #[source]
        source: Box<BrokerError>,
    },
}

fn join(errors: &[RelatedError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl BrokerError {
    /// A failed API call, with what it was doing.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        BrokerError::Kube {
            context: context.into(),
            source,
        }
    }
}

impl ReconcileError for BrokerError {
    /// Client errors as [`kube_error_is_transient`] says; kinds not found by discovery, missing
    /// providers and objects nobody accepts yet are waited for (retried), as related resources
    /// that are missing or fail to copy; objects that cannot be built and bad templates are
    /// fatal. A provider's bad related-resource list is retried: the provider may fix it.
    fn is_transient(&self) -> bool {
        match self {
            BrokerError::Kube { source, .. } | BrokerError::Read(source) => {
                kube_error_is_transient(source)
            }
            BrokerError::Cache(e) => e.is_transient(),
            BrokerError::Build(_) | BrokerError::Json(_) | BrokerError::Template => false,
            BrokerError::Discovery { .. }
            | BrokerError::NotConnected(_)
            | BrokerError::NobodyAccepts { .. }
            | BrokerError::RelatedResources(_)
            | BrokerError::Related(_) => true,
        }
    }
}

/// Adds or removes finalizer `f` of a typed object (no write when already so).
pub(crate) async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    f: &str,
    present: bool,
) -> Result<(), BrokerError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let has = obj.finalizers().iter().any(|x| x == f);
    if has == present {
        return Ok(());
    }
    let mut all: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|x| *x != f)
        .cloned()
        .collect();
    if present {
        all.push(f.to_string());
    }
    let patch = json!({"metadata": {"finalizers": all, "resourceVersion": obj.resource_version()}});
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|e| BrokerError::kube("writing finalizers", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_upstream_names() {
        assert_eq!(
            cluster_hash("consumer#/kubeconfigs/consumer/kubeconfig+default"),
            "d480f64dc494"
        );
        assert_eq!(cluster_hash("consumer#consumer#cluster"), "a8b70b353e97");
        assert_eq!(
            provider_name("consumer#consumer#cluster", "test-vm"),
            "a8b70b353e97-test-vm"
        );
    }

    #[test]
    fn bad_kinds_say_what_to_write() {
        for bad in ["", "A", "A.v1", "A..g", ".v1.g"] {
            let err = parse_kind(bad).unwrap_err();
            assert!(err.contains("Kind.version.group"), "{err}");
        }
    }
}
