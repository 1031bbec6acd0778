//! Table tests for [`crate::meta::schema::prune`], [`crate::meta::schema::default()`] and [`crate::meta::schema::admit`].

use serde_json::{json, Value};

use crate::meta::schema::{admit, default, prune, FieldValidation};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer", "default": 1},
                    "items": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"},
                        "weight": {"type": "integer", "default": 10}}}},
                    "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                               "properties": {"known": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
                    "m": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                        "x": {"type": "integer"}, "mode": {"type": "string", "default": "auto"}}}},
                    "free": {"type": "object", "additionalProperties": true},
                    "port": {"x-kubernetes-int-or-string": true},
                    "empty": {"type": "object"},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object", "properties": {
                                     "replicas": {"type": "integer", "default": 3}}}}},
                    "exposure": {"type": "object", "default": {}, "properties": {
                        "port": {"type": "integer", "default": 80},
                        "protocol": {"type": "string", "default": "TCP"}}},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["port", "protocol"],
                              "items": {"type": "object", "properties": {
                                  "port": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"}}}},
                    "foo": {"type": "string", "default": "default"},
                    "bar": {"type": "string", "nullable": true},
                    "baz": {"type": "string"},
                    "list": {"type": "array", "items": {"type": "string", "default": "x"}}
                }
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    })
}

#[test]
fn prune_table() {
    let s = schema();
    let cases: Vec<(&str, Value, Vec<&str>, Value)> = vec![
        (
            "unknown spec field",
            json!({"spec": {"replicas": 2, "foo2": 1}}),
            vec!["spec.foo2"],
            json!({"spec": {"replicas": 2}}),
        ),
        (
            "unknown field in array items",
            json!({"spec": {"items": [{"name": "a"}, {"name": "b", "bar": 1}]}}),
            vec!["spec.items[1].bar"],
            json!({"spec": {"items": [{"name": "a"}, {"name": "b"}]}}),
        ),
        (
            "root and metadata unknowns; ObjectMeta content kept",
            json!({"apiVersion": "example.com/v1", "extra": 1, "kind": "Widget",
                   "metadata": {"bogus": true, "labels": {"any": "thing"}, "name": "w",
                                "managedFields": [{"manager": "k", "weird": 1}]}}),
            vec!["extra", "metadata.bogus"],
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"labels": {"any": "thing"}, "name": "w",
                                "managedFields": [{"manager": "k", "weird": 1}]}}),
        ),
        (
            "preserve-unknown keeps unknowns but prunes inside declared properties",
            json!({"spec": {"config": {"anything": {"deep": 1}, "known": {"a": 1, "b": 2}}}}),
            vec!["spec.config.known.b"],
            json!({"spec": {"config": {"anything": {"deep": 1}, "known": {"a": 1}}}}),
        ),
        (
            "preserve-unknown status kept whole",
            json!({"spec": {"something": 1}, "status": {"something": {"x": 1}}}),
            vec!["spec.something"],
            json!({"spec": {}, "status": {"something": {"x": 1}}}),
        ),
        (
            "additionalProperties schema prunes inside map values",
            json!({"spec": {"m": {"a": {"x": 1, "y": 2}}}}),
            vec!["spec.m.a.y"],
            json!({"spec": {"m": {"a": {"x": 1}}}}),
        ),
        (
            "additionalProperties true keeps everything",
            json!({"spec": {"free": {"a": {"b": [1, {"c": 2}]}}}}),
            vec![],
            json!({"spec": {"free": {"a": {"b": [1, {"c": 2}]}}}}),
        ),
        (
            "int-or-string values kept",
            json!({"spec": {"port": "http"}}),
            vec![],
            json!({"spec": {"port": "http"}}),
        ),
        (
            "object without properties drops all fields",
            json!({"spec": {"empty": {"a": 1, "b": 2}}}),
            vec!["spec.empty.a", "spec.empty.b"],
            json!({"spec": {"empty": {}}}),
        ),
        (
            "embedded resource keeps apiVersion/kind/metadata",
            json!({"spec": {"template": {"apiVersion": "v1", "junk": 1, "kind": "Pod",
                   "metadata": {"junk": 2, "labels": {"a": "b"}, "name": "p"},
                   "spec": {"junk": 3, "replicas": 2}}}}),
            vec![
                "spec.template.junk",
                "spec.template.metadata.junk",
                "spec.template.spec.junk",
            ],
            json!({"spec": {"template": {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"labels": {"a": "b"}, "name": "p"}, "spec": {"replicas": 2}}}}),
        ),
    ];
    for (name, mut obj, want_paths, want_obj) in cases {
        let got = prune(&mut obj, &s);
        assert_eq!(got, want_paths, "case {name:?}");
        assert_eq!(obj, want_obj, "case {name:?}");
    }
}

#[test]
fn default_table() {
    let s = schema();
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "absent scalar defaulted, nested object default gets its children's defaults",
            json!({"spec": {}}),
            json!({"spec": {"replicas": 1, "foo": "default",
                            "exposure": {"port": 80, "protocol": "TCP"}}}),
        ),
        (
            "present values are kept",
            json!({"spec": {"replicas": 5, "foo": "mine", "exposure": {"port": 8080}}}),
            json!({"spec": {"replicas": 5, "foo": "mine", "exposure": {"port": 8080, "protocol": "TCP"}}}),
        ),
        (
            "defaults inside array items",
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "items": [{"name": "a"}, {"name": "b", "weight": 3}],
                            "ports": [{"port": 80}]}}),
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "items": [{"name": "a", "weight": 10}, {"name": "b", "weight": 3}],
                            "ports": [{"port": 80, "protocol": "TCP"}]}}),
        ),
        (
            "defaults inside additionalProperties values",
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "m": {"a": {"x": 1}, "b": {"mode": "manual"}}}}),
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "m": {"a": {"x": 1, "mode": "auto"}, "b": {"mode": "manual"}}}}),
        ),
        (
            "nulls: non-nullable with default → default, nullable kept, no default → removed",
            json!({"spec": {"replicas": 1, "exposure": {"port": 1, "protocol": "UDP"},
                            "foo": null, "bar": null, "baz": null}}),
            json!({"spec": {"replicas": 1, "exposure": {"port": 1, "protocol": "UDP"},
                            "foo": "default", "bar": null}}),
        ),
        (
            "null array item replaced by items default",
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "list": ["a", null]}}),
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "list": ["a", "x"]}}),
        ),
        (
            "embedded resource content defaulted, its metadata untouched",
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "template": {"apiVersion": "v1", "kind": "Pod", "spec": {}}}}),
            json!({"spec": {"replicas": 1, "foo": "f", "exposure": {"port": 1, "protocol": "UDP"},
                            "template": {"apiVersion": "v1", "kind": "Pod", "spec": {"replicas": 3}}}}),
        ),
        (
            "no spec, nothing to default",
            json!({"metadata": {"name": "a"}}),
            json!({"metadata": {"name": "a"}}),
        ),
    ];
    for (name, mut obj, want) in cases {
        default(&mut obj, &s);
        assert_eq!(obj, want, "case {name:?}");
    }
}

#[test]
fn null_handling_follows_the_kube_doc_example() {
    let s = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "foo": {"type": "string", "default": "default"},
        "bar": {"type": "string", "nullable": true, "default": "nope"},
        "baz": {"type": "string"}}}}});
    let mut obj = json!({"spec": {"foo": null, "bar": null, "baz": null}});
    default(&mut obj, &s);
    assert_eq!(obj, json!({"spec": {"foo": "default", "bar": null}}));
    let mut obj = json!({"spec": {}});
    default(&mut obj, &s);
    assert_eq!(obj, json!({"spec": {"foo": "default", "bar": "nope"}}));
}

#[test]
fn admit_runs_the_whole_pipeline() {
    let mut s = schema();
    s["properties"]["spec"]["properties"]["replicas"]["maximum"] = json!(10);
    s["properties"]["spec"]["x-kubernetes-validations"] =
        json!([{"rule": "self.replicas <= 5", "message": "too many replicas"}]);
    let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                         "spec": {"replicas": 20, "unknown": true, "items": [{"name": "a", "zzz": 1}]}});
    let a = admit(&mut obj, None, &s, FieldValidation::Strict);
    assert_eq!(a.unknown_fields, vec!["spec.items[0].zzz", "spec.unknown"]);
    assert_eq!(obj["spec"]["items"][0]["weight"], json!(10), "defaulted");
    assert!(obj["spec"].get("unknown").is_none(), "pruned");
    let got: Vec<String> = a.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        vec![
            "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10",
            r#"spec: Invalid value: "object": too many replicas"#,
        ]
    );
    assert_eq!(
        a.warnings(),
        vec![
            r#"unknown field "spec.items[0].zzz""#,
            r#"unknown field "spec.unknown""#
        ]
    );
    assert_eq!(
        a.strict_error().as_deref(),
        Some(
            r#"strict decoding error: unknown field "spec.items[0].zzz", unknown field "spec.unknown""#
        )
    );

    let mut obj = json!({"spec": {"replicas": 2, "unknown": true}});
    let a = admit(&mut obj, None, &s, FieldValidation::Ignore);
    assert!(a.unknown_fields.is_empty() && a.errors.is_empty());
    assert!(obj["spec"].get("unknown").is_none(), "Ignore still prunes");
    assert_eq!(a.strict_error(), None);
}

#[test]
fn field_validation_parse() {
    assert_eq!(FieldValidation::parse(None), Some(FieldValidation::Warn));
    assert_eq!(
        FieldValidation::parse(Some("")),
        Some(FieldValidation::Warn)
    );
    assert_eq!(
        FieldValidation::parse(Some("Strict")),
        Some(FieldValidation::Strict)
    );
    assert_eq!(
        FieldValidation::parse(Some("Ignore")),
        Some(FieldValidation::Ignore)
    );
    assert_eq!(FieldValidation::parse(Some("strict")), None);
}
