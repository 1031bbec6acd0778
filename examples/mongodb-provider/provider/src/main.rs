//! `mongodb-provider`: an example provider integration for Platform Mesh, written on this
//! project's Rust controller runtime.
//!
//! A provider publishes the MongoDB community operator's `MongoDBCommunity` kind as the kcp
//! APIExport `mongodb` (workspace `root:mongodb`); consumers bind it in their workspaces. Its
//! subcommands:
//!
//! - `provider`: the provider's controller. It engages every bound workspace through the
//!   export's virtual workspace (the `controllers` crate's manager and kcp APIExport provider),
//!   projects each consumer object into a downstream Kubernetes cluster, and brings its status
//!   and a connection Secret back.
//! - `operator`: a strict stand-in of the MongoDB community operator for that downstream
//!   cluster, which validates specs and reports phases as the real one does.
//! - `measure`: how long a consumer waits from creating an object until it is Running.
//!
//! The walkthrough is in `examples/mongodb-provider/README.md`; the behaviour shared with the Go
//! implementation is in `examples/mongodb-provider/CONTRACT.md`.

mod measure;
mod model;
mod operator;
mod provider;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// The command line.
#[derive(Parser)]
#[command(
    name = "mongodb-provider",
    version,
    about = "Example Platform Mesh provider: MongoDBCommunity through a kcp APIExport"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the provider controller: bound workspaces' MongoDBCommunity objects go downstream.
    Provider {
        /// A kubeconfig whose current context points at the provider workspace
        /// (`https://host:port/clusters/root:mongodb`).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The APIExport (and APIExportEndpointSlice) name.
        #[arg(long, default_value = "mongodb")]
        export: String,
        /// A kubeconfig of the downstream cluster, where the MongoDB operator runs.
        #[arg(long)]
        downstream_kubeconfig: PathBuf,
    },
    /// Run the MongoDB community operator stand-in against a downstream cluster.
    Operator {
        /// A kubeconfig of the downstream cluster.
        #[arg(long)]
        kubeconfig: PathBuf,
    },
    /// Measure how long a consumer waits: create `--count` objects at once in the workspace
    /// of the kubeconfig's current context, print the p50 and p99 from create to Running, and
    /// delete them again.
    Measure {
        /// A kubeconfig whose current context is a consumer workspace that binds the export.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// How many objects.
        #[arg(long, default_value_t = 100)]
        count: usize,
    },
}

/// Logs to stderr: `RUST_LOG` when set, else `info`; coloured only on a terminal.
fn init_logging() {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The client configuration of a kubeconfig file's current context.
async fn load_config(path: &Path) -> anyhow::Result<kube::Config> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("using kubeconfig {}", path.display()))
}

async fn load_client(path: &Path) -> anyhow::Result<kube::Client> {
    let config = load_config(path).await?;
    kube::Client::try_from(config)
        .with_context(|| format!("building a client for {}", path.display()))
}

/// Resolves on SIGINT or SIGTERM (or when listening for them fails, which stops the process
/// rather than leaving it unstoppable).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    info!("signal received; shutting down");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Provider {
            kubeconfig,
            export,
            downstream_kubeconfig,
        } => {
            let home = load_config(&kubeconfig).await?;
            let downstream = load_client(&downstream_kubeconfig).await?;
            provider::run(home, &export, downstream, shutdown_signal())
                .await
                .context("provider controller")?;
        }
        Command::Measure { kubeconfig, count } => {
            let client = load_client(&kubeconfig).await?;
            measure::run(client, count).await.context("measuring")?;
        }
        Command::Operator { kubeconfig } => {
            let client = load_client(&kubeconfig).await?;
            let stop = CancellationToken::new();
            let run = tokio::spawn(operator::run(client, stop.clone()));
            shutdown_signal().await;
            stop.cancel();
            run.await
                .context("operator stand-in task")?
                .context("operator stand-in")?;
        }
    }
    Ok(())
}
