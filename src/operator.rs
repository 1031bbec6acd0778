//! The controllers `serve` runs beside the API server: the PlatformMesh and ManagedProvider
//! controllers, reaching kcp, the infra cluster and the runtime cluster by kubeconfig, each
//! defaulting to this server; and
//! the workspace controllers (Account, AccountInfo, Provider), over every workspace of this server, or
//! over the workspaces bound to the `core.platform-mesh.io` export of a real kcp.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use controllers::cluster_providers::fixed::FixedClusters;
use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
use controllers::kcp::IdpSettings;
use controllers::kcp::Kcp;
use controllers::platformmesh::controller::controller;
use controllers::platformmesh::deployment::Clusters;
use controllers::platformmesh::vars::{RemoteRuntime, Render};
use controllers::provider::managed;
use controllers::runtime::leader::{LeaderElectionConfig, LeaderElector, LeaderStatus};
use controllers::runtime::sharding::{Sharded, ShardingConfig};
use controllers::runtime::{Cluster, Manager, ManagerOptions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Flags of the co-located controllers.
#[derive(clap::Args, Clone)]
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
    /// Namespace of the runtime cluster that receives provider kubeconfig Secrets naming none;
    /// also where kcp runs (its pods and kcp-operator's objects) in the cluster the releases
    /// install into.
    #[arg(long, default_value = "platform-mesh-system")]
    pub kcp_namespace: String,
    /// Kubeconfig of the infra cluster, where Flux or Argo CD run (default: this server).
    /// Upstream's name `--remote-infra-kubeconfig` is accepted too.
    #[arg(long, alias = "remote-infra-kubeconfig")]
    pub infra_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the runtime cluster, where PlatformMeshes, profiles and OCM Resources live
    /// (default: this server). Upstream's name `--remote-runtime-kubeconfig` is accepted too.
    #[arg(long, alias = "remote-runtime-kubeconfig")]
    pub runtime_kubeconfig: Option<PathBuf>,
    /// Secret (in the infra cluster) with the runtime cluster's kubeconfig, for the deployers'
    /// `kubeConfig.secretRef` when runtime and infra differ.
    #[arg(long)]
    pub remote_runtime_infra_secret_name: Option<String>,
    /// Key of the kubeconfig in --remote-runtime-infra-secret-name.
    #[arg(long, default_value = "kubeconfig")]
    pub remote_runtime_infra_secret_key: String,
    /// Secret (in the PlatformMesh's namespace) with the kubeconfig kcp calls the rebac-authz
    /// authorization webhook with; made when missing, and given the webhook's CA once
    /// cert-manager has issued its certificate.
    #[arg(long, default_value = "kcp-webhook-secret")]
    pub authorization_webhook_secret_name: String,
    /// Secret (in the PlatformMesh's namespace) cert-manager writes the webhook's certificate
    /// into; its `ca.crt` goes into the kubeconfig, and kcp's pods (label
    /// `app.kubernetes.io/name=kcp` in --kcp-namespace) are deleted to start with it.
    #[arg(long, default_value = "rebac-authz-webhook-cert")]
    pub authorization_webhook_secret_ca_name: String,
    /// Wait for the `istio-istiod` release and give this operator's pod (label
    /// `app=platform-mesh-operator` in platform-mesh-system) its istio sidecar by deleting it
    /// when it has none. Off by default here (upstream defaults it on): this binary usually runs
    /// outside a pod and a mesh.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_name = "BOOL")]
    pub subroutines_deployment_enable_istio: bool,
    /// The operator does not run in a pod: the istio gate does not look for its sidecar.
    #[arg(long)]
    pub is_local: bool,
    /// kcp-operator's RootShard (in --kcp-namespace of the cluster the releases install into)
    /// that must be Available before the Deployment, KcpSetup and ProviderSecret steps go on.
    /// Not checked unless given (upstream checks `root` always), since the kcp here is often
    /// this server or one kcp-operator does not run.
    #[arg(long)]
    pub kcp_root_shard_name: Option<String>,
    /// kcp-operator's FrontProxy that must be Available, as --kcp-root-shard-name (upstream's
    /// default name is `frontproxy`).
    #[arg(long)]
    pub kcp_front_proxy_name: Option<String>,
    /// Let users register themselves in the portal's identity provider.
    #[arg(long)]
    pub idp_registration_allowed: bool,
    /// Extra redirect URIs of the portal's sign-in client.
    #[arg(long, value_delimiter = ',')]
    pub idp_welcome_additional_redirect_uris: Vec<String>,
    /// Extra post-logout redirect URIs of the portal's sign-in client.
    #[arg(long, value_delimiter = ',')]
    pub idp_welcome_additional_post_logout_redirect_uris: Vec<String>,
    /// Run the Account, AccountInfo and Provider controllers and the security initializer
    /// under an identity of their own (user `system:platform-mesh:workspace-controllers`,
    /// kubeconfig `<data-dir>/workspace-controllers.kubeconfig`) instead of the server's admin:
    /// they reach organisations and accounts only through the `core.platform-mesh.io` export's
    /// virtual workspace and its permission claims, Providers only through the
    /// `providers.platform-mesh.io` export's (so only in workspaces bound to it), and new
    /// workspaces through the security type's initializing virtual workspace, as upstream's
    /// operators on a real kcp. Outside those, the identity holds only what it needs in root,
    /// root:orgs, root:providers and root:platform-mesh-system, and (as any creator of a
    /// workspace on kcp) owns the workspaces it creates. The export comes from a
    /// PlatformMesh's KcpSetup. Only for this server's own workspaces.
    #[arg(long, conflicts_with = "kcp_kubeconfig")]
    pub forbid_tenant_admin: bool,
    /// With --kcp-kubeconfig: the identity the Account, AccountInfo and Provider controllers
    /// and the security initializer use on that kcp instead of its kubeconfig. Give one that is
    /// not an administrator (they reach organisations, accounts and Providers through the
    /// `core.platform-mesh.io` and `providers.platform-mesh.io` exports' virtual workspaces and
    /// claims) and grant it what --forbid-tenant-admin grants its own identity here
    /// (`controllers::tenants::workspace_controller_rules`): in root:platform-mesh-system
    /// `apiexports/content` of both exports and `bind` of the core export; in root get,
    /// initialize and terminate of WorkspaceType `security` and use of `org`, `account`,
    /// `security` and `provider`; in root:orgs use of WorkspaceTypes, get of Accounts and writes
    /// of IdentityProviderConfigurations; in root:providers the Workspaces; and `access` to
    /// each of those workspaces.
    #[arg(long, requires = "kcp_kubeconfig")]
    pub workspace_controllers_kubeconfig: Option<PathBuf>,
    /// `host[:port]` of the organisations' identity provider: organisation `<org>`'s realm is
    /// `https://<it>/keycloak/realms/<org>`, the issuer the security initializer writes into
    /// its AccountInfo and its WorkspaceAuthenticationConfiguration.
    #[arg(long, default_value = "portal.dev.local:8443")]
    pub security_base_domain: String,
    /// PEM file of the CA of the identity provider's TLS, for the organisations'
    /// WorkspaceAuthenticationConfigurations (default: the system's roots).
    #[arg(long)]
    pub security_domain_ca_file: Option<PathBuf>,
    /// Audiences the organisations' configurations accept beside their clients' ids.
    #[arg(long, value_delimiter = ',')]
    pub security_additional_audiences: Vec<String>,
    /// Admit users whose email the identity provider has not verified.
    #[arg(long)]
    pub security_allow_unverified_emails: bool,
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
    #[command(flatten)]
    pub sharding: ShardingArgs,
    /// The controllers' metrics (`controller_runtime_*`, `workqueue_*`), which the caller
    /// registers with its `/metrics`.
    #[arg(skip)]
    pub metrics: controllers::runtime::Metrics,
}

impl ControllerArgs {
    /// The Deployment step's gates as the flags set them.
    fn gates(&self) -> controllers::platformmesh::gates::Gates {
        use controllers::platformmesh::gates::{Gates, Istio, KcpOperator, WebhookSecrets};
        let named = |n: &Option<String>| n.clone().filter(|n| !n.is_empty());
        let (root_shard, front_proxy) = (
            named(&self.kcp_root_shard_name),
            named(&self.kcp_front_proxy_name),
        );
        Gates {
            webhook: Some(WebhookSecrets {
                kubeconfig_secret: self.authorization_webhook_secret_name.clone(),
                ca_secret: self.authorization_webhook_secret_ca_name.clone(),
                kcp_namespace: self.kcp_namespace.clone(),
            }),
            istio: self.subroutines_deployment_enable_istio.then_some(Istio {
                is_local: self.is_local,
            }),
            kcp_operator: (root_shard.is_some() || front_proxy.is_some()).then(|| KcpOperator {
                namespace: self.kcp_namespace.clone(),
                root_shard,
                front_proxy,
            }),
        }
    }
}

/// The user the workspace controllers run as with `--forbid-tenant-admin`.
pub const WORKSPACE_CONTROLLERS_USER: &str = "system:platform-mesh:workspace-controllers";
/// The kubeconfig file (in the data directory) of [`WORKSPACE_CONTROLLERS_USER`].
pub const WORKSPACE_CONTROLLERS_KUBECONFIG: &str = "workspace-controllers.kubeconfig";

/// Leader election among replicas, with kube-controller-manager's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaderElectionArgs {
    /// Run each controller group only while this replica holds its Lease, so that of several
    /// replicas on one etcd one reconciles it at a time: the workspace controllers (Account,
    /// AccountInfo, Provider) on `<name>-workspaces`, the rest on `<name>` (default: true with
    /// --etcd-servers, else false).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub leader_elect: Option<bool>,
    /// How long the other replicas wait after the leader's last renewal before taking over.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader tries to renew before it stops its controllers.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Pause between attempts to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub leader_elect_retry_period: Duration,
    /// Namespace of the Lease, in the runtime cluster (created when missing).
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "platform-mesh-controllers")]
    pub leader_elect_resource_name: String,
}

/// Sharding of the workspace controllers over replicas.
#[derive(clap::Args, Clone, Debug)]
pub struct ShardingArgs {
    /// How many replicas the workspace controllers (Account, AccountInfo, Provider) are spread
    /// over. With more than 1, every replica runs them for its share of the workspaces, chosen
    /// by rendezvous hashing over the live replicas and fenced by a Lease per workspace (so two
    /// replicas never reconcile in one workspace at once), while the PlatformMesh and
    /// ManagedProvider controllers and the security initializer keep one leader. The Leases use
    /// the --leader-elect-* namespace and timings; needs a shared store (--etcd-servers) or
    /// --leader-elect.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub shard_replicas: u16,
    /// This replica's name among the shards (default: the host name and a random suffix, the
    /// leader election's identity).
    #[arg(long)]
    pub shard_identity: Option<String>,
}

impl ShardingArgs {
    /// The sharding of one group of workspace controllers (`group` names its Leases), or `None`
    /// when the controllers are not sharded.
    fn config(
        &self,
        election: Option<&LeaderElectionConfig>,
        group: &str,
    ) -> anyhow::Result<Option<ShardingConfig>> {
        if self.shard_replicas <= 1 {
            return Ok(None);
        }
        let Some(election) = election else {
            anyhow::bail!(
                "--shard-replicas {} needs Leases that every replica reads: run the replicas on one etcd (--etcd-servers) or give --leader-elect",
                self.shard_replicas
            );
        };
        let identity = self
            .shard_identity
            .clone()
            .unwrap_or_else(|| election.identity.clone());
        Ok(Some(ShardingConfig {
            lease_duration: election.lease_duration,
            renew_deadline: election.renew_deadline,
            probe_period: election.retry_period,
            expected_peers: usize::from(self.shard_replicas),
            ..ShardingConfig::new(
                &election.namespace,
                &identity,
                &format!("{}-{group}", election.name),
            )
        }))
    }
}

fn go_duration(s: &str) -> Result<Duration, String> {
    apiserver::request::query::parse_go_duration(s)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} is not a positive duration (want e.g. 15s, 500ms or 1m)"))
}

impl LeaderElectionArgs {
    /// The election's settings, or `None` when the controllers run without one. `shared_store`:
    /// other replicas may serve the same objects (etcd).
    pub fn config(&self, shared_store: bool) -> anyhow::Result<Option<LeaderElectionConfig>> {
        if !self.leader_elect.unwrap_or(shared_store) {
            return Ok(None);
        }
        let (lease, renew, retry) = (
            self.leader_elect_lease_duration,
            self.leader_elect_renew_deadline,
            self.leader_elect_retry_period,
        );
        // client-go's rules: a leader must give up before others may take over, and must be
        // able to retry within its deadline.
        if lease <= renew {
            anyhow::bail!(
                "--leader-elect-lease-duration ({lease:?}) must be longer than --leader-elect-renew-deadline ({renew:?})"
            );
        }
        if renew <= retry.mul_f64(1.2) {
            anyhow::bail!(
                "--leader-elect-renew-deadline ({renew:?}) must be longer than 1.2 × --leader-elect-retry-period ({retry:?})"
            );
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "platform-mesh".into());
        Ok(Some(LeaderElectionConfig {
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            ..LeaderElectionConfig::new(
                &self.leader_elect_resource_namespace,
                &self.leader_elect_resource_name,
                &format!("{host}_{}", uuid::Uuid::new_v4()),
            )
        }))
    }
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

/// How the workspace controllers reach workspaces.
enum WorkspaceAccess {
    /// Every workspace of this server, with its admin credentials (the kinds are served
    /// natively everywhere).
    Native,
    /// Through the exports' virtual workspaces of a real kcp, with the kcp credentials.
    Exports,
    /// The workspace controllers under their own identity (`--forbid-tenant-admin` on this
    /// server, `--workspace-controllers-kubeconfig` on a kcp): the Account controllers through
    /// the `core.platform-mesh.io` export, the Provider controller through the
    /// `providers.platform-mesh.io` export, the security initializer through the initializing
    /// virtual workspace; the provider workspaces as their creator.
    Restricted {
        /// The identity's access.
        identity: Arc<Kcp>,
    },
}

/// A client configuration of `kcp`'s kubeconfig, and its base address.
async fn home_of(kcp: &Kcp) -> anyhow::Result<(kube::Config, String)> {
    let home =
        kube::Config::from_custom_kubeconfig(kcp.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .context("the kcp kubeconfig")?;
    let base = home
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    Ok((home, base))
}

/// `home` pointed at the workspace of the Platform Mesh exports.
fn at_exports(home: &kube::Config, base: &str) -> anyhow::Result<kube::Config> {
    let mut at = home.clone();
    at.cluster_url = format!("{base}/clusters/{EXPORT_WORKSPACE}")
        .parse()
        .context("the kcp address")?;
    Ok(at)
}

/// Starts the workspace controllers (Account, AccountInfo, Provider) and the security
/// initializer. On this server every workspace is engaged (the kinds are served natively
/// everywhere) unless `--forbid-tenant-admin`; on a real kcp, the workspaces bound to the
/// `core.platform-mesh.io` export (Accounts) and to the `providers.platform-mesh.io` export
/// (Providers), as upstream's operators do. Of these, `part` picks: the initializer unless
/// [`Part::Workspaces`], the managers unless [`Part::Singletons`], sharded by `sharding` for
/// [`Part::Workspaces`].
async fn start_workspace_controllers(
    metrics: &controllers::runtime::Metrics,
    kcp: Arc<Kcp>,
    access: WorkspaceAccess,
    security: controllers::security::SecurityOptions,
    part: Part<'_>,
    sharding: &ShardingArgs,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let (home, base) = home_of(&kcp).await?;
    let mut groups: Vec<(&str, ApiExportOptions, kube::Config, Manager)> = Vec::new();
    let mut initializer_kcp = kcp.clone();
    match access {
        WorkspaceAccess::Native => {
            let manager = Manager::with_metrics(ManagerOptions::default(), metrics.sharing());
            controllers::tenants::add(&manager, kcp.clone(), WORKSPACE_WORKERS)
                .context("adding the workspace controllers")?;
            groups.push((
                "workspaces",
                ApiExportOptions::every_workspace(vec![base]),
                home,
                manager,
            ));
        }
        WorkspaceAccess::Exports => {
            let at_exports = at_exports(&home, &base)?;
            let accounts = Manager::with_metrics(ManagerOptions::default(), metrics.sharing());
            controllers::tenants::add_accounts(&accounts, kcp.clone(), WORKSPACE_WORKERS)
                .context("adding the account controllers")?;
            groups.push((
                "accounts",
                ApiExportOptions::for_slice("core.platform-mesh.io"),
                at_exports.clone(),
                accounts,
            ));
            let providers = Manager::with_metrics(ManagerOptions::default(), metrics.sharing());
            controllers::tenants::add_providers(&providers, kcp.clone(), WORKSPACE_WORKERS)
                .context("adding the Provider controller")?;
            groups.push((
                "providers",
                ApiExportOptions::for_slice("providers.platform-mesh.io"),
                at_exports,
                providers,
            ));
        }
        WorkspaceAccess::Restricted {
            identity: restricted,
        } => {
            let (own_home, own_base) = home_of(&restricted).await?;
            let accounts = Manager::with_metrics(ManagerOptions::default(), metrics.sharing());
            controllers::tenants::add_accounts(&accounts, restricted.clone(), WORKSPACE_WORKERS)
                .context("adding the account controllers")?;
            groups.push((
                "accounts",
                ApiExportOptions::for_slice("core.platform-mesh.io"),
                at_exports(&own_home, &own_base)?,
                accounts,
            ));
            let providers = Manager::with_metrics(ManagerOptions::default(), metrics.sharing());
            controllers::tenants::add_providers(&providers, restricted.clone(), WORKSPACE_WORKERS)
                .context("adding the Provider controller")?;
            groups.push((
                "providers",
                ApiExportOptions::for_slice(controllers::provider::EXPORT),
                at_exports(&own_home, &own_base)?,
                providers,
            ));
            initializer_kcp = restricted;
        }
    }
    let mut running = Vec::new();
    if !matches!(part, Part::Workspaces { .. }) {
        // The security type's initializer finishes new organisation and account workspaces
        // through kcp's initializing virtual workspace (this server's or a real kcp's).
        let initializer = controllers::security::SecurityInitializer::new(
            initializer_kcp,
            Arc::new(controllers::security::NoStore),
            security,
        );
        running.push(tokio::spawn(initializer.run(stop.clone())));
    }
    if matches!(part, Part::Singletons) {
        return Ok(running);
    }
    for (group, options, home, manager) in groups {
        let provider = PathAware::new(ApiExportProvider::new(home, options));
        let stop = stop.clone();
        let sharded = match part {
            Part::Workspaces { election, leases } => sharding
                .config(Some(election), group)?
                .map(|config| (config, leases.clone())),
            _ => None,
        };
        running.push(tokio::spawn(async move {
            let stopped = match sharded {
                Some((config, leases)) => {
                    let sharded = Sharded::new(provider, leases, config);
                    manager.run(Arc::new(sharded), stop.cancelled_owned()).await
                }
                None => {
                    manager
                        .run(Arc::new(provider), stop.cancelled_owned())
                        .await
                }
            };
            if let Err(e) = stopped {
                tracing::error!(error = %e, "the workspace controller manager stopped");
            }
        }));
    }
    Ok(running)
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

/// The controllers running in the background.
pub struct Controllers {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Controllers {
    /// Stops the controllers and, when leading, gives the Lease up so that another replica
    /// takes over at once.
    pub async fn shutdown(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

/// Starts the controllers in the background; `own` is this server's admin kubeconfig, used for
/// every cluster no flag names. With leader election (see [`LeaderElectionArgs`]) they run only
/// while this replica leads; `status` then reports `leader_election_master_status`.
/// `restricted`: the kubeconfig of [`WORKSPACE_CONTROLLERS_USER`] with `--forbid-tenant-admin`.
pub async fn start(
    args: &ControllerArgs,
    own: &Path,
    restricted: Option<&Path>,
    shared_store: bool,
    status: LeaderStatus,
) -> anyhow::Result<Controllers> {
    let restricted = restricted.map(Path::to_path_buf);
    let stop = CancellationToken::new();
    if args.no_controllers {
        return Ok(Controllers { stop, task: None });
    }
    let election = args.leader_election.config(shared_store)?;
    // Refuse sharding that cannot work before anything starts.
    args.sharding.config(election.as_ref(), "check")?;
    let task = match election {
        None => {
            let running = run(args, own, restricted.as_deref(), Part::All, &stop).await?;
            tokio::spawn(async move {
                futures::future::join_all(running).await;
            })
        }
        Some(config) => {
            let runtime = client(
                read_kubeconfig(&pick(&args.runtime_kubeconfig, own), "runtime")?,
                "runtime",
            )
            .await?;
            // The workspace controllers (upstream's account-operator) and the rest (upstream's
            // platform-mesh-operator) are led apart, as upstream's two operators each have
            // their Lease. Sharded, every replica runs the workspace controllers for its
            // share, outside any election; otherwise the holder of `<lease>-workspaces` runs
            // them, so two replicas can each lead one half. The leader of `<lease>` runs the
            // rest.
            let sharded = args.sharding.shard_replicas > 1;
            let mut shares = Vec::new();
            if sharded {
                ensure_namespace(&runtime, &config.namespace, &stop).await;
                let part = Part::Workspaces {
                    election: &config,
                    leases: &runtime,
                };
                shares = run(args, own, restricted.as_deref(), part, &stop).await?;
            } else {
                let workspaces = LeaderElectionConfig {
                    name: format!("{}-workspaces", config.name),
                    ..config.clone()
                };
                let elector = LeaderElector::new(runtime.clone(), workspaces.clone());
                let (args, own, stop) = (args.clone(), own.to_path_buf(), stop.clone());
                let (runtime, restricted) = (runtime.clone(), restricted.clone());
                shares.push(tokio::spawn(async move {
                    let part = Part::Workspaces {
                        election: &workspaces,
                        leases: &runtime,
                    };
                    lead(
                        elector,
                        runtime.clone(),
                        &workspaces,
                        (&args, &own, restricted.as_deref(), part),
                        &stop,
                    )
                    .await;
                }));
            }
            let elector = LeaderElector::new(runtime.clone(), config.clone()).with_status(status);
            let (args, own, stop) = (args.clone(), own.to_path_buf(), stop.clone());
            tokio::spawn(async move {
                lead(
                    elector,
                    runtime,
                    &config,
                    (&args, &own, restricted.as_deref(), Part::Singletons),
                    &stop,
                )
                .await;
                futures::future::join_all(shares).await;
            })
        }
    };
    Ok(Controllers {
        stop,
        task: Some(task),
    })
}

/// Campaigns for the Lease; runs the controllers while leading and stops them when leadership
/// is lost (then campaigns again) or `stop` is cancelled (then releases the Lease).
async fn lead(
    elector: LeaderElector,
    runtime: kube::Client,
    config: &LeaderElectionConfig,
    (args, own, restricted, part): (&ControllerArgs, &Path, Option<&Path>, Part<'_>),
    stop: &CancellationToken,
) {
    ensure_namespace(&runtime, &config.namespace, stop).await;
    while let Some(leadership) = elector.acquire(stop).await {
        let lost = leadership.lost();
        let running = match run(args, own, restricted, part, &lost).await {
            Ok(running) => running,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "starting the controllers failed; giving leadership up");
                Vec::new()
            }
        };
        if !running.is_empty() {
            tokio::select! {
                _ = lost.cancelled() => {
                    tracing::warn!(lease = %config.name, "leadership lost: stopping the controllers");
                }
                _ = stop.cancelled() => {}
            }
        }
        if let Err(e) = leadership.release().await {
            tracing::warn!(lease = %config.name, error = %e, "releasing the lease failed");
        }
        futures::future::join_all(running).await;
        if stop.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.retry_period) => {}
        }
    }
}

/// Creates the Lease's namespace when missing (a fresh server has only `default`); retries
/// until the cluster answers, and leaves a refusal (403) to show in the election's errors.
pub(crate) async fn ensure_namespace(client: &kube::Client, name: &str, stop: &CancellationToken) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    loop {
        match api.create(&Default::default(), &namespace).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 403 => return,
            Err(e) => {
                tracing::warn!(namespace = %name, error = %e, "creating the lease namespace failed; retrying")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn pick(flag: &Option<PathBuf>, own: &Path) -> PathBuf {
    flag.clone().unwrap_or_else(|| own.to_path_buf())
}

/// Which controllers one call of [`run`] starts.
#[derive(Clone, Copy)]
enum Part<'a> {
    /// Every controller, unsharded.
    All,
    /// The PlatformMesh, ResourceReconciler and ManagedProvider controllers and the security
    /// initializer: what only the leader runs when the workspace controllers are sharded.
    Singletons,
    /// The workspace controllers for this replica's share of the workspaces, fenced by Leases
    /// in `leases` with the namespace and timings of `election`.
    Workspaces {
        election: &'a LeaderElectionConfig,
        leases: &'a kube::Client,
    },
}

/// Starts the controllers of `part`, each manager stopping when `stop` is cancelled.
async fn run(
    args: &ControllerArgs,
    own: &Path,
    restricted: Option<&Path>,
    part: Part<'_>,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let infra = client(
        read_kubeconfig(&pick(&args.infra_kubeconfig, own), "infra")?,
        "infra",
    )
    .await?;
    let runtime = client(
        read_kubeconfig(&pick(&args.runtime_kubeconfig, own), "runtime")?,
        "runtime",
    )
    .await?;
    let mut kcp = kcp_access(args, own).await?;
    let shared = Arc::new(kcp_access(args, own).await?);
    let restricted = match (restricted, &args.workspace_controllers_kubeconfig) {
        (Some(path), _) => {
            controllers::tenants::grant(&shared, WORKSPACE_CONTROLLERS_USER).await?;
            Some(path)
        }
        (None, Some(path)) => Some(path.as_path()),
        (None, None) => None,
    };
    let access = match (restricted, &args.kcp_kubeconfig) {
        (Some(path), _) => WorkspaceAccess::Restricted {
            // The address provider kubeconfigs name is --kcp-url's, as for the admin access.
            identity: Arc::new(
                Kcp::from_kubeconfig(
                    read_kubeconfig(path, "workspace controllers")?,
                    args.kcp_url.clone(),
                )
                .await
                .context("the workspace controllers' kubeconfig")?,
            ),
        },
        (None, None) => WorkspaceAccess::Native,
        (None, Some(_)) => WorkspaceAccess::Exports,
    };
    let security = controllers::security::SecurityOptions {
        base_domain: args.security_base_domain.clone(),
        domain_ca: match &args.security_domain_ca_file {
            Some(f) => std::fs::read_to_string(f)
                .with_context(|| format!("reading --security-domain-ca-file {}", f.display()))?,
            None => String::new(),
        },
        additional_audiences: args.security_additional_audiences.clone(),
        allow_unverified_emails: args.security_allow_unverified_emails,
        ..Default::default()
    };
    let mut running = start_workspace_controllers(
        &args.metrics,
        shared.clone(),
        access,
        security,
        part,
        &args.sharding,
        stop,
    )
    .await?;
    if matches!(part, Part::Workspaces { .. }) {
        return Ok(running);
    }
    kcp.secret_namespace = args.kcp_namespace.clone();
    kcp.idp = IdpSettings {
        registration_allowed: args.idp_registration_allowed,
        redirect_uris: args.idp_welcome_additional_redirect_uris.clone(),
        post_logout_redirect_uris: args
            .idp_welcome_additional_post_logout_redirect_uris
            .clone(),
        welcome_audiences: Vec::new(),
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
        images: Default::default(),
        gates: args.gates(),
    });
    let engine: Arc<dyn Render + Send + Sync> = Arc::new(gotemplate::Engine::default());
    let manager = Manager::with_metrics(ManagerOptions::default(), args.metrics.clone());
    manager
        .add(controller(engine, clusters.clone()))
        .context("adding the PlatformMesh controller")?;
    manager
        .add(controllers::platformmesh::ocm_resources::controller(
            clusters,
        ))
        .context("adding the ResourceReconciler")?;
    manager
        .add(managed::controller(shared, 4))
        .context("adding the ManagedProvider controller")?;
    let provider = Arc::new(FixedClusters::new([Cluster::new("runtime", runtime)]));
    let stop = stop.clone();
    running.push(tokio::spawn(async move {
        if let Err(e) = manager.run(provider, stop.cancelled_owned()).await {
            tracing::error!(error = %e, "the controller manager stopped");
        }
    }));
    Ok(running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        election: LeaderElectionArgs,
    }

    fn config(args: &[&str], shared: bool) -> anyhow::Result<Option<LeaderElectionConfig>> {
        let flags = Flags::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))?;
        flags.election.config(shared)
    }

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        controllers: ControllerArgs,
    }

    #[test]
    fn the_controllers_identity_flags_refuse_what_cannot_work() {
        let parse = |args: &[&str]| {
            Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
                .map(|s| s.controllers)
        };
        let e = parse(&[
            "--forbid-tenant-admin",
            "--kcp-kubeconfig",
            "kcp.kubeconfig",
        ])
        .err()
        .expect("a kcp's identities are its installer's");
        assert!(e.to_string().contains("--kcp-kubeconfig"), "{e}");
        let e = parse(&["--workspace-controllers-kubeconfig", "user.kubeconfig"])
            .err()
            .expect("only with a kcp");
        assert!(e.to_string().contains("--kcp-kubeconfig"), "{e}");
        let ok = parse(&[
            "--kcp-kubeconfig",
            "kcp.kubeconfig",
            "--workspace-controllers-kubeconfig",
            "user.kubeconfig",
        ])
        .expect("both");
        assert!(!ok.forbid_tenant_admin);
        assert!(
            parse(&["--forbid-tenant-admin"])
                .expect("alone")
                .forbid_tenant_admin
        );
    }

    #[test]
    fn elects_by_default_only_on_a_shared_store() {
        assert!(config(&[], false).unwrap().is_none());
        let on = config(&[], true).unwrap().expect("elects on etcd");
        assert_eq!(
            (on.namespace.as_str(), on.name.as_str()),
            ("kube-system", "platform-mesh-controllers")
        );
        assert_eq!(on.lease_duration, Duration::from_secs(15));
        assert!(config(&["--leader-elect"], false).unwrap().is_some());
        assert!(config(&["--leader-elect=false"], true).unwrap().is_none());
        let a = config(&[], true).unwrap().expect("a").identity;
        let b = config(&[], true).unwrap().expect("b").identity;
        assert_ne!(a, b, "every process campaigns under its own identity");
    }

    #[test]
    fn timings_that_cannot_work_are_refused_with_the_flags_to_fix() {
        let e = config(&["--leader-elect-lease-duration=5s"], true).unwrap_err();
        assert!(
            e.to_string().contains("--leader-elect-lease-duration"),
            "{e}"
        );
        let e = config(&["--leader-elect-renew-deadline=2s"], true).unwrap_err();
        assert!(e.to_string().contains("--leader-elect-retry-period"), "{e}");
        let e = config(&["--leader-elect-retry-period=soon"], true).unwrap_err();
        assert!(e.to_string().contains("not a positive duration"), "{e}");
    }

    fn parse(args: &[&str]) -> Result<ControllerArgs, clap::Error> {
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map(|s| s.controllers)
    }

    #[test]
    fn sharding_takes_the_elections_namespace_and_timings_and_its_own_identity() {
        let args = parse(&[
            "--shard-replicas",
            "3",
            "--shard-identity",
            "replica-a",
            "--leader-elect-lease-duration",
            "6s",
            "--leader-elect-renew-deadline",
            "4s",
            "--leader-elect-retry-period",
            "1s",
        ])
        .unwrap();
        let election = args.leader_election.config(true).unwrap().unwrap();
        let config = args
            .sharding
            .config(Some(&election), "workspaces")
            .unwrap()
            .unwrap();
        assert_eq!(config.identity, "replica-a");
        assert_eq!(config.namespace, "kube-system");
        assert_eq!(config.lease_prefix, "platform-mesh-controllers-workspaces");
        assert_eq!(config.expected_peers, 3);
        assert_eq!(
            (
                config.lease_duration,
                config.renew_deadline,
                config.probe_period
            ),
            (
                Duration::from_secs(6),
                Duration::from_secs(4),
                Duration::from_secs(1)
            )
        );
    }

    #[test]
    fn sharding_without_shared_leases_or_with_no_replica_is_refused() {
        let args = parse(&["--shard-replicas", "2"]).unwrap();
        let e = args.sharding.config(None, "workspaces").unwrap_err();
        assert!(e.to_string().contains("--etcd-servers"), "{e}");
        assert!(parse(&["--shard-replicas", "0"]).is_err());
        let one = parse(&[]).unwrap();
        assert!(one.sharding.config(None, "workspaces").unwrap().is_none());
    }
}
