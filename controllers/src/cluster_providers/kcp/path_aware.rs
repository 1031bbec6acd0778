//! Path awareness for kcp providers: each engaged cluster's workspace path (from its
//! LogicalCluster's `kcp.io/path`, or a path the inner provider saw) resolves to its name.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{logical_cluster_kind, path_of, LOGICAL_CLUSTER_NAME};
use crate::runtime::{
    Cluster, ClusterEvent, ClusterName, ClusterProvider, ClusterSink, ProviderError,
};

/// Workspace paths of engaged clusters, both ways.
#[derive(Debug, Default)]
pub struct PathIndex {
    by_path: HashMap<String, ClusterName>,
    by_name: HashMap<ClusterName, Vec<String>>,
}

impl PathIndex {
    /// Records `paths` as names of `cluster` (replacing what it had).
    ///
    /// ```
    /// use controllers::cluster_providers::kcp::path_aware::PathIndex;
    /// let mut index = PathIndex::default();
    /// index.insert(&"2x9c".into(), vec!["root:orgs:acme".into()]);
    /// assert_eq!(index.resolve("root:orgs:acme").map(|c| c.to_string()).as_deref(), Some("2x9c"));
    /// ```
    pub fn insert(&mut self, cluster: &ClusterName, paths: Vec<String>) {
        self.remove(cluster);
        for p in &paths {
            self.by_path.insert(p.clone(), cluster.clone());
        }
        self.by_name.insert(cluster.clone(), paths);
    }

    /// Forgets the paths of `cluster`.
    pub fn remove(&mut self, cluster: &ClusterName) {
        for p in self.by_name.remove(cluster).unwrap_or_default() {
            if self.by_path.get(&p) == Some(cluster) {
                self.by_path.remove(&p);
            }
        }
    }

    /// The cluster a path names.
    pub fn resolve(&self, path: &str) -> Option<ClusterName> {
        self.by_path.get(path).cloned()
    }

    /// The paths of a cluster.
    pub fn paths(&self, cluster: &ClusterName) -> &[String] {
        self.by_name
            .get(cluster)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// Wraps a kcp provider so that clusters can also be found by workspace path.
///
/// ```no_run
/// # fn f(home: kube::Config) {
/// use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
/// let provider = PathAware::new(ApiExportProvider::new(home, ApiExportOptions::for_slice("core.platform-mesh.io")));
/// // manager.cluster("root:orgs:acme") now finds the engaged cluster of that workspace.
/// # }
/// ```
pub struct PathAware<P> {
    inner: Arc<P>,
    paths: Arc<RwLock<PathIndex>>,
    lookup_timeout: Duration,
}

impl<P: ClusterProvider> PathAware<P> {
    /// Adds path resolution to `inner`.
    pub fn new(inner: P) -> Self {
        PathAware {
            inner: Arc::new(inner),
            paths: Arc::default(),
            lookup_timeout: Duration::from_secs(10),
        }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The paths known for an engaged cluster.
    pub fn paths_of(&self, cluster: &str) -> Vec<String> {
        self.paths
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .paths(&ClusterName::from(cluster))
            .to_vec()
    }

    /// Reads `kcp.io/path` of the cluster's LogicalCluster `cluster`.
    async fn lookup_path(&self, cluster: &Cluster) -> Option<String> {
        let api = cluster.dynamic_api(&logical_cluster_kind().api, None);
        match tokio::time::timeout(self.lookup_timeout, api.get_opt(LOGICAL_CLUSTER_NAME)).await {
            Ok(Ok(Some(lc))) => path_of(&lc).map(str::to_string),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                debug!(cluster = %cluster.name(), error = %e, "no LogicalCluster to read the path from");
                None
            }
            Err(_) => {
                warn!(cluster = %cluster.name(), "reading the LogicalCluster timed out");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl<P: ClusterProvider> ClusterProvider for PathAware<P> {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        let (inner_sink, mut events) = ClusterSink::channel(64);
        let inner = self.inner.clone();
        let inner_stop = stop.clone();
        let mut inner_task = tokio::spawn(async move { inner.run(inner_sink, inner_stop).await });
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => break,
                event = events.recv() => event,
            };
            match event {
                Some(ClusterEvent::Engage(cluster)) => {
                    let mut paths: Vec<String> = cluster.aliases().to_vec();
                    if let Some(p) = self.lookup_path(&cluster).await {
                        if !paths.contains(&p) {
                            paths.push(p);
                        }
                    }
                    self.paths
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(cluster.name(), paths);
                    sink.engage(cluster).await?;
                }
                Some(ClusterEvent::Disengage(name, ack)) => {
                    self.paths
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&name);
                    let sent = sink.disengage(&name).await;
                    ack.done();
                    sent?;
                }
                None => break,
            }
        }
        match (&mut inner_task).await {
            Ok(result) => result,
            Err(_) => Err(ProviderError::Config("inner provider panicked".into())),
        }
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        if let Some(c) = self.inner.get(name) {
            return Some(c);
        }
        let resolved = self
            .paths
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .resolve(name)?;
        self.inner.get(resolved.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_until_the_cluster_goes() {
        let mut index = PathIndex::default();
        let c = ClusterName::from("2x9c");
        index.insert(&c, vec!["root:orgs:acme".into(), "root:acme-alias".into()]);
        assert_eq!(index.resolve("root:orgs:acme"), Some(c.clone()));
        assert_eq!(index.resolve("root:acme-alias"), Some(c.clone()));
        assert_eq!(index.paths(&c).len(), 2);
        index.insert(&c, vec!["root:orgs:renamed".into()]);
        assert_eq!(
            index.resolve("root:orgs:acme"),
            None,
            "old paths are replaced"
        );
        index.remove(&c);
        assert_eq!(index.resolve("root:orgs:renamed"), None);
        assert!(index.paths(&c).is_empty());
    }

    #[test]
    fn a_path_moved_to_another_cluster_is_not_removed_with_the_old_one() {
        let mut index = PathIndex::default();
        index.insert(&"old".into(), vec!["root:ws".into()]);
        index.insert(&"new".into(), vec!["root:ws".into()]);
        index.remove(&"old".into());
        assert_eq!(index.resolve("root:ws"), Some("new".into()));
    }
}
