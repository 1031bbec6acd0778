//! Leader election on a `coordination.k8s.io/v1` Lease with client-go's timing (15 s lease,
//! 10 s renew deadline, 2 s retry): wait to lead, renew while leading, notice loss, release.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::lease::{LeaseError, LeaseLock};

/// Settings of a leader election.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease (e.g. controller-runtime's `8c290d9a.platform-mesh.io`).
    pub name: String,
    /// This candidate's unique identity (e.g. `<hostname>_<uuid>`).
    pub identity: String,
    /// How long others wait after the last renewal before taking over (default 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up (default 10 s).
    pub renew_deadline: Duration,
    /// Pause between attempts (default 2 s).
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// controller-runtime's defaults for the Lease `namespace/name`.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElectionConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Campaigns for leadership.
///
/// ```no_run
/// # async fn f(client: kube::Client, manager: mc_runtime::Manager,
/// #            provider: std::sync::Arc<dyn mc_runtime::ClusterProvider>) {
/// use mc_runtime::leader::{LeaderElectionConfig, LeaderElector};
/// use tokio_util::sync::CancellationToken;
/// let stop = CancellationToken::new();
/// let elector = LeaderElector::new(client, LeaderElectionConfig::new("kube-system", "pm", "pod-1"));
/// if let Some(leadership) = elector.acquire(&stop).await {
///     let lost = leadership.lost();
///     let _ = manager.run(provider, async move { lost.cancelled().await }).await;
///     leadership.release().await;
/// }
/// # }
/// ```
pub struct LeaderElector {
    client: kube::Client,
    config: LeaderElectionConfig,
    status: Option<LeaderStatus>,
}

/// `leader_election_master_status{name}`: 1 while this process leads the lease, else 0 (the
/// metric client-go's leader election reports).
#[derive(Clone, Debug, Default)]
pub struct LeaderStatus {
    family: prometheus_client::metrics::family::Family<
        LeaseName,
        prometheus_client::metrics::gauge::Gauge,
    >,
}

/// The label of [`LeaderStatus`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct LeaseName {
    /// The Lease's name.
    pub name: String,
}

impl LeaderStatus {
    /// Registers the metric.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "leader_election_master_status",
            "Whether this process leads the lease (1) or not (0)",
            self.family.clone(),
        );
    }

    fn set(&self, name: &str, leading: bool) {
        self.family
            .get_or_create(&LeaseName {
                name: name.to_string(),
            })
            .set(i64::from(leading));
    }

    /// The current value for a lease (for tests and health output).
    pub fn get(&self, name: &str) -> i64 {
        self.family
            .get_or_create(&LeaseName {
                name: name.to_string(),
            })
            .get()
    }
}

impl LeaderElector {
    /// An elector using `client` for the Lease.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        LeaderElector {
            client,
            config,
            status: None,
        }
    }

    /// Reports leadership in `status` (`leader_election_master_status`).
    pub fn with_status(mut self, status: LeaderStatus) -> Self {
        status.set(&self.config.name, false);
        self.status = Some(status);
        self
    }

    fn lock(&self) -> LeaseLock {
        LeaseLock::new(
            self.client.clone(),
            &self.config.namespace,
            self.config.name.clone(),
            self.config.identity.clone(),
            self.config.lease_duration,
        )
    }

    /// Waits until this candidate leads (`Some`) or `stop` is cancelled (`None`).
    pub async fn acquire(&self, stop: &CancellationToken) -> Option<Leadership> {
        let mut lock = self.lock();
        loop {
            match lock.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    warn!(lease = %self.config.name, error = %e, "leader election attempt failed")
                }
            }
            // client-go waits between retry and 2.2 x retry.
            let jitter = self
                .config
                .retry_period
                .mul_f64(1.2 * rand::random::<f64>());
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(self.config.retry_period + jitter) => {}
            }
        }
        info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
        if let Some(s) = &self.status {
            s.set(&self.config.name, true);
        }
        let lost = CancellationToken::new();
        if let Some(s) = self.status.clone() {
            // Back to 0 whenever leadership ends: lost, released or abandoned.
            let (lost, name) = (lost.clone(), self.config.name.clone());
            tokio::spawn(async move {
                lost.cancelled().await;
                s.set(&name, false);
            });
        }
        let stop_renewing = CancellationToken::new();
        let task = tokio::spawn(renew(
            lock,
            self.config.clone(),
            lost.clone(),
            stop_renewing.clone(),
        ));
        Some(Leadership {
            lost,
            stop_renewing,
            task,
        })
    }
}

/// Keeps renewing until the renew deadline passes without success, another holder appears,
/// or renewal is stopped (then the lease is released when asked).
async fn renew(
    mut lock: LeaseLock,
    config: LeaderElectionConfig,
    lost: CancellationToken,
    stop: CancellationToken,
) -> Option<LeaseLock> {
    let mut last_renewal = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Some(lock),
            _ = tokio::time::sleep(config.retry_period) => {}
        }
        let deadline = last_renewal + config.renew_deadline;
        let attempt = tokio::time::timeout_at(deadline, lock.try_acquire_or_renew()).await;
        match attempt {
            Ok(Ok(true)) => last_renewal = Instant::now(),
            Ok(Ok(false)) => {
                warn!(lease = %config.name, identity = %config.identity, "leadership taken by another candidate");
                break;
            }
            Ok(Err(e)) if Instant::now() < deadline => {
                warn!(lease = %config.name, error = %e, "lease renewal failed; retrying");
            }
            Ok(Err(_)) | Err(_) => {
                warn!(lease = %config.name, identity = %config.identity, "lease not renewed within the renew deadline");
                break;
            }
        }
    }
    lost.cancel();
    None
}

/// Held while leading.
pub struct Leadership {
    lost: CancellationToken,
    stop_renewing: CancellationToken,
    task: JoinHandle<Option<LeaseLock>>,
}

impl Leadership {
    /// Cancelled when leadership is lost; stop all leader-only work then.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Whether leadership was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stops renewing and gives the lease up so another candidate takes over at once.
    pub async fn release(self) -> Result<(), LeaseError> {
        self.stop_renewing.cancel();
        if let Ok(Some(mut lock)) = self.task.await {
            lock.release().await?;
        }
        self.lost.cancel();
        Ok(())
    }

    /// Stops renewing without releasing (as a crashed leader would): others take over once the
    /// lease expires.
    pub fn abandon(self) {
        self.task.abort();
        self.lost.cancel();
    }
}
