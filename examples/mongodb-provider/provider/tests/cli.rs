//! The binary's command line: a kubeconfig that cannot be read stops it at once with a message
//! naming the file, for both subcommands, instead of a controller that never connects. (The
//! walkthrough in `examples/mongodb-provider/README.md`, run by the root package's
//! `tests/examples.rs`, exercises the controller and the operator stand-in end to end.)

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mongodb-provider"))
        .args(args)
        .output()
        .expect("run mongodb-provider")
}

#[test]
fn a_missing_kubeconfig_is_named_in_the_error() {
    let missing = "/nonexistent/provider.kubeconfig";
    for args in [
        vec![
            "provider",
            "--kubeconfig",
            missing,
            "--downstream-kubeconfig",
            missing,
        ],
        vec!["operator", "--kubeconfig", missing],
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(missing), "{args:?}: {stderr}");
    }
}

#[test]
fn the_provider_needs_its_downstream_cluster() {
    let out = run(&["provider", "--kubeconfig", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--downstream-kubeconfig"), "{stderr}");
}
