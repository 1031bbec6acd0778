//! The attacks section of `platform-mesh bench` runs end to end on a small load, so it cannot
//! rot; the README keeps the figures of a full run. What is checked here is what the attacks
//! must meet whatever the machine: refusals happen and the server stays within its ceiling.

mod common;

#[test]
fn the_memory_attacks_are_refused_and_bounded() {
    let stdout = common::bench(&[
        "--only",
        "attacks",
        "--seconds",
        "2",
        "--attack-list-mib",
        "8",
        "--attack-roles",
        "200",
    ]);
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| attack:"))
        .collect();
    assert_eq!(rows.len(), 7, "{stdout}");
    for row in &rows {
        assert!(row.contains("(under the 1024 MiB ceiling)"), "{row}");
    }
    // At most 500 of the 1,500 watches open (the per-user limit); the rest get 429.
    assert!(
        rows[0].contains("500 watches open (1000 refused 429)"),
        "{}",
        rows[0]
    );
    // Every doubling patch is refused.
    let bombs = rows[3];
    assert!(bombs.contains("doubling copies"), "{bombs}");
    let figures = bombs.split(" | ").nth(1).unwrap_or_default();
    let counts: Vec<usize> = figures
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(bombs.contains("refused 422"), "{bombs}");
    assert!(
        counts.len() >= 3 && counts[0] > 0 && counts[0] == counts[2],
        "{bombs}"
    );
    // A tenant's hostile issuer: its garbage tokens are answered 401, bob is served.
    let jwks = rows
        .iter()
        .find(|r| r.contains("8192-bit keys"))
        .expect("the jwks row");
    assert!(jwks.contains("garbage tokens/s answered 401"), "{jwks}");
    assert!(jwks.contains(", 0 errors)"), "{jwks}");
    // The cubic CEL rule is refused over an unbounded list and admitted only bounded.
    let cel = rows
        .iter()
        .find(|r| r.contains("cubic-rule CRDs refused 422"))
        .expect("the cel row");
    assert!(!cel.contains("| 0 cubic-rule"), "{cel}");
}
