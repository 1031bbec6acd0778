//! Table tests for [`crate::meta::schema::validate_cel`]: `x-kubernetes-validations` rules,
//! messages, reasons, field paths and transition rules.

use serde_json::{json, Value};

use crate::meta::schema::validate_cel;

/// A resource whose `spec` carries the given rules next to a fixed set of
/// typed properties.
fn schema_with(spec_rules: Value) -> Value {
    json!({
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.metadata.name.startsWith('w')", "message": "name must start with w"}
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "x-kubernetes-validations": spec_rules,
                "properties": {
                    "replicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "items": {"type": "array", "items": {"type": "integer"}},
                    "x-y": {"type": "string"},
                    "start": {"type": "string", "format": "date-time"},
                    "end": {"type": "string", "format": "date-time"},
                    "timeout": {"type": "string", "format": "duration"},
                    "port": {"x-kubernetes-int-or-string": true},
                    "name": {"type": "string",
                             "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "Value is immutable"}]},
                    "size": {"type": "integer",
                             "x-kubernetes-validations": [{"rule": "!oldSelf.hasValue() || self >= oldSelf.value()",
                                                           "message": "size may only grow", "optionalOldSelf": true}]},
                    "labels": {"type": "object", "additionalProperties": {"type": "string",
                               "x-kubernetes-validations": [{"rule": "self.size() <= 3", "message": "label too long"}]}},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                              "items": {"type": "object",
                                        "x-kubernetes-validations": [{"rule": "self.number >= oldSelf.number",
                                                                      "message": "port number may not decrease"}],
                                        "properties": {"name": {"type": "string"}, "number": {"type": "integer"}}}},
                    "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                               "properties": {"known": {"type": "string"}}}
                }
            }
        }
    })
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": spec})
}

fn run(rules: Value, spec: Value, old_spec: Option<Value>) -> Vec<String> {
    let schema = schema_with(rules);
    let old = old_spec.map(widget);
    validate_cel(&widget(spec), old.as_ref(), &schema)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn cel_table() {
    type Case = (&'static str, Value, Value, Option<Value>, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        (
            "integer equality with a literal (no uint trap)",
            json!([{"rule": "self.replicas == 2"}]),
            json!({"replicas": 2}),
            None,
            vec![],
        ),
        (
            "failed rule without message",
            json!([{"rule": "self.replicas == 2"}]),
            json!({"replicas": 3}),
            None,
            vec![r#"spec: Invalid value: "object": failed rule: self.replicas == 2"#],
        ),
        (
            "exists over integers",
            json!([{"rule": "self.items.exists(i, i == 2)", "message": "must contain 2"}]),
            json!({"items": [1, 2, 3]}),
            None,
            vec![],
        ),
        (
            "exists over integers fails",
            json!([{"rule": "self.items.exists(i, i == 2)", "message": "  must contain 2  "}]),
            json!({"items": [1, 3]}),
            None,
            vec![r#"spec: Invalid value: "object": must contain 2"#],
        ),
        (
            "messageExpression",
            json!([{"rule": "self.replicas <= self.maxReplicas", "message": "static",
                    "messageExpression": "'replicas ' + string(self.replicas) + ' exceeds ' + string(self.maxReplicas)"}]),
            json!({"replicas": 7, "maxReplicas": 5}),
            None,
            vec![r#"spec: Invalid value: "object": replicas 7 exceeds 5"#],
        ),
        (
            "messageExpression failing falls back to message",
            json!([{"rule": "self.replicas <= self.maxReplicas", "message": "replicas too high",
                    "messageExpression": "self.nothing"}]),
            json!({"replicas": 7, "maxReplicas": 5}),
            None,
            vec![r#"spec: Invalid value: "object": replicas too high"#],
        ),
        (
            "reason FieldValueForbidden",
            json!([{"rule": "!has(self.ratio)", "message": "ratio is not allowed", "reason": "FieldValueForbidden"}]),
            json!({"ratio": 0.5}),
            None,
            vec!["spec: Forbidden: ratio is not allowed"],
        ),
        (
            "reason FieldValueRequired with fieldPath",
            json!([{"rule": "has(self.replicas)", "message": "replicas is required",
                    "reason": "FieldValueRequired", "fieldPath": ".replicas"}]),
            json!({}),
            None,
            vec!["spec.replicas: Required value: replicas is required"],
        ),
        (
            "reason FieldValueDuplicate",
            json!([{"rule": "false", "reason": "FieldValueDuplicate"}]),
            json!({}),
            None,
            vec![r#"spec: Duplicate value: "object""#],
        ),
        (
            "fieldPath into a map key",
            json!([{"rule": "false", "message": "bad label", "fieldPath": ".labels['app.kubernetes.io/name']"}]),
            json!({"labels": {}}),
            None,
            vec![r#"spec.labels[app.kubernetes.io/name]: Invalid value: "object": bad label"#],
        ),
        (
            "number compares as double",
            json!([{"rule": "self.ratio < 1.0", "message": "ratio below 1"}]),
            json!({"ratio": 2}),
            None,
            vec![r#"spec: Invalid value: "object": ratio below 1"#],
        ),
        (
            "escaped property names",
            json!([{"rule": "self.x__dash__y == 'ok'", "message": "x-y must be ok"}]),
            json!({"x-y": "no"}),
            None,
            vec![r#"spec: Invalid value: "object": x-y must be ok"#],
        ),
        (
            "date-time strings are timestamps",
            json!([{"rule": "self.start < self.end", "message": "start must precede end"}]),
            json!({"start": "2024-02-01T00:00:00Z", "end": "2024-01-01T00:00:00Z"}),
            None,
            vec![r#"spec: Invalid value: "object": start must precede end"#],
        ),
        (
            "duration strings are durations",
            json!([{"rule": "self.timeout <= duration('1h')", "message": "timeout at most 1h"}]),
            json!({"timeout": "90m"}),
            None,
            vec![r#"spec: Invalid value: "object": timeout at most 1h"#],
        ),
        (
            "int-or-string exposes ints and strings",
            json!([{"rule": "self.port == 8080"}]),
            json!({"port": 8080}),
            None,
            vec![],
        ),
        (
            "runtime error",
            json!([{"rule": "self.replicas > 1"}]),
            json!({}),
            None,
            vec![
                r#"spec: Invalid value: "object": no such key: replicas evaluating rule: self.replicas > 1"#,
            ],
        ),
        (
            "unknown preserved fields are invisible",
            json!([{"rule": "!has(self.config.secret)", "message": "secret visible"}]),
            json!({"config": {"secret": 1, "known": "k"}}),
            None,
            vec![],
        ),
        (
            "rules inside additionalProperties values",
            json!([]),
            json!({"labels": {"a": "abc", "b": "abcd"}}),
            None,
            vec![r#"spec.labels[b]: Invalid value: "string": label too long"#],
        ),
        (
            "transition rule skipped on create",
            json!([]),
            json!({"name": "new"}),
            None,
            vec![],
        ),
        (
            "transition rule on update with change",
            json!([]),
            json!({"name": "new"}),
            Some(json!({"name": "old"})),
            vec![r#"spec.name: Invalid value: "string": Value is immutable"#],
        ),
        (
            "transition rule on update without change",
            json!([]),
            json!({"name": "same"}),
            Some(json!({"name": "same"})),
            vec![],
        ),
        (
            "transition rule skipped when the field is added",
            json!([]),
            json!({"name": "added"}),
            Some(json!({})),
            vec![],
        ),
        (
            "optionalOldSelf runs on create",
            json!([]),
            json!({"size": 1}),
            None,
            vec![],
        ),
        (
            "optionalOldSelf on update",
            json!([]),
            json!({"size": 1}),
            Some(json!({"size": 2})),
            vec![r#"spec.size: Invalid value: "integer": size may only grow"#],
        ),
        (
            "list-map items correlate by key for oldSelf",
            json!([]),
            json!({"ports": [{"name": "b", "number": 5}, {"name": "a", "number": 1}]}),
            Some(
                json!({"ports": [{"name": "a", "number": 2}, {"name": "b", "number": 5}, {"name": "c", "number": 9}]}),
            ),
            vec![r#"spec.ports[1]: Invalid value: "object": port number may not decrease"#],
        ),
        (
            "spec-level transition rule",
            json!([{"rule": "self.replicas >= oldSelf.replicas", "message": "no scale down"}]),
            json!({"replicas": 1}),
            Some(json!({"replicas": 3})),
            vec![r#"spec: Invalid value: "object": no scale down"#],
        ),
        (
            "kubernetes library functions",
            json!([{"rule": "isURL('https://example.com') && 'abc'.matches('^a') && quantity('1Gi').isGreaterThan(quantity('1Mi'))"}]),
            json!({}),
            None,
            vec![],
        ),
        (
            "rule that does not compile",
            json!([{"rule": "self.replicas >"}]),
            json!({}),
            None,
            vec!["spec: Internal error: rule compile error"],
        ),
    ];
    for (name, rules, spec, old, want) in cases {
        let got = run(rules, spec, old);
        if name == "rule that does not compile" {
            assert_eq!(got.len(), 1, "case {name:?}: {got:?}");
            assert!(got[0].starts_with(want[0]), "case {name:?}: {got:?}");
            continue;
        }
        assert_eq!(got, want, "case {name:?}");
    }
}

#[test]
fn root_rules_see_only_name_and_report_nil_field() {
    let schema = schema_with(json!([]));
    let mut obj = widget(json!({}));
    obj["metadata"]["name"] = json!("x1");
    let got: Vec<String> = validate_cel(&obj, None, &schema)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        vec![r#"<nil>: Invalid value: "object": name must start with w"#]
    );

    let mut schema = schema_with(json!([]));
    schema["x-kubernetes-validations"] =
        json!([{"rule": "!has(self.metadata.labels) && self.kind == 'Widget'"}]);
    obj["metadata"]["labels"] = json!({"a": "b"});
    assert!(validate_cel(&obj, None, &schema).is_empty());
}

#[test]
fn cause_shape_of_a_cel_error() {
    let schema = schema_with(json!([{"rule": "self.replicas == 2", "message": "need 2"}]));
    let errs = validate_cel(&widget(json!({"replicas": 1})), None, &schema);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec");
    assert_eq!(errs[0].reason(), "FieldValueInvalid");
    assert_eq!(errs[0].body(), r#"Invalid value: "object": need 2"#);
}
