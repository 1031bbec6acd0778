//! Go's own output for every case of `../shared/reference/gotemplate-conformance`: in Go mode the
//! engine matches each case (the same output, or an error where Go errs); in the project's mode
//! the cases listed in [`PROJECT_DIFFERS`] differ, each for a reason given there, and all the
//! others still match.

use serde_json::Value;

use gotemplate::{render, Error, MissingKey, Options};

fn corpus() -> (Vec<Value>, Vec<Value>) {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/gotemplate-conformance"
    );
    let read = |f: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(format!("{dir}/{f}"))
            .unwrap_or_else(|e| panic!("{dir}/{f}: {e}"));
        serde_json::from_str(&text).expect("json")
    };
    (read("cases.json"), read("golden.json"))
}

/// Cases whose result in the project's mode deliberately differs from Go's, and why.
const PROJECT_DIFFERS: &[(&str, &str)] = &[
    (
        "field-bigint",
        "integers stay integers: 123456789, not 1.23456789e+08",
    ),
    ("field-null", "printing null is an error, not <no value>"),
    (
        "field-missing",
        "printing a missing key is an error, not <no value>",
    ),
    (
        "field-missing-chain",
        "printing a missing key is an error, not <no value>",
    ),
    (
        "index-missing-key",
        "printing a missing key is an error, not <no value>",
    ),
    (
        "missingkey-zero-option",
        "printing a missing key is an error, not <no value>",
    ),
    (
        "range-break-continue",
        "integers stay integers, so eq . 1 compares instead of failing",
    ),
    (
        "printf-float-as-d",
        "integers stay integers, so %d formats 8443",
    ),
];

fn go_options(case: &Value) -> Options {
    let mut o = Options::go();
    match case["option"].as_str() {
        Some("missingkey=error") => o.missing_key = MissingKey::Error,
        Some("missingkey=zero") | Some("missingkey=default") => o.missing_key = MissingKey::Print,
        Some(other) => panic!("unknown option {other}"),
        None => {}
    }
    o
}

/// Whether `result` is what Go produced for the case.
fn matches(result: &Result<String, Error>, golden: &Value) -> Result<(), String> {
    match (result, golden["error"].as_bool().unwrap_or(false)) {
        (Ok(out), false) if Some(out.as_str()) == golden["output"].as_str() => Ok(()),
        (Err(e), true) => {
            // The gist of Go's message: what follows `at <...>: ` (or the location), up to the
            // next colon ("error calling eq", "unexpected EOF", "nil pointer evaluating ...").
            let want = golden["error_message"].as_str().unwrap_or_default();
            let tail = match want.split_once(">: ") {
                Some((_, t)) => t,
                None => want.rsplit_once(": ").map(|x| x.1).unwrap_or(want),
            };
            let first = tail.split(':').next().unwrap_or(tail);
            if e.to_string().contains(first) {
                Ok(())
            } else {
                Err(format!("error {:?}, Go's: {want:?}", e.to_string()))
            }
        }
        (r, _) => Err(format!("got {r:?}, Go's: {golden}")),
    }
}

#[test]
fn every_case_matches_go_in_go_mode() {
    let (cases, goldens) = corpus();
    assert_eq!(cases.len(), goldens.len());
    assert!(cases.len() >= 70, "the corpus shrank: {}", cases.len());
    let mut failures = Vec::new();
    for (case, golden) in cases.iter().zip(&goldens) {
        let name = case["name"].as_str().expect("name");
        assert_eq!(golden["name"], case["name"]);
        let result = render(
            name,
            case["template"].as_str().expect("template"),
            &case["data"],
            &go_options(case),
        );
        if let Err(why) = matches(&result, golden) {
            failures.push(format!("{name}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_projects_mode_differs_only_where_it_says_so() {
    let (cases, goldens) = corpus();
    let mut differs = Vec::new();
    for (case, golden) in cases.iter().zip(&goldens) {
        let name = case["name"].as_str().expect("name");
        let mut options = Options::default();
        if case["option"] == "missingkey=error" {
            options.missing_key = MissingKey::Error;
        }
        let result = render(
            name,
            case["template"].as_str().expect("template"),
            &case["data"],
            &options,
        );
        if matches(&result, golden).is_err() {
            differs.push(name.to_string());
            // Each difference is the documented one.
            let reason = PROJECT_DIFFERS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, r)| *r)
                .unwrap_or_else(|| panic!("{name} differs from Go without a reason: {result:?}"));
            if reason.starts_with("printing") {
                let err = result.as_ref().expect_err(reason);
                assert!(
                    err.to_string().contains(&format!("template: {name}:1:"))
                        && err.to_string().contains("printing it would write"),
                    "{name}: {err}"
                );
            }
        }
    }
    let mut listed: Vec<String> = PROJECT_DIFFERS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    differs.sort();
    assert_eq!(differs, listed);
}
