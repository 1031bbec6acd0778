//! Clusters from kubeconfigs: files in a directory (polled) and Secrets in a home cluster
//! (watched by namespace and label selector, key `kubeconfig`), engaged as they come and go.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Observed;
use crate::{Cluster, ClusterName, ClusterProvider, ClusterSink, ProviderError};

/// The Secret key holding a kubeconfig.
pub const SECRET_KEY: &str = "kubeconfig";

/// Why a kubeconfig could not become a client.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigLoadError {
    /// The text is not a usable kubeconfig.
    #[error("invalid kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The client could not be built (e.g. TLS material).
    #[error("cannot build client: {0}")]
    Client(#[from] kube::Error),
}

/// Builds a client from kubeconfig text (its current context).
pub async fn client_from_kubeconfig(text: &str) -> Result<kube::Client, KubeconfigLoadError> {
    let kubeconfig = Kubeconfig::from_yaml(text)?;
    config_to_client(kubeconfig).await
}

async fn config_to_client(kubeconfig: Kubeconfig) -> Result<kube::Client, KubeconfigLoadError> {
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A content fingerprint (compared within one process only).
fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The cluster name of a kubeconfig file: its name without a `.kubeconfig`, `.yaml`, `.yml` or
/// `.json` extension; hidden and temporary files have none.
///
/// ```
/// use mc_runtime::providers::kubeconfig::cluster_name_of_file;
/// assert_eq!(cluster_name_of_file("prod-eu.kubeconfig").as_deref(), Some("prod-eu"));
/// assert_eq!(cluster_name_of_file(".prod.swp"), None);
/// ```
pub fn cluster_name_of_file(file_name: &str) -> Option<String> {
    if file_name.starts_with('.') || file_name.ends_with('~') || file_name.ends_with(".tmp") {
        return None;
    }
    let stem = [".kubeconfig", ".yaml", ".yml", ".json"]
        .iter()
        .find_map(|ext| file_name.strip_suffix(ext))
        .unwrap_or(file_name);
    (!stem.is_empty()).then(|| stem.to_string())
}

/// What changed between two views of `name → fingerprint`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// New or changed clusters, sorted.
    pub engage: Vec<ClusterName>,
    /// Clusters that are gone, sorted.
    pub disengage: Vec<ClusterName>,
}

/// Compares two snapshots.
///
/// ```
/// use mc_runtime::providers::kubeconfig::diff;
/// use std::collections::BTreeMap;
/// let before = BTreeMap::from([("a".into(), 1), ("b".into(), 2)]);
/// let after = BTreeMap::from([("a".into(), 1), ("b".into(), 3), ("c".into(), 4)]);
/// let changes = diff(&before, &after);
/// assert_eq!(changes.engage, vec!["b".into(), "c".into()]);
/// assert!(changes.disengage.is_empty());
/// ```
pub fn diff(before: &BTreeMap<ClusterName, u64>, after: &BTreeMap<ClusterName, u64>) -> Changes {
    Changes {
        engage: after
            .iter()
            .filter(|(n, f)| before.get(*n) != Some(*f))
            .map(|(n, _)| n.clone())
            .collect(),
        disengage: before
            .keys()
            .filter(|n| !after.contains_key(*n))
            .cloned()
            .collect(),
    }
}

/// Reads every kubeconfig file of `dir`: `name → (path, fingerprint)`.
fn scan_directory(dir: &Path) -> std::io::Result<BTreeMap<ClusterName, (PathBuf, u64)>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().and_then(cluster_name_of_file) else {
            continue;
        };
        // A file may vanish between listing and reading.
        let Ok(bytes) = std::fs::read(entry.path()) else {
            continue;
        };
        out.insert(ClusterName::from(name), (entry.path(), fingerprint(&bytes)));
    }
    Ok(out)
}

/// Engaged clusters of one source with the fingerprint they were built from.
#[derive(Default)]
struct Engaged {
    clusters: HashMap<ClusterName, (u64, Option<Arc<Cluster>>)>,
}

type Shared = Arc<Mutex<Engaged>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Engaged> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records `name` at `print` and engages the client, or disengages when it cannot be built.
async fn engage_or_drop(
    shared: &Shared,
    sink: &ClusterSink,
    name: ClusterName,
    print: u64,
    client: Result<kube::Client, KubeconfigLoadError>,
) -> Result<(), ProviderError> {
    match client {
        Ok(client) => {
            let cluster = Arc::new(
                Cluster::new(name.clone(), client).with_fingerprint(format!("{print:016x}")),
            );
            lock(shared)
                .clusters
                .insert(name.clone(), (print, Some(cluster.clone())));
            info!(cluster = %name, "kubeconfig cluster found");
            sink.engage(cluster).await
        }
        Err(e) => {
            warn!(cluster = %name, error = %e, "kubeconfig unusable; cluster not engaged");
            let was = lock(shared).clusters.insert(name.clone(), (print, None));
            if matches!(was, Some((_, Some(_)))) {
                sink.disengage(&name).await?;
            }
            Ok(())
        }
    }
}

async fn forget(
    shared: &Shared,
    sink: &ClusterSink,
    name: &ClusterName,
) -> Result<(), ProviderError> {
    let was = lock(shared).clusters.remove(name);
    if matches!(was, Some((_, Some(_)))) {
        info!(cluster = %name, "kubeconfig cluster gone");
        sink.disengage(name).await?;
    }
    Ok(())
}

/// Polls a directory of kubeconfig files.
struct DirectorySource {
    dir: PathBuf,
    poll: Duration,
    engaged: Shared,
}

impl DirectorySource {
    async fn run(&self, sink: &ClusterSink, stop: &CancellationToken) -> Result<(), ProviderError> {
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            let found = match scan_directory(&self.dir) {
                Ok(f) => f,
                Err(e) => {
                    warn!(dir = %self.dir.display(), error = %e, "cannot read kubeconfig directory");
                    continue;
                }
            };
            let before: BTreeMap<ClusterName, u64> = lock(&self.engaged)
                .clusters
                .iter()
                .map(|(n, (f, _))| (n.clone(), *f))
                .collect();
            let after: BTreeMap<ClusterName, u64> =
                found.iter().map(|(n, (_, f))| (n.clone(), *f)).collect();
            let changes = diff(&before, &after);
            for name in changes.disengage {
                forget(&self.engaged, sink, &name).await?;
            }
            for name in changes.engage {
                let Some((path, print)) = found.get(&name) else {
                    continue;
                };
                let client = match Kubeconfig::read_from(path) {
                    Ok(kc) => config_to_client(kc).await,
                    Err(e) => Err(e.into()),
                };
                engage_or_drop(&self.engaged, sink, name, *print, client).await?;
            }
        }
    }
}

/// Watches Secrets holding kubeconfigs in a home cluster.
struct SecretSource {
    home: kube::Client,
    namespace: String,
    label_selector: String,
    engaged: Shared,
}

/// The kubeconfig text of a Secret (`data` or `stringData` key `kubeconfig`).
pub fn kubeconfig_of_secret(secret: &Secret) -> Option<String> {
    if let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(SECRET_KEY)) {
        return String::from_utf8(bytes.0.clone()).ok();
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .cloned()
}

impl SecretSource {
    async fn apply(&self, sink: &ClusterSink, secret: &Secret) -> Result<(), ProviderError> {
        let Some(name) = secret.metadata.name.clone() else {
            return Ok(());
        };
        let name = ClusterName::from(name);
        let Some(text) = kubeconfig_of_secret(secret) else {
            warn!(cluster = %name, namespace = %self.namespace, "secret has no kubeconfig key");
            return forget(&self.engaged, sink, &name).await;
        };
        let print = fingerprint(text.as_bytes());
        if lock(&self.engaged).clusters.get(&name).map(|(f, _)| *f) == Some(print) {
            return Ok(());
        }
        let client = client_from_kubeconfig(&text).await;
        engage_or_drop(&self.engaged, sink, name, print, client).await
    }

    async fn run(&self, sink: &ClusterSink, stop: &CancellationToken) -> Result<(), ProviderError> {
        let api: Api<Secret> = Api::namespaced(self.home.clone(), &self.namespace);
        let config = watcher::Config::default().labels(&self.label_selector);
        let mut secrets = super::follow(
            watcher(api, config).default_backoff(),
            format!("kubeconfig secrets in {}", self.namespace),
            Some,
        );
        while let Some(observed) = secrets.next(stop).await {
            match observed {
                Observed::Applied(s) => self.apply(sink, &s).await?,
                Observed::Deleted(s) => {
                    if let Some(n) = s.metadata.name.clone() {
                        forget(&self.engaged, sink, &n.into()).await?;
                    }
                }
                Observed::Relisted(present) => {
                    for s in &present {
                        self.apply(sink, s).await?;
                    }
                    let names: Vec<ClusterName> = present
                        .iter()
                        .filter_map(|s| s.metadata.name.clone())
                        .map(ClusterName::from)
                        .collect();
                    let gone: Vec<ClusterName> = lock(&self.engaged)
                        .clusters
                        .keys()
                        .filter(|n| !names.contains(n))
                        .cloned()
                        .collect();
                    for name in gone {
                        forget(&self.engaged, sink, &name).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Engages clusters from kubeconfig files in a directory and/or Secrets in a home cluster.
/// Names must be unique across both sources.
///
/// ```no_run
/// # fn f(home: kube::Client) {
/// use mc_runtime::providers::KubeconfigProvider;
/// use std::time::Duration;
/// let provider = KubeconfigProvider::new()
///     .with_directory("/etc/platform-mesh/clusters", Duration::from_secs(5))
///     .with_secrets(home, "platform-mesh-system", "platform-mesh.io/kubeconfig=true");
/// # }
/// ```
#[derive(Default)]
pub struct KubeconfigProvider {
    directory: Option<DirectorySource>,
    secrets: Option<SecretSource>,
}

impl KubeconfigProvider {
    /// A provider with no sources yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the kubeconfig files of `dir`, re-read every `poll`.
    pub fn with_directory(mut self, dir: impl Into<PathBuf>, poll: Duration) -> Self {
        self.directory = Some(DirectorySource {
            dir: dir.into(),
            poll: poll.max(Duration::from_millis(10)),
            engaged: Shared::default(),
        });
        self
    }

    /// Adds Secrets of `namespace` in `home` matching `label_selector` (key `kubeconfig`).
    pub fn with_secrets(
        mut self,
        home: kube::Client,
        namespace: &str,
        label_selector: &str,
    ) -> Self {
        self.secrets = Some(SecretSource {
            home,
            namespace: namespace.to_string(),
            label_selector: label_selector.to_string(),
            engaged: Shared::default(),
        });
        self
    }
}

#[async_trait::async_trait]
impl ClusterProvider for KubeconfigProvider {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        if self.directory.is_none() && self.secrets.is_none() {
            return Err(ProviderError::Config(
                "no kubeconfig directory or secrets configured".into(),
            ));
        }
        let dir = async {
            match &self.directory {
                Some(d) => d.run(&sink, &stop).await,
                None => Ok(()),
            }
        };
        let secrets = async {
            match &self.secrets {
                Some(s) => s.run(&sink, &stop).await,
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(dir, secrets);
        a.and(b)
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        let name = ClusterName::from(name);
        let find = |shared: &Shared| {
            lock(shared)
                .clusters
                .get(&name)
                .and_then(|(_, c)| c.clone())
        };
        self.directory
            .as_ref()
            .and_then(|d| find(&d.engaged))
            .or_else(|| self.secrets.as_ref().and_then(|s| find(&s.engaged)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterEvent;
    use tokio::sync::mpsc;

    fn kubeconfig(server: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n"
        )
    }

    async fn next_event(rx: &mut mpsc::Receiver<ClusterEvent>) -> (String, String) {
        let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an event in time")
            .expect("provider running");
        match event {
            ClusterEvent::Engage(c) => ("engage".into(), c.name().to_string()),
            ClusterEvent::Disengage(n, ack) => {
                ack.done();
                ("disengage".into(), n.to_string())
            }
        }
    }

    #[test]
    fn file_names_map_to_cluster_names() {
        assert_eq!(cluster_name_of_file("a.kubeconfig").as_deref(), Some("a"));
        assert_eq!(cluster_name_of_file("b.yaml").as_deref(), Some("b"));
        assert_eq!(cluster_name_of_file("plain").as_deref(), Some("plain"));
        assert_eq!(cluster_name_of_file(".hidden"), None);
        assert_eq!(cluster_name_of_file("x.tmp"), None);
        assert_eq!(cluster_name_of_file(".yaml"), None);
    }

    #[test]
    fn diff_reports_new_changed_and_removed() {
        let before = BTreeMap::from([("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]);
        let after = BTreeMap::from([("a".into(), 1), ("b".into(), 5), ("d".into(), 4)]);
        assert_eq!(
            diff(&before, &after),
            Changes {
                engage: vec!["b".into(), "d".into()],
                disengage: vec!["c".into()],
            }
        );
        assert_eq!(diff(&after, &after), Changes::default());
    }

    #[test]
    fn secret_kubeconfig_from_data_or_string_data() {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x"}, "data": {"kubeconfig": "aGVsbG8="}}))
        .unwrap();
        assert_eq!(kubeconfig_of_secret(&s).as_deref(), Some("hello"));
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x"}, "stringData": {"kubeconfig": "hi"}}))
        .unwrap();
        assert_eq!(kubeconfig_of_secret(&s).as_deref(), Some("hi"));
        let s: Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(kubeconfig_of_secret(&s), None);
    }

    #[tokio::test]
    async fn directory_files_engage_and_disengage_as_they_come_change_and_go() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.kubeconfig"),
            kubeconfig("https://127.0.0.1:1/clusters/a"),
        )
        .unwrap();
        let provider = Arc::new(
            KubeconfigProvider::new().with_directory(dir.path(), Duration::from_millis(20)),
        );
        let (sink, mut rx) = ClusterSink::channel(16);
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (p, stop) = (provider.clone(), stop.clone());
            async move { p.run(sink, stop).await }
        });
        assert_eq!(next_event(&mut rx).await, ("engage".into(), "a".into()));
        assert!(provider.get("a").is_some());

        std::fs::write(
            dir.path().join("b.yaml"),
            kubeconfig("https://127.0.0.1:1/clusters/b"),
        )
        .unwrap();
        assert_eq!(next_event(&mut rx).await, ("engage".into(), "b".into()));
        let old_b = provider.get("b").unwrap().instance();

        // A changed file re-engages with a new client.
        std::fs::write(
            dir.path().join("b.yaml"),
            kubeconfig("https://127.0.0.1:2/clusters/b"),
        )
        .unwrap();
        assert_eq!(next_event(&mut rx).await, ("engage".into(), "b".into()));
        assert_ne!(provider.get("b").unwrap().instance(), old_b);

        // An unusable file disengages its cluster.
        std::fs::write(dir.path().join("b.yaml"), "not: [a kubeconfig").unwrap();
        assert_eq!(next_event(&mut rx).await, ("disengage".into(), "b".into()));
        assert!(provider.get("b").is_none());

        std::fs::remove_file(dir.path().join("a.kubeconfig")).unwrap();
        assert_eq!(next_event(&mut rx).await, ("disengage".into(), "a".into()));
        assert!(provider.get("a").is_none());

        // Nothing else happens while nothing changes.
        assert!(tokio::time::timeout(Duration::from_millis(150), rx.recv())
            .await
            .is_err());
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_provider_without_sources_is_a_configuration_error() {
        let (sink, _rx) = ClusterSink::channel(1);
        let err = KubeconfigProvider::new()
            .run(sink, CancellationToken::new())
            .await;
        assert!(matches!(err, Err(ProviderError::Config(_))));
    }
}
