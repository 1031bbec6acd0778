//! A provider of a fixed set of clusters, engaged at start: for tests, for a single home
//! cluster, and as the inner provider of sharded engagement.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::{Cluster, ClusterName, ClusterProvider, ClusterSink, ProviderError};

/// Engages the clusters it was given, once, and keeps them until stopped.
///
/// ```no_run
/// # fn f(client: kube::Client) {
/// use mc_runtime::providers::FixedClusters;
/// use mc_runtime::Cluster;
/// let provider = FixedClusters::new([Cluster::new("home", client)]);
/// # }
/// ```
pub struct FixedClusters {
    clusters: Mutex<BTreeMap<ClusterName, Arc<Cluster>>>,
}

impl FixedClusters {
    /// A provider of `clusters`.
    pub fn new(clusters: impl IntoIterator<Item = Cluster>) -> Self {
        FixedClusters {
            clusters: Mutex::new(
                clusters
                    .into_iter()
                    .map(|c| (c.name().clone(), Arc::new(c)))
                    .collect(),
            ),
        }
    }
}

#[async_trait::async_trait]
impl ClusterProvider for FixedClusters {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        let clusters: Vec<_> = self
            .clusters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for c in clusters {
            sink.engage(c).await?;
        }
        stop.cancelled().await;
        Ok(())
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.clusters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ClusterName::from(name))
            .cloned()
    }
}
