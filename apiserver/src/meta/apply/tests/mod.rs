//! Tests of field sets, FieldsV1, path rendering, entry serde and `record_update`.

use serde_json::{json, Value};

use super::*;

mod apply;
mod edge;

pub(super) const NOW: &str = "2024-01-01T00:00:00Z";
pub(super) const LATER: &str = "2024-01-02T00:00:00Z";

/// A CRD-style schema exercising every merge strategy.
pub(super) fn schema() -> Value {
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "apiVersion": string,
            "kind": string,
            "metadata": {"type": "object"},
            "data": {"type": "object", "additionalProperties": string},
            "spec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "a": string,
                    "b": string,
                    "items": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": string, "value": string, "extra": string
                        }}
                    },
                    "ports": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["port", "protocol"],
                        "items": {"type": "object", "properties": {
                            "port": {"type": "integer"},
                            "protocol": {"type": "string", "default": "TCP"},
                            "name": string
                        }}
                    },
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": string},
                    "args": {"type": "array", "items": string},
                    "selector": {
                        "type": "object",
                        "x-kubernetes-map-type": "atomic",
                        "additionalProperties": string
                    },
                    "config": {"type": "object", "additionalProperties": string},
                    "template": {"type": "object", "properties": {"image": string, "tag": string}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }
            },
            "status": {"type": "object", "properties": {"phase": string}}
        }
    })
}

/// A Widget with the given spec.
pub(super) fn widget(spec: Value) -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": spec
    })
}

/// A managedFields entry.
pub(super) fn entry(manager: &str, op: &str, time: &str, fields: Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: manager.to_string(),
        operation: op.to_string(),
        api_version: "v1".to_string(),
        time: Some(time.to_string()),
        fields_type: "FieldsV1".to_string(),
        fields_v1: fields,
        subresource: None,
    }
}

/// `(manager, operation, fieldsV1)` of each entry.
pub(super) fn summary(entries: &[ManagedFieldsEntry]) -> Vec<(String, String, Value)> {
    entries
        .iter()
        .map(|e| (e.manager.clone(), e.operation.clone(), e.fields_v1.clone()))
        .collect()
}

pub(super) fn expect(rows: &[(&str, &str, Value)]) -> Vec<(String, String, Value)> {
    rows.iter()
        .map(|(m, o, f)| (m.to_string(), o.to_string(), f.clone()))
        .collect()
}

#[test]
fn field_sets_of_objects() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "scalars and metadata",
            json!({"apiVersion": "v1", "kind": "Widget", "metadata": {
                "name": "w", "namespace": "n", "uid": "u", "resourceVersion": "1",
                "generation": 2, "creationTimestamp": "t", "managedFields": [{}],
                "labels": {"app": "x"}, "annotations": {"a": "b"}}, "spec": {"replicas": 1}}),
            json!({"f:metadata": {"f:annotations": {"f:a": {}}, "f:labels": {"f:app": {}}},
                   "f:spec": {"f:replicas": {}}}),
        ),
        (
            "map list and set",
            widget(json!({"items": [{"name": "a", "value": "1"}], "tags": ["x", "y"]})),
            json!({"f:spec": {
                "f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}}},
                "f:tags": {"v:\"x\"": {}, "v:\"y\"": {}}}}),
        ),
        (
            "atomic list and atomic map",
            widget(json!({"args": ["a"], "selector": {"k": "v"}})),
            json!({"f:spec": {"f:args": {}, "f:selector": {}}}),
        ),
        (
            "multi-key list with defaulted key",
            widget(json!({"ports": [{"port": 80, "name": "http"}]})),
            json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}":
                {".": {}, "f:name": {}, "f:port": {}}}}}),
        ),
        (
            "preserve-unknown and free-form maps",
            widget(json!({"free": {"x": {"y": 1}}, "config": {"k": "v"}})),
            json!({"f:spec": {"f:config": {"f:k": {}}, "f:free": {"f:x": {".": {}, "f:y": {}}}}}),
        ),
        (
            "empty values are leaves",
            widget(json!({"template": {}, "items": [], "tags": []})),
            json!({"f:spec": {"f:items": {}, "f:tags": {}, "f:template": {}}}),
        ),
        (
            "finalizers and ownerReferences",
            json!({"metadata": {"finalizers": ["f"], "ownerReferences": [{"uid": "1", "name": "o"}]}}),
            json!({"f:metadata": {"f:finalizers": {"v:\"f\"": {}},
                "f:ownerReferences": {"k:{\"uid\":\"1\"}": {".": {}, "f:name": {}, "f:uid": {}}}}}),
        ),
    ];
    for (name, object, fields) in cases {
        let set = FieldSet::from_object(&object, &schema());
        assert_eq!(set.to_fields_v1(), fields, "{name}");
    }
}

#[test]
fn schemaless_objects_are_deduced() {
    let set = FieldSet::from_object(&widget(json!({"replicas": 1, "list": [1]})), &json!({}));
    assert_eq!(
        set.to_fields_v1(),
        json!({"f:spec": {".": {}, "f:list": {}, "f:replicas": {}}})
    );
}

#[test]
fn fields_v1_round_trip() {
    let cases = [
        json!({}),
        json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {".": {}, "f:replicas": {}}}),
        json!({"f:spec": {"f:items": {".": {}, "k:{\"name\":\"a\"}": {".": {}, "f:name": {}}}}}),
        json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"x\"": {}, "v:5": {}}}}),
        json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {}}}}),
        json!({"f:list": {"i:0": {}, "i:3": {"f:x": {}}}}),
    ];
    for fields in cases {
        let set = FieldSet::from_fields_v1(&fields).expect("decodes");
        assert_eq!(set.to_fields_v1(), fields);
    }
}

#[test]
fn bad_fields_v1_is_an_error() {
    let cases = [
        json!([1]),
        json!({"x:bad": {}}),
        json!({"f:a": 5}),
        json!({"k:notjson": {}}),
        json!({"i:-1": {}}),
        json!({"k:[1]": {}}),
    ];
    for fields in cases {
        assert!(FieldSet::from_fields_v1(&fields).is_err(), "{fields}");
    }
    assert_eq!(FieldSet::from_fields_v1(&Value::Null), Ok(FieldSet::new()));
}

#[test]
fn set_algebra() {
    let a = FieldSet::from_fields_v1(&json!({"f:spec": {".": {}, "f:a": {}, "f:b": {}}})).unwrap();
    let b = FieldSet::from_fields_v1(&json!({"f:spec": {"f:b": {}, "f:c": {}}})).unwrap();
    assert_eq!(
        a.union(&b).to_fields_v1(),
        json!({"f:spec": {".": {}, "f:a": {}, "f:b": {}, "f:c": {}}})
    );
    assert_eq!(
        a.intersection(&b).to_fields_v1(),
        json!({"f:spec": {"f:b": {}}})
    );
    assert_eq!(
        a.difference(&b).to_fields_v1(),
        json!({"f:spec": {".": {}, "f:a": {}}})
    );
    assert_eq!(a.len(), 3);
    assert!(a.difference(&a).is_empty());
    let spec = [PathElement::Field("spec".into())];
    assert!(a.contains(&spec) && !b.contains(&spec) && b.contains_at_or_below(&spec));
}

#[test]
fn path_rendering() {
    let f = |s: &str| PathElement::Field(s.to_string());
    let cases: Vec<(Path, &str)> = vec![
        (vec![f("spec"), f("replicas")], ".spec.replicas"),
        (
            vec![f("metadata"), f("labels"), f("app")],
            ".metadata.labels.app",
        ),
        (vec![f("data"), f("key")], ".data.key"),
        (
            vec![
                f("spec"),
                f("containers"),
                PathElement::Key(vec![("name".into(), json!("nginx"))]),
                f("image"),
            ],
            ".spec.containers[name=\"nginx\"].image",
        ),
        (
            vec![
                f("metadata"),
                f("finalizers"),
                PathElement::Value(json!("x")),
            ],
            ".metadata.finalizers[=\"x\"]",
        ),
        (
            vec![
                f("ports"),
                PathElement::Key(vec![
                    ("port".into(), json!(80)),
                    ("protocol".into(), json!("TCP")),
                ]),
            ],
            ".ports[port=80,protocol=\"TCP\"]",
        ),
        (vec![f("l"), PathElement::Index(2)], ".l[2]"),
        (vec![f("s"), PathElement::Value(json!(1.5))], ".s[=1.5]"),
        (vec![f("s"), PathElement::Value(json!(1e6))], ".s[=1e+06]"),
        (vec![f("s"), PathElement::Value(json!(true))], ".s[=true]"),
        (
            vec![f("s"), PathElement::Value(json!("a\"b\n"))],
            ".s[=\"a\\\"b\\n\"]",
        ),
    ];
    for (path, rendered) in cases {
        assert_eq!(path_to_string(&path), rendered);
    }
}

#[test]
fn entry_serde_shape() {
    let e = entry("kubectl", "Apply", NOW, json!({"f:spec": {"f:a": {}}}));
    let wire = serde_json::to_value(&e).unwrap();
    assert_eq!(
        wire,
        json!({"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": NOW,
               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:a": {}}}})
    );
    let status: ManagedFieldsEntry = serde_json::from_value(json!({
        "manager": "ctrl", "operation": "Update", "apiVersion": "v1",
        "fieldsType": "FieldsV1", "fieldsV1": {}, "subresource": "status"}))
    .unwrap();
    assert_eq!(status.subresource.as_deref(), Some("status"));
    assert_eq!(status.time, None);
    assert_eq!(
        serde_json::to_value(&status).unwrap()["subresource"],
        "status"
    );

    let mut object = widget(json!({}));
    set_managed_fields(&mut object, std::slice::from_ref(&e));
    assert_eq!(managed_fields_of(&object), vec![e]);
    set_managed_fields(&mut object, &[]);
    assert!(object["metadata"].get("managedFields").is_none());
}

struct UpdateCase {
    name: &'static str,
    old: Option<Value>,
    new: Value,
    managed: Vec<ManagedFieldsEntry>,
    manager: &'static str,
    expected: Vec<(String, String, Value)>,
}

#[test]
fn record_update_table() {
    let cases = vec![
        UpdateCase {
            name: "create owns every set field",
            old: None,
            new: json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "w", "labels": {"app": "x"}},
                "spec": {"replicas": 1, "items": [{"name": "a", "value": "1"}]}}),
            managed: vec![],
            manager: "kubectl-create",
            expected: expect(&[(
                "kubectl-create",
                "Update",
                json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {".": {}, "f:items": {".": {}, "k:{\"name\":\"a\"}":
                        {".": {}, "f:name": {}, "f:value": {}}}, "f:replicas": {}}}),
            )]),
        },
        UpdateCase {
            name: "update takes changed fields from others",
            old: Some(widget(json!({"a": "1", "b": "1"}))),
            new: widget(json!({"a": "2", "b": "1"})),
            managed: vec![entry(
                "creator",
                "Update",
                NOW,
                json!({"f:spec": {".": {}, "f:a": {}, "f:b": {}}}),
            )],
            manager: "editor",
            expected: expect(&[
                ("creator", "Update", json!({"f:spec": {".": {}, "f:b": {}}})),
                ("editor", "Update", json!({"f:spec": {"f:a": {}}})),
            ]),
        },
        UpdateCase {
            name: "manager owning nothing is dropped",
            old: Some(widget(json!({"a": "1"}))),
            new: widget(json!({"a": "2"})),
            managed: vec![entry(
                "creator",
                "Update",
                NOW,
                json!({"f:spec": {"f:a": {}}}),
            )],
            manager: "editor",
            expected: expect(&[("editor", "Update", json!({"f:spec": {"f:a": {}}}))]),
        },
        UpdateCase {
            name: "removed fields leave every set",
            old: Some(widget(json!({"a": "1", "b": "1"}))),
            new: widget(json!({"b": "1"})),
            managed: vec![entry(
                "applier",
                "Apply",
                NOW,
                json!({"f:spec": {"f:a": {}, "f:b": {}}}),
            )],
            manager: "editor",
            expected: expect(&[("applier", "Apply", json!({"f:spec": {"f:b": {}}}))]),
        },
        UpdateCase {
            name: "merged into the manager's existing entry",
            old: Some(widget(json!({"a": "1"}))),
            new: widget(json!({"a": "1", "b": "2"})),
            managed: vec![entry(
                "editor",
                "Update",
                NOW,
                json!({"f:spec": {"f:a": {}}}),
            )],
            manager: "editor",
            expected: expect(&[(
                "editor",
                "Update",
                json!({"f:spec": {"f:a": {}, "f:b": {}}}),
            )]),
        },
        UpdateCase {
            name: "labels and annotations per key",
            old: Some(json!({"metadata": {"name": "w", "labels": {"app": "x"}}})),
            new: json!({"metadata": {"name": "w", "labels": {"app": "x", "env": "prod"},
                "annotations": {"note": "n"}}}),
            managed: vec![entry(
                "creator",
                "Update",
                NOW,
                json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}),
            )],
            manager: "labeler",
            expected: expect(&[
                (
                    "creator",
                    "Update",
                    json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}),
                ),
                (
                    "labeler",
                    "Update",
                    json!({"f:metadata": {
                    "f:annotations": {".": {}, "f:note": {}}, "f:labels": {"f:env": {}}}}),
                ),
            ]),
        },
        UpdateCase {
            name: "finalizer added to a set",
            old: Some(json!({"metadata": {"name": "w"}})),
            new: json!({"metadata": {"name": "w", "finalizers": ["example.com/f"]}}),
            managed: vec![],
            manager: "ctrl",
            expected: expect(&[(
                "ctrl",
                "Update",
                json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"example.com/f\"": {}}}}),
            )]),
        },
        UpdateCase {
            name: "untracked metadata changes own nothing",
            old: Some(json!({"metadata": {"name": "w", "resourceVersion": "1", "generation": 1}})),
            new: json!({"metadata": {"name": "w", "resourceVersion": "2", "generation": 2,
                "managedFields": [{"manager": "x"}]}}),
            managed: vec![],
            manager: "ctrl",
            expected: vec![],
        },
        UpdateCase {
            name: "list-map element edit",
            old: Some(widget(
                json!({"items": [{"name": "a", "value": "1"}, {"name": "b", "value": "1"}]}),
            )),
            new: widget(
                json!({"items": [{"name": "a", "value": "2"}, {"name": "b", "value": "1"}]}),
            ),
            managed: vec![],
            manager: "ctrl",
            expected: expect(&[(
                "ctrl",
                "Update",
                json!({"f:spec": {"f:items": {"k:{\"name\":\"a\"}": {"f:value": {}}}}}),
            )]),
        },
    ];
    for case in cases {
        let out = record_update(
            case.old.as_ref(),
            &case.new,
            case.managed,
            case.manager,
            "v1",
            None,
            &schema(),
            LATER,
        );
        assert_eq!(summary(&out), case.expected, "{}", case.name);
    }
}

#[test]
fn record_update_times() {
    let old = widget(json!({"a": "1"}));
    let managed = vec![entry(
        "editor",
        "Update",
        NOW,
        json!({"f:spec": {"f:a": {}}}),
    )];
    // Nothing changed: entries (and time) untouched.
    let same = record_update(
        Some(&old),
        &old,
        managed.clone(),
        "editor",
        "v1",
        None,
        &schema(),
        LATER,
    );
    assert_eq!(same, managed);
    // A change re-stamps the entry.
    let new = widget(json!({"a": "2"}));
    let changed = record_update(
        Some(&old),
        &new,
        managed,
        "editor",
        "v1",
        None,
        &schema(),
        LATER,
    );
    assert_eq!(changed[0].time.as_deref(), Some(LATER));
}

#[test]
fn record_update_keys_entries_by_version_and_subresource() {
    let old = json!({"spec": {"a": "1"}, "status": {}});
    let new = json!({"spec": {"a": "1"}, "status": {"phase": "Ready"}});
    let managed = vec![entry("ctrl", "Update", NOW, json!({"f:spec": {"f:a": {}}}))];
    let out = record_update(
        Some(&old),
        &new,
        managed,
        "ctrl",
        "v1",
        Some("status"),
        &schema(),
        LATER,
    );
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].subresource.as_deref(), Some("status"));
    assert_eq!(out[1].fields_v1, json!({"f:status": {"f:phase": {}}}));
    assert_eq!(
        out[1].describe(),
        "\"ctrl\" with subresource \"status\" using v1"
    );

    let newer = json!({"spec": {"a": "2"}, "status": {}});
    let out = record_update(
        Some(&old),
        &newer,
        out,
        "ctrl",
        "v2",
        None,
        &schema(),
        LATER,
    );
    let versions: Vec<&str> = out.iter().map(|e| e.api_version.as_str()).collect();
    assert_eq!(
        versions,
        ["v1", "v2"],
        "a new apiVersion gets its own entry"
    );
}

#[test]
fn update_managers_are_capped() {
    let mut managed = Vec::new();
    let mut spec = serde_json::Map::new();
    for i in 0..11 {
        let time = format!("2024-01-01T00:00:{i:02}Z");
        managed.push(entry(
            &format!("m{i:02}"),
            "Update",
            &time,
            json!({"f:spec": {format!("f:k{i}"): {}}}),
        ));
        spec.insert(format!("k{i}"), json!("v"));
    }
    let old = json!({"spec": Value::Object(spec.clone())});
    spec.insert("new".into(), json!("v"));
    let new = json!({"spec": Value::Object(spec)});
    let out = record_update(
        Some(&old),
        &new,
        managed,
        "m11",
        "v1",
        None,
        &schema(),
        LATER,
    );
    assert_eq!(out.len(), MAX_UPDATE_MANAGERS);
    let bucket = out
        .iter()
        .find(|e| e.manager == ANCIENT_CHANGES_MANAGER)
        .expect("bucket");
    assert_eq!(
        bucket.fields_v1,
        json!({"f:spec": {"f:k0": {}, "f:k1": {}, "f:k2": {}}})
    );
}

#[test]
fn garbage_inputs_do_not_panic() {
    let weird_schema = json!({"type": 5, "properties": [], "items": "x",
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [1]});
    let values = [
        json!(null),
        json!(5),
        json!([1, [2]]),
        json!({"spec": [{"a": 1}]}),
        widget(json!({"items": [1, {"x": 1}]})),
    ];
    let bad_entry = ManagedFieldsEntry {
        fields_v1: json!("nope"),
        ..entry("bad", "Update", "not a time", json!({}))
    };
    for schema in [weird_schema, schema(), json!({})] {
        for old in &values {
            for new in &values {
                let _ = FieldSet::from_object(new, &schema);
                let _ = record_update(
                    Some(old),
                    new,
                    vec![bad_entry.clone()],
                    "m",
                    "v1",
                    None,
                    &schema,
                    NOW,
                );
                let _ = apply(
                    Some(old),
                    new,
                    vec![bad_entry.clone()],
                    "m",
                    false,
                    "v1",
                    None,
                    &schema,
                    NOW,
                );
                let _ = apply(Some(old), new, vec![], "m", true, "v1", None, &schema, NOW)
                    .and_then(|(o, m)| {
                        apply(Some(&o), old, m, "m", false, "v1", None, &schema, NOW)
                    });
            }
        }
    }
}
