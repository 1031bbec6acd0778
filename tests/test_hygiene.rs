//! The patterns that let a test pass when the product is wrong, refused in the test code of
//! the whole tree (tests/, every crate's tests/, `*_tests.rs` files and the `#[cfg(test)]`
//! part of source files):
//!
//! - a timed assertion: `elapsed() <` inside an assertion (timing is for benchmarks, which print
//!   figures; a test waits with a deadline and fails saying what it waited for);
//! - an error read as absence: `.ok()` right after a Kubernetes call (`get_opt`, `get`, `list`,
//!   `create`, `patch`, `delete`), so that a 403 or a 500 counts as "gone" or "not placed";
//! - a negative check after a fixed sleep: `sleep(...)` followed within a few lines by an
//!   assertion of absence (`assert!(!`, `is_none()`, `is_empty()`, `assert_ne!`), outside a
//!   polling loop. Wait for a positive signal first (an object written later being handled, a
//!   renewal observed), then assert the absence.
//!
//! The test names each place; there is no list of exceptions.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first line of a file that is test code: 0 for test files, the `#[cfg(test)]` line of
/// a source file, `None` for a source file without tests.
fn test_start(path: &Path, lines: &[&str]) -> Option<usize> {
    let s = path.to_string_lossy();
    if s.starts_with("tests/")
        || s.contains("/tests/")
        || s.ends_with("_tests.rs")
        || s.contains("/tests_")
    {
        return Some(0);
    }
    lines.iter().position(|l| l.trim() == "#[cfg(test)]")
}

fn indent(l: &str) -> usize {
    l.len() - l.trim_start().len()
}

/// Whether the line at `i` sits in a loop that starts at most 15 lines above it.
fn in_loop(lines: &[&str], i: usize) -> bool {
    let own = indent(lines[i]);
    lines[i.saturating_sub(15)..i].iter().any(|l| {
        let t = l.trim_start();
        indent(l) < own
            && (t.starts_with("for ")
                || t.starts_with("while ")
                || t.starts_with("loop ")
                || t.contains("= loop {"))
    })
}

fn problems(path: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = test_start(path, &lines) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let at = |i: usize, what: &str| format!("{}:{}: {what}", path.display(), i + 1);
    for i in start..lines.len() {
        let l = lines[i];
        let around = lines[i.saturating_sub(3)..=i].join("\n");
        if (l.contains("elapsed() <") || l.contains("elapsed() <=")) && around.contains("assert") {
            out.push(at(i, "timed assertion"));
        }
        if l.trim_start().starts_with(".ok()") || l.contains(".await.ok()") {
            let call = lines[i.saturating_sub(3)..=i].join("\n");
            if [
                ".get_opt(",
                ".get(",
                ".list(",
                ".create(",
                ".patch(",
                ".delete(",
            ]
            .iter()
            .any(|c| call.contains(c))
                && call.contains(".await")
            {
                out.push(at(
                    i,
                    "an error of a Kubernetes call read as absence (`.ok()`)",
                ));
            }
        }
        if l.contains("sleep(") && !in_loop(&lines, i) {
            let next = lines[i + 1..lines.len().min(i + 6)].join("\n");
            if ["assert!(!", "is_none()", "is_empty()", "assert_ne!"]
                .iter()
                .any(|p| next.contains(p))
            {
                out.push(at(i, "a negative check after a fixed sleep"));
            }
        }
    }
    out
}

#[test]
fn tests_cannot_pass_by_ignoring_errors_sleeping_or_timing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "tests",
        "src",
        "api",
        "apiserver",
        "certs",
        "controllers",
        "gotemplate",
        "https-client",
        "mc-runtime",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files.retain(|f| !f.ends_with("tests/test_hygiene.rs"));
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        found.extend(problems(f.strip_prefix(root).unwrap_or(f), &text));
    }
    assert!(
        found.is_empty(),
        "test code that passes when the product is wrong (see tests/test_hygiene.rs):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_patterns_are_recognised() {
    let p = Path::new("tests/x.rs");
    let code = "fn t() {\n    let started = now();\n    assert!(started.elapsed() < D);\n    let x = api.get_opt(n)\n        .await\n        .ok()\n        .flatten();\n    sleep(D).await;\n    assert!(x.is_none());\n    for _ in 0..3 {\n        sleep(D).await;\n        assert!(y.is_none());\n    }\n}\n";
    let found = problems(p, code);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].ends_with("timed assertion"));
    assert!(found[1].contains("read as absence"));
    assert!(found[2].contains("fixed sleep"));
    // Source files are looked at from their tests on.
    assert!(problems(
        Path::new("src/a.rs"),
        "fn a() { x.elapsed() < y; assert!(1) }"
    )
    .is_empty());
}
