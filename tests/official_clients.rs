//! The official client libraries against `platform-mesh serve`, as applications use them: what a
//! real client sends (which differs from what this project's own clients send) must work.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

/// Runs `tests/peers/js/<program>` with Node.js against a fresh server; returns its output.
fn node(program: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/js");
    assert!(
        dir.join("node_modules/@kubernetes/client-node").exists(),
        "the JavaScript client is not installed: run `npm ci` in {} (scripts/test does)",
        dir.display()
    );
    let server = Server::start();
    let out = Command::new("node")
        .arg(program)
        .current_dir(&dir)
        .env("KUBECONFIG", &server.kubeconfig)
        .output()
        .expect("node runs");
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
    let out = node("configmaps.mjs");
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
