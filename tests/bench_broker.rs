//! The broker section of `platform-mesh bench` runs end to end on a small load (so the benchmark
//! cannot rot); its figures are not checked here, the README keeps those of a full run.

mod common;

#[test]
fn the_broker_benchmark_delivers_every_object() {
    let stdout = common::bench(&[
        "--only",
        "broker",
        "--broker-objects",
        "60",
        "--broker-consumers",
        "3",
        "--broker-rate",
        "100",
    ]);
    assert!(stdout.contains("(60 of 60;"), "{stdout}");
    assert!(stdout.contains("broker RSS after 60 objects"), "{stdout}");
}
