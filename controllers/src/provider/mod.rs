//! The provider controllers.
//!
//! - **Provider** (`providers.platform-mesh.io`, cluster-scoped, in any workspace): a workspace of
//!   type `provider` under `root:providers`, and a kubeconfig for it (a ServiceAccount token with
//!   `cluster-admin` there) written as a Secret into the workspace holding the Provider.
//!   `status.phase` becomes `Ready` only after the kubeconfig was used successfully.
//!
//! Steps, conditions, finalizers and phases are upstream's. Differences, on purpose: the
//! kubeconfig is tried before the Provider is called Ready; objects are created or updated only
//! when they differ, so a steady Provider costs no writes.

pub mod managed;
mod steps;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use crate::ensure::EnsureError;
use crate::kcp::Kcp;
use crate::objects::api_resource;
use crate::runtime::{
    kube_error_is_transient, Action, ClusterContext, Controller, ReconcileError, Reconciler,
    Request, ResourceKind,
};
use crate::subroutines::{drive_with_status, Lifecycle, StatusFields, Step, WriteError};

pub(crate) use crate::ensure::{ensure, ensure_written};
pub use steps::{
    ProviderWorkspace, ScopedKubeconfig, KUBECONFIG_FINALIZER, PROVIDERS_PATH, WORKSPACE_FINALIZER,
};

/// The controller's name.
pub const CONTROLLER: &str = "ProviderReconciler";

/// The APIExport of Providers, whose virtual workspace the controller reaches them through on
/// a kcp (and on this server without admin access).
pub const EXPORT: &str = "providers.platform-mesh.io";

/// `providers.platform-mesh.io/v1alpha1` Provider (cluster-scoped).
pub fn providers() -> ApiResource {
    api_resource(
        "providers.platform-mesh.io",
        "v1alpha1",
        "Provider",
        "providers",
    )
}

/// Provider phases.
pub mod phase {
    /// Nothing done yet.
    pub const PENDING: &str = "Pending";
    /// Waiting for the provider workspace.
    pub const PROVISIONING_WORKSPACE: &str = "ProvisioningWorkspace";
    /// Writing the kubeconfig.
    pub const PROVISIONING_KUBECONFIG: &str = "ProvisioningKubeconfig";
    /// The kubeconfig works.
    pub const READY: &str = "Ready";
    /// Being deleted.
    pub const DELETING: &str = "Deleting";
}

/// Why reconciling a Provider or a ManagedProvider failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderReconcileError {
    /// The controller's watch cache could not be read (it did not sync in time).
    #[error("reading the watch cache: {0}")]
    Cache(#[from] crate::runtime::CacheError),
    /// A call to the API server failed; `context` says which.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating or updating an object failed.
    #[error(transparent)]
    Ensure(#[from] EnsureError),
    /// The provider workspace exists with another type, which cannot change.
    #[error("Workspace {PROVIDERS_PATH}:{name} exists with type {have}, not provider")]
    WorkspaceType {
        /// The workspace's name in `root:providers`.
        name: String,
        /// Its type.
        have: String,
    },
    /// A kubeconfig does not encode (a bug).
    #[error("encoding a kubeconfig: {0}")]
    EncodeKubeconfig(#[source] serde_json::Error),
    /// Reading the Secret with the runtime cluster's kubeconfig failed.
    #[error("reading the runtime kubeconfig Secret {secret}: {source}")]
    RuntimeSecret {
        /// The Secret, next to the ManagedProvider.
        secret: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The runtime kubeconfig Secret has no `kubeconfig` key.
    #[error("Secret {secret} has no key kubeconfig")]
    RuntimeSecretKey {
        /// The Secret.
        secret: String,
    },
    /// The runtime kubeconfig does not parse or load.
    #[error("the runtime kubeconfig in Secret {secret}: {source}")]
    RuntimeKubeconfig {
        /// The Secret.
        secret: String,
        /// Why it does not load.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No client could be built for the runtime cluster.
    #[error("{0}")]
    RuntimeClient(#[source] kube::Error),
    /// Writing the object's finalizers or status failed.
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl ProviderReconcileError {
    /// A failed API call, with what it was doing.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        ProviderReconcileError::Kube {
            context: context.into(),
            source,
        }
    }
}

impl ReconcileError for ProviderReconcileError {
    /// Client errors as [`kube_error_is_transient`] says. The runtime kubeconfig Secret is not
    /// watched, so a bad or missing one is retried, as a provider workspace of the wrong type
    /// (whose deletion brings no event). An unencodable kubeconfig is fatal.
    fn is_transient(&self) -> bool {
        match self {
            ProviderReconcileError::Cache(e) => e.is_transient(),
            ProviderReconcileError::Kube { source, .. }
            | ProviderReconcileError::RuntimeClient(source) => kube_error_is_transient(source),
            ProviderReconcileError::Ensure(e) => e.is_transient(),
            ProviderReconcileError::EncodeKubeconfig(_) => false,
            ProviderReconcileError::WorkspaceType { .. }
            | ProviderReconcileError::RuntimeSecret { .. }
            | ProviderReconcileError::RuntimeSecretKey { .. }
            | ProviderReconcileError::RuntimeKubeconfig { .. } => true,
            ProviderReconcileError::Write(e) => e.is_transient(),
        }
    }
}

/// What a step of a Provider sees and reports.
pub struct ProviderContext {
    /// The Provider as read at the start of the reconcile.
    pub provider: DynamicObject,
    /// The logical cluster holding it.
    pub cluster: String,
    /// A client of that cluster.
    pub client: kube::Client,
    /// kcp access for `root:providers` and the provider workspace.
    pub kcp: Arc<Kcp>,
    /// `status.phase` and `status.providerKubeconfigSecretRef` as the steps leave them.
    pub status: StatusFields,
}

impl ProviderContext {
    /// The Provider's name.
    pub fn name(&self) -> &str {
        self.provider.metadata.name.as_deref().unwrap_or_default()
    }

    /// The provider workspace's name in `root:providers`: `<name>-<cluster>`, as upstream.
    pub fn workspace_name(&self) -> String {
        format!("{}-{}", self.name(), self.cluster)
    }
}

/// The status fields besides conditions that the provider steps own.
pub(crate) const OWNED_STATUS: &[&str] = &["phase", "providerKubeconfigSecretRef"];

/// How long a waiting step waits before looking again.
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// Stops the chain, to look again after [`WAIT`].
pub(crate) fn stop(message: impl Into<String>) -> Step {
    Step::stop(message, WAIT)
}

/// The text under `key` of a Secret's base64 `data`, if there is some.
pub(crate) fn secret_text(data: &Value, key: &str) -> Option<String> {
    let b = base64::engine::general_purpose::STANDARD
        .decode(data[key].as_str()?)
        .ok()?;
    String::from_utf8(b).ok().filter(|s| !s.is_empty())
}

/// Reconciles Providers in every engaged workspace.
pub struct ProviderReconciler {
    lifecycle: Lifecycle<ProviderContext, ProviderReconcileError>,
    kcp: Arc<Kcp>,
}

impl Reconciler for ProviderReconciler {
    type Error = ProviderReconcileError;

    async fn reconcile(
        &self,
        req: Request,
        ctx: ClusterContext,
    ) -> Result<Action, ProviderReconcileError> {
        let api: Api<DynamicObject> = ctx.cluster().dynamic_api(&providers(), None);
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(provider) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        let context = ProviderContext {
            status: StatusFields::stored(&provider, OWNED_STATUS),
            provider: provider.clone(),
            cluster: ctx.cluster_name().to_string(),
            client: ctx.client(),
            kcp: self.kcp.clone(),
        };
        let result = drive_with_status(&self.lifecycle, &api, &provider, &context, |c| {
            c.status.snapshot()
        })
        .await;
        match result {
            Ok(Some(after)) => Ok(Action::requeue_after(after)),
            Ok(None) => Ok(Action::await_change()),
            Err(e) => Err(e.flatten()),
        }
    }
}

/// The steps of a Provider: its workspace, then its kubeconfig (reversed on deletion).
pub fn lifecycle() -> Lifecycle<ProviderContext, ProviderReconcileError> {
    Lifecycle::new()
        .step(ProviderWorkspace)
        .step(ScopedKubeconfig)
}

/// The Provider controller over every engaged workspace.
pub fn controller(kcp: Arc<Kcp>, workers: usize) -> Controller<ProviderReconciler> {
    Controller::new(
        CONTROLLER,
        ProviderReconciler {
            lifecycle: lifecycle(),
            kcp,
        },
    )
    .for_kind(ResourceKind::dynamic(providers(), false))
    .workers(workers)
}
