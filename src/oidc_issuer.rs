//! `platform-mesh oidc-issuer`: a local OpenID issuer for trying per-workspace authentication
//! without an identity provider ([`apiserver::access::workspace_authn::issuer`]). `serve` publishes the
//! discovery document and key set; `config` prints a WorkspaceAuthenticationConfiguration that
//! trusts it; `token` signs a token and can wrap it in a kubeconfig of a workspace.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use apiserver::access::workspace_authn::issuer::{DevIssuer, Signer};
use serde_json::{json, Value};

/// What the issuer remembers in its directory for `config` and `token`.
const STATE_FILE: &str = "issuer.json";

/// The subcommands.
#[derive(clap::Subcommand)]
pub enum IssuerCommand {
    /// Serve the issuer's discovery document and keys over HTTPS until interrupted.
    Serve {
        /// Directory for its certificates and address (made if missing).
        #[arg(long)]
        dir: PathBuf,
        /// PKCS#8 RSA private key (`openssl genpkey -algorithm RSA -out key.pem`).
        #[arg(long)]
        key: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8555")]
        listen: SocketAddr,
        /// Path of the issuer below the address (e.g. `/realms/acme`).
        #[arg(long, default_value = "")]
        path: String,
    },
    /// Print a WorkspaceAuthenticationConfiguration (JSON) that trusts the running issuer.
    Config {
        /// The issuer's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The configuration's name.
        #[arg(long)]
        name: String,
        /// Accepted audiences (repeatable).
        #[arg(long = "audience", required = true)]
        audiences: Vec<String>,
        /// The claim naming the user.
        #[arg(long, default_value = "email")]
        username_claim: String,
        /// Prefix of user names.
        #[arg(long, default_value = "")]
        username_prefix: String,
        /// The claim listing the user's groups.
        #[arg(long, default_value = "groups")]
        groups_claim: String,
        /// Prefix of group names.
        #[arg(long, default_value = "")]
        groups_prefix: String,
    },
    /// Sign a token with the issuer's key.
    Token {
        /// The issuer's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The issuer's key.
        #[arg(long)]
        key: PathBuf,
        /// The claims, as a JSON object (`iss`, `iat` and `exp` are added unless given).
        #[arg(long)]
        claims: String,
        /// Write a kubeconfig with the token instead of printing it: the server's address and
        /// CA come from the server's data directory, the URL is the workspace's.
        #[arg(long, requires = "workspace")]
        kubeconfig: Option<PathBuf>,
        /// The workspace the kubeconfig points at.
        #[arg(long)]
        workspace: Option<String>,
        /// The server's data directory.
        #[arg(long, default_value = ".platform-mesh", env = "PLATFORM_MESH_DATA_DIR")]
        data_dir: PathBuf,
    },
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn state(dir: &Path) -> anyhow::Result<Value> {
    let path = dir.join(STATE_FILE);
    let text = read(&path).with_context(|| {
        format!(
            "no issuer has run with --dir {}: start `platform-mesh oidc-issuer serve --dir {}` first",
            dir.display(),
            dir.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is not the issuer's", path.display()))
}

/// Runs one subcommand.
pub async fn run(command: IssuerCommand) -> anyhow::Result<()> {
    match command {
        IssuerCommand::Serve {
            dir,
            key,
            listen,
            path,
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // What a previous run left names another address: gone until this one listens.
            let _ = std::fs::remove_file(dir.join(STATE_FILE));
            let issuer = DevIssuer::start(&dir.join("pki"), listen, &path, &read(&key)?)
                .await
                .context("starting the issuer")?;
            // Written aside and renamed: whoever waits for the file reads it whole.
            let file = dir.join(STATE_FILE);
            let partial = dir.join(format!("{STATE_FILE}.partial"));
            std::fs::write(
                &partial,
                serde_json::to_string_pretty(&json!({"url": issuer.url(), "ca": issuer.ca_pem}))?,
            )
            .with_context(|| format!("writing {}", partial.display()))?;
            std::fs::rename(&partial, &file)
                .with_context(|| format!("writing {}", file.display()))?;
            crate::logging::announce(&format!("issuer {} is serving", issuer.url()), &[]);
            crate::shutdown_signal().await?;
            drop(issuer);
            Ok(())
        }
        IssuerCommand::Config {
            dir,
            name,
            audiences,
            username_claim,
            username_prefix,
            groups_claim,
            groups_prefix,
        } => {
            let s = state(&dir)?;
            let config = json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1",
                "kind": "WorkspaceAuthenticationConfiguration",
                "metadata": {"name": name},
                "spec": {"jwt": [{
                    "issuer": {"url": s["url"], "certificateAuthority": s["ca"],
                               "audiences": audiences, "audienceMatchPolicy": "MatchAny"},
                    "claimMappings": {
                        "username": {"claim": username_claim, "prefix": username_prefix},
                        "groups": {"claim": groups_claim, "prefix": groups_prefix}},
                }]},
            });
            println!("{}", serde_json::to_string_pretty(&config)?);
            Ok(())
        }
        IssuerCommand::Token {
            dir,
            key,
            claims,
            kubeconfig,
            workspace,
            data_dir,
        } => {
            let s = state(&dir)?;
            let url = s["url"].as_str().unwrap_or_default();
            let claims: Value = serde_json::from_str(&claims)
                .context("--claims: give the claims as one JSON object")?;
            if !claims.is_object() {
                anyhow::bail!(
                    "--claims: give the claims as one JSON object, e.g. '{{\"aud\": \"portal\"}}'"
                );
            }
            let token = Signer::new(url, &read(&key)?)?.token(&claims)?;
            let (Some(out), Some(workspace)) = (kubeconfig, workspace) else {
                println!("{token}");
                return Ok(());
            };
            let server = crate::admin_server(&data_dir)?;
            let base = match server.find("/clusters/") {
                Some(i) => server[..i].to_string(),
                None => server.trim_end_matches('/').to_string(),
            };
            let pki = certs::load_or_create(&data_dir.join("pki"), &[])
                .with_context(|| format!("loading the certificates in {}", data_dir.display()))?;
            let mut opts = pki.admin_kubeconfig_options(&format!("{base}/clusters/{workspace}"));
            opts.user_name = "oidc".into();
            opts.client_cert_pem = None;
            opts.client_key_pem = None;
            opts.token = Some(token);
            certs::write_kubeconfig(&out, &opts)?;
            println!("wrote {} for workspace {workspace}", out.display());
            Ok(())
        }
    }
}
