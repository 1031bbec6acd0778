//! `kubectl-ws`: a kubectl plugin (`kubectl ws ...`) to show, switch, create and list the
//! workspaces of a platform-mesh (kcp-style) server by editing the kubeconfig so that the
//! current context points at `<base>/clusters/<workspace path>`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod client;
mod commands;
mod kubeconfig;
mod paths;
mod tree;

#[derive(Parser)]
#[command(
    name = "kubectl ws",
    bin_name = "kubectl ws",
    about = "Show, switch, create and list workspaces",
    after_help = "\
Examples:
  kubectl ws current            # print the current workspace (also: kubectl ws .)
  kubectl ws root:orgs          # switch to an absolute path
  kubectl ws acme               # switch to a child of the current workspace
  kubectl ws ..                 # switch to the parent workspace
  kubectl ws -                  # switch back to the previous workspace
  kubectl ws ~                  # switch to the root workspace
  kubectl ws create acme --type organization --enter
  kubectl ws tree               # print the workspaces below the current one"
)]
struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the current workspace.
    Current,
    /// Switch to a workspace: an absolute path (root:orgs:acme), a child name, "..", "-", "~".
    Use {
        /// Where to go.
        #[arg(allow_hyphen_values = true)]
        path: String,
    },
    /// Create a workspace in the current workspace and wait until it is ready.
    Create {
        /// Name of the new workspace.
        name: String,
        /// Workspace type: a name such as "organization", or "path:name".
        #[arg(long = "type", value_name = "TYPE")]
        ty: Option<String>,
        /// Switch to the new workspace once it is ready.
        #[arg(long)]
        enter: bool,
        /// Do not fail if the workspace exists already (its type must match --type).
        #[arg(long)]
        ignore_existing: bool,
    },
    /// Print the tree of workspaces below the current workspace.
    Tree,
}

const SUBCOMMANDS: &[&str] = &["current", "use", "create", "tree", "help"];

/// Lets `kubectl ws PATH` mean `kubectl ws use PATH` and `kubectl ws .` mean `current`:
/// inserts `use` before the first positional argument unless it names a subcommand.
fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut iter = args.into_iter();
    out.extend(iter.next()); // program name
    let mut done = false;
    while let Some(arg) = iter.next() {
        if done {
            out.push(arg);
            continue;
        }
        let s = arg.to_string_lossy().into_owned();
        if s == "--kubeconfig" {
            out.push(arg);
            out.extend(iter.next());
            continue;
        }
        if s.starts_with('-') && s != "-" {
            out.push(arg);
            continue;
        }
        done = true;
        if s == "." {
            out.push("current".into());
        } else if SUBCOMMANDS.contains(&s.as_str()) {
            out.push(arg);
        } else {
            out.push("use".into());
            out.push(arg);
        }
    }
    out
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let flag = cli.kubeconfig.as_deref();
    match cli.command.unwrap_or(Command::Current) {
        Command::Current => commands::current(flag),
        Command::Use { path } => commands::use_workspace(flag, &path).await,
        Command::Create {
            name,
            ty,
            enter,
            ignore_existing,
        } => {
            let o = commands::CreateOptions {
                name,
                ty,
                enter,
                ignore_existing,
            };
            commands::create(flag, &o).await
        }
        Command::Tree => commands::tree(flag).await,
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(normalize_args(std::env::args_os().collect())) {
        Ok(cli) => cli,
        Err(e) => {
            // Help goes to stdout with success; usage errors exit with 1 like every other error.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(args: &[&str]) -> Vec<String> {
        let mut all = vec!["kubectl-ws"];
        all.extend_from_slice(args);
        normalize_args(all.iter().map(OsString::from).collect())
            .into_iter()
            .skip(1)
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn shorthand_arguments() {
        assert_eq!(norm(&["root:orgs"]), ["use", "root:orgs"]);
        assert_eq!(norm(&[".."]), ["use", ".."]);
        assert_eq!(norm(&["-"]), ["use", "-"]);
        assert_eq!(norm(&["~"]), ["use", "~"]);
        assert_eq!(norm(&["."]), ["current"]);
        assert_eq!(norm(&["use", "-"]), ["use", "-"]);
        assert_eq!(norm(&["tree"]), ["tree"]);
        assert_eq!(
            norm(&["--kubeconfig", "k", "acme"]),
            ["--kubeconfig", "k", "use", "acme"]
        );
        assert_eq!(
            norm(&["--kubeconfig=k", "acme"]),
            ["--kubeconfig=k", "use", "acme"]
        );
        assert_eq!(
            norm(&["create", "x", "--type", "organization"]),
            ["create", "x", "--type", "organization"]
        );
        assert_eq!(norm(&["--help"]), ["--help"]);
        assert!(norm(&[]).is_empty());
    }

    #[test]
    fn parses_commands() {
        let parse = |args: &[&str]| {
            let mut all = vec!["kubectl-ws"];
            all.extend_from_slice(args);
            Cli::try_parse_from(normalize_args(all.iter().map(OsString::from).collect()))
        };
        let cli = parse(&["-"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Use { path }) if path == "-"));
        let cli = parse(&["create", "acme", "--type", "organization", "--enter"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Create { name, ty: Some(t), enter: true, ignore_existing: false })
                if name == "acme" && t == "organization"
        ));
        let cli = parse(&["tree", "--kubeconfig", "/k"]).unwrap();
        assert_eq!(cli.kubeconfig, Some(PathBuf::from("/k")));
        assert!(cli.command.is_some());
        assert!(parse(&[]).unwrap().command.is_none());
        assert!(parse(&["create"]).is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
