//! `platform-mesh broker`: the resource broker as its own process, over clusters given by
//! kubeconfig files or over the workspaces of a kcp (such as `platform-mesh serve`).

use std::sync::Arc;

use anyhow::{bail, Context as _};
use controllers::broker::generic::Brokered;
use controllers::broker::parse_kind;
use controllers::broker::wiring::{kubeconfig_cluster, kubeconfig_clusters, Broker, BrokerOptions};
use controllers::cluster_providers::FixedClusters;
use controllers::runtime::leader::{LeaderElectionConfig, LeaderElector, LeaderStatus};
use controllers::runtime::sharding::{Sharded, ShardingConfig};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;

/// Flags of `platform-mesh broker`.
#[derive(clap::Args)]
pub struct BrokerArgs {
    /// A brokered kind as Kind.version.group (ConfigMap.v1.core for the core group); repeatable.
    #[arg(long = "watch-kind", required = true)]
    watch_kinds: Vec<String>,
    /// Kubeconfig files of consumer clusters (one cluster per context), comma-separated.
    #[arg(long, value_delimiter = ',')]
    consumer_kubeconfig: Vec<String>,
    /// Kubeconfig files of provider clusters (one cluster per context), comma-separated.
    #[arg(long, value_delimiter = ',')]
    provider_kubeconfig: Vec<String>,
    /// Kubeconfig of the coordination cluster, holding MigrationConfigurations and Migrations
    /// (without it objects move between providers without migrations).
    #[arg(long)]
    coordination_kubeconfig: Option<String>,
    /// Kubeconfig of the cluster migration stage objects are created in (default: coordination).
    #[arg(long)]
    compute_kubeconfig: Option<String>,
    /// Broker between the workspaces of this kcp instead: consumers bind --brokered-export of
    /// --platform-workspace; providers bind --acceptapi-export (or, without it, are the
    /// workspaces with AcceptAPIs, and this kubeconfig must be an administrator's).
    #[arg(long, conflicts_with_all = ["consumer_kubeconfig", "provider_kubeconfig", "coordination_kubeconfig"])]
    kcp_kubeconfig: Option<String>,
    /// The workspace holding the brokered APIExport, MigrationConfigurations and Migrations.
    #[arg(long, default_value = "root:platform", requires = "kcp_kubeconfig")]
    platform_workspace: String,
    /// Name of the APIExport consumers bind to get the brokered APIs.
    #[arg(long, requires = "kcp_kubeconfig")]
    brokered_export: Option<String>,
    /// Reach providers as upstream's kcp variant, without entering their workspaces: the
    /// APIExport of --platform-workspace that provider workspaces bind so the broker sees their
    /// AcceptAPIs. Copies then go into staging workspaces the broker creates under
    /// --workspace-tree-root, bound to the APIExport each AcceptAPI names in annotation
    /// broker.platform-mesh.io/kcp-apiexport-name. Without it, --kcp-kubeconfig must be allowed
    /// into every workspace.
    #[arg(long, requires = "kcp_kubeconfig")]
    acceptapi_export: Option<String>,
    /// Where staging workspaces are created (default: --platform-workspace).
    #[arg(long, requires = "acceptapi_export")]
    workspace_tree_root: Option<String>,
    /// Concurrent reconciles per brokered kind.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Where to serve Prometheus metrics (`/metrics`, plain HTTP), e.g. `:8080`; `0` for none.
    #[arg(long, default_value = "0")]
    metrics_bind_address: String,
    /// Where to serve the health probes (`/healthz`, `/readyz`, plain HTTP), e.g. `:8081`; `0`
    /// for none (upstream's manager defaults to `:8081`; here it is asked for, so that several
    /// brokers on one machine do not collide).
    #[arg(long, default_value = "0")]
    health_probe_bind_address: String,
    /// Broker only while holding a Lease, so that of several replicas one works at a time. The
    /// Lease is in --coordination-kubeconfig's cluster, or with --kcp-kubeconfig in
    /// --platform-workspace.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the Lease (created when missing).
    #[arg(long, default_value = "default")]
    leader_election_namespace: String,
    /// Name of the Lease: upstream's leader-election id.
    #[arg(long, default_value = "c8c3e66c.platform-mesh.io")]
    leader_election_id: String,
    /// How many replicas share the consumer clusters. With more than 1, every replica brokers
    /// the objects of its share of the consumers, chosen by rendezvous hashing over the live
    /// replicas and fenced by a Lease per cluster (`<leader-election-id>-consumers-shard-…`), so
    /// two replicas never reconcile in one consumer cluster at once; the Migration controller
    /// runs on the replica holding the --leader-election-id Lease. The Leases are where
    /// --leader-elect keeps its Lease.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    shard_replicas: u16,
    /// This replica's name among the shards (default: the host name and a random suffix).
    #[arg(long)]
    shard_identity: Option<String>,
}

/// Reads the flags into the broker's clusters.
async fn options(args: &BrokerArgs) -> anyhow::Result<BrokerOptions> {
    let mut kinds = Vec::new();
    for k in &args.watch_kinds {
        let gvk = parse_kind(k)
            .map_err(anyhow::Error::msg)
            .context("--watch-kind")?;
        kinds.push(Brokered::new(gvk, None));
    }
    let compute = match &args.compute_kubeconfig {
        Some(path) => Some(
            kubeconfig_cluster(path, "compute")
                .await
                .map_err(anyhow::Error::msg)?
                .client(),
        ),
        None => None,
    };
    if let Some(path) = &args.kcp_kubeconfig {
        let Some(export) = &args.brokered_export else {
            bail!("--kcp-kubeconfig needs --brokered-export: the APIExport consumers bind");
        };
        let kc =
            Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {path}"))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {path}"))?;
        let mut root = config.clone();
        // The kubeconfig may point into a workspace; the broker works from the server root.
        let url = root.cluster_url.to_string();
        if let Some(i) = url.find("/clusters/") {
            root.cluster_url = url[..i].parse().context("the kcp address")?;
        }
        let mut options = match &args.acceptapi_export {
            Some(accept) => controllers::broker::kcp::staging_options(
                &root,
                &args.platform_workspace,
                export,
                accept,
                args.workspace_tree_root
                    .as_deref()
                    .unwrap_or(&args.platform_workspace),
                kinds,
                args.workers,
            ),
            None => controllers::broker::kcp::options(
                &root,
                &args.platform_workspace,
                export,
                kinds,
                args.workers,
            ),
        }
        .map_err(anyhow::Error::msg)?;
        options.compute = compute;
        return Ok(options);
    }
    if args.consumer_kubeconfig.is_empty() || args.provider_kubeconfig.is_empty() {
        bail!(
            "say where consumers and providers are: --consumer-kubeconfig and --provider-kubeconfig \
             (kubeconfig files), or --kcp-kubeconfig with --brokered-export (kcp workspaces)"
        );
    }
    let consumers = kubeconfig_clusters(&args.consumer_kubeconfig)
        .await
        .map_err(anyhow::Error::msg)?;
    let providers = kubeconfig_clusters(&args.provider_kubeconfig)
        .await
        .map_err(anyhow::Error::msg)?;
    let coordination = match &args.coordination_kubeconfig {
        Some(path) => Some(
            kubeconfig_cluster(path, "coordination")
                .await
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    Ok(BrokerOptions {
        consumers: Arc::new(FixedClusters::new(consumers.clusters)),
        providers: Arc::new(FixedClusters::new(providers.clusters)),
        accept_apis: None,
        staging: None,
        coordination,
        compute,
        kinds,
        workers: args.workers,
        metrics: Default::default(),
        migrations_apart: false,
        consumer_aliases: consumers.aliases,
        provider_aliases: providers.aliases,
    })
}

/// Runs the broker until `shutdown` resolves.
pub async fn run(
    args: BrokerArgs,
    shutdown: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let metrics = controllers::runtime::Metrics::default();
    let status = LeaderStatus::default();
    // Checked before anything starts: a flag that cannot work fails at once.
    let sharded = args.shard_replicas > 1;
    let election = match args.leader_elect || sharded {
        true => Some(lease_client(&args).await?),
        false => None,
    };
    let metrics_address = bind_address(&args.metrics_bind_address, "--metrics-bind-address")?;
    let probe_address = bind_address(
        &args.health_probe_bind_address,
        "--health-probe-bind-address",
    )?;
    let mut endpoints = Vec::new();
    if let Some(address) = metrics_address {
        let registry = {
            let mut registry = prometheus_client::registry::Registry::default();
            metrics.register(&mut registry);
            status.register(&mut registry);
            Arc::new(registry)
        };
        endpoints.push(serve_plain(address, "metrics", Endpoint::Metrics(registry)).await?);
    }
    if let Some(address) = probe_address {
        endpoints.push(serve_plain(address, "health probes", Endpoint::Probes).await?);
    }
    let stop = CancellationToken::new();
    let work = async {
        let Some((client, namespace)) = election else {
            crate::logging::announce(
                &format!(
                    "platform-mesh broker is running for {}",
                    args.watch_kinds.join(", ")
                ),
                &[],
            );
            return broker_until(&args, &metrics, stop.clone()).await;
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let identity = format!("{host}_{}", uuid::Uuid::new_v4());
        let config = LeaderElectionConfig::new(&namespace, &args.leader_election_id, &identity);
        crate::operator::ensure_namespace(&client, &namespace, &stop).await;
        if sharded {
            let identity = args.shard_identity.clone().unwrap_or(identity);
            crate::logging::announce(
                &format!(
                    "platform-mesh broker is running for {} as shard {identity} of {}",
                    args.watch_kinds.join(", "),
                    args.shard_replicas
                ),
                &[],
            );
            let elector = LeaderElector::new(client.clone(), config).with_status(status.clone());
            return sharded_until(
                &args,
                &metrics,
                client,
                &namespace,
                &identity,
                elector,
                stop.clone(),
            )
            .await;
        }
        let elector = LeaderElector::new(client, config).with_status(status.clone());
        while let Some(leadership) = elector.acquire(&stop).await {
            crate::logging::announce(
                &format!(
                    "platform-mesh broker leads ({}/{}) and is running for {}",
                    namespace,
                    args.leader_election_id,
                    args.watch_kinds.join(", ")
                ),
                &[],
            );
            let lost = leadership.lost();
            let worked = broker_until(&args, &metrics, lost.clone()).await;
            if let Err(e) = leadership.release().await {
                tracing::warn!(error = %e, "releasing the lease failed");
            }
            worked?;
            if stop.is_cancelled() {
                break;
            }
            tracing::warn!("leadership lost: the broker stopped and campaigns again");
        }
        Ok(())
    };
    tokio::pin!(work);
    let result = tokio::select! {
        r = shutdown => {
            stop.cancel();
            // Let the broker stop and a leader give its Lease up.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), &mut work).await;
            r
        }
        r = &mut work => r,
    };
    for e in endpoints {
        e.abort();
    }
    result
}

/// Runs the broker until `stop` is cancelled (or it fails).
async fn broker_until(
    args: &BrokerArgs,
    metrics: &controllers::runtime::Metrics,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut opts = options(args).await?;
    opts.metrics = metrics.clone();
    let broker = Broker::new(opts).map_err(anyhow::Error::msg)?;
    broker.run(stop).await.map_err(anyhow::Error::msg)
}

/// Runs this replica's share of the broker until `stop` is cancelled: its consumer clusters,
/// and the Migration controller while it holds the leader Lease.
async fn sharded_until(
    args: &BrokerArgs,
    metrics: &controllers::runtime::Metrics,
    leases: kube::Client,
    namespace: &str,
    identity: &str,
    elector: LeaderElector,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut opts = options(args).await?;
    opts.metrics = metrics.clone();
    opts.migrations_apart = true;
    let config = ShardingConfig {
        expected_peers: usize::from(args.shard_replicas),
        ..ShardingConfig::new(
            namespace,
            identity,
            &format!("{}-consumers", args.leader_election_id),
        )
    };
    opts.consumers = Arc::new(Sharded::new(opts.consumers, leases, config));
    let broker = Broker::new(opts).map_err(anyhow::Error::msg)?;
    let migrations = broker.migrations();
    // The leader's part stops with the broker's, also when the broker fails.
    let lead_stop = stop.child_token();
    let lead = async {
        let Some(migrations) = migrations else {
            return Ok(());
        };
        while let Some(leadership) = elector.acquire(&lead_stop).await {
            crate::logging::announce(
                "platform-mesh broker leads and runs the Migration controller",
                &[],
            );
            let worked = migrations.run(leadership.lost()).await;
            if let Err(e) = leadership.release().await {
                tracing::warn!(error = %e, "releasing the lease failed");
            }
            worked.map_err(anyhow::Error::msg)?;
            if lead_stop.is_cancelled() {
                break;
            }
            tracing::warn!("leadership lost: the Migration controller stopped; campaigning again");
        }
        Ok(())
    };
    let run = async {
        let ran = broker.run(stop.clone()).await;
        lead_stop.cancel();
        ran
    };
    let (brokered, led) = tokio::join!(run, lead);
    brokered.map_err(anyhow::Error::msg)?;
    led
}

/// The client and namespace of the leader-election Lease.
async fn lease_client(args: &BrokerArgs) -> anyhow::Result<(kube::Client, String)> {
    let path = match (&args.coordination_kubeconfig, &args.kcp_kubeconfig) {
        (Some(path), _) => path.clone(),
        (None, Some(path)) => path.clone(),
        (None, None) => bail!(
            "--leader-elect and --shard-replicas keep their Leases in the coordination cluster: give --coordination-kubeconfig (or --kcp-kubeconfig)"
        ),
    };
    let kc = Kubeconfig::read_from(&path).with_context(|| format!("reading kubeconfig {path}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {path}"))?;
    if args.coordination_kubeconfig.is_none() {
        // On kcp the Lease is the platform workspace's.
        let base = controllers::kcp::base_address(&config.cluster_url.to_string());
        config.cluster_url = format!("{base}/clusters/{}", args.platform_workspace)
            .parse()
            .context("the platform workspace's address")?;
    }
    let client = kube::Client::try_from(config).context("the Lease's cluster")?;
    Ok((client, args.leader_election_namespace.clone()))
}

/// `:8081` (every interface), `127.0.0.1:0` or `0` (none), as controller-runtime reads them.
fn bind_address(s: &str, flag: &str) -> anyhow::Result<Option<std::net::SocketAddr>> {
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse()
        .map(Some)
        .with_context(|| format!("{flag} {s:?}: give host:port, :port, or 0 for none"))
}

/// What a plain-HTTP endpoint of the broker serves.
#[derive(Clone)]
enum Endpoint {
    /// `/metrics`.
    Metrics(Arc<prometheus_client::registry::Registry>),
    /// `/healthz` and `/readyz`.
    Probes,
}

/// Serves `endpoint` over plain HTTP on `address`; says where on stderr.
async fn serve_plain(
    address: std::net::SocketAddr,
    what: &str,
    endpoint: Endpoint,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("listening for the {what} on {address}"))?;
    let bound = listener.local_addr().context("the bound address")?;
    crate::logging::announce(
        &format!("platform-mesh broker serves its {what} on http://{bound}"),
        &[],
    );
    Ok(tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let endpoint = endpoint.clone();
                    async move {
                        let (code, body) = match (&endpoint, req.uri().path()) {
                            (Endpoint::Probes, "/healthz" | "/readyz") => (200, "ok".to_string()),
                            (Endpoint::Metrics(registry), "/metrics") => {
                                let mut text = String::new();
                                match prometheus_client::encoding::text::encode(&mut text, registry)
                                {
                                    Ok(()) => (200, text),
                                    Err(e) => (500, e.to_string()),
                                }
                            }
                            _ => (404, "404 page not found\n".to_string()),
                        };
                        hyper::Response::builder()
                            .status(code)
                            .header("content-type", "text/plain; charset=utf-8")
                            .body(Full::new(Bytes::from(body)))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(32))
                    .serve_connection(io, service)
                    .await;
            });
        }
    }))
}
