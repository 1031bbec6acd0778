//! The controllers `serve` runs beside the API server: the PlatformMesh and ManagedProvider
//! controllers, reaching kcp, the infra cluster and the runtime cluster by kubeconfig, each
//! defaulting to this server; and
//! the workspace controllers (Account, AccountInfo, Provider), over every workspace of this server, or
//! over the workspaces bound to the `core.platform-mesh.io` export of a real kcp.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use controllers::platformmesh::controller::controller;
use controllers::platformmesh::deployment::Clusters;
use controllers::platformmesh::kcp::Kcp;
use controllers::platformmesh::manifests::IdpSettings;
use controllers::platformmesh::vars::{RemoteRuntime, Render};
use controllers::provider::managed;
use controllers::providers::fixed::FixedClusters;
use controllers::providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
use controllers::runtime::{Cluster, Manager, ManagerOptions};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Flags of the co-located controllers.
#[derive(clap::Args)]
pub struct ControllerArgs {
    /// Run the API server only, without the controllers.
    #[arg(long)]
    pub no_controllers: bool,
    /// Kubeconfig of the kcp that PlatformMeshes set up (default: this server's workspaces).
    #[arg(long)]
    pub kcp_kubeconfig: Option<PathBuf>,
    /// Address written into provider kubeconfigs, e.g. kcp's front proxy as clients reach it
    /// (default: the kcp kubeconfig's server).
    #[arg(long)]
    pub kcp_url: Option<String>,
    /// Namespace of the runtime cluster that receives provider kubeconfig Secrets naming none.
    #[arg(long, default_value = "platform-mesh-system")]
    pub kcp_namespace: String,
    /// Kubeconfig of the infra cluster, where Flux or Argo CD run (default: this server).
    #[arg(long)]
    pub infra_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the runtime cluster, where PlatformMeshes, profiles and OCM Resources live
    /// (default: this server).
    #[arg(long)]
    pub runtime_kubeconfig: Option<PathBuf>,
    /// Secret (in the infra cluster) with the runtime cluster's kubeconfig, for the deployers'
    /// `kubeConfig.secretRef` when runtime and infra differ.
    #[arg(long)]
    pub remote_runtime_infra_secret_name: Option<String>,
    /// Key of the kubeconfig in --remote-runtime-infra-secret-name.
    #[arg(long, default_value = "kubeconfig")]
    pub remote_runtime_infra_secret_key: String,
    /// Let users register themselves in the portal's identity provider.
    #[arg(long)]
    pub idp_registration_allowed: bool,
    /// Extra redirect URIs of the portal's sign-in client.
    #[arg(long, value_delimiter = ',')]
    pub idp_welcome_additional_redirect_uris: Vec<String>,
    /// Extra post-logout redirect URIs of the portal's sign-in client.
    #[arg(long, value_delimiter = ',')]
    pub idp_welcome_additional_post_logout_redirect_uris: Vec<String>,
}

async fn kcp_access(args: &ControllerArgs, own: &Path) -> anyhow::Result<Kcp> {
    let path = args
        .kcp_kubeconfig
        .clone()
        .unwrap_or_else(|| own.to_path_buf());
    Kcp::from_kubeconfig(read_kubeconfig(&path, "kcp")?, args.kcp_url.clone())
        .await
        .context("kcp access")
}

/// The workspace where a real kcp's Platform Mesh exports and their endpoint slices live.
const EXPORT_WORKSPACE: &str = "root:platform-mesh-system";

/// Starts the workspace controllers (Account, AccountInfo, Provider). On this server (`own`)
/// every workspace is engaged (the kinds are served natively everywhere); on a real kcp, the
/// workspaces bound to the `core.platform-mesh.io` export (Accounts) and to the
/// `providers.platform-mesh.io` export (Providers), as upstream's operators do.
async fn start_workspace_controllers(kcp: Arc<Kcp>, own: bool) -> anyhow::Result<()> {
    let home =
        kube::Config::from_custom_kubeconfig(kcp.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .context("the kcp kubeconfig")?;
    let base = home
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let mut groups: Vec<(ApiExportOptions, kube::Config, Manager)> = Vec::new();
    if own {
        let manager = Manager::new(ManagerOptions::default());
        controllers::tenants::add(&manager, kcp, WORKSPACE_WORKERS)
            .context("adding the workspace controllers")?;
        groups.push((ApiExportOptions::every_workspace(vec![base]), home, manager));
    } else {
        let mut at_exports = home.clone();
        at_exports.cluster_url = format!("{base}/clusters/{EXPORT_WORKSPACE}")
            .parse()
            .context("the kcp address")?;
        let accounts = Manager::new(ManagerOptions::default());
        controllers::tenants::add_accounts(&accounts, kcp.clone(), WORKSPACE_WORKERS)
            .context("adding the account controllers")?;
        groups.push((
            ApiExportOptions::for_slice("core.platform-mesh.io"),
            at_exports.clone(),
            accounts,
        ));
        let providers = Manager::new(ManagerOptions::default());
        controllers::tenants::add_providers(&providers, kcp, WORKSPACE_WORKERS)
            .context("adding the Provider controller")?;
        groups.push((
            ApiExportOptions::for_slice("providers.platform-mesh.io"),
            at_exports,
            providers,
        ));
    }
    for (options, home, manager) in groups {
        let provider = Arc::new(PathAware::new(ApiExportProvider::new(home, options)));
        tokio::spawn(async move {
            if let Err(e) = manager.run(provider, std::future::pending()).await {
                tracing::error!(error = %e, "the workspace controller manager stopped");
            }
        });
    }
    Ok(())
}

/// Concurrent reconciles of each workspace controller.
const WORKSPACE_WORKERS: usize = 16;

fn read_kubeconfig(path: &Path, what: &str) -> anyhow::Result<Kubeconfig> {
    Kubeconfig::read_from(path)
        .with_context(|| format!("reading the {what} kubeconfig {}", path.display()))
}

async fn client(kubeconfig: Kubeconfig, what: &str) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("the {what} kubeconfig"))?;
    kube::Client::try_from(config).with_context(|| format!("a client for the {what} cluster"))
}

/// Starts the PlatformMesh controller in the background; `own` is this server's admin
/// kubeconfig, used for every cluster no flag names.
pub async fn start(args: &ControllerArgs, own: &Path) -> anyhow::Result<()> {
    if args.no_controllers {
        return Ok(());
    }
    let pick = |p: &Option<PathBuf>| p.clone().unwrap_or_else(|| own.to_path_buf());
    let infra = client(
        read_kubeconfig(&pick(&args.infra_kubeconfig), "infra")?,
        "infra",
    )
    .await?;
    let runtime = client(
        read_kubeconfig(&pick(&args.runtime_kubeconfig), "runtime")?,
        "runtime",
    )
    .await?;
    let mut kcp = kcp_access(args, own).await?;
    let shared = Arc::new(kcp_access(args, own).await?);
    start_workspace_controllers(shared.clone(), args.kcp_kubeconfig.is_none()).await?;
    kcp.secret_namespace = args.kcp_namespace.clone();
    kcp.idp = IdpSettings {
        registration_allowed: args.idp_registration_allowed,
        redirect_uris: args.idp_welcome_additional_redirect_uris.clone(),
        post_logout_redirect_uris: args
            .idp_welcome_additional_post_logout_redirect_uris
            .clone(),
    };
    let remote = args
        .remote_runtime_infra_secret_name
        .clone()
        .map(|secret_name| RemoteRuntime {
            secret_name,
            secret_key: args.remote_runtime_infra_secret_key.clone(),
        });
    let clusters = Arc::new(Clusters {
        infra,
        runtime: runtime.clone(),
        remote,
        kcp: Some(kcp),
    });
    let engine: Arc<dyn Render + Send + Sync> = Arc::new(controllers::templates::Engine::default());
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(controller(engine, clusters))
        .context("adding the PlatformMesh controller")?;
    manager
        .add(managed::controller(shared, 4))
        .context("adding the ManagedProvider controller")?;
    let provider = Arc::new(FixedClusters::new([Cluster::new("runtime", runtime)]));
    tokio::spawn(async move {
        if let Err(e) = manager.run(provider, std::future::pending()).await {
            tracing::error!(error = %e, "the controller manager stopped");
        }
    });
    Ok(())
}
