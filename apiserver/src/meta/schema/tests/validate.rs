//! Table tests for [`crate::meta::schema::validate`]: one case per keyword, with the exact
//! kube-apiserver message (`<field>: <body>`) expected.

use serde_json::{json, Value};

use crate::meta::schema::validate;

/// A small CRD-like schema (`Widget`) exercising every keyword.
fn widget_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
            "spec": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z][a-z0-9-]*$"},
                    "protocol": {"type": "string", "enum": ["http", "https"]},
                    "replicas": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 10},
                    "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true,
                              "maximum": 1, "exclusiveMaximum": true, "multipleOf": 0.25},
                    "exposure": {"type": "object", "properties": {
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535}}},
                    "when": {"type": "string", "format": "date-time"},
                    "data": {"type": "string", "format": "byte"},
                    "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set",
                             "minItems": 1, "maxItems": 3},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["port", "protocol"],
                              "items": {"type": "object", "required": ["port"], "properties": {
                                  "port": {"type": "integer"}, "protocol": {"type": "string"}}}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 5},
                               "minProperties": 1, "maxProperties": 2},
                    "target": {"x-kubernetes-int-or-string": true,
                               "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "note": {"type": "string", "nullable": true},
                    "items": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "weight": {"type": "integer", "multipleOf": 5}}}},
                    "choice": {"type": "object",
                               "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                               "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                    "flag": {"type": "boolean"},
                    "mode": {"type": "string", "not": {"enum": ["legacy"]}},
                    "level": {"type": "integer", "allOf": [{"minimum": 0}, {"maximum": 5}]},
                    "size": {"type": "string", "anyOf": [{"pattern": "^[0-9]+Gi$"}, {"pattern": "^[0-9]+Mi$"}]},
                    "code": {"type": "integer", "enum": [1, 2]},
                    "big": {"type": "integer", "maximum": 1000000},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object"}}}
                }
            }
        }
    })
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec})
}

fn messages(obj: &Value, schema: &Value) -> Vec<String> {
    validate(obj, schema)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn widget_table() {
    let schema = widget_schema();
    let long_name = "a".repeat(64);
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        ("valid minimal", json!({"name": "web"}), vec![]),
        ("required", json!({}), vec!["spec.name: Required value"]),
        (
            "type string for integer",
            json!({"name": "web", "replicas": "three"}),
            vec![r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#],
        ),
        (
            "type fraction for integer",
            json!({"name": "web", "replicas": 1.5}),
            vec![r#"spec.replicas: Invalid value: "number": spec.replicas in body must be of type integer: "number""#],
        ),
        ("integral float is an integer", json!({"name": "web", "replicas": 2.0}), vec![]),
        (
            "type boolean",
            json!({"name": "web", "flag": "yes"}),
            vec![r#"spec.flag: Invalid value: "string": spec.flag in body must be of type boolean: "string""#],
        ),
        (
            "type object",
            json!({"name": "web", "exposure": "x"}),
            vec![r#"spec.exposure: Invalid value: "string": spec.exposure in body must be of type object: "string""#],
        ),
        (
            "type array",
            json!({"name": "web", "tags": "a"}),
            vec![r#"spec.tags: Invalid value: "string": spec.tags in body must be of type array: "string""#],
        ),
        ("nullable null kept", json!({"name": "web", "note": null}), vec![]),
        (
            "null in non-nullable",
            json!({"name": "web", "protocol": null}),
            vec![r#"spec.protocol: Invalid value: "null": spec.protocol in body must be of type string: "null""#],
        ),
        (
            "enum",
            json!({"name": "web", "protocol": "ftp"}),
            vec![r#"spec.protocol: Unsupported value: "ftp": supported values: "http", "https""#],
        ),
        (
            "enum of integers",
            json!({"name": "web", "code": 3}),
            vec![r#"spec.code: Unsupported value: 3: supported values: "1", "2""#],
        ),
        (
            "pattern",
            json!({"name": "Web"}),
            vec![r#"spec.name: Invalid value: "Web": spec.name in body should match '^[a-z][a-z0-9-]*$'"#],
        ),
        (
            "minLength and pattern",
            json!({"name": ""}),
            vec![
                r#"spec.name: Invalid value: "": spec.name in body should be at least 1 chars long"#,
                r#"spec.name: Invalid value: "": spec.name in body should match '^[a-z][a-z0-9-]*$'"#,
            ],
        ),
        ("maxLength", json!({"name": long_name}), vec!["spec.name: Too long: may not be more than 63 bytes"]),
        (
            "maximum",
            json!({"name": "web", "exposure": {"port": 70000}}),
            vec!["spec.exposure.port: Invalid value: 70000: spec.exposure.port in body should be less than or equal to 65535"],
        ),
        (
            "minimum",
            json!({"name": "web", "exposure": {"port": 0}}),
            vec!["spec.exposure.port: Invalid value: 0: spec.exposure.port in body should be greater than or equal to 1"],
        ),
        (
            "maximum printed like Go",
            json!({"name": "web", "big": 2000000}),
            vec!["spec.big: Invalid value: 2000000: spec.big in body should be less than or equal to 1e+06"],
        ),
        (
            "exclusiveMaximum",
            json!({"name": "web", "ratio": 1}),
            vec!["spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1"],
        ),
        (
            "exclusiveMinimum",
            json!({"name": "web", "ratio": 0}),
            vec!["spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0"],
        ),
        (
            "multipleOf fraction",
            json!({"name": "web", "ratio": 0.3}),
            vec!["spec.ratio: Invalid value: 0.3: spec.ratio in body should be a multiple of 0.25"],
        ),
        ("multipleOf fraction ok", json!({"name": "web", "ratio": 0.75}), vec![]),
        (
            "multipleOf inside array items",
            json!({"name": "web", "items": [{"weight": 10}, {"name": "b", "weight": 7}]}),
            vec!["spec.items[1].weight: Invalid value: 7: spec.items[1].weight in body should be a multiple of 5"],
        ),
        (
            "format date-time",
            json!({"name": "web", "when": "yesterday"}),
            vec![r#"spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday""#],
        ),
        ("format date-time ok", json!({"name": "web", "when": "2024-05-01T10:00:00Z"}), vec![]),
        (
            "format byte",
            json!({"name": "web", "data": "!!"}),
            vec![r#"spec.data: Invalid value: "!!": spec.data in body must be of type byte: "!!""#],
        ),
        (
            "minItems",
            json!({"name": "web", "tags": []}),
            vec!["spec.tags: Invalid value: 0: spec.tags in body should have at least 1 items"],
        ),
        (
            "maxItems",
            json!({"name": "web", "tags": ["a", "b", "c", "d"]}),
            vec!["spec.tags: Too many: 4: must have at most 3 items"],
        ),
        (
            "list-type set duplicate",
            json!({"name": "web", "tags": ["a", "b", "a"]}),
            vec![r#"spec.tags[2]: Duplicate value: "a""#],
        ),
        (
            "list-type map duplicate key tuple",
            json!({"name": "web", "ports": [
                {"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]}),
            vec![r#"spec.ports[2]: Duplicate value: {"port":80,"protocol":"TCP"}"#],
        ),
        (
            "required inside array items",
            json!({"name": "web", "ports": [{"protocol": "TCP"}]}),
            vec!["spec.ports[0].port: Required value"],
        ),
        (
            "additionalProperties value",
            json!({"name": "web", "labels": {"app": "toolong"}}),
            vec!["spec.labels.app: Too long: may not be more than 5 bytes"],
        ),
        (
            "maxProperties",
            json!({"name": "web", "labels": {"a": "1", "b": "2", "c": "3"}}),
            vec!["spec.labels: Too many: 3: must have at most 2 items"],
        ),
        (
            "minProperties",
            json!({"name": "web", "labels": {}}),
            vec!["spec.labels: Invalid value: 0: spec.labels in body should have at least 1 properties"],
        ),
        ("int-or-string integer", json!({"name": "web", "target": 8080}), vec![]),
        ("int-or-string string", json!({"name": "web", "target": "http"}), vec![]),
        (
            "int-or-string other type",
            json!({"name": "web", "target": true}),
            vec![r#"spec.target: Invalid value: "boolean": spec.target in body must be of type integer,string: "boolean""#],
        ),
        (
            "anyOf none valid",
            json!({"name": "web", "size": "10G"}),
            vec![
                r#"<nil>: Invalid value: "": "spec.size" must validate at least one schema (anyOf)"#,
                r#"spec.size: Invalid value: "10G": spec.size in body should match '^[0-9]+Gi$'"#,
            ],
        ),
        ("anyOf second branch valid", json!({"name": "web", "size": "10Mi"}), vec![]),
        (
            "oneOf none valid",
            json!({"name": "web", "choice": {}}),
            vec![
                r#"<nil>: Invalid value: "": "spec.choice" must validate one and only one schema (oneOf). Found none valid"#,
                "spec.choice.a: Required value",
            ],
        ),
        (
            "oneOf two valid",
            json!({"name": "web", "choice": {"a": "x", "b": "y"}}),
            vec![r#"<nil>: Invalid value: "": "spec.choice" must validate one and only one schema (oneOf). Found 2 valid alternatives"#],
        ),
        ("oneOf exactly one", json!({"name": "web", "choice": {"b": "y"}}), vec![]),
        (
            "allOf",
            json!({"name": "web", "level": 9}),
            vec![
                "spec.level: Invalid value: 9: spec.level in body should be less than or equal to 5",
                r#"<nil>: Invalid value: "": "spec.level" must validate all the schemas (allOf)"#,
            ],
        ),
        (
            "not",
            json!({"name": "web", "mode": "legacy"}),
            vec![r#"<nil>: Invalid value: "": "spec.mode" must not validate the schema (not)"#],
        ),
        (
            "embedded resource needs apiVersion and kind",
            json!({"name": "web", "template": {"metadata": {"name": "x"}, "spec": {}}}),
            vec![
                "spec.template.apiVersion: Required value: must not be empty",
                "spec.template.kind: Required value: must not be empty",
            ],
        ),
        (
            "embedded resource complete",
            json!({"name": "web", "template": {"apiVersion": "v1", "kind": "Pod", "spec": {}}}),
            vec![],
        ),
        (
            "all errors collected in document order",
            json!({"name": "Web", "protocol": "ftp", "replicas": 11}),
            vec![
                r#"spec.name: Invalid value: "Web": spec.name in body should match '^[a-z][a-z0-9-]*$'"#,
                r#"spec.protocol: Unsupported value: "ftp": supported values: "http", "https""#,
                "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
            ],
        ),
    ];
    assert!(cases.len() >= 40, "keep the table broad");
    for (name, spec, want) in cases {
        let got = messages(&widget(spec), &schema);
        assert_eq!(got, want, "case {name:?}");
    }
}

#[test]
fn metadata_name_constraint_and_other_metadata_ignored() {
    let schema = widget_schema();
    let mut obj = widget(json!({"name": "web"}));
    obj["metadata"] = json!({"name": "a-very-long-widget-name-indeed", "labels": {"x": 1}});
    assert_eq!(
        messages(&obj, &schema),
        vec!["metadata.name: Too long: may not be more than 20 bytes"]
    );
}

#[test]
fn max_length_counts_characters() {
    let schema = json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 2}}});
    assert!(messages(&json!({"s": "üü"}), &schema).is_empty());
    assert_eq!(
        messages(&json!({"s": "üüü"}), &schema),
        vec!["s: Too long: may not be more than 2 bytes"]
    );
}

#[test]
fn labels_map_in_array_and_cause_fields() {
    let schema = widget_schema();
    let errs = validate(&widget(json!({"name": "web", "replicas": 0})), &schema);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec.replicas");
    assert_eq!(errs[0].reason(), "FieldValueInvalid");
    assert_eq!(
        errs[0].body(),
        "Invalid value: 0: spec.replicas in body should be greater than or equal to 1"
    );
    let errs = validate(&widget(json!({"name": "web", "replicas": "x"})), &schema);
    assert_eq!(errs[0].reason(), "FieldValueTypeInvalid");
}

#[test]
fn nested_list_map_duplicate_path_uses_brackets_for_map_keys() {
    let schema = json!({"type": "object", "properties": {"groups": {"type": "object",
        "additionalProperties": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}}}}});
    assert_eq!(
        messages(&json!({"groups": {"g1": [1, 2, 1]}}), &schema),
        vec!["groups[g1][2]: Duplicate value: 1"]
    );
}

#[test]
fn hostile_inputs_do_not_panic() {
    let schemas = [
        json!(null),
        json!("string"),
        json!({"type": 5, "properties": [], "items": "x", "required": "spec"}),
        json!({"type": "string", "pattern": "(unclosed", "maxLength": -1}),
        json!({"type": "number", "multipleOf": 0, "maximum": "x"}),
        json!({"anyOf": "x", "oneOf": [1, 2], "allOf": [null], "not": 3}),
        json!({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [1]}),
    ];
    let values = [
        json!(null),
        json!([1, [2, [3]]]),
        json!({"a": {"b": []}}),
        json!("s"),
        json!(1.0e308),
        json!(-9223372036854775808i64),
    ];
    for s in &schemas {
        for v in &values {
            let _ = validate(v, s);
            let mut w = v.clone();
            let _ = crate::meta::schema::prune(&mut w, s);
            crate::meta::schema::default(&mut w, s);
            let _ = crate::meta::schema::validate_cel(v, Some(v), s);
        }
    }
}
