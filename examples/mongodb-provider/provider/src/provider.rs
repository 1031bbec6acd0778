//! The provider controller: this project's multi-cluster runtime over the kcp APIExport
//! `mongodb`, projecting each consumer's MongoDBCommunity into the downstream cluster and
//! bringing its status (and a connection Secret) back.
//!
//! How it runs:
//! - An [`ApiExportProvider`] reads the APIExportEndpointSlice of the export in the provider
//!   workspace, watches the APIBindings at `<url>/clusters/*` and engages every bound logical
//!   cluster through `<url>/clusters/<cluster>`.
//! - One [`Manager`] runs one [`Controller`] for the consumer kind (and the connection Secrets it
//!   owns, so a deleted Secret comes back) in every engaged cluster: the [`MongoReconciler`].
//! - The downstream cluster is a plain `kube::Client`. A manager runs over exactly one cluster
//!   provider (`Manager::run` takes one), and engaging the downstream cluster in the same
//!   manager would make the controller's primary watch reconcile the downstream objects too; so
//!   downstream events come from a kube-rs watcher on the downstream MongoDBCommunity objects
//!   carrying the provider's labels, mapped back to the consumer object through those labels and
//!   handed to the controller's queue with [`Manager::enqueue`] (the runtime's external trigger).
//!   A downstream status change thus wakes its consumer object at once; nothing polls.

use std::sync::Arc;
use std::time::Duration;

use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider};
use controllers::runtime::{
    kube_error_is_transient, Action, CacheError, ClusterContext, Controller, Manager, ManagerError,
    ManagerOptions, ReconcileError, Reconciler, Request, ResourceKind,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::model::{
    api_resource, connection_secret, consumer_request, finalizer_patch, has_finalizer, is_deleting,
    resource_kind, status_patch, updated_secret, Placement, PlacementError, ReportedStatus,
    CLUSTER_LABEL,
};

/// The controller's name (in logs, metrics, and for [`Manager::enqueue`]).
pub const CONTROLLER: &str = "mongodb-provider";

/// How soon a consumer object being deleted is looked at again while its downstream object is
/// still there (the downstream watch usually wakes it first).
const DELETE_RECHECK: Duration = Duration::from_secs(1);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A request to the consumer's workspace (through the virtual workspace) failed.
    #[error("{what} in the consumer's workspace: {source}")]
    Consumer {
        /// What was being done.
        what: &'static str,
        /// The client error.
        source: kube::Error,
    },
    /// A request to the downstream cluster failed.
    #[error("{what} in the downstream cluster: {source}")]
    Downstream {
        /// What was being done.
        what: &'static str,
        /// The client error.
        source: kube::Error,
    },
    /// The consumer object cannot be placed downstream.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The watch cache of the consumer kind is not ready.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An object could not be converted.
    #[error("converting an object: {0}")]
    Json(#[from] serde_json::Error),
}

impl ReconcileError for SyncError {
    fn is_transient(&self) -> bool {
        match self {
            SyncError::Consumer { source, .. } | SyncError::Downstream { source, .. } => {
                kube_error_is_transient(source)
            }
            SyncError::Placement(_) | SyncError::Json(_) => false,
            SyncError::Cache(e) => e.is_transient(),
        }
    }
}

fn consumer_err(what: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Consumer { what, source }
}

fn downstream_err(what: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Downstream { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Reconciles one consumer MongoDBCommunity: see the contract in
/// `examples/mongodb-provider/CONTRACT.md`.
pub struct MongoReconciler {
    /// The downstream cluster.
    downstream: kube::Client,
    /// The consumer kind (the same coordinates downstream).
    kind: ResourceKind,
}

impl MongoReconciler {
    /// A reconciler writing into the downstream cluster of `downstream`.
    pub fn new(downstream: kube::Client) -> Self {
        MongoReconciler {
            downstream,
            kind: resource_kind(),
        }
    }

    fn downstream_api(&self, placement: &Placement) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.downstream.clone(),
            &placement.downstream_namespace(),
            &self.kind.api,
        )
    }

    /// Step 1: the consumer object is being deleted. Deletes the downstream object; once it is
    /// gone, deletes the connection Secret and releases the consumer object.
    async fn finalize(
        &self,
        ctx: &ClusterContext,
        consumer_api: &Api<DynamicObject>,
        placement: &Placement,
        obj: &Value,
    ) -> Result<Action, SyncError> {
        if !has_finalizer(obj) {
            return Ok(Action::await_change());
        }
        let api = self.downstream_api(placement);
        let name = placement.downstream_name();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(downstream_err("deleting the downstream object")(e)),
        }
        if api
            .get_opt(&name)
            .await
            .map_err(downstream_err("reading the downstream object"))?
            .is_some()
        {
            debug!(downstream = %name, "waiting for the downstream object to go");
            return Ok(Action::requeue_after(DELETE_RECHECK));
        }
        let secrets: Api<Secret> = Api::namespaced(ctx.client(), &placement.namespace);
        match secrets
            .delete(&placement.secret_name(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(consumer_err("deleting the connection Secret")(e)),
        }
        consumer_api
            .patch(
                &placement.name,
                &PatchParams::default(),
                &Patch::Merge(&finalizer_patch(obj, false)),
            )
            .await
            .map_err(consumer_err("removing the finalizer"))?;
        info!(downstream = %name, "downstream object deleted; finalizer removed");
        Ok(Action::await_change())
    }

    /// Step 3: the downstream namespace and object, created or updated to carry the consumer's
    /// spec; returns the downstream object as stored.
    async fn ensure_downstream(
        &self,
        placement: &Placement,
        obj: &Value,
    ) -> Result<Value, SyncError> {
        let api = self.downstream_api(placement);
        let name = placement.downstream_name();
        let stored = api
            .get_opt(&name)
            .await
            .map_err(downstream_err("reading the downstream object"))?;
        match stored {
            Some(stored) => {
                let stored = serde_json::to_value(&stored)?;
                match placement.updated_downstream(&stored, obj) {
                    None => Ok(stored),
                    Some(updated) => {
                        let replaced = api
                            .replace(
                                &name,
                                &PostParams::default(),
                                &serde_json::from_value(updated)?,
                            )
                            .await
                            .map_err(downstream_err("updating the downstream object"))?;
                        info!(downstream = %name, "downstream object updated");
                        Ok(serde_json::to_value(&replaced)?)
                    }
                }
            }
            None => {
                self.ensure_namespace(placement).await?;
                let wanted: DynamicObject =
                    serde_json::from_value(placement.downstream_object(obj))?;
                let created = api
                    .create(&PostParams::default(), &wanted)
                    .await
                    .map_err(downstream_err("creating the downstream object"))?;
                info!(downstream = %name, namespace = %placement.downstream_namespace(),
                    "downstream object created");
                Ok(serde_json::to_value(&created)?)
            }
        }
    }

    /// The downstream namespace `consumer-<C>`, created when missing.
    async fn ensure_namespace(&self, placement: &Placement) -> Result<(), SyncError> {
        let namespaces: Api<Namespace> = Api::all(self.downstream.clone());
        let name = placement.downstream_namespace();
        if namespaces
            .get_opt(&name)
            .await
            .map_err(downstream_err("reading the downstream namespace"))?
            .is_some()
        {
            return Ok(());
        }
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {
                info!(namespace = %name, "downstream namespace created");
                Ok(())
            }
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(downstream_err("creating the downstream namespace")(e)),
        }
    }

    /// Step 5: the connection Secret in the consumer's namespace, written through the virtual
    /// workspace (the export's claim on labelled Secrets allows it).
    async fn ensure_secret(
        &self,
        ctx: &ClusterContext,
        placement: &Placement,
        obj: &Value,
    ) -> Result<(), SyncError> {
        let secrets: Api<Secret> = Api::namespaced(ctx.client(), &placement.namespace);
        let wanted = connection_secret(placement, obj);
        let name = placement.secret_name();
        match secrets
            .get_opt(&name)
            .await
            .map_err(consumer_err("reading the connection Secret"))?
        {
            None => {
                secrets
                    .create(&PostParams::default(), &serde_json::from_value(wanted)?)
                    .await
                    .map_err(consumer_err("creating the connection Secret"))?;
                info!(secret = %name, "connection Secret created");
            }
            Some(stored) => {
                let stored = serde_json::to_value(&stored)?;
                if let Some(updated) = updated_secret(&stored, &wanted, decode_data) {
                    secrets
                        .replace(
                            &name,
                            &PostParams::default(),
                            &serde_json::from_value(updated)?,
                        )
                        .await
                        .map_err(consumer_err("updating the connection Secret"))?;
                    info!(secret = %name, "connection Secret updated");
                }
            }
        }
        Ok(())
    }
}

/// A Secret `data` value (base64 in JSON) as text.
fn decode_data(v: &Value) -> Option<String> {
    let bytes: k8s_openapi::ByteString = serde_json::from_value(v.clone()).ok()?;
    String::from_utf8(bytes.0).ok()
}

impl Reconciler for MongoReconciler {
    type Error = SyncError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, SyncError> {
        let Some(namespace) = req.namespace.as_deref() else {
            return Ok(Action::await_change());
        };
        let cache = ctx.cache(&self.kind).await?;
        let Some(cached) = cache.get(ctx.cluster_name(), Some(namespace), &req.name) else {
            // Gone: the finalizer made sure its downstream object went first.
            return Ok(Action::await_change());
        };
        let mut obj = serde_json::to_value(&*cached)?;
        let placement = Placement::new(ctx.cluster_name().as_str(), namespace, &req.name)?;
        let consumer_api = ctx.cluster().dynamic_api(&self.kind.api, Some(namespace));

        // 1. Deleting.
        if is_deleting(&obj) {
            return self.finalize(&ctx, &consumer_api, &placement, &obj).await;
        }
        // 2. The finalizer, before anything exists downstream.
        if !has_finalizer(&obj) {
            let patched = consumer_api
                .patch(
                    &req.name,
                    &PatchParams::default(),
                    &Patch::Merge(&finalizer_patch(&obj, true)),
                )
                .await
                .map_err(consumer_err("adding the finalizer"))?;
            obj = serde_json::to_value(&patched)?;
        }
        // 3. The downstream namespace and object.
        let downstream = self.ensure_downstream(&placement, &obj).await?;
        // 4. Status back.
        if let Some(patch) = status_patch(&obj, &downstream) {
            consumer_api
                .patch_status(&req.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(consumer_err("writing the status"))?;
            info!(status = %patch["status"], "status written");
        }
        // 5. The connection Secret once the database runs.
        if ReportedStatus::of(&downstream).is_running() {
            self.ensure_secret(&ctx, &placement, &obj).await?;
        }
        Ok(Action::await_change())
    }
}

/// Watches the downstream MongoDBCommunity objects the provider made (those with its cluster
/// label) and enqueues the consumer object each belongs to, until `stop` is cancelled.
pub async fn watch_downstream(client: kube::Client, manager: Manager, stop: CancellationToken) {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource());
    let stream = watcher(api, watcher::Config::default().labels(CLUSTER_LABEL)).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            next = stream.next() => next,
        };
        let obj = match next {
            None => return,
            Some(Err(e)) => {
                warn!(error = %e, "downstream watch failed; retrying");
                continue;
            }
            Some(Ok(Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj))) => obj,
            Some(Ok(Event::Init | Event::InitDone)) => continue,
        };
        if let Some(req) = consumer_request(&obj) {
            debug!(request = %req, "downstream change");
            // A request for a cluster not engaged (yet) is dropped by the runtime; engaging it
            // reconciles all its objects anyway.
            manager.enqueue(CONTROLLER, req);
        }
    }
}

/// Why the provider stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The manager failed (its cluster provider, or a controller that could not be built).
    #[error(transparent)]
    Manager(#[from] ManagerError),
}

/// Runs the provider controller until `shutdown` resolves: `home` points at the provider
/// workspace holding the APIExport `export` and its endpoint slice; `downstream` is the
/// cluster the databases go to.
pub async fn run(
    home: kube::Config,
    export: &str,
    downstream: kube::Client,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let provider = Arc::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice(export),
    ));
    let manager = Manager::new(ManagerOptions {
        graceful_shutdown_timeout: Duration::from_secs(10),
        ..ManagerOptions::default()
    });
    manager.add(
        Controller::new(CONTROLLER, MongoReconciler::new(downstream.clone()))
            .for_kind(resource_kind())
            .owns_kind(ResourceKind::of::<Secret>())
            .workers(2),
    )?;
    let stop = CancellationToken::new();
    let watch = tokio::spawn(watch_downstream(downstream, manager.clone(), stop.clone()));
    info!(export, "provider controller running");
    let result = manager.run(provider, shutdown).await;
    stop.cancel();
    let _ = watch.await;
    match result {
        Err(ManagerError::ShutdownTimeout(deadline)) => {
            warn!(?deadline, "reconciles were cut short at shutdown");
            Ok(())
        }
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_data_is_decoded_from_base64() {
        // "mongodb://x" in base64.
        assert_eq!(
            decode_data(&json!("bW9uZ29kYjovL3g=")).as_deref(),
            Some("mongodb://x")
        );
        assert_eq!(decode_data(&json!("not base64!")), None);
        assert_eq!(decode_data(&json!(7)), None);
    }

    #[test]
    fn errors_are_retried_unless_the_same_input_fails_again() {
        let api = |code| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "y").with_code(code),
            ))
        };
        let conflict = SyncError::Consumer {
            what: "adding the finalizer",
            source: api(409),
        };
        assert!(conflict.is_transient());
        let invalid = SyncError::Downstream {
            what: "creating the downstream object",
            source: api(422),
        };
        assert!(!invalid.is_transient());
        assert!(invalid
            .to_string()
            .starts_with("creating the downstream object in the downstream cluster"));
        let long = Placement::new("c", "default", &"x".repeat(64)).unwrap_err();
        assert!(!SyncError::from(long).is_transient());
    }
}
