//! The controller builder (`for_`, `owns`, `watches`) and the running controller: cache
//! subscriptions per engaged cluster feeding one work queue, drained by a pool of workers.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::api::DynamicObject;
use tokio::task::JoinHandle;
use tracing::{debug, error, info_span, warn, Instrument};

use super::cache::{CacheEvent, CacheRegistry, SharedCache, Subscription};
use super::cluster::{Cluster, ClusterContext};
use super::error::ReconcileError;
use super::manager::Manager;
use super::mapping::{owner_requests, request_for, MapFn, Predicate};
use super::metrics::Metrics;
use super::queue::WorkQueue;
use super::rate_limit::{default_controller_rate_limiter, RateLimiter};
use super::request::{Action, ClusterName, Request, ResourceKind};

/// A level-based reconciler: reads the world for `req`, makes it as it should be, and may be
/// run any number of times.
///
/// ```
/// use mc_runtime::{Action, ClusterContext, Reconciler, Request};
/// struct Noop;
/// impl Reconciler for Noop {
///     type Error = std::convert::Infallible;
///     async fn reconcile(&self, _req: Request, _ctx: ClusterContext) -> Result<Action, Self::Error> {
///         Ok(Action::await_change())
///     }
/// }
/// ```
pub trait Reconciler: Send + Sync + 'static {
    /// What a failed reconcile reports: a transient error is retried with backoff, a fatal one
    /// waits for the next event (see [`ReconcileError`]).
    type Error: ReconcileError;

    /// Reconciles one object of one cluster.
    fn reconcile(
        &self,
        req: Request,
        ctx: ClusterContext,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// Why a controller cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// `for_` was never called.
    #[error("controller {0} has no primary type: call for_ or for_kind")]
    NoPrimary(String),
    /// A controller with that name was already added.
    #[error("a controller named {0} already exists")]
    Duplicate(String),
}

/// One watched resource and how its events become requests.
struct WatchSource {
    kind: ResourceKind,
    map: MapFn,
    predicate: Option<Predicate>,
}

/// Builds a controller: its primary type, owned types, extra watches, workers and rate limit.
///
/// ```no_run
/// # use mc_runtime::*;
/// # struct R; impl Reconciler for R { type Error = std::convert::Infallible;
/// #   async fn reconcile(&self, _: Request, _: ClusterContext) -> Result<Action, Self::Error> { Ok(Action::default()) } }
/// use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
/// let controller = Controller::new("configmaps", R)
///     .for_::<ConfigMap>()
///     .owns::<Secret>()
///     .watches::<Namespace>(|cluster, ns| {
///         vec![Request::namespaced(cluster.clone(), ns.metadata.name.clone().unwrap_or_default(), "settings")]
///     })
///     .workers(4);
/// ```
pub struct Controller<R> {
    name: String,
    reconciler: R,
    primary: Option<(ResourceKind, Option<Predicate>)>,
    owned: Vec<ResourceKind>,
    watches: Vec<WatchSource>,
    workers: usize,
    limiter: Option<Box<dyn RateLimiter<Request>>>,
}

impl<R: Reconciler> Controller<R> {
    /// A controller named `name` (used in metrics and logs) running `reconciler`.
    pub fn new(name: impl Into<String>, reconciler: R) -> Self {
        Controller {
            name: name.into(),
            reconciler,
            primary: None,
            owned: Vec::new(),
            watches: Vec::new(),
            workers: 1,
            limiter: None,
        }
    }

    /// Reconciles objects of type `K`: every event on one enqueues its own request.
    pub fn for_<K>(self) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        self.for_kind(ResourceKind::of::<K>())
    }

    /// Reconciles objects of a kind known at run time.
    pub fn for_kind(mut self, kind: ResourceKind) -> Self {
        self.primary = Some((kind, None));
        self
    }

    /// Only events on primary objects passing `predicate` enqueue requests.
    pub fn with_event_filter(
        mut self,
        predicate: impl Fn(&DynamicObject) -> bool + Send + Sync + 'static,
    ) -> Self {
        if let Some((_, p)) = self.primary.as_mut() {
            *p = Some(Arc::new(predicate));
        }
        self
    }

    /// Watches children of type `K`: an event on one enqueues its controlling owner of the
    /// primary type.
    pub fn owns<K>(self) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        self.owns_kind(ResourceKind::of::<K>())
    }

    /// Watches children of a kind known at run time.
    pub fn owns_kind(mut self, kind: ResourceKind) -> Self {
        self.owned.push(kind);
        self
    }

    /// Watches objects of type `K` in every engaged cluster; `map` turns an object seen in a
    /// cluster into requests, in that cluster or others.
    pub fn watches<K>(
        self,
        map: impl Fn(&ClusterName, &DynamicObject) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        self.watches_kind(ResourceKind::of::<K>(), Arc::new(map))
    }

    /// Watches a kind known at run time with a mapping function.
    pub fn watches_kind(mut self, kind: ResourceKind, map: MapFn) -> Self {
        self.watches.push(WatchSource {
            kind,
            map,
            predicate: None,
        });
        self
    }

    /// Number of concurrent reconciles (at least 1; default 1, as controller-runtime).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Replaces the default rate limiter (per-item 5 ms → 1000 s, overall 10 qps burst 100).
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<Request> + 'static) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn build(
        self,
        metrics: &Metrics,
    ) -> Result<Arc<RunningController<R>>, ControllerError> {
        let Some((primary, predicate)) = self.primary else {
            return Err(ControllerError::NoPrimary(self.name));
        };
        let mut sources = vec![WatchSource {
            kind: primary.clone(),
            map: Arc::new(|cluster, obj| request_for(cluster, obj).into_iter().collect()),
            predicate,
        }];
        for kind in self.owned {
            let owner = primary.clone();
            sources.push(WatchSource {
                kind,
                map: Arc::new(move |cluster, obj| owner_requests(cluster, obj, &owner)),
                predicate: None,
            });
        }
        sources.extend(self.watches);
        let limiter = match self.limiter {
            Some(l) => l,
            None => Box::new(default_controller_rate_limiter()),
        };
        metrics.started(&self.name);
        let queue = WorkQueue::with_metrics(limiter, metrics.queue(&self.name));
        Ok(Arc::new(RunningController {
            name: Arc::from(self.name.as_str()),
            reconciler: self.reconciler,
            sources,
            queue,
            workers: self.workers,
            metrics: metrics.clone(),
        }))
    }
}

/// What the manager needs from a controller, whatever its reconciler type.
pub(crate) trait ControllerRunner: Send + Sync {
    fn name(&self) -> &str;
    /// Subscribes this controller to the caches of `cluster`; events enqueue requests until the
    /// subscriptions drop.
    fn engage(&self, cluster: &Arc<Cluster>, caches: &CacheRegistry) -> Vec<Subscription>;
    fn start_workers(self: Arc<Self>, manager: Manager) -> Vec<JoinHandle<()>>;
    fn stop_queue(&self);
    fn enqueue(&self, req: Request);
}

/// A built controller.
pub(crate) struct RunningController<R> {
    name: Arc<str>,
    reconciler: R,
    sources: Vec<WatchSource>,
    queue: WorkQueue<Request>,
    workers: usize,
    metrics: Metrics,
}

/// How soon a request is tried again in a cluster whose fence renewal is overdue.
const FENCE_RECHECK: Duration = Duration::from_secs(1);

impl<R: Reconciler> RunningController<R> {
    async fn work(self: Arc<Self>, manager: Manager) {
        while let Some(req) = self.queue.get().await {
            self.process(&manager, req.clone()).await;
            self.queue.done(&req);
        }
    }

    async fn process(&self, manager: &Manager, req: Request) {
        let Some(cluster) = manager.engaged(&req.cluster) else {
            // The cluster is gone: retrying cannot help, and its backoff state must go too.
            debug!(controller = %self.name, cluster = %req.cluster, namespace = req.namespace.as_deref().unwrap_or(""),
                name = %req.name, "dropping request for a cluster that is not engaged");
            self.queue.forget(&req);
            self.metrics.dropped(&self.name);
            return;
        };
        if !cluster.fence_holds() {
            // A sharded replica whose fence renewal is overdue starts nothing here; the request
            // waits for the renewal, or goes with the cluster when it is handed off.
            self.queue.add_after(req, FENCE_RECHECK);
            return;
        }
        let _running = cluster.begin_reconcile();
        let ctx = ClusterContext::new(
            cluster.clone(),
            manager.caches(),
            &self.name,
            manager.options().cache_sync_timeout,
        )
        .with_manager(manager.clone())
        .with_primary(self.sources[0].kind.clone());
        let span = info_span!("reconcile", controller = %self.name, cluster = %req.cluster,
            namespace = req.namespace.as_deref().unwrap_or(""), name = %req.name);
        let started = Instant::now();
        // The start and end of every reconcile, for whoever must show that two replicas never
        // reconcile in one cluster at once (logged at debug: off unless asked for).
        debug!(parent: &span, cluster = %req.cluster, "reconcile started");
        let outcome = AssertUnwindSafe(self.reconciler.reconcile(req.clone(), ctx))
            .catch_unwind()
            .instrument(span.clone())
            .await;
        debug!(parent: &span, cluster = %req.cluster, "reconcile ended");
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(Ok(action)) => {
                self.queue.forget(&req);
                match action.requeue {
                    Some(delay) => {
                        self.metrics
                            .reconciled(&self.name, "requeue_after", seconds);
                        self.queue.add_after(req, delay);
                    }
                    None => self.metrics.reconciled(&self.name, "success", seconds),
                }
            }
            Ok(Err(e)) if e.is_transient() => {
                self.metrics.reconciled(&self.name, "error", seconds);
                warn!(parent: &span, error = %e, retries = self.queue.num_requeues(&req), "reconcile failed");
                self.queue.add_rate_limited(req);
            }
            Ok(Err(e)) => {
                // Fatal: the same input fails again, so the request waits for the next event.
                self.metrics.reconciled(&self.name, "error", seconds);
                error!(parent: &span, error = %e, "reconcile failed with a fatal error, not retried");
                self.queue.forget(&req);
            }
            Err(_) => {
                self.metrics.reconciled(&self.name, "panic", seconds);
                error!(parent: &span, "reconcile panicked");
                self.queue.add_rate_limited(req);
            }
        }
    }
}

impl<R: Reconciler> ControllerRunner for RunningController<R> {
    fn name(&self) -> &str {
        &self.name
    }

    fn engage(&self, cluster: &Arc<Cluster>, caches: &CacheRegistry) -> Vec<Subscription> {
        self.sources
            .iter()
            .map(|source| {
                let cache = caches.get_or_start(cluster, &source.kind);
                let cluster_name = cluster.name().clone();
                let queue = self.queue.clone();
                let map = source.map.clone();
                let predicate = source.predicate.clone();
                SharedCache::subscribe_with(&cache, cluster.name(), move |event: &CacheEvent| {
                    let obj = event.object();
                    if predicate.as_ref().is_none_or(|p| p(obj)) {
                        for req in map(&cluster_name, obj) {
                            queue.add(req);
                        }
                    }
                })
            })
            .collect()
    }

    fn start_workers(self: Arc<Self>, manager: Manager) -> Vec<JoinHandle<()>> {
        (0..self.workers)
            .map(|_| tokio::spawn(self.clone().work(manager.clone())))
            .collect()
    }

    fn stop_queue(&self) {
        self.queue.shut_down();
    }

    fn enqueue(&self, req: Request) {
        self.queue.add(req);
    }
}
