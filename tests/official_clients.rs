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
    let out = Command::new(interpreter)
        .arg(program)
        .current_dir(&dir)
        .env("KUBECONFIG", &server.kubeconfig)
        .output()
        .expect("the peer runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
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
