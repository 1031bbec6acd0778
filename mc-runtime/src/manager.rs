//! The manager: engages and disengages clusters as its provider reports them, keeps one client
//! and the shared caches per engaged cluster, runs the controllers, and shuts down gracefully.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cache::{CacheRegistry, Subscription};
use super::cluster::Cluster;
use super::controller::{Controller, ControllerError, ControllerRunner, Reconciler};
use super::metrics::Metrics;
use super::provider::{ClusterEvent, ClusterProvider, ClusterSink, DisengageAck, ProviderError};
use super::request::{ClusterName, Request};

/// Settings of a manager.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// How long in-flight reconciles may take to finish at shutdown (default 30 s).
    pub graceful_shutdown_timeout: Duration,
    /// How long a cached read waits for its cache's initial list (default 2 min).
    pub cache_sync_timeout: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            graceful_shutdown_timeout: Duration::from_secs(30),
            cache_sync_timeout: Duration::from_secs(120),
        }
    }
}

/// Why the manager stopped or refused something.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// `run` was called twice, or `add` after `run`.
    #[error("the manager is already running")]
    AlreadyRunning,
    /// A controller could not be built.
    #[error(transparent)]
    Controller(#[from] ControllerError),
    /// The provider failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The provider task panicked.
    #[error("the cluster provider panicked")]
    ProviderPanicked,
    /// Reconciles were still running when the shutdown deadline passed.
    #[error("reconciles still running after the {0:?} shutdown deadline")]
    ShutdownTimeout(Duration),
}

struct EngagedCluster {
    cluster: Arc<Cluster>,
    /// The controllers' cache subscriptions for this cluster; dropped on disengage.
    _subscriptions: Vec<Subscription>,
}

struct ManagerInner {
    options: ManagerOptions,
    metrics: Metrics,
    caches: CacheRegistry,
    engaged: RwLock<HashMap<ClusterName, EngagedCluster>>,
    controllers: Mutex<Vec<Arc<dyn ControllerRunner>>>,
    provider: RwLock<Option<Arc<dyn ClusterProvider>>>,
    running: AtomicBool,
}

/// Runs controllers over every cluster a provider engages.
///
/// ```no_run
/// # async fn f(provider: std::sync::Arc<dyn mc_runtime::ClusterProvider>) {
/// use mc_runtime::{Manager, ManagerOptions};
/// let manager = Manager::new(ManagerOptions::default());
/// // manager.add(Controller::new(...).for_::<ConfigMap>())?;
/// manager.run(provider, async { let _ = tokio::signal::ctrl_c().await; }).await.unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct Manager {
    inner: Arc<ManagerInner>,
}

impl Manager {
    /// A manager with fresh metrics.
    pub fn new(options: ManagerOptions) -> Self {
        Self::with_metrics(options, Metrics::default())
    }

    /// A manager reporting to `metrics` (register them once with a Prometheus registry).
    pub fn with_metrics(options: ManagerOptions, metrics: Metrics) -> Self {
        Manager {
            inner: Arc::new(ManagerInner {
                options,
                metrics,
                caches: CacheRegistry::default(),
                engaged: RwLock::new(HashMap::new()),
                controllers: Mutex::new(Vec::new()),
                provider: RwLock::new(None),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// The manager's settings.
    pub fn options(&self) -> &ManagerOptions {
        &self.inner.options
    }

    /// The manager's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The shared caches.
    pub fn caches(&self) -> CacheRegistry {
        self.inner.caches.clone()
    }

    /// Adds a controller; must happen before [`Manager::run`].
    pub fn add<R: Reconciler>(&self, controller: Controller<R>) -> Result<(), ManagerError> {
        if self.inner.running.load(Ordering::SeqCst) {
            return Err(ManagerError::AlreadyRunning);
        }
        let mut controllers = self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if controllers.iter().any(|c| c.name() == controller.name()) {
            return Err(ControllerError::Duplicate(controller.name().to_string()).into());
        }
        controllers.push(controller.build(&self.inner.metrics)?);
        Ok(())
    }

    /// Adds a request to the queue of controller `controller` (an external trigger, like
    /// controller-runtime's channel source); returns whether that controller exists.
    pub fn enqueue(&self, controller: &str, req: Request) -> bool {
        let controllers = self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match controllers.iter().find(|c| c.name() == controller) {
            Some(c) => {
                c.enqueue(req);
                true
            }
            None => false,
        }
    }

    /// The engaged cluster of that exact name.
    pub fn engaged(&self, name: &ClusterName) -> Option<Arc<Cluster>> {
        self.inner
            .engaged
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|e| e.cluster.clone())
    }

    /// An engaged cluster by name or by any other name the provider resolves (e.g. a path).
    pub fn cluster(&self, name: &str) -> Option<Arc<Cluster>> {
        if let Some(c) = self.engaged(&ClusterName::from(name)) {
            return Some(c);
        }
        let resolved = self.provider()?.get(name)?;
        self.engaged(resolved.name())
    }

    fn provider(&self) -> Option<Arc<dyn ClusterProvider>> {
        self.inner
            .provider
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A cluster to write into from a reconcile elsewhere: an engaged one, or one the provider
    /// knows that another replica of a sharded group engages (see
    /// [`crate::sharding::Sharded`]); never reconciled here because of this.
    pub fn reachable(&self, name: &str) -> Option<Arc<Cluster>> {
        self.cluster(name).or_else(|| self.provider()?.get(name))
    }

    /// Names of the engaged clusters, sorted.
    pub fn engaged_clusters(&self) -> Vec<ClusterName> {
        let mut names: Vec<_> = self
            .inner
            .engaged
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    fn engage(&self, cluster: Arc<Cluster>) {
        let name = cluster.name().clone();
        let replaced = {
            let mut engaged = self
                .inner
                .engaged
                .write()
                .unwrap_or_else(|p| p.into_inner());
            if engaged
                .get(&name)
                .is_some_and(|e| Arc::ptr_eq(&e.cluster, &cluster))
            {
                return;
            }
            // Engaged before subscribing, so the requests the subscriptions enqueue find it.
            let old = engaged.insert(
                name.clone(),
                EngagedCluster {
                    cluster: cluster.clone(),
                    _subscriptions: Vec::new(),
                },
            );
            self.inner.metrics.set_engaged_clusters(engaged.len());
            old
        };
        // The old instance's subscriptions end here.
        drop(replaced);
        let controllers = self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let subscriptions: Vec<Subscription> = controllers
            .iter()
            .flat_map(|c| c.engage(&cluster, &self.inner.caches))
            .collect();
        let mut engaged = self
            .inner
            .engaged
            .write()
            .unwrap_or_else(|p| p.into_inner());
        match engaged.get_mut(&name) {
            Some(e) if Arc::ptr_eq(&e.cluster, &cluster) => e._subscriptions = subscriptions,
            // Disengaged or replaced meanwhile: the subscriptions drop here.
            _ => {}
        }
        drop(engaged);
        info!(cluster = %name, "cluster engaged");
    }

    fn disengage(&self, name: &ClusterName, ack: DisengageAck) {
        let removed = {
            let mut engaged = self
                .inner
                .engaged
                .write()
                .unwrap_or_else(|p| p.into_inner());
            let removed = engaged.remove(name);
            self.inner.metrics.set_engaged_clusters(engaged.len());
            removed
        };
        let Some(removed) = removed else {
            ack.done();
            return;
        };
        let EngagedCluster {
            cluster,
            _subscriptions,
        } = removed;
        drop(_subscriptions);
        info!(cluster = %name, "cluster disengaged");
        let deadline = self.inner.options.graceful_shutdown_timeout;
        tokio::spawn(async move {
            if !cluster.wait_idle(deadline).await {
                warn!(cluster = %cluster.name(), "reconciles still running after disengage deadline");
            }
            ack.done();
        });
    }

    /// Runs until `shutdown` resolves (or the provider fails): engages clusters as `provider`
    /// reports them and runs every controller's workers. On shutdown it stops taking work, lets
    /// in-flight reconciles finish within the graceful-shutdown deadline, and disengages all.
    pub async fn run(
        &self,
        provider: Arc<dyn ClusterProvider>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ManagerError> {
        if self.inner.running.swap(true, Ordering::SeqCst) {
            return Err(ManagerError::AlreadyRunning);
        }
        *self
            .inner
            .provider
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(provider.clone());
        let root = CancellationToken::new();
        let controllers = self
            .inner
            .controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut workers: Vec<JoinHandle<()>> = Vec::new();
        for c in &controllers {
            workers.extend(c.clone().start_workers(self.clone()));
        }
        let (sink, mut events) = ClusterSink::channel(64);
        let mut provider_task = {
            let stop = root.clone();
            tokio::spawn(async move { provider.run(sink, stop).await })
        };
        let mut provider_done = false;
        let mut events_closed = false;
        tokio::pin!(shutdown);
        let mut result = Ok(());
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                event = events.recv(), if !events_closed => match event {
                    Some(ClusterEvent::Engage(cluster)) => self.engage(cluster),
                    Some(ClusterEvent::Disengage(name, ack)) => self.disengage(&name, ack),
                    // The provider is done reporting; engaged clusters stay until shutdown.
                    None => events_closed = true,
                },
                joined = &mut provider_task, if !provider_done => {
                    provider_done = true;
                    match joined {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => { result = Err(ManagerError::Provider(e)); break; }
                        Err(_) => { result = Err(ManagerError::ProviderPanicked); break; }
                    }
                }
            }
        }
        info!("manager shutting down");
        root.cancel();
        for c in &controllers {
            c.stop_queue();
        }
        let deadline = self.inner.options.graceful_shutdown_timeout;
        let aborts: Vec<_> = workers.iter().map(|w| w.abort_handle()).collect();
        let joined = tokio::time::timeout(deadline, futures::future::join_all(workers)).await;
        if joined.is_err() {
            for a in aborts {
                a.abort();
            }
            warn!(deadline = ?deadline, "reconciles still running at the shutdown deadline");
            if result.is_ok() {
                result = Err(ManagerError::ShutdownTimeout(deadline));
            }
        }
        if !provider_done
            && tokio::time::timeout(deadline, &mut provider_task)
                .await
                .is_err()
        {
            provider_task.abort();
        }
        let mut engaged = self
            .inner
            .engaged
            .write()
            .unwrap_or_else(|p| p.into_inner());
        engaged.clear();
        self.inner.metrics.set_engaged_clusters(0);
        result
    }
}

#[cfg(test)]
mod tests;
