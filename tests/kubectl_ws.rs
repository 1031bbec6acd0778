//! End to end: the `kubectl-ws` plugin, run by the real kubectl (found on PATH as a plugin),
//! against a freshly started `platform-mesh serve` that serves `tenancy.kcp.io` Workspaces
//! (root with orgs, providers and platform-mesh-system created on first start).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{kubectl_binary, Server};

/// Runs kubectl with the plugin's directory first on PATH, a private HOME and its own copy of
/// the admin kubeconfig. Plugins must come first on the command line (kubectl refuses flags
/// before a plugin name), so no global flags are added.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
    path: std::ffi::OsString,
}

impl Kubectl {
    fn new(bin: PathBuf, server: &Server) -> Kubectl {
        let home = tempfile::tempdir().expect("home");
        let kubeconfig = home.path().join("kubeconfig");
        std::fs::copy(&server.kubeconfig, &kubeconfig).expect("copy kubeconfig");
        let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-ws"))
            .parent()
            .expect("plugin directory")
            .to_path_buf();
        let mut dirs = vec![plugin_dir];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        Kubectl {
            bin,
            kubeconfig,
            home,
            path: std::env::join_paths(dirs).expect("PATH"),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .env("HOME", self.home.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", &self.path)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// Runs, asserts success, returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs, asserts exit code 1, returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "kubectl {} should fail with exit code 1:\nstdout: {}\nstderr: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// The server URL of the current context.
    fn server(&self) -> String {
        self.ok(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
    }
}

fn assert_contains(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
}

fn flow(version: &str) {
    let bin = kubectl_binary(version)
        .unwrap_or_else(|| panic!("kubectl.{version} is not installed beside kubectl"));
    let server = Server::start();
    let k = Kubectl::new(bin, &server);
    let base = server.url();

    // The admin kubeconfig may point at the bare server URL, which names no workspace.
    if !k.server().contains("/clusters/") {
        let err = k.fails(&["ws", "current"]);
        assert_contains(
            &err,
            "the current context's server URL has no /clusters/ path",
        );
    }

    // Into root, and the tree of the initial workspaces.
    assert_contains(
        &k.ok(&["ws", "use", "root"]),
        "Current workspace is \"root\"",
    );
    assert_eq!(k.server(), format!("{base}/clusters/root"));
    let tree = k.ok(&["ws", "tree"]);
    assert!(tree.starts_with(".\n└── root\n"), "tree:\n{tree}");
    for child in ["orgs", "providers", "platform-mesh-system"] {
        assert_contains(&tree, &format!("── {child}\n"));
    }

    // Create an organization and enter it.
    assert_contains(
        &k.ok(&["ws", "use", "root:orgs"]),
        "Current workspace is \"root:orgs\"",
    );
    let created = k.ok(&["ws", "create", "acme", "--type", "organization", "--enter"]);
    assert_contains(
        &created,
        "Workspace \"acme\" (type root:organization) created. Waiting for it to be ready...",
    );
    assert_contains(
        &created,
        "Workspace \"acme\" (type root:organization) is ready to use.",
    );
    assert_contains(&created, "Current workspace is \"root:orgs:acme\"");
    assert_eq!(
        k.ok(&["ws", "current"]),
        "Current workspace is \"root:orgs:acme\".\n"
    );
    assert_eq!(
        k.ok(&["ws", "."]),
        "Current workspace is \"root:orgs:acme\".\n"
    );
    assert_eq!(k.server(), format!("{base}/clusters/root:orgs:acme"));
    // kubectl itself now talks to the new workspace.
    k.ok(&["api-resources"]);

    // Up, list, and back with `-`.
    assert_contains(&k.ok(&["ws", ".."]), "Current workspace is \"root:orgs\"");
    let list = k.ok(&["get", "ws"]);
    assert_contains(&list, "acme");
    let phase = k.ok(&["get", "workspace", "acme", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Ready");
    assert_contains(
        &k.ok(&["ws", "-"]),
        "Current workspace is \"root:orgs:acme\"",
    );
    assert_contains(&k.ok(&["ws", "-"]), "Current workspace is \"root:orgs\"");
    assert_contains(
        &k.ok(&["ws", "acme"]),
        "Current workspace is \"root:orgs:acme\"",
    );

    // Errors.
    assert_contains(
        &k.fails(&["ws", "use", "nope"]),
        "workspace \"nope\" not found",
    );
    assert_contains(
        &k.fails(&["ws", "root:orgs:nope"]),
        "workspace \"nope\" not found",
    );
    assert_eq!(k.server(), format!("{base}/clusters/root:orgs:acme"));
    k.ok(&["ws", ".."]);
    k.fails(&["ws", "create", "acme", "--type", "organization"]);
    let again = k.ok(&[
        "ws",
        "create",
        "acme",
        "--type",
        "organization",
        "--ignore-existing",
    ]);
    assert_contains(&again, "is ready to use.");

    // From root the tree shows the new workspace; `~` goes to root.
    assert_contains(&k.ok(&["ws", "~"]), "Current workspace is \"root\"");
    let tree = k.ok(&["ws", "tree"]);
    assert_contains(&tree, "── orgs\n    │   └── acme\n");

    // --kubeconfig instead of KUBECONFIG.
    let other = k.home.path().join("other.kubeconfig");
    std::fs::copy(&k.kubeconfig, &other).expect("copy");
    let out = Command::new(&k.bin)
        .env("HOME", k.home.path())
        .env("KUBECONFIG", k.home.path().join("missing"))
        .env("PATH", &k.path)
        .args(["ws", "--kubeconfig"])
        .arg(&other)
        .arg("root:orgs:acme")
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_contains(
        &String::from_utf8_lossy(&out.stdout),
        "Current workspace is \"root:orgs:acme\"",
    );

    // A CRD created in one workspace is invisible in another.
    k.ok(&["ws", "use", "root:orgs:acme"]);
    k.ok(&[
        "create",
        "-f",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/workspaces/widget-crd.yaml"
        ),
    ]);
    k.ok(&[
        "wait",
        "crd/gadgets.example.com",
        "--for=condition=Established",
        "--timeout=30s",
    ]);
    assert_contains(
        &k.ok(&["api-resources", "--api-group=example.com"]),
        "gadgets",
    );
    k.ok(&["get", "gadgets"]);
    k.ok(&["ws", "use", "root:orgs"]);
    assert!(!k
        .ok(&["api-resources", "--api-group=example.com"])
        .contains("gadgets"));
    k.fails(&["get", "gadgets"]);
}

#[test]
fn kubectl_ws_1_33() {
    flow("1.33");
}

#[test]
fn kubectl_ws_1_27() {
    flow("1.27");
}
