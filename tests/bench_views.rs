//! The views section of `platform-mesh bench` runs end to end on a small load, so it cannot rot;
//! the README keeps the figures of a full run. What is checked here is that every measurement is
//! made on views holding exactly what they should.

mod common;

#[test]
fn the_views_benchmark_measures_views_of_the_right_size() {
    let stdout = common::bench(&[
        "--only",
        "views",
        "--view-providers",
        "20",
        "--view-bindings",
        "5",
    ]);
    let row = |start: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row {start:?} in\n{stdout}"))
            .to_string()
    };
    assert!(
        row("| marketplace LIST").contains("20 providers x 3 exports (60 entries)"),
        "{stdout}"
    );
    assert!(
        row("| contentconfigurations LIST").contains("5 bindings (5 items)"),
        "{stdout}"
    );
    assert!(
        row("| marketplace watch").contains("10 exports | median"),
        "{stdout}"
    );
}
