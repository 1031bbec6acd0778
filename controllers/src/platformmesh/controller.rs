//! The PlatformMesh controller: each PlatformMesh in the runtime cluster is driven through its
//! steps (Deployment, KcpSetup, ProviderSecret, FeatureToggles, Wait) by the
//! [`lifecycle`](crate::subroutines). It reconciles again
//! when the instance changes, when a HelmRelease it deployed changes (they name their owner in
//! `owner.platform-mesh.io/*` annotations) and when its profile ConfigMap changes (upstream
//! registers no such watch, so a profile edit waits for the next periodic reconcile there).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::api::{Api, DynamicObject};

use crate::objects::platform_meshes;

use crate::objects::api_resource as resource;
use serde_json::Value;

use super::apply::DeployError;
use super::deployment::{Clusters, Context, Deployment, OWNER_PREFIX};
use super::features::FeatureToggles;
use super::kcp_setup::KcpSetup;
use super::providersecret::ProviderSecret;
use super::vars::{profile_config_map, Render};
use super::wait::Wait;
use crate::runtime::mapping::{annotated_target, CrossClusterKeys};
use crate::runtime::{
    kube_error_is_transient, Action, ClusterContext, ClusterName, Controller, ReconcileError,
    Reconciler, Request, ResourceKind,
};
use crate::subroutines::{drive, Lifecycle, WriteError};

/// Why reconciling a PlatformMesh failed.
#[derive(Debug, thiserror::Error)]
pub enum PlatformMeshError {
    /// The controller's watch cache could not be read (it did not sync in time).
    #[error("reading the watch cache: {0}")]
    Cache(#[from] crate::runtime::CacheError),
    /// A call to an API server failed; `context` says which.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Applying or pruning rendered objects failed; `context` says where.
    #[error("{context}: {source}")]
    Deploy {
        /// Where.
        context: String,
        /// The failure.
        #[source]
        source: DeployError,
    },
    /// A step failed for a reason given as text (configuration, rendering, deployment).
    #[error("{0}")]
    Step(String),
    /// Writing the PlatformMesh's finalizers or status failed.
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl PlatformMeshError {
    /// A failed API call, with what it was doing.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        PlatformMeshError::Kube {
            context: context.into(),
            source,
        }
    }
}

impl From<String> for PlatformMeshError {
    fn from(message: String) -> Self {
        PlatformMeshError::Step(message)
    }
}

impl ReconcileError for PlatformMeshError {
    /// Client errors as [`kube_error_is_transient`] says, as deployment requests; a kind not
    /// served yet is waited for, a malformed rendered object is fatal; a step's other failures
    /// are retried (they were before the classification, and may depend on other clusters).
    fn is_transient(&self) -> bool {
        match self {
            PlatformMeshError::Cache(e) => e.is_transient(),
            PlatformMeshError::Kube { source, .. } => kube_error_is_transient(source),
            PlatformMeshError::Deploy { source, .. } => match source {
                DeployError::Malformed(_) => false,
                DeployError::UnknownKind { .. } => true,
                DeployError::Request { source, .. } => kube_error_is_transient(source),
            },
            PlatformMeshError::Step(_) => true,
            PlatformMeshError::Write(e) => e.is_transient(),
        }
    }
}

/// The controller's name.
pub const CONTROLLER: &str = "PlatformMeshReconciler";

/// A ConfigMap by cluster, namespace and name.
type ConfigMapKey = (ClusterName, String, String);

/// Which PlatformMeshes read which profile ConfigMap, learnt at each reconcile.
#[derive(Clone, Default)]
pub struct ProfileIndex {
    by_config_map: Arc<RwLock<HashMap<ConfigMapKey, Vec<Request>>>>,
}

impl ProfileIndex {
    fn record(&self, cluster: &ClusterName, profile: (String, String), req: &Request) {
        let mut m = self
            .by_config_map
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for reqs in m.values_mut() {
            reqs.retain(|r| r != req);
        }
        m.retain(|_, reqs| !reqs.is_empty());
        m.entry((cluster.clone(), profile.0, profile.1))
            .or_default()
            .push(req.clone());
    }

    /// The PlatformMeshes reading ConfigMap `obj` of `cluster`; by convention also `<name>` for
    /// a ConfigMap `<name>-profile` not seen yet.
    pub fn requests(&self, cluster: &ClusterName, obj: &DynamicObject) -> Vec<Request> {
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let m = self.by_config_map.read().unwrap_or_else(|p| p.into_inner());
        let mut out = m
            .get(&(cluster.clone(), ns.clone(), name.clone()))
            .cloned()
            .unwrap_or_default();
        if let Some(pm) = name.strip_suffix("-profile") {
            let conventional = Request::namespaced(cluster.clone(), &ns, pm);
            if !out.contains(&conventional) {
                out.push(conventional);
            }
        }
        out
    }
}

/// Reconciles PlatformMeshes.
pub struct PlatformMeshReconciler {
    lifecycle: Lifecycle<Context, PlatformMeshError>,
    clusters: Arc<Clusters>,
    profiles: ProfileIndex,
}

impl Reconciler for PlatformMeshReconciler {
    type Error = PlatformMeshError;

    async fn reconcile(
        &self,
        req: Request,
        ctx: ClusterContext,
    ) -> Result<Action, PlatformMeshError> {
        let api: Api<DynamicObject> = ctx
            .cluster()
            .dynamic_api(&platform_meshes(), req.namespace.as_deref());
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(obj) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        let mut context = match Context::new(obj.clone(), self.clusters.clone()) {
            Ok(c) => c,
            // A spec that does not decode cannot get better by retrying; it waits for an edit.
            Err(e) => {
                tracing::warn!(platformmesh = %req, error = %e, "not reconciled");
                return Ok(Action::await_change());
            }
        };
        context.cluster = Some(ctx.cluster_name().to_string());
        self.profiles.record(
            ctx.cluster_name(),
            profile_config_map(context.name(), context.namespace(), &context.spec),
            &req,
        );
        match drive(&self.lifecycle, &api, &obj, &context).await {
            Ok(Some(after)) => Ok(Action::requeue_after(after)),
            Ok(None) => Ok(Action::await_change()),
            Err(e) => Err(e.flatten()),
        }
    }
}

/// The steps of a PlatformMesh, in order: Deployment, KcpSetup, ProviderSecret, FeatureToggles,
/// Wait (reversed on deletion).
pub fn lifecycle(engine: Arc<dyn Render + Send + Sync>) -> Lifecycle<Context, PlatformMeshError> {
    Lifecycle::new()
        .step(Deployment {
            engine: engine.clone(),
        })
        .step(KcpSetup {
            engine: engine.clone(),
        })
        .step(ProviderSecret)
        .step(FeatureToggles { engine })
        .step(Wait)
}

/// The PlatformMesh controller over `clusters`, rendering with `engine`. Engage the runtime
/// cluster (and the infra cluster, if another) with the manager; PlatformMeshes are watched in
/// every engaged cluster.
pub fn controller(
    engine: Arc<dyn Render + Send + Sync>,
    clusters: Arc<Clusters>,
) -> Controller<PlatformMeshReconciler> {
    let profiles = ProfileIndex::default();
    let lifecycle = lifecycle(engine);
    let keys = CrossClusterKeys::with_prefix(OWNER_PREFIX);
    let index = profiles.clone();
    Controller::new(
        CONTROLLER,
        PlatformMeshReconciler {
            lifecycle,
            clusters,
            profiles,
        },
    )
    .for_kind(ResourceKind::dynamic(platform_meshes(), true))
    .watches_kind(
        ResourceKind::dynamic(
            resource(
                "helm.toolkit.fluxcd.io",
                "v2",
                "HelmRelease",
                "helmreleases",
            ),
            true,
        ),
        Arc::new(move |cluster, obj| annotated_target(&keys, cluster, obj)),
    )
    .watches_kind(
        ResourceKind::dynamic(super::ocm_resources::applications(), true),
        Arc::new({
            let keys = CrossClusterKeys::with_prefix(OWNER_PREFIX);
            move |cluster, obj| annotated_target(&keys, cluster, obj)
        }),
    )
    .watches_kind(
        // Only to map a profile ConfigMap's change to its PlatformMeshes (the profile is read
        // when reconciling): the cache keeps every ConfigMap's metadata, not its data.
        ResourceKind::dynamic(resource("", "v1", "ConfigMap", "configmaps"), true)
            .with_metadata_only(),
        Arc::new(move |cluster, obj| index.requests(cluster, obj)),
    )
    .workers(10)
}

/// The `Ready` condition of a PlatformMesh as JSON, if it has one.
pub fn ready_condition(obj: &DynamicObject) -> Option<&Value> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(ns: &str, name: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns}}))
        .unwrap()
    }

    #[test]
    fn profile_changes_map_to_the_instances_that_read_them() {
        let idx = ProfileIndex::default();
        let c = ClusterName::from("runtime");
        let pm = Request::namespaced(c.clone(), "pm-system", "pm");
        // By convention before any reconcile.
        assert_eq!(
            idx.requests(&c, &cm("pm-system", "pm-profile")),
            vec![pm.clone()]
        );
        assert!(idx.requests(&c, &cm("pm-system", "shared")).is_empty());
        // Recorded: a named ConfigMap elsewhere.
        idx.record(&c, ("profiles".into(), "shared".into()), &pm);
        assert_eq!(
            idx.requests(&c, &cm("profiles", "shared")),
            vec![pm.clone()]
        );
        // The instance moves to another ConfigMap: the old one no longer maps to it.
        idx.record(&c, ("profiles".into(), "other".into()), &pm);
        assert!(idx.requests(&c, &cm("profiles", "shared")).is_empty());
        assert_eq!(idx.requests(&c, &cm("profiles", "other")), vec![pm]);
        assert!(idx
            .requests(&"infra".into(), &cm("profiles", "other"))
            .is_empty());
    }
}
