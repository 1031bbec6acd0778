//! `platform-mesh broker`: the resource broker as its own process, over clusters given by
//! kubeconfig files or over the workspaces of a kcp (such as `platform-mesh serve`).

use std::sync::Arc;

use anyhow::{bail, Context as _};
use controllers::broker::generic::Brokered;
use controllers::broker::parse_kind;
use controllers::broker::wiring::{kubeconfig_cluster, kubeconfig_clusters, Broker, BrokerOptions};
use controllers::providers::FixedClusters;
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
        consumers: Arc::new(FixedClusters::new(consumers)),
        providers: Arc::new(FixedClusters::new(providers)),
        accept_apis: None,
        staging: None,
        coordination,
        compute,
        kinds,
        workers: args.workers,
    })
}

/// Runs the broker until `shutdown` resolves.
pub async fn run(
    args: BrokerArgs,
    shutdown: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let broker = Broker::new(options(&args).await?).map_err(anyhow::Error::msg)?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(broker.run(stop.clone()));
    eprintln!(
        "platform-mesh broker is running for {}",
        args.watch_kinds.join(", ")
    );
    tokio::select! {
        r = shutdown => { stop.cancel(); r?; }
        r = running => { r.context("the broker task")?.map_err(anyhow::Error::msg)?; }
    }
    Ok(())
}
