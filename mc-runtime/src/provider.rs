//! The cluster-provider interface: a provider discovers clusters and reports which to engage and
//! disengage through a [`ClusterSink`]; the manager owns what happens next.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::request::ClusterName;

/// Why a provider stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider's configuration cannot work (bad path, bad selector, ...).
    #[error("provider configuration: {0}")]
    Config(String),
    /// Talking to a cluster failed in a way the provider cannot recover from.
    #[error("provider: {0}")]
    Kube(#[from] kube::Error),
    /// Reading local files failed.
    #[error("provider I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The manager went away.
    #[error("the manager stopped listening")]
    SinkClosed,
}

/// Tells the provider that the manager finished disengaging a cluster: its watches stopped and
/// its in-flight reconciles ended (or the shutdown deadline passed).
#[derive(Debug)]
pub struct DisengageAck(Option<oneshot::Sender<()>>);

impl DisengageAck {
    /// An acknowledgement nobody waits for.
    pub fn none() -> Self {
        DisengageAck(None)
    }

    /// Reports the cluster as disengaged.
    pub fn done(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// What a provider reports.
#[derive(Debug)]
pub enum ClusterEvent {
    /// Start (or, when a cluster of that name is engaged, restart) controllers for the cluster.
    Engage(Arc<Cluster>),
    /// Stop controllers for the cluster; the ack fires once nothing runs there any more.
    Disengage(ClusterName, DisengageAck),
}

/// The sending side a provider reports clusters to.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use mc_runtime::{ClusterEvent, ClusterSink};
/// let (sink, mut events) = ClusterSink::channel(8);
/// let waiter = tokio::spawn(async move { sink.disengage(&"a".into()).await });
/// match events.recv().await {
///     Some(ClusterEvent::Disengage(name, ack)) => { assert_eq!(name.as_str(), "a"); ack.done() }
///     _ => unreachable!(),
/// }
/// waiter.await.unwrap().unwrap();
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct ClusterSink {
    tx: mpsc::Sender<ClusterEvent>,
}

impl ClusterSink {
    /// A sink and the receiver of its events (the manager's side, or a test's).
    pub fn channel(buffer: usize) -> (ClusterSink, mpsc::Receiver<ClusterEvent>) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        (ClusterSink { tx }, rx)
    }

    /// Reports a cluster to engage.
    pub async fn engage(&self, cluster: Arc<Cluster>) -> Result<(), ProviderError> {
        self.tx
            .send(ClusterEvent::Engage(cluster))
            .await
            .map_err(|_| ProviderError::SinkClosed)
    }

    /// Reports a cluster to disengage and waits until the receiver acknowledges it (a dropped
    /// acknowledgement counts as done).
    pub async fn disengage(&self, name: &ClusterName) -> Result<(), ProviderError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(ClusterEvent::Disengage(
                name.clone(),
                DisengageAck(Some(tx)),
            ))
            .await
            .map_err(|_| ProviderError::SinkClosed)?;
        let _ = rx.await;
        Ok(())
    }

    /// Whether the receiving side is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Discovers clusters and reports them to engage or disengage.
///
/// A provider is small: it does not know about controllers, caches or queues. The runtime knows
/// no particular control plane; what is particular to one lives in its provider.
#[async_trait::async_trait]
pub trait ClusterProvider: Send + Sync + 'static {
    /// Runs until `stop` is cancelled, reporting clusters to `sink`. Returning early with `Ok`
    /// leaves engaged clusters engaged; an error stops the manager.
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError>;

    /// An engaged cluster by name (a provider may also accept other names for it, e.g. a path
    /// in a hierarchy of clusters).
    fn get(&self, name: &str) -> Option<Arc<Cluster>>;
}

/// A shared provider is a provider, so one chosen at run time can be wrapped (e.g. sharded).
#[async_trait::async_trait]
impl ClusterProvider for Arc<dyn ClusterProvider> {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        (**self).run(sink, stop).await
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        (**self).get(name)
    }
}
