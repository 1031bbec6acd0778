//! Runs the commands of every `examples/*/README.md` as written, against a fresh server, with
//! every kubectl version of the machine image, so the walkthroughs cannot drift from the code.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{kubectl_binary, Server};

/// One step of a walkthrough.
enum Step {
    /// A shell command that must succeed.
    Shell(String),
    /// `cargo run --release -- <args> &`: the binary started in the background with `args`,
    /// stopped when the walkthrough ends.
    Background(Vec<String>),
    /// `cargo run --release -- serve <flags>`: the flags the walkthrough's server runs with
    /// (the test starts it itself).
    Serve(Vec<String>),
}

/// The steps of a README's ```sh blocks; the server's start becomes its flags, and pointing
/// KUBECONFIG at it is left out (the test does both itself).
fn commands(readme: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(readme).expect("read README");
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_block = !in_block && t == "```sh";
            continue;
        }
        if in_block && !t.is_empty() && !t.starts_with('#') {
            if let Some(args) = t
                .strip_prefix("cargo run --release -- ")
                .and_then(|a| a.strip_suffix('&'))
            {
                out.push(Step::Background(
                    args.split_whitespace().map(str::to_string).collect(),
                ));
                continue;
            }
            if let Some(flags) = t.strip_prefix("cargo run --release -- serve") {
                out.push(Step::Serve(
                    flags.split_whitespace().map(str::to_string).collect(),
                ));
                continue;
            }
            if t.starts_with("export KUBECONFIG=") {
                continue;
            }
            if let Some(args) = t.strip_prefix("cargo run --release -- ") {
                // Another command of the binary, run in the foreground.
                out.push(Step::Shell(format!(
                    "{} {args}",
                    env!("CARGO_BIN_EXE_platform-mesh")
                )));
                continue;
            }
            out.push(Step::Shell(t.to_string()));
        }
    }
    out
}

fn run_walkthrough(example: &str, version: &str) {
    let Some(bin) = kubectl_binary(version) else {
        panic!("kubectl.{version} is not installed beside the machine's kubectl");
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = root.join("examples").join(example).join("README.md");
    let cmds = commands(&readme);
    assert!(!cmds.is_empty(), "{} has no commands", readme.display());
    let flags: Vec<&str> = cmds
        .iter()
        .filter_map(|s| match s {
            Step::Serve(flags) => Some(flags.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    let server = Server::start_with(&flags);
    let home = tempfile::tempdir().expect("home");
    let bin_dir = home.path().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin dir");
    std::os::unix::fs::symlink(&bin, bin_dir.join("kubectl")).expect("symlink kubectl");
    // The kubectl ws plugin of this repository.
    let plugin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-ws"))
        .parent()
        .expect("plugin directory")
        .to_path_buf();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        plugin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut background = Background(Vec::new());
    // The walkthroughs name files of the server's data directory as the quick start makes it.
    let data_dir = format!("{}/", server.data_dir.display());
    let in_data_dir = |s: &str| s.replace(".platform-mesh/", &data_dir);
    for step in cmds {
        let cmd = match step {
            Step::Shell(cmd) => in_data_dir(&cmd),
            Step::Serve(_) => continue,
            Step::Background(args) => {
                let args: Vec<String> = args.iter().map(|a| in_data_dir(a)).collect();
                let child = Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
                    .args(&args)
                    .current_dir(&root)
                    .env("HOME", home.path())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("start background command");
                background.0.push(child);
                continue;
            }
        };
        let out = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .current_dir(&root)
            .env("PATH", &path)
            .env("HOME", home.path())
            .env("KUBECONFIG", &server.kubeconfig)
            .env("PLATFORM_MESH_DATA_DIR", &server.data_dir)
            .output()
            .expect("run command");
        assert!(
            out.status.success(),
            "kubectl {version}: `{cmd}` failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Background processes of a walkthrough, killed when it ends (also when it fails).
struct Background(Vec<std::process::Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

macro_rules! walkthrough {
    ($($name:ident => $example:literal, $version:literal;)*) => {
        $(
            #[test]
            fn $name() {
                run_walkthrough($example, $version);
            }
        )*
    };
}

walkthrough! {
    accounts_kubectl_1_27 => "accounts", "1.27";
    workspace_authentication_kubectl_1_27 => "workspace-authentication", "1.27";
    workspace_authentication_kubectl_1_33 => "workspace-authentication", "1.33";
    broker_certs_kubectl_1_27 => "broker-certs", "1.27";
    broker_certs_kubectl_1_33 => "broker-certs", "1.33";
    accounts_kubectl_1_33 => "accounts", "1.33";
    providers_kubectl_1_27 => "providers", "1.27";
    managed_provider_kubectl_1_27 => "managed-provider", "1.27";
    managed_provider_kubectl_1_33 => "managed-provider", "1.33";
    providers_kubectl_1_33 => "providers", "1.33";
    quickstart_kubectl_1_27 => "quickstart", "1.27";
    quickstart_kubectl_1_30 => "quickstart", "1.30";
    quickstart_kubectl_1_33 => "quickstart", "1.33";
    platform_mesh_kubectl_1_27 => "platform-mesh", "1.27";
    platform_mesh_kubectl_1_33 => "platform-mesh", "1.33";
    workspaces_kubectl_1_27 => "workspaces", "1.27";
    workspaces_kubectl_1_33 => "workspaces", "1.33";
    service_accounts_kubectl_1_27 => "service-accounts", "1.27";
    service_accounts_kubectl_1_33 => "service-accounts", "1.33";
    marketplace_kubectl_1_27 => "marketplace", "1.27";
    marketplace_kubectl_1_33 => "marketplace", "1.33";
}

#[test]
fn every_example_has_a_walkthrough_test() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let this = include_str!("examples.rs");
    for entry in std::fs::read_dir(&root).expect("examples dir") {
        let entry = entry.expect("entry");
        if entry.path().is_dir() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                entry.path().join("README.md").exists(),
                "examples/{name} has no README.md"
            );
            assert!(
                this.contains(&format!("=> \"{name}\"")),
                "examples/{name} is not run by tests/examples.rs"
            );
        }
    }
}
