//! `platform-mesh`: the Platform Mesh control plane in one binary. This file only wires the CLI.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use controllers::runtime::leader::LeaderStatus;
use logging::LogFormat;

mod bench;
mod broker;
mod delegation;
mod extension;
mod logging;
mod oidc_issuer;
mod operator;
mod peers;

/// mimalloc instead of glibc's malloc: the server allocates many small short-lived values per
/// request (JSON trees, headers, frames), where glibc spent a fifth of the create path's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "platform-mesh",
    version = VERSION,
    about = "The Platform Mesh control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: `text` (coloured only on a terminal) or `json` (one
    /// object per line, with the request span's fields).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Verbosity, counted as kube components count it: 0 info and warnings (each cause once an
    /// hour), 3 a line per request, 4 debug, 6 trace (see src/logging.rs). RUST_LOG, when set,
    /// decides instead (e.g. `RUST_LOG=info,apiserver=debug`).
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        default_value_t = 0,
        value_name = "LEVEL"
    )]
    verbosity: u8,
}

/// The version `--version` prints: the crate's version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PLATFORM_MESH_GIT_COMMIT"),
    ")"
);

/// `--request-timeout`: a positive Go duration, or whole seconds as this flag took before.
fn request_timeout(s: &str) -> Result<std::time::Duration, String> {
    s.parse::<u64>()
        .ok()
        .map(std::time::Duration::from_secs)
        .or_else(|| apiserver::request::query::parse_go_duration(s))
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} is not a positive duration (want e.g. 1m0s, 30s or 60)"))
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTPS Kubernetes-API server.
    Serve(Box<ServeArgs>),
    /// Print a completion script for a shell (e.g. `source <(platform-mesh completion bash)`).
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Serve only Platform Mesh's virtual workspaces (marketplace, contentconfigurations) in
    /// front of a kcp this process does not own: kcp's workspaces, tokens and permissions.
    VirtualWorkspaces(Box<VirtualWorkspacesArgs>),
    /// Run the resource broker: copy consumer objects to accepting providers and bring their
    /// status and related resources back.
    Broker(Box<broker::BrokerArgs>),
    /// Measure the server against a bare hyper+rustls server (prints a report).
    Bench(Box<bench::BenchOptions>),
    /// The benchmark's baseline server (a fixed 1 KiB JSON over hyper+rustls).
    #[command(hide = true)]
    BenchBareServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// A local OpenID issuer, for trying per-workspace authentication
    /// (WorkspaceAuthenticationConfigurations) without an identity provider.
    OidcIssuer {
        #[command(subcommand)]
        what: oidc_issuer::IssuerCommand,
    },
    /// Certificates of a data directory (created if missing).
    Certs {
        #[command(subcommand)]
        what: CertsCommand,
    },
    /// Print every object the PlatformMesh controller's Deployment step would apply, without a
    /// cluster: the gotemplates rendered with a PlatformMesh and its profile.
    Render {
        /// The PlatformMesh (YAML).
        #[arg(short = 'f', long = "filename")]
        platform_mesh: PathBuf,
        /// The profile: its ConfigMap, or the profile.yaml it holds.
        #[arg(long)]
        profile: PathBuf,
        /// Render for a remote runtime cluster whose kubeconfig is in this Secret (name).
        #[arg(long)]
        remote_runtime_secret: Option<String>,
        /// Key of the kubeconfig in --remote-runtime-secret.
        #[arg(long, default_value = "kubeconfig")]
        remote_runtime_secret_key: String,
        /// Resource objects (delivery.ocm.software) with their resolved status, as `kubectl get
        /// resources.delivery.ocm.software -A -o yaml` prints them; the output then also holds
        /// what the ResourceReconciler writes: the Flux sources, and the HelmReleases and
        /// Applications with their sources and image versions filled in.
        #[arg(long, value_name = "FILE")]
        resources: Option<PathBuf>,
    },
    /// Render one Go template with data, with the engine and functions the controller uses.
    Template {
        /// The template file.
        file: PathBuf,
        /// Data (YAML or JSON).
        #[arg(long)]
        values: PathBuf,
    },
    /// Write the CRDs of the Platform Mesh APIs to manifests/crds, and the kcp
    /// APIResourceSchemas of the exported kinds to manifests/kcp (or check both with --check).
    Crds {
        /// Directory to write to.
        #[arg(long, default_value = "manifests/crds")]
        dir: PathBuf,
        /// Directory of the generated APIResourceSchemas (and of the APIExports that list them).
        #[arg(long, default_value = api::schemas::SCHEMA_DIR)]
        schemas_dir: PathBuf,
        /// Only check that the files are up to date; exit 1 if not.
        #[arg(long)]
        check: bool,
    },
}

/// `platform-mesh virtual-workspaces`.
#[derive(clap::Args)]
struct VirtualWorkspacesArgs {
    #[command(flatten)]
    kcp: extension::KcpArgs,
    #[command(flatten)]
    views: ViewArgs,
    #[command(flatten)]
    request_header: RequestHeaderArgs,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443", env = "PLATFORM_MESH_LISTEN")]
    listen: SocketAddr,
    /// Directory for the store, the PKI and admin.kubeconfig.
    #[arg(long, default_value = ".platform-mesh", env = "PLATFORM_MESH_DATA_DIR")]
    data_dir: PathBuf,
    /// Serving certificate (PEM) instead of the generated one.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// CA bundle (PEM) that signs accepted client certificates, beside the generated CA (which
    /// signs only admin.kubeconfig and the co-located controllers).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Keep everything in memory (nothing survives a restart).
    #[arg(long, conflicts_with = "etcd_servers")]
    in_memory: bool,
    /// Store objects in etcd instead of <data-dir>/store.redb: comma-separated client URLs
    /// (needs a binary built with `--features etcd`). Replicas on the same etcd and prefix serve
    /// the same objects.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// Key prefix in etcd; servers with different prefixes share an etcd without seeing each other.
    #[arg(long, default_value = "/platform-mesh")]
    etcd_prefix: String,
    /// CA bundle (PEM) that signs etcd's serving certificate; needed for https:// etcd URLs.
    #[arg(long, requires = "etcd_servers")]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that verifies its clients (`--client-cert-auth`).
    #[arg(long, requires_all = ["etcd_keyfile", "etcd_cafile"])]
    etcd_certfile: Option<PathBuf>,
    /// Private key (PEM) of --etcd-certfile.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// Short (non-watch) requests served at once; beyond it clients get 429 and Retry-After.
    #[arg(long, default_value_t = apiserver::server::DEFAULT_MAX_REQUESTS_IN_FLIGHT)]
    max_requests_inflight: usize,
    /// How long a short request may take before it is answered 504: a duration as kube's flags
    /// take it (`1m0s`, `30s`, `1500ms`), or a number of seconds.
    #[arg(long, default_value = "1m0s", value_parser = request_timeout)]
    request_timeout: std::time::Duration,
    /// Objects one workspace may hold; creates beyond it get 403 (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_objects_per_workspace: usize,
    /// Open watches one user may have (429 beyond; system:masters exempt; 0: no limit).
    #[arg(long, default_value_t = apiserver::access::budget::DEFAULT_WATCHES_PER_USER)]
    max_watches_per_user: usize,
    /// Bytes of list answers one user may leave unread at once (429 beyond; 0: no limit).
    #[arg(long, default_value_t = apiserver::access::budget::DEFAULT_LIST_BYTES_PER_USER)]
    max_list_bytes_per_user: usize,
    /// Bytes of list answers all users together may leave unread at once (0: no limit).
    #[arg(long, default_value_t = apiserver::access::budget::DEFAULT_LIST_BYTES)]
    max_list_bytes: usize,
    /// Bytes of events the watch cache keeps for watches that start in the past, all resource
    /// types together.
    #[arg(long, default_value_t = apiserver::storage::cache::DEFAULT_WINDOW_BYTES)]
    watch_cache_window_bytes: usize,
    /// Bytes of events one watcher may fall behind before it is cut off (429 in the stream).
    #[arg(long, default_value_t = apiserver::storage::cache::DEFAULT_MAX_LAG_BYTES)]
    watch_buffer_bytes: usize,
    /// Bearer tokens: CSV lines `token,user,uid,"group1,group2"`.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// PKCS#8 PEM P-256 key that signs ServiceAccount tokens (created in <data-dir>/pki if not given).
    #[arg(long)]
    service_account_key_file: Option<PathBuf>,
    /// Issuer (`iss`) of ServiceAccount tokens.
    #[arg(long, default_value = apiserver::access::serviceaccounts::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// Audiences accepted in tokens (default: the issuer).
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// Kubeconfig of the kube-apiserver this server extends: its
    /// kube-system/extension-apiserver-authentication ConfigMap sets the request-header options
    /// no flag sets.
    #[arg(long, conflicts_with = "authentication_in_cluster")]
    authentication_kubeconfig: Option<PathBuf>,
    /// As --authentication-kubeconfig, with the pod's service account (deploy/aggregation).
    #[arg(long)]
    authentication_in_cluster: bool,
    #[command(flatten)]
    views: ViewArgs,
    #[command(flatten)]
    request_header: RequestHeaderArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    controllers: operator::ControllerArgs,
}

/// kube-apiserver's audit flags (log backend).
#[derive(clap::Args)]
struct AuditArgs {
    /// audit.k8s.io/v1 Policy (YAML or JSON) deciding what each request records; without it
    /// nothing is audited.
    #[arg(long)]
    audit_policy_file: Option<PathBuf>,
    /// File the audit events go to, one JSON object per line; `-` for standard output.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// Megabytes the audit log may grow to before it is rotated (0: 100, as kube-apiserver).
    #[arg(long, default_value_t = 0)]
    audit_log_maxsize: u64,
    /// Rotated audit logs to keep (0: all).
    #[arg(long, default_value_t = 0)]
    audit_log_maxbackup: usize,
    /// Days to keep rotated audit logs (0: no limit).
    #[arg(long, default_value_t = 0)]
    audit_log_maxage: u64,
}

impl AuditArgs {
    /// The policy and the log, when both are given (as kube-apiserver, a log needs a policy).
    fn audit(self) -> anyhow::Result<Option<Arc<apiserver::meta::audit::Audit>>> {
        let (policy, path) = match (self.audit_policy_file, self.audit_log_path) {
            (Some(policy), Some(path)) => (policy, path),
            (None, None) => return Ok(None),
            (Some(_), None) => anyhow::bail!(
                "--audit-policy-file needs --audit-log-path: where the events go (`-` for stdout)"
            ),
            (None, Some(_)) => anyhow::bail!(
                "--audit-log-path needs --audit-policy-file: which requests to record and how"
            ),
        };
        let bytes = std::fs::read(&policy)
            .with_context(|| format!("reading --audit-policy-file {}", policy.display()))?;
        let policy = apiserver::meta::audit::Policy::from_bytes(&bytes)
            .with_context(|| format!("--audit-policy-file {}", policy.display()))?;
        let mut config = apiserver::meta::audit::LogConfig::new(path);
        // lumberjack, which kube-apiserver's log backend writes with, rotates at 100 MB when
        // no size is given.
        config.max_size_mb = if self.audit_log_maxsize == 0 {
            100
        } else {
            self.audit_log_maxsize
        };
        config.max_backups = self.audit_log_maxbackup;
        config.max_age_days = self.audit_log_maxage;
        let writer = apiserver::meta::audit::LogWriter::open(config).context("--audit-log-path")?;
        Ok(Some(Arc::new(apiserver::meta::audit::Audit {
            policy,
            writer,
        })))
    }
}

impl ServeArgs {
    /// The server's options and the controllers' flags.
    fn into_options(
        self,
    ) -> anyhow::Result<(apiserver::server::ServeOptions, operator::ControllerArgs)> {
        let mut opts = apiserver::server::ServeOptions::new(self.listen, self.data_dir);
        opts.tls_cert_file = self.tls_cert_file;
        opts.tls_private_key_file = self.tls_private_key_file;
        opts.client_ca_file = self.client_ca_file;
        opts.max_requests_in_flight = self.max_requests_inflight;
        opts.request_timeout = self.request_timeout;
        opts.max_objects_per_workspace = self.max_objects_per_workspace;
        opts.views = self.views.into_options();
        opts.budgets = apiserver::access::budget::BudgetLimits {
            list_bytes_per_user: self.max_list_bytes_per_user,
            list_bytes: self.max_list_bytes,
            watches_per_user: self.max_watches_per_user,
        };
        if let Some(cache) = opts.watch_cache.as_mut() {
            cache.window_bytes = self.watch_cache_window_bytes;
            cache.max_lag_bytes = self.watch_buffer_bytes;
        }
        opts.token_auth_file = self.token_auth_file;
        opts.service_account_key_file = self.service_account_key_file;
        opts.service_account_issuer = self.service_account_issuer;
        opts.api_audiences = self.api_audiences;
        self.request_header.apply(&mut opts);
        opts.audit = self.audit.audit()?;
        if self.in_memory {
            opts.store = apiserver::server::StoreKind::Memory;
        }
        if !self.etcd_servers.is_empty() {
            let tls = EtcdTlsFiles {
                ca: self.etcd_cafile,
                cert: self.etcd_certfile,
                key: self.etcd_keyfile,
            };
            opts.store = etcd_store(self.etcd_servers, self.etcd_prefix, tls)?;
        }
        Ok((opts, self.controllers))
    }
}

/// Upstream's flags of Platform Mesh's virtual workspaces.
#[derive(clap::Args)]
struct ViewArgs {
    /// The label naming the entity type a ContentConfiguration is for (virtual workspaces).
    #[arg(long, default_value = "ui.platform-mesh.io/entity")]
    entity_label: String,
    /// The label naming the APIExport or ProviderMetadata content is for (virtual workspaces).
    #[arg(long, default_value = "ui.platform-mesh.io/content-for")]
    content_for_label: String,
    /// The entity type of a workspace right below `orgs` (virtual workspaces).
    #[arg(long, default_value = "main")]
    main_entity_name: String,
    /// The entity type of the workspaces below an organization (virtual workspaces).
    #[arg(long, default_value = "core_platform-mesh_io_account")]
    account_entity_name: String,
    /// The workspace of the core APIExport and of the platform's own content.
    #[arg(long, default_value = "root:platform-mesh-system")]
    resource_schema_workspace: String,
    /// The APIExport that serves ContentConfigurations and ProviderMetadata.
    #[arg(long, default_value = "core.platform-mesh.io")]
    resource_apiexport_endpointslice_name: String,
}

impl ViewArgs {
    fn into_options(self) -> apiserver::endpoints::views::ViewOptions {
        apiserver::endpoints::views::ViewOptions {
            entity_label: self.entity_label,
            content_for_label: self.content_for_label,
            main_entity: self.main_entity_name,
            account_entity: self.account_entity_name,
            provider_workspace: self.resource_schema_workspace,
            core_export: self.resource_apiexport_endpointslice_name,
        }
    }
}

/// Request-header authentication: whom to trust as an authenticating proxy (kube-apiserver's
/// aggregator, kcp's front proxy) and which headers it sets.
#[derive(clap::Args)]
struct RequestHeaderArgs {
    /// CA (PEM) of the authenticating proxy's client certificate (kube-apiserver's
    /// --proxy-client-cert-file); enables X-Remote-User style request-header authentication.
    #[arg(long)]
    requestheader_client_ca_file: Option<PathBuf>,
    /// Common names the proxy's client certificate may have (empty: any).
    #[arg(long, value_delimiter = ',')]
    requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name (default X-Remote-User).
    #[arg(long, value_delimiter = ',')]
    requestheader_username_headers: Vec<String>,
    /// Headers carrying the user's uid (default X-Remote-Uid).
    #[arg(long, value_delimiter = ',')]
    requestheader_uid_headers: Vec<String>,
    /// Headers carrying the groups (default X-Remote-Group).
    #[arg(long, value_delimiter = ',')]
    requestheader_group_headers: Vec<String>,
    /// Header prefixes carrying extra attributes (default X-Remote-Extra-).
    #[arg(long, value_delimiter = ',')]
    requestheader_extra_headers_prefix: Vec<String>,
}

impl RequestHeaderArgs {
    fn apply(self, opts: &mut apiserver::server::ServeOptions) {
        opts.requestheader_client_ca_file = self.requestheader_client_ca_file;
        opts.requestheader_allowed_names = self.requestheader_allowed_names;
        opts.requestheader_username_headers = self.requestheader_username_headers;
        opts.requestheader_uid_headers = self.requestheader_uid_headers;
        opts.requestheader_group_headers = self.requestheader_group_headers;
        opts.requestheader_extra_headers_prefix = self.requestheader_extra_headers_prefix;
    }
}

/// The `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile` paths.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
struct EtcdTlsFiles {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

#[cfg(feature = "etcd")]
fn etcd_store(
    endpoints: Vec<String>,
    prefix: String,
    files: EtcdTlsFiles,
) -> anyhow::Result<apiserver::server::StoreKind> {
    if let Some(bad) = endpoints
        .iter()
        .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
    {
        anyhow::bail!("--etcd-servers: {bad:?} is not a URL (want e.g. http://127.0.0.1:2379)");
    }
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).with_context(|| format!("{flag}: reading {}", path.display()))
    };
    let tls = match &files.ca {
        None => None,
        Some(ca) => Some(apiserver::storage::EtcdTls {
            ca_pem: read("--etcd-cafile", ca)?,
            client: match (&files.cert, &files.key) {
                (Some(cert), Some(key)) => {
                    Some((read("--etcd-certfile", cert)?, read("--etcd-keyfile", key)?))
                }
                _ => None,
            },
        }),
    };
    Ok(apiserver::server::StoreKind::Etcd(
        apiserver::storage::EtcdOptions {
            endpoints,
            prefix,
            tls,
            ..Default::default()
        },
    ))
}

#[cfg(not(feature = "etcd"))]
fn etcd_store(
    _: Vec<String>,
    _: String,
    _: EtcdTlsFiles,
) -> anyhow::Result<apiserver::server::StoreKind> {
    anyhow::bail!(
        "--etcd-servers: this binary was built without etcd support; build it with `cargo build --release --features etcd` (needs protoc: apt-get install protobuf-compiler libprotobuf-dev)"
    )
}

/// `certs kubeconfig`: a kubeconfig for `user` of the server whose data directory is `data_dir`.
/// The server URL of a data directory's `admin.kubeconfig`.
fn admin_server(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let admin = data_dir.join("admin.kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&admin)
        .with_context(|| format!("reading {} for the server's address", admin.display()))?;
    kc.clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .with_context(|| format!("{} names no server", admin.display()))
}

fn user_kubeconfig(
    data_dir: &std::path::Path,
    user: &str,
    groups: &[String],
    days: u32,
    workspace: Option<&str>,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    if user.trim().is_empty() {
        anyhow::bail!("--user: give the user's name");
    }
    if let Some(ws) = workspace {
        if ws
            .split(':')
            .any(|seg| !apiserver::meta::names::validate_dns1123_label(seg).is_empty())
        {
            anyhow::bail!(
                "--workspace {ws:?}: give a workspace path such as root or root:team-a (lowercase names joined by ':')"
            );
        }
    }
    let pki_dir = data_dir.join("pki");
    if !pki_dir.join(certs::CA_CERT_FILE).exists() {
        anyhow::bail!(
            "{} has no CA: start the server once (`platform-mesh serve --data-dir {}`) or point --data-dir at its data directory",
            data_dir.display(),
            data_dir.display()
        );
    }
    let mut server = admin_server(data_dir)?;
    if let Some(ws) = workspace {
        // The admin kubeconfig may itself point into a workspace; start from the base address.
        if let Some(i) = server.find("/clusters/") {
            server.truncate(i);
        }
        server = format!("{}/clusters/{ws}", server.trim_end_matches('/'));
    }
    let pki = certs::load_or_create(&pki_dir, &[])
        .with_context(|| format!("loading the certificates in {}", data_dir.display()))?;
    let (cert, key) = pki
        .issue_client_certificate(user, groups, days)
        .context("issuing the client certificate")?;
    let mut opts = pki.admin_kubeconfig_options(&server);
    opts.user_name = user.to_string();
    opts.client_cert_pem = Some(cert);
    opts.client_key_pem = Some(key);
    certs::write_kubeconfig(out, &opts)?;
    println!("wrote {} for user {user}", out.display());
    Ok(())
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Print the base64 CA bundle, for `caBundle` of webhook configurations and APIServices.
    CaBundle {
        #[arg(long, default_value = ".platform-mesh", env = "PLATFORM_MESH_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Write a kubeconfig for a user of the running server: a client certificate from the data
    /// directory's CA (CN = the user, one O per group) and the server address and CA of the
    /// data directory's admin.kubeconfig. The user has no rights until RBAC grants them.
    Kubeconfig {
        #[arg(long, default_value = ".platform-mesh", env = "PLATFORM_MESH_DATA_DIR")]
        data_dir: PathBuf,
        /// The user name (the certificate's common name).
        #[arg(long)]
        user: String,
        /// Groups of the user (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Point the kubeconfig at this workspace (e.g. `root:team-a`): its server is
        /// `<server>/clusters/<workspace>`, as kcp's kubeconfigs name a workspace.
        #[arg(long)]
        workspace: Option<String>,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a serving certificate from the data directory's CA (for running in a cluster:
    /// `--host platform-mesh.platform-mesh-system.svc`), written as tls.crt and tls.key.
    Serving {
        #[arg(long, default_value = ".platform-mesh", env = "PLATFORM_MESH_DATA_DIR")]
        data_dir: PathBuf,
        /// DNS names or IP addresses the certificate is valid for (repeatable).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Directory to write tls.crt and tls.key to.
        #[arg(long)]
        out_dir: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format, cli.verbosity);
    apiserver::endpoints::nonresource::set_build(apiserver::endpoints::nonresource::Build {
        commit: env!("PLATFORM_MESH_GIT_FULL_COMMIT"),
        tree_state: env!("PLATFORM_MESH_GIT_TREE_STATE"),
        date: env!("PLATFORM_MESH_BUILD_DATE"),
    });
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            logging::fail(&e);
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Completion { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "platform-mesh", &mut std::io::stdout());
            Ok(())
        }
        Command::Serve(args) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let host = args.authentication_kubeconfig.clone();
                let in_cluster = args.authentication_in_cluster;
                let (mut opts, controller_args) = args.into_options()?;
                if host.is_some() || in_cluster {
                    let config = delegation::host_config(host.as_deref()).await?;
                    delegation::apply(delegation::fetch(config).await?, &mut opts)?;
                }
                let shared_store = opts.store.is_shared();
                let leader_status = LeaderStatus::default();
                // The co-located controllers report beside the server: controller-runtime's
                // and the work queues' metrics and the leader election's status.
                opts.extra_metrics = Some(apiserver::meta::metrics::ExtraMetrics::new({
                    let status = leader_status.clone();
                    let metrics = controller_args.metrics.clone();
                    move |registry| {
                        status.register(registry);
                        metrics.register(registry);
                    }
                }));
                let server = apiserver::server::start(opts).await?;
                let restricted = match controller_args.forbid_tenant_admin {
                    true => Some(server.write_user_kubeconfig(
                        operator::WORKSPACE_CONTROLLERS_KUBECONFIG,
                        operator::WORKSPACE_CONTROLLERS_USER,
                        &[],
                    )?),
                    false => None,
                };
                let controllers = operator::start(
                    &controller_args,
                    &server.kubeconfig,
                    restricted.as_deref(),
                    shared_store,
                    leader_status,
                )
                .await?;
                logging::announce(
                    &format!(
                        "platform-mesh is serving on https://{}\n  kubectl --kubeconfig {} get namespaces",
                        server.address,
                        server.kubeconfig.display()
                    ),
                    &[
                        ("address", &server.address.to_string()),
                        ("kubeconfig", &server.kubeconfig.display().to_string()),
                    ],
                );
                tokio::select! {
                    r = shutdown_signal() => r?,
                    r = async { server.wait().await } => return Ok(r?),
                }
                controllers.shutdown().await;
                anyhow::Ok(())
            })
        }
        Command::VirtualWorkspaces(args) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let VirtualWorkspacesArgs {
                    kcp,
                    views,
                    request_header,
                } = *args;
                let upstream = Arc::new(
                    extension::KcpUpstream::connect(&kcp.kcp_kubeconfig, kcp.server_url.as_deref())
                        .await?,
                );
                let ext = apiserver::endpoints::views::Extension::new(upstream.clone());
                let mut opts = apiserver::server::ServeOptions::new(kcp.listen, kcp.data_dir);
                opts.store = apiserver::server::StoreKind::Memory;
                opts.tls_cert_file = kcp.tls_cert_file;
                opts.tls_private_key_file = kcp.tls_private_key_file;
                opts.client_ca_file = kcp.client_ca_file;
                opts.views = views.into_options();
                opts.extension = Some(ext.clone());
                request_header.apply(&mut opts);
                let view_options = opts.views.clone();
                let server = apiserver::server::start(opts).await?;
                let mirror =
                    extension::mirror(upstream, ext, server.state.store.clone(), view_options);
                logging::announce(
                    &format!(
                        "platform-mesh virtual workspaces are serving on https://{}/services/{{marketplace,contentconfigurations}}/clusters/<workspace>",
                        server.address
                    ),
                    &[("address", &server.address.to_string())],
                );
                let result = tokio::select! {
                    r = shutdown_signal() => r,
                    r = async { server.wait().await } => r.map_err(anyhow::Error::from),
                };
                mirror.abort();
                result
            })
        }
        Command::Bench(opts) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(bench::run(*opts))
        }
        Command::Broker(args) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(broker::run(*args, shutdown_signal()))
        }
        Command::BenchBareServer { listen, data_dir } => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(bench::bare_server(listen, &data_dir))
        }
        Command::OidcIssuer { what } => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(oidc_issuer::run(what))
        }
        Command::Certs {
            what: CertsCommand::CaBundle { data_dir },
        } => {
            let pki = certs::load_or_create(&data_dir.join("pki"), &[])
                .with_context(|| format!("loading the certificates in {}", data_dir.display()))?;
            println!("{}", pki.ca_bundle_base64());
            Ok(())
        }
        Command::Certs {
            what:
                CertsCommand::Kubeconfig {
                    data_dir,
                    user,
                    groups,
                    days,
                    workspace,
                    out,
                },
        } => user_kubeconfig(&data_dir, &user, &groups, days, workspace.as_deref(), &out),
        Command::Certs {
            what:
                CertsCommand::Serving {
                    data_dir,
                    hosts,
                    out_dir,
                },
        } => {
            let pki = certs::load_or_create(&data_dir.join("pki"), &[])
                .with_context(|| format!("loading the certificates in {}", data_dir.display()))?;
            let (cert, key) = pki
                .issue_serving_certificate(&hosts)
                .context("issuing the serving certificate")?;
            std::fs::create_dir_all(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            std::fs::write(out_dir.join("tls.crt"), cert)
                .with_context(|| format!("writing {}/tls.crt", out_dir.display()))?;
            certs::write_private(&out_dir.join("tls.key"), key.as_bytes())?;
            println!(
                "wrote {0}/tls.crt and {0}/tls.key for {1}",
                out_dir.display(),
                hosts.join(", ")
            );
            Ok(())
        }
        Command::Render {
            platform_mesh,
            profile,
            remote_runtime_secret,
            remote_runtime_secret_key,
            resources,
        } => {
            use controllers::platformmesh::render_cli::{
                render_resolved_yaml, render_yaml, ResolveError,
            };
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            };
            let remote = remote_runtime_secret.map(|secret_name| {
                controllers::platformmesh::vars::RemoteRuntime {
                    secret_name,
                    secret_key: remote_runtime_secret_key,
                }
            });
            let engine = gotemplate::Engine::default();
            let (platform_mesh, profile) = (read(&platform_mesh)?, read(&profile)?);
            let out = match &resources {
                None => render_yaml(&engine, &platform_mesh, &profile, remote.as_ref())
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
                Some(file) => render_resolved_yaml(
                    &engine,
                    &platform_mesh,
                    &profile,
                    remote.as_ref(),
                    &read(file)?,
                )
                .map_err(|e| match e {
                    ResolveError::Render(e) => anyhow::anyhow!("{e}"),
                    e => anyhow::anyhow!("--resources {}: {e}", file.display()),
                })?,
            };
            print!("{out}");
            Ok(())
        }
        Command::Template { file, values } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let data = std::fs::read_to_string(&values)
                .with_context(|| format!("reading {}", values.display()))?;
            let name = file.display().to_string();
            let out = controllers::platformmesh::render_cli::template(
                &gotemplate::Engine::default(),
                &name,
                &text,
                &data,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            print!("{out}");
            Ok(())
        }
        Command::Crds {
            dir,
            schemas_dir,
            check,
        } => {
            if check {
                api::check_crds(&dir).map_err(|e| {
                    anyhow::anyhow!("{e}\nrun `cargo run -- crds` and commit the result")
                })?;
                println!("CRDs in {} are up to date", dir.display());
                api::check_schemas(&schemas_dir).map_err(|e| {
                    anyhow::anyhow!("{e}\nrun `cargo run -- crds` and commit the result")
                })?;
                println!(
                    "APIResourceSchemas in {} are up to date",
                    schemas_dir.display()
                );
            } else {
                let written = api::write_crds(&dir)
                    .with_context(|| format!("writing CRDs to {}", dir.display()))?;
                for p in written {
                    println!("wrote {}", p.display());
                }
                let today = api::schemas::today_utc();
                for w in api::write_schemas(&schemas_dir, &today)? {
                    match w.replaced {
                        Some(old) => println!(
                            "wrote {} ({}, was {old}; renamed in {})",
                            w.path.display(),
                            w.name,
                            schemas_dir.display()
                        ),
                        None => println!("wrote {} ({})", w.path.display(), w.name),
                    }
                }
            }
            Ok(())
        }
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// clap's own checks of every subcommand's flags (unique names, groups, requirements).
    #[test]
    fn the_command_line_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
