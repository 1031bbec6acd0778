//! Puts the broker together: one manager per role (consumers, providers, coordination), the
//! controllers on each, and the event paths between them.
//!
//! - consumers: one brokering controller per kind ([`GenericReconciler`]);
//! - providers: the AcceptAPI controller, and per kind a watch whose events wake the consumer
//!   object a copy belongs to;
//! - coordination: the MigrationConfiguration and Migration controllers; Migration events wake
//!   the consumer object being moved.
//!
//! An AcceptAPI change wakes every consumer object of its API, so objects move as soon as what
//! providers accept changes.
//!
//! Sharded replicas ([`BrokerOptions::migrations_apart`]) each run the consumers manager over
//! their share of the consumer clusters, the providers and AcceptAPI managers over all (their
//! events only wake consumer objects this replica has engaged; requests for other clusters are
//! dropped, and the AcceptAPI status they write is the same from every replica), and the
//! Migration controller on one replica at a time ([`Migrations`]).

use std::collections::HashMap;
use std::sync::Arc;

use api::broker::{AcceptAPI, Migration, MigrationConfiguration};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::accept::{AcceptApiReconciler, Registry};
use super::generic::{
    consumer_request, Brokered, Discovery, GenericReconciler, Shared, CONSUMER_KIND,
};
use super::migration::{
    ConfigurationReconciler, Configurations, MigrationReconciler, MIGRATION_CONTROLLER,
};
use crate::cluster_providers::FixedClusters;
use crate::runtime::{
    Action, Cluster, ClusterContext, ClusterProvider, Controller, Manager, ManagerOptions,
    Reconciler, Request,
};

/// What the broker runs over.
pub struct BrokerOptions {
    /// The consumer clusters.
    pub consumers: Arc<dyn ClusterProvider>,
    /// The provider clusters: where copies go, and (without `accept_apis`) where AcceptAPIs are.
    pub providers: Arc<dyn ClusterProvider>,
    /// The clusters holding AcceptAPIs, when they are not the provider clusters (on kcp through
    /// staging workspaces: the providers' workspaces, seen through an APIExport).
    pub accept_apis: Option<Arc<dyn ClusterProvider>>,
    /// The staging workspaces, when `providers` are those.
    pub staging: Option<Arc<super::staging::Staging>>,
    /// The coordination cluster (MigrationConfigurations and Migrations); without one, objects
    /// move without migrations.
    pub coordination: Option<Cluster>,
    /// Where migration stage objects go (the coordination cluster when not given).
    pub compute: Option<kube::Client>,
    /// The brokered kinds.
    pub kinds: Vec<Brokered>,
    /// Workers per brokering controller.
    pub workers: usize,
    /// Where the broker's managers count reconciles and queues (`controller_runtime_*`,
    /// `workqueue_*`).
    pub metrics: crate::runtime::Metrics,
    /// The Migration controller is left out of [`Broker::run`], for a replica to run it with
    /// [`Broker::migrations`] while it leads: sharded replicas each broker their share of the
    /// consumers, and a Migration must have one writer.
    pub migrations_apart: bool,
    /// Consumer contexts that reach a cluster of `consumers` under another name, as
    /// `(alias, cluster)` (see [`kubeconfig_clusters`]): the copies made under an alias (by an
    /// earlier broker that engaged both) are removed.
    pub consumer_aliases: Vec<(String, String)>,
    /// Provider contexts that reach a cluster of `providers` under another name: an object
    /// whose annotations name the alias is on that cluster.
    pub provider_aliases: Vec<(String, String)>,
}

/// A reconciler for watches that only forward events elsewhere; never called.
struct Forwarder;

impl Reconciler for Forwarder {
    type Error = std::convert::Infallible;

    async fn reconcile(&self, _: Request, _: ClusterContext) -> Result<Action, Self::Error> {
        Ok(Action::await_change())
    }
}

/// The broker's three managers, ready to run.
pub struct Broker {
    /// Manager of the consumer clusters.
    pub consumers: Manager,
    /// Manager of the provider clusters.
    pub providers: Manager,
    /// Manager of the coordination cluster.
    pub coordination: Manager,
    /// Manager of the AcceptAPI clusters when they are not the provider clusters.
    pub accept_apis: Manager,
    /// The AcceptAPI registry.
    pub registry: Registry,
    /// What the Migration controller needs, when it runs apart.
    migrations: Option<Migrations>,
    options: BrokerOptions,
}

/// Wakes, through `consumers`, the consumer object the Migration `obj` moves.
fn wake_moved(consumers: &Manager, obj: &kube::api::DynamicObject) {
    let kind = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONSUMER_KIND));
    if let (Some(kind), Some((_, req))) = (kind, consumer_request(obj)) {
        consumers.enqueue(&format!("broker-{kind}"), req);
    }
}

/// The Migration controller's parts, shared with the rest of the broker.
#[derive(Clone)]
struct MigrationParts {
    consumers: Manager,
    providers: Manager,
    configurations: Configurations,
    compute: Option<kube::Client>,
    discovery: Discovery,
}

impl MigrationParts {
    /// Adds the Migration controller to `coordination`; its events wake the consumer object
    /// being moved.
    fn add_to(&self, coordination: &Manager) -> Result<(), String> {
        let to_consumers = self.consumers.clone();
        coordination
            .add(
                Controller::new(
                    MIGRATION_CONTROLLER,
                    MigrationReconciler {
                        configurations: self.configurations.clone(),
                        providers: self.providers.clone(),
                        compute: self.compute.clone(),
                        discovery: self.discovery.clone(),
                    },
                )
                .for_::<Migration>()
                .with_event_filter(move |obj| {
                    wake_moved(&to_consumers, obj);
                    true
                }),
            )
            .map_err(|e| e.to_string())
    }
}

/// The Migration controller of a broker whose migrations run apart
/// ([`BrokerOptions::migrations_apart`]).
#[derive(Clone)]
pub struct Migrations {
    parts: MigrationParts,
    coordination: (crate::runtime::ClusterName, kube::Client),
    metrics: crate::runtime::Metrics,
}

impl Migrations {
    /// Runs the Migration controller on a manager of its own until `stop` is cancelled; called
    /// once per leadership.
    pub async fn run(&self, stop: CancellationToken) -> Result<(), String> {
        let manager = Manager::with_metrics(ManagerOptions::default(), self.metrics.sharing());
        // The configurations' controller again, here: a changed configuration wakes the
        // Migrations through the manager that runs them (the registry is shared, so the
        // broker's own copy of this controller writes the same entries).
        manager
            .add(
                Controller::new(
                    "broker-migrationconfiguration",
                    ConfigurationReconciler {
                        configurations: self.parts.configurations.clone(),
                        coordination: manager.clone(),
                    },
                )
                .for_::<MigrationConfiguration>(),
            )
            .map_err(|e| e.to_string())?;
        self.parts.add_to(&manager)?;
        let (name, client) = self.coordination.clone();
        let clusters: Arc<dyn ClusterProvider> =
            Arc::new(FixedClusters::new(Some(Cluster::new(name, client))));
        manager
            .run(clusters, async move { stop.cancelled().await })
            .await
            .map_err(|e| e.to_string())
    }
}

impl Broker {
    /// Builds the managers and controllers.
    pub fn new(options: BrokerOptions) -> Result<Broker, String> {
        let manager =
            || Manager::with_metrics(ManagerOptions::default(), options.metrics.sharing());
        let consumers = Manager::with_metrics(ManagerOptions::default(), options.metrics.clone());
        let providers = manager();
        let coordination = manager();
        let accept_apis = manager();
        let registry = Registry::default();
        let configurations = Configurations::default();
        let discovery = Discovery::default();
        let shared = Shared {
            registry: registry.clone(),
            configurations: configurations.clone(),
            providers: providers.clone(),
            coordination: options.coordination.as_ref().map(|c| c.client()),
            discovery: discovery.clone(),
            staging: options.staging.clone(),
            aliases: {
                let mut of: HashMap<String, Vec<String>> = HashMap::new();
                for (alias, cluster) in &options.consumer_aliases {
                    of.entry(cluster.clone()).or_default().push(alias.clone());
                }
                Arc::new(of)
            },
            provider_aliases: Arc::new(options.provider_aliases.iter().cloned().collect()),
        };
        let aliased: Arc<HashMap<String, String>> =
            Arc::new(options.consumer_aliases.iter().cloned().collect());
        let err = |e: crate::runtime::ManagerError| e.to_string();
        for b in &options.kinds {
            consumers
                .add(
                    Controller::new(
                        b.controller(),
                        GenericReconciler {
                            brokered: b.clone(),
                            shared: shared.clone(),
                        },
                    )
                    .for_kind(b.kind.clone())
                    .workers(options.workers.max(1)),
                )
                .map_err(err)?;
            let to_consumers = consumers.clone();
            let controller = b.controller();
            let aliased = aliased.clone();
            providers
                .add(
                    Controller::new(format!("{}-copies", b.controller()), Forwarder)
                        .for_kind(b.kind.clone())
                        .with_event_filter(move |obj| {
                            if let Some((_, mut req)) = consumer_request(obj) {
                                // A copy made under an alias wakes the object in the
                                // cluster the alias reaches, whose reconcile removes it.
                                if let Some(cluster) = aliased.get(req.cluster.as_str()) {
                                    req.cluster =
                                        crate::runtime::ClusterName::from(cluster.as_str());
                                }
                                to_consumers.enqueue(&controller, req);
                            }
                            false
                        }),
                )
                .map_err(err)?;
        }
        let registering = match options.accept_apis {
            Some(_) => &accept_apis,
            None => &providers,
        };
        registering
            .add(
                Controller::new(
                    "broker-acceptapi",
                    AcceptApiReconciler {
                        registry: registry.clone(),
                        brokered: options.kinds.iter().map(|b| b.gvr.clone()).collect(),
                        staging: options.staging.clone(),
                    },
                )
                .for_::<AcceptAPI>(),
            )
            .map_err(err)?;
        // What providers accept changed: every consumer object of that API may move.
        {
            let consumers = consumers.clone();
            let kinds = options.kinds.clone();
            registry.on_change(move |gvr| {
                for b in kinds.iter().filter(|b| &b.gvr == gvr) {
                    let controller = b.controller();
                    let caches = consumers.caches();
                    for name in consumers.engaged_clusters() {
                        let Some(cluster) = consumers.engaged(&name) else {
                            continue;
                        };
                        let cache = caches.get_or_start(&cluster, &b.kind);
                        for obj in cache.list(&name, None) {
                            if let Some(req) = crate::runtime::mapping::request_for(&name, &obj) {
                                consumers.enqueue(&controller, req);
                            }
                        }
                    }
                }
            });
        }
        let parts = MigrationParts {
            consumers: consumers.clone(),
            providers: providers.clone(),
            configurations: configurations.clone(),
            compute: options.compute.clone(),
            discovery: discovery.clone(),
        };
        let mut migrations = None;
        if let Some(c) = &options.coordination {
            coordination
                .add(
                    Controller::new(
                        "broker-migrationconfiguration",
                        ConfigurationReconciler {
                            configurations: configurations.clone(),
                            coordination: coordination.clone(),
                        },
                    )
                    .for_::<MigrationConfiguration>(),
                )
                .map_err(err)?;
            if options.migrations_apart {
                // The Migration controller runs on one replica, but a Migration's events must
                // wake the consumer object where it is brokered: every replica watches them and
                // wakes its own (requests for consumers it has not engaged are dropped).
                let to_consumers = consumers.clone();
                coordination
                    .add(
                        Controller::new("broker-migration-wakes", Forwarder)
                            .for_::<Migration>()
                            .with_event_filter(move |obj| {
                                wake_moved(&to_consumers, obj);
                                false
                            }),
                    )
                    .map_err(err)?;
                migrations = Some(Migrations {
                    parts,
                    coordination: (c.name().clone(), c.client()),
                    metrics: options.metrics.sharing(),
                });
            } else {
                parts.add_to(&coordination)?;
            }
        }
        Ok(Broker {
            consumers,
            providers,
            coordination,
            accept_apis,
            registry,
            migrations,
            options,
        })
    }

    /// The Migration controller, when it runs apart from [`Broker::run`].
    pub fn migrations(&self) -> Option<Migrations> {
        self.migrations.clone()
    }

    /// Runs every manager until `stop` is cancelled (or one of them fails).
    pub async fn run(self, stop: CancellationToken) -> Result<(), String> {
        let Broker {
            consumers,
            providers,
            coordination,
            accept_apis,
            options,
            ..
        } = self;
        let coordination_clusters: Arc<dyn ClusterProvider> =
            Arc::new(FixedClusters::new(options.coordination));
        let accept_api_clusters: Arc<dyn ClusterProvider> = options
            .accept_apis
            .unwrap_or_else(|| Arc::new(FixedClusters::new(None)));
        let wait = |s: CancellationToken| async move { s.cancelled().await };
        let (a, b, c, d) = tokio::join!(
            providers.run(options.providers, wait(stop.clone())),
            consumers.run(options.consumers, wait(stop.clone())),
            coordination.run(coordination_clusters, wait(stop.clone())),
            accept_apis.run(accept_api_clusters, wait(stop.clone())),
        );
        for (role, r) in [
            ("providers", a),
            ("consumers", b),
            ("coordination", c),
            ("AcceptAPI", d),
        ] {
            if let Err(e) = r {
                warn!(role, error = %e, "broker manager stopped");
                stop.cancel();
                return Err(format!("the {role} manager stopped: {e}"));
            }
        }
        Ok(())
    }
}

/// The clusters of kubeconfig files: one per cluster the contexts reach, not one per context.
pub struct KubeconfigClusters {
    /// The clusters, named `<path>+<context>` after the context that names them first.
    pub clusters: Vec<Cluster>,
    /// Contexts that reach a cluster an earlier context already names, as `(alias, cluster)`
    /// names: brokered once, under the cluster's name.
    pub aliases: Vec<(String, String)>,
}

/// One cluster per cluster the contexts of the kubeconfig files reach, named
/// `<path>+<context>` (as upstream's file provider names them, so provider-side names match
/// upstream's).
///
/// Two contexts can reach one cluster: the kubeconfig `serve` writes has `platform-mesh` (its
/// base URL) and `root` (`/clusters/root`), kcp's has `base` and `root`. Engaged twice, such a
/// cluster's objects would be brokered twice, each time under another consumer name, so every
/// object would have two copies. What a context reaches is asked of the server (the
/// `kcp.io/cluster` of its LogicalCluster); a server that does not answer (no kcp API, no
/// permission, not reachable yet) is known by its URL, where `/clusters/<name>` names the
/// logical cluster. Within the contexts of one cluster, the file's current context comes
/// first, then the others in the file's order; the first names the cluster, the rest are
/// aliases.
pub async fn kubeconfig_clusters(paths: &[String]) -> Result<KubeconfigClusters, String> {
    let mut out = KubeconfigClusters {
        clusters: Vec::new(),
        aliases: Vec::new(),
    };
    let mut named: HashMap<String, String> = HashMap::new();
    for path in paths.iter().filter(|p| !p.is_empty()) {
        let kc =
            Kubeconfig::read_from(path).map_err(|e| format!("reading kubeconfig {path}: {e}"))?;
        if kc.contexts.is_empty() {
            return Err(format!("kubeconfig {path} has no contexts"));
        }
        let mut contexts: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        if let Some(current) = kc.current_context.as_deref() {
            if let Some(at) = contexts.iter().position(|c| *c == current) {
                let current = contexts.remove(at);
                contexts.insert(0, current);
            }
        }
        for context in contexts {
            let options = KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            let config = kube::Config::from_custom_kubeconfig(kc.clone(), &options)
                .await
                .map_err(|e| format!("kubeconfig {path}, context {context}: {e}"))?;
            let url = config.cluster_url.to_string();
            let client = kube::Client::try_from(config)
                .map_err(|e| format!("kubeconfig {path}, context {context}: {e}"))?;
            let name = format!("{path}+{context}");
            let reached = reached_cluster(&client, &url).await;
            match named.get(&reached) {
                Some(first) => {
                    tracing::warn!(
                        context = %name,
                        cluster = %first,
                        reached = %reached,
                        "two contexts reach one cluster: it is brokered once, under the first one's name"
                    );
                    out.aliases.push((name, first.clone()));
                }
                None => {
                    named.insert(reached, name.clone());
                    out.clusters.push(Cluster::new(name, client));
                }
            }
        }
    }
    Ok(out)
}

/// What a client reaches: `<origin> <logical cluster>` when that is known, else its URL.
async fn reached_cluster(client: &kube::Client, url: &str) -> String {
    let url = url.trim_end_matches('/');
    let origin_and_path = |url: &str| -> (String, String) {
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        match url[after_scheme..].find('/') {
            Some(slash) => (
                url[..after_scheme + slash].to_string(),
                url[after_scheme + slash..].to_string(),
            ),
            None => (url.to_string(), String::new()),
        }
    };
    let (origin, path) = origin_and_path(url);
    let asked = async {
        let request = http::Request::get("/apis/core.kcp.io/v1alpha1/logicalclusters/cluster")
            .body(Vec::new())
            .ok()?;
        let answer: serde_json::Value = client.request(request).await.ok()?;
        answer["metadata"]["annotations"]["kcp.io/cluster"]
            .as_str()
            .map(String::from)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), asked).await {
        Ok(Some(cluster)) => format!("{origin} {cluster}"),
        _ => match path.strip_prefix("/clusters/") {
            Some(cluster) if !cluster.is_empty() && !cluster.contains('/') => {
                format!("{origin} {cluster}")
            }
            _ => url.to_string(),
        },
    }
}

/// The cluster of a kubeconfig file's current context, named `name`.
pub async fn kubeconfig_cluster(path: &str, name: &str) -> Result<Cluster, String> {
    let kc = Kubeconfig::read_from(path).map_err(|e| format!("reading kubeconfig {path}: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig {path}: {e}"))?;
    let client = kube::Client::try_from(config).map_err(|e| format!("kubeconfig {path}: {e}"))?;
    Ok(Cluster::new(name, client))
}
