//! The broker over kcp workspaces: consumers are the workspaces bound to the brokered APIExport
//! (engaged through its endpoint slice, as any APIExport controller), providers are the
//! workspaces holding AcceptAPIs (found by a wildcard watch of AcceptAPIs), and coordination is
//! the workspace of the export.
//!
//! Two ways to reach providers:
//! - [`staging_options`], as upstream's kcp variant: AcceptAPIs are seen through an APIExport
//!   the provider workspaces bind, and copies go into the broker's own staging workspaces bound
//!   to each provider's export (see [`staging`](super::staging)). The broker needs no rights in
//!   consumer or provider workspaces beyond what their bindings grant.
//! - [`options`]: AcceptAPIs by a wildcard watch and copies written into the provider workspace
//!   itself, where the provider's controller picks them up. This needs a kubeconfig allowed into
//!   every workspace (an administrator's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use api::broker::AcceptAPI;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cluster_providers::kcp::CLUSTER_ANNOTATION;
use crate::runtime::client::{cluster_prefix, scoped_client};
use crate::runtime::providers::{follow, Observed};
use crate::runtime::{
    Cluster, ClusterName, ClusterProvider, ClusterSink, ProviderError, ResourceKind,
};

/// Engages every workspace that holds at least one AcceptAPI, through `/clusters/<name>` of
/// the server `root` points at (which must be allowed to watch AcceptAPIs across workspaces).
///
/// Not [`ApiExportProvider`](crate::cluster_providers::kcp::ApiExportProvider) watching AcceptAPIs: its
/// clusters share wildcard caches, and a wildcard watch of the brokered kind (a CRD of each
/// provider workspace) is not served; these clusters watch through their own prefix.
pub struct AcceptApiWorkspaces {
    root: kube::Client,
    engaged: Mutex<BTreeMap<ClusterName, Arc<Cluster>>>,
}

impl AcceptApiWorkspaces {
    /// Workspaces of the server at `root`.
    pub fn new(root: kube::Client) -> Self {
        AcceptApiWorkspaces {
            root,
            engaged: Mutex::new(BTreeMap::new()),
        }
    }

    async fn engage(&self, sink: &ClusterSink, name: &str) -> Result<(), ProviderError> {
        let cluster = Arc::new(Cluster::scoped(
            name,
            self.root.clone(),
            &cluster_prefix(name),
        ));
        self.engaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ClusterName::from(name), cluster.clone());
        debug!(
            cluster = name,
            "workspace holds AcceptAPIs; engaging as a provider"
        );
        sink.engage(cluster).await
    }

    async fn disengage(&self, sink: &ClusterSink, name: &str) -> Result<(), ProviderError> {
        let name = ClusterName::from(name);
        self.engaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&name);
        sink.disengage(&name).await
    }
}

/// The workspace and namespace/name of an AcceptAPI seen through the wildcard.
fn key_of(obj: &DynamicObject) -> Option<(String, (String, String))> {
    let cluster = obj.annotations().get(CLUSTER_ANNOTATION)?.clone();
    Some((
        cluster,
        (obj.namespace().unwrap_or_default(), obj.name_any()),
    ))
}

type Index = BTreeMap<String, BTreeSet<(String, String)>>;

#[async_trait::async_trait]
impl ClusterProvider for AcceptApiWorkspaces {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        let wildcard = scoped_client(&self.root, &cluster_prefix("*"));
        let kind = ResourceKind::of::<AcceptAPI>();
        let api: Api<DynamicObject> = Api::all_with(wildcard, &kind.api);
        let mut accept_apis = follow(
            watcher(api, watcher::Config::default()).default_backoff(),
            "AcceptAPIs across workspaces",
            |obj: DynamicObject| key_of(&obj),
        );
        let mut index: Index = BTreeMap::new();
        while let Some(observed) = accept_apis.next(&stop).await {
            match observed {
                Observed::Relisted(keys) => {
                    let mut fresh: Index = BTreeMap::new();
                    for (c, k) in keys {
                        fresh.entry(c).or_default().insert(k);
                    }
                    for gone in index.keys().filter(|c| !fresh.contains_key(*c)) {
                        self.disengage(&sink, gone).await?;
                    }
                    for new in fresh.keys().filter(|c| !index.contains_key(*c)) {
                        self.engage(&sink, new).await?;
                    }
                    index = fresh;
                }
                Observed::Applied((c, k)) => {
                    let first = !index.contains_key(&c);
                    index.entry(c.clone()).or_default().insert(k);
                    if first {
                        self.engage(&sink, &c).await?;
                    }
                }
                Observed::Deleted((c, k)) => {
                    let now_empty = index.get_mut(&c).is_some_and(|s| {
                        s.remove(&k);
                        s.is_empty()
                    });
                    if now_empty {
                        index.remove(&c);
                        self.disengage(&sink, &c).await?;
                    }
                }
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.engaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ClusterName::from(name))
            .cloned()
    }
}

/// `root` pointed at workspace `platform`, and a client at the server root.
fn platform_home(
    root: &kube::Config,
    platform: &str,
) -> Result<(kube::Config, kube::Client), String> {
    let base = root
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let mut home = root.clone();
    home.cluster_url = format!("{base}{}", cluster_prefix(platform))
        .parse()
        .map_err(|e| format!("the address of workspace {platform}: {e}"))?;
    let client =
        kube::Client::try_from(root.clone()).map_err(|e| format!("a client for kcp: {e}"))?;
    Ok((home, client))
}

/// The broker's clusters on the kcp that `root` (a config at the server root, allowed to read
/// and write every workspace) points at: consumers bound to the APIExport `export` of workspace
/// `platform`, providers holding AcceptAPIs, and `platform` as the coordination cluster.
pub fn options(
    root: &kube::Config,
    platform: &str,
    export: &str,
    kinds: Vec<super::generic::Brokered>,
    workers: usize,
) -> Result<super::wiring::BrokerOptions, String> {
    let (home, client) = platform_home(root, platform)?;
    let consumers = crate::cluster_providers::kcp::ApiExportProvider::new(
        home,
        crate::cluster_providers::kcp::ApiExportOptions::for_slice(export),
    );
    Ok(super::wiring::BrokerOptions {
        consumers: Arc::new(consumers),
        providers: Arc::new(AcceptApiWorkspaces::new(client.clone())),
        accept_apis: None,
        staging: None,
        coordination: Some(Cluster::scoped(
            "coordination",
            client.clone(),
            &cluster_prefix(platform),
        )),
        compute: None,
        kinds,
        workers,
        metrics: Default::default(),
        migrations_apart: false,
        consumer_aliases: Vec::new(),
        provider_aliases: Vec::new(),
    })
}

/// The broker's clusters on a kcp without entering provider or consumer workspaces, for the
/// identity of `root` (a config at the server root): consumers bound to APIExport `export` of
/// workspace `platform` and providers bound to its APIExport `accept_export` (claiming or
/// serving AcceptAPIs), both through the exports' virtual workspaces; copies in staging
/// workspaces under `tree_root`; `platform` as the coordination cluster.
///
/// The identity needs, in `platform`: the content of both exports, their endpoint slices, and
/// Migrations and MigrationConfigurations; in `tree_root`: to create workspaces; and from each
/// provider, `bind` on the export its AcceptAPIs name.
pub fn staging_options(
    root: &kube::Config,
    platform: &str,
    export: &str,
    accept_export: &str,
    tree_root: &str,
    kinds: Vec<super::generic::Brokered>,
    workers: usize,
) -> Result<super::wiring::BrokerOptions, String> {
    let (home, client) = platform_home(root, platform)?;
    let provider = |name: &str| {
        Arc::new(crate::cluster_providers::kcp::ApiExportProvider::new(
            home.clone(),
            crate::cluster_providers::kcp::ApiExportOptions::for_slice(name),
        ))
    };
    let staging = Arc::new(super::staging::Staging::new(
        client.clone(),
        tree_root,
        kinds.iter().map(|k| k.kind.api.clone()).collect(),
    ));
    Ok(super::wiring::BrokerOptions {
        consumers: provider(export),
        providers: staging.clone(),
        accept_apis: Some(provider(accept_export)),
        staging: Some(staging),
        coordination: Some(Cluster::scoped(
            "coordination",
            client,
            &cluster_prefix(platform),
        )),
        compute: None,
        kinds,
        workers,
        metrics: Default::default(),
        migrations_apart: false,
        consumer_aliases: Vec::new(),
        provider_aliases: Vec::new(),
    })
}
