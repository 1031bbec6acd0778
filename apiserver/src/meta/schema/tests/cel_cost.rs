//! The cost limits of CEL rules: estimated at write time ([`crate::meta::schema::check_rule_costs`]) and
//! metered at run time ([`crate::meta::schema::cel::validate_cel_within`]).

use serde_json::{json, Value};

use crate::meta::schema::cel::validate_cel_within;
use crate::meta::schema::{check_expression, check_rule_costs, validate_cel};

const CUBIC: &str = "self.l.all(a, self.l.all(b, self.l.all(c, a + b + c >= 0)))";
const ROOT: &str = "spec.versions[0].schema.openAPIV3Schema";

fn list_schema(max_items: Option<u64>, rule: &str) -> Value {
    let mut l = json!({"type": "array", "items": {"type": "integer"}});
    if let Some(n) = max_items {
        l["maxItems"] = json!(n);
    }
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"l": l},
                "x-kubernetes-validations": [{"rule": rule}],
            }
        }
    })
}

fn messages(errs: &[crate::meta::field_error::FieldError]) -> Vec<String> {
    errs.iter().map(ToString::to_string).collect()
}

#[test]
fn cubic_rule_over_an_unbounded_list_is_refused() {
    let errs = check_rule_costs(&list_schema(None, CUBIC), ROOT);
    assert_eq!(
        messages(&errs),
        vec![
            format!("{ROOT}.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"),
            format!("{ROOT}: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"),
        ]
    );
}

#[test]
fn cubic_rule_over_a_bounded_list_passes() {
    assert!(check_rule_costs(&list_schema(Some(10), CUBIC), ROOT).is_empty());
}

#[test]
fn simple_rules_pass() {
    for rule in [
        "self.l.all(x, x >= 0)",
        "size(self.l) <= 3",
        "has(self.l) || self.l.exists(x, x == 1)",
    ] {
        let errs = check_rule_costs(&list_schema(None, rule), ROOT);
        assert!(errs.is_empty(), "{rule}: {errs:?}");
    }
}

#[test]
fn rule_on_list_items_multiplies_by_the_list_bound() {
    // A cheap rule on each item of a list of strings; the list bound multiplies it.
    let schema = |max: Option<u64>| {
        let mut l = json!({
            "type": "array",
            "items": {"type": "string", "maxLength": 1000,
                      "x-kubernetes-validations": [{"rule": "self.startsWith('a') && self.contains('bcdefghijk')"}]},
        });
        if let Some(n) = max {
            l["maxItems"] = json!(n);
        }
        json!({"type": "object", "properties": {"l": l}})
    };
    assert!(check_rule_costs(&schema(Some(10)), ROOT).is_empty());
    // Unbounded: a million strings, each costing about a hundred.
    let errs = check_rule_costs(&schema(None), ROOT);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!(
        errs[0].field,
        format!("{ROOT}.properties[l].items.x-kubernetes-validations[0].rule")
    );
}

#[test]
fn the_total_of_a_schema_is_limited() {
    // Each rule alone is within the per-rule limit (about 3 million), 40 of them are not.
    let one = |n: usize| {
        json!({"type": "object", "properties": {"p": {
            "type": "array", "maxItems": n, "items": {"type": "integer"},
            "x-kubernetes-validations": [{"rule": "self.all(a, self.all(b, a <= b || a > b))"}],
        }}})
    };
    assert!(check_rule_costs(&one(600), ROOT).is_empty());
    let mut props = serde_json::Map::new();
    for i in 0..40 {
        props.insert(
            format!("p{i}"),
            json!({
                "type": "array", "maxItems": 600,
                "items": {"type": "integer"},
                "x-kubernetes-validations": [{"rule": "self.all(a, self.all(b, a <= b || a > b))"}],
            }),
        );
    }
    let schema = json!({"type": "object", "properties": props});
    let errs = check_rule_costs(&schema, ROOT);
    assert_eq!(errs.len(), 1, "{:?}", messages(&errs));
    assert_eq!(errs[0].field, ROOT);
    assert!(
        errs[0].detail.starts_with("x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of "),
        "{}",
        errs[0].detail
    );
}

#[test]
fn rules_that_do_not_compile_are_refused() {
    let errs = check_rule_costs(&list_schema(Some(1), "self.l.all(x, "), ROOT);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].field,
        format!("{ROOT}.properties[spec].x-kubernetes-validations[0].rule")
    );
    assert!(errs[0]
        .to_string()
        .contains("Invalid value: \"self.l.all(x, \": compilation failed: "));
}

#[test]
fn factor_is_worded_as_kube() {
    use crate::meta::schema::cel_cost::cost_error_message;
    let tail = " (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)";
    assert_eq!(
        cost_error_message("c", 12, 10),
        format!("c exceeds budget by factor of 1.200000x{tail}")
    );
    assert_eq!(
        cost_error_message("c", 25, 10),
        format!("c exceeds budget by factor of 2.5x{tail}")
    );
    assert_eq!(
        cost_error_message("c", 1001, 10),
        format!("c exceeds budget by factor of more than 100x{tail}")
    );
}

#[test]
fn authentication_expressions_are_estimated() {
    assert!(check_expression("claims.sub").is_ok());
    assert!(check_expression("claims.groups.all(g, g.startsWith('team-'))").is_ok());
    let err =
        check_expression("claims.l.all(a, claims.l.all(b, claims.l.all(c, a == b)))").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("estimated cost exceeds budget by factor of"),
        "{err}"
    );
}

fn cubic_object(n: i64) -> Value {
    json!({"apiVersion": "a/v1", "kind": "K", "spec": {"l": (0..n).collect::<Vec<_>>()}})
}

#[test]
fn an_evaluation_over_its_limit_fails_as_kube() {
    let schema = list_schema(Some(100), CUBIC);
    let obj = cubic_object(100);
    // A million steps: over a lowered per-call limit, within the object's budget.
    let errs = validate_cel_within(&obj, None, &schema, 10_000_000, 10_000);
    assert_eq!(
        messages(&errs),
        vec![format!("spec: Invalid value: \"object\": operation cancelled: actual cost limit exceeded evaluating rule: {CUBIC}")]
    );
}

#[test]
fn an_object_over_its_budget_stops_all_rules() {
    let mut schema = list_schema(Some(100), CUBIC);
    schema["properties"]["spec"]["x-kubernetes-validations"] = json!([
        {"rule": CUBIC}, {"rule": "false"}
    ]);
    let obj = cubic_object(100);
    let errs = validate_cel_within(&obj, None, &schema, 5_000, 10_000);
    assert_eq!(
        messages(&errs),
        vec!["spec: Invalid value: \"object\": validation failed due to running out of cost budget, no further validation rules will be run".to_string()]
    );
}

#[test]
fn the_default_limits_stop_the_cubic_rule() {
    // The rule of the finding over 400 integers: 64 million steps, stopped after one million.
    let schema = list_schema(None, CUBIC);
    let start = std::time::Instant::now();
    let errs = validate_cel(&cubic_object(400), None, &schema);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].detail.contains("actual cost limit exceeded"),
        "{errs:?}"
    );
    eprintln!("stopped after {:?}", start.elapsed());
}

#[test]
fn cheap_rules_run_as_before_within_the_limits() {
    let schema = list_schema(None, "self.l.all(x, x >= 0) && size(self.l) == 400");
    assert!(validate_cel(&cubic_object(400), None, &schema).is_empty());
    let schema = list_schema(None, "self.l.exists(x, x < 0)");
    assert_eq!(validate_cel(&cubic_object(400), None, &schema).len(), 1);
}
