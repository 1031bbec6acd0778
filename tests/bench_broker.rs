//! The broker section of `platform-mesh bench` runs end to end on a small load (so the benchmark
//! cannot rot); its figures are not checked here, the README keeps those of a full run.

use std::process::Command;

#[test]
fn the_broker_benchmark_delivers_every_object() {
    let out = Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
        .args([
            "bench",
            "--only",
            "broker",
            "--broker-objects",
            "60",
            "--broker-consumers",
            "3",
            "--broker-rate",
            "100",
        ])
        .env("RUST_LOG", "error")
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(60 of 60;"), "{stdout}");
    assert!(stdout.contains("broker RSS after 60 objects"), "{stdout}");
}
