//! The etcd section of `platform-mesh bench` runs end to end on a small load (so the benchmark
//! cannot rot); its figures are not checked here, the README keeps those of a full run.

#![cfg(feature = "etcd")]

mod common;

#[test]
fn the_etcd_benchmark_delivers_every_event() {
    let stdout = common::bench(&[
        "--only",
        "etcd",
        "--seconds",
        "1",
        "--connections",
        "4",
        "--watchers",
        "40",
        "--watch-workspaces",
        "4",
        "--watch-rate",
        "40",
    ]);
    assert!(stdout.contains("% of raw puts"), "{stdout}");
    // 40 writes/s for 10 s, each reaching 10 watchers.
    assert!(stdout.contains("delivered 4000 of 4000 events"), "{stdout}");
    assert!(stdout.contains("0 watches failed"), "{stdout}");
}
