//! The official client libraries against `platform-mesh serve`, as applications use them: what a
//! real client sends (which differs from what this project's own clients send) must work.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

/// Runs `program` of `tests/peers/<peer>` with `interpreter` (relative to that directory, or on
/// PATH) against a fresh server; returns its output. `installed` is what the peer's install puts
/// there (scripts/test installs it).
fn run_peer(peer: &str, interpreter: &str, installed: &str, program: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(peer);
    assert!(
        dir.join(installed).exists(),
        "the {peer} client is not installed in {} (scripts/test installs it)",
        dir.display()
    );
    let server = Server::start();
    let local = dir.join(interpreter);
    let interpreter = if local.exists() {
        local
    } else {
        PathBuf::from(interpreter)
    };
    common::stdout_of(
        Command::new(interpreter)
            .arg(program)
            .current_dir(&dir)
            .env("KUBECONFIG", &server.kubeconfig),
        program,
    )
}

#[test]
fn the_javascript_client_creates_reads_replaces_lists_watches_and_deletes() {
    let out = run_peer(
        "js",
        "node",
        "node_modules/@kubernetes/client-node",
        "configmaps.mjs",
    );
    let steps: Vec<&str> = out.lines().collect();
    assert_eq!(
        steps,
        [
            "ok create",
            "ok read-modify-replace",
            "ok list",
            "ok watch",
            "ok invalid",
            "ok delete"
        ],
        "{out}"
    );
}

#[test]
fn the_python_client_creates_reads_replaces_patches_lists_watches_and_deletes() {
    let out = run_peer(
        "python",
        ".venv/bin/python",
        ".venv/bin/python",
        "configmaps.py",
    );
    let steps: Vec<&str> = out.lines().collect();
    assert_eq!(
        steps,
        [
            "ok create",
            "ok read-modify-replace",
            "ok patch",
            "ok list",
            "ok watch",
            "ok invalid",
            "ok delete"
        ],
        "{out}"
    );
}

/// The checks `tests/peers/go/clients` makes, in order.
const GO_CHECKS: [&str; 11] = [
    "ok namespace",
    "ok typed-crud",
    "ok typed-conflict",
    "ok typed-patches",
    "ok typed-list-pages",
    "ok dynamic",
    "ok informer",
    "ok watch-resume",
    "ok apply",
    "ok controller-runtime",
    "ok errors",
];

/// Runs the client-go / controller-runtime program with `kubeconfig`; returns its output lines.
fn run_go_clients(kubeconfig: &std::path::Path) -> Vec<String> {
    common::stdout_of(
        Command::new(common::kube_apiserver::peer_binary("go-clients"))
            .arg("--kubeconfig")
            .arg(kubeconfig),
        "go-clients",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

#[test]
fn client_go_and_controller_runtime_work_against_serve() {
    let server = Server::start();
    assert_eq!(run_go_clients(&server.kubeconfig), GO_CHECKS);
}

/// The control: the same program passes against the real kube-apiserver, so what it expects of
/// `serve` is what Kubernetes does.
#[test]
fn client_go_and_controller_runtime_checks_hold_against_kube_apiserver() {
    let kube = common::kube_apiserver::KubeApiserver::start();
    assert_eq!(run_go_clients(&kube.admin_kubeconfig), GO_CHECKS);
}
