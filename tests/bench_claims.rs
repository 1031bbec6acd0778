//! The claims section of `platform-mesh bench` runs end to end on a small load, so it cannot rot;
//! the README keeps the figures of a full run. The section itself fails unless every object was
//! labelled and then half unlabelled, and unless the initializer finished every workspace.

mod common;

#[test]
fn the_claims_benchmark_relabels_and_initializes_everything_it_measures() {
    let stdout = common::bench(&[
        "--only",
        "claims",
        "--claim-objects",
        "200",
        "--claim-workspaces",
        "20",
    ]);
    for start in [
        "| write 200 ConfigMaps",
        "| accept a claim on them (`matchAll`): all 200 labelled",
        "| the binding's selector narrowed to `team=a`: 100 unlabelled",
        "| 20 workspaces created until Ready, no initializer",
        "| 20 workspaces created until Ready, one initializer",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(start)),
            "no row {start:?} in\n{stdout}"
        );
    }
}
