//! Table-driven tests of server-side `apply`.

use serde_json::{json, Value};

use super::{entry, expect, schema, summary, widget, LATER, NOW};
use crate::meta::apply::*;

const CSA: &str = "kubectl-client-side-apply";

struct ApplyCase {
    name: &'static str,
    live: Option<Value>,
    managed: Vec<ManagedFieldsEntry>,
    applied: Value,
    force: bool,
    /// Expected object (`None`: not checked).
    object: Option<Value>,
    /// Expected entries as `(manager, operation, fieldsV1)`.
    entries: Vec<(String, String, Value)>,
}

fn run(case: &ApplyCase) -> Result<(Value, Vec<ManagedFieldsEntry>), ApplyConflicts> {
    apply(
        case.live.as_ref(),
        &case.applied,
        case.managed.clone(),
        "kubectl",
        case.force,
        "v1",
        None,
        &schema(),
        LATER,
    )
}

fn csa(fields: Value) -> ManagedFieldsEntry {
    entry(CSA, "Update", NOW, fields)
}

fn mine(fields: Value) -> ManagedFieldsEntry {
    entry("kubectl", "Apply", NOW, fields)
}

#[test]
fn apply_table() {
    let items_ab = json!([{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]);
    let cases = vec![
        ApplyCase {
            name: "create via apply",
            live: None,
            managed: vec![],
            applied: widget(json!({"replicas": 1, "items": [{"name": "a", "value": "1"}]})),
            force: false,
            object: Some(widget(
                json!({"replicas": 1, "items": [{"name": "a", "value": "1"}]}),
            )),
            entries: expect(&[(
                "kubectl",
                "Apply",
                json!({"f:spec": {
                "f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}}},
                "f:replicas": {}}}),
            )]),
        },
        ApplyCase {
            name: "same value is shared, no conflict",
            live: Some(widget(json!({"replicas": 1}))),
            managed: vec![csa(json!({"f:spec": {".": {}, "f:replicas": {}}}))],
            applied: widget(json!({"replicas": 1})),
            force: false,
            object: Some(widget(json!({"replicas": 1}))),
            entries: expect(&[
                ("kubectl", "Apply", json!({"f:spec": {"f:replicas": {}}})),
                (
                    CSA,
                    "Update",
                    json!({"f:spec": {".": {}, "f:replicas": {}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "force moves ownership",
            live: Some(widget(json!({"replicas": 1, "a": "x"}))),
            managed: vec![csa(
                json!({"f:spec": {".": {}, "f:a": {}, "f:replicas": {}}}),
            )],
            applied: widget(json!({"replicas": 3})),
            force: true,
            object: Some(widget(json!({"replicas": 3, "a": "x"}))),
            entries: expect(&[
                ("kubectl", "Apply", json!({"f:spec": {"f:replicas": {}}})),
                (CSA, "Update", json!({"f:spec": {".": {}, "f:a": {}}})),
            ]),
        },
        ApplyCase {
            name: "force drops a manager left owning nothing",
            live: Some(widget(json!({"replicas": 1}))),
            managed: vec![csa(json!({"f:spec": {"f:replicas": {}}}))],
            applied: widget(json!({"replicas": 3})),
            force: true,
            object: Some(widget(json!({"replicas": 3}))),
            entries: expect(&[("kubectl", "Apply", json!({"f:spec": {"f:replicas": {}}}))]),
        },
        ApplyCase {
            name: "field no longer applied is removed",
            live: Some(widget(json!({"a": "1", "b": "2"}))),
            managed: vec![mine(json!({"f:spec": {"f:a": {}, "f:b": {}}}))],
            applied: widget(json!({"a": "1"})),
            force: false,
            object: Some(widget(json!({"a": "1"}))),
            entries: expect(&[("kubectl", "Apply", json!({"f:spec": {"f:a": {}}}))]),
        },
        ApplyCase {
            name: "field no longer applied is kept when another manager owns it",
            live: Some(widget(json!({"a": "1", "b": "2"}))),
            managed: vec![
                mine(json!({"f:spec": {"f:a": {}, "f:b": {}}})),
                csa(json!({"f:spec": {"f:b": {}}})),
            ],
            applied: widget(json!({"a": "1"})),
            force: false,
            object: Some(widget(json!({"a": "1", "b": "2"}))),
            entries: expect(&[
                ("kubectl", "Apply", json!({"f:spec": {"f:a": {}}})),
                (CSA, "Update", json!({"f:spec": {"f:b": {}}})),
            ]),
        },
        ApplyCase {
            name: "emptied unowned parents are removed",
            live: Some(widget(json!({"replicas": 1, "template": {"image": "i"}}))),
            managed: vec![mine(
                json!({"f:spec": {"f:replicas": {}, "f:template": {"f:image": {}}}}),
            )],
            applied: widget(json!({"replicas": 1})),
            force: false,
            object: Some(widget(json!({"replicas": 1}))),
            entries: expect(&[("kubectl", "Apply", json!({"f:spec": {"f:replicas": {}}}))]),
        },
        ApplyCase {
            name: "list-map merge by key keeps live order and appends",
            live: Some(widget(json!({"items": items_ab}))),
            managed: vec![csa(json!({"f:spec": {"f:items": {
                "k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}},
                "k:{\"name\":\"b\"}": {".": {}, "f:name": {}, "f:value": {}}}}}))],
            applied: widget(
                json!({"items": [{"name": "c", "value": "3"}, {"name": "a", "extra": "e"}]}),
            ),
            force: false,
            object: Some(widget(json!({"items": [
                {"name": "a", "value": "1", "extra": "e"},
                {"name": "b", "value": "2"},
                {"name": "c", "value": "3"}]}))),
            entries: expect(&[
                (
                    "kubectl",
                    "Apply",
                    json!({"f:spec": {"f:items": {
                    "k:{\"name\":\"a\"}": {".": {}, "f:extra": {}, "f:name": {}},
                    "k:{\"name\":\"c\"}": {".": {}, "f:name": {}, "f:value": {}}}}}),
                ),
                (
                    CSA,
                    "Update",
                    json!({"f:spec": {"f:items": {
                    "k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}},
                    "k:{\"name\":\"b\"}": {".": {}, "f:name": {}, "f:value": {}}}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "list-map element no longer applied is removed",
            live: Some(widget(json!({"items": items_ab}))),
            managed: vec![mine(json!({"f:spec": {"f:items": {
                "k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}},
                "k:{\"name\":\"b\"}": {".": {}, "f:name": {}, "f:value": {}}}}}))],
            applied: widget(json!({"items": [{"name": "a", "value": "1"}]})),
            force: false,
            object: Some(widget(json!({"items": [{"name": "a", "value": "1"}]}))),
            entries: expect(&[(
                "kubectl",
                "Apply",
                json!({"f:spec": {"f:items": {
                "k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}}}}}),
            )]),
        },
        ApplyCase {
            name: "list-map element kept with the fields another manager owns",
            live: Some(widget(
                json!({"items": [{"name": "a", "value": "1", "extra": "x"}]}),
            )),
            managed: vec![
                mine(json!({"f:spec": {"f:items": {
                    "k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}}}}})),
                csa(json!({"f:spec": {"f:items": {"k:{\"name\":\"a\"}": {"f:extra": {}}}}})),
            ],
            applied: widget(json!({})),
            force: false,
            object: Some(widget(json!({"items": [{"name": "a", "extra": "x"}]}))),
            entries: expect(&[
                ("kubectl", "Apply", json!({"f:spec": {}})),
                (
                    CSA,
                    "Update",
                    json!({"f:spec": {"f:items": {"k:{\"name\":\"a\"}": {"f:extra": {}}}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "set union",
            live: Some(widget(json!({"tags": ["x", "y"]}))),
            managed: vec![csa(
                json!({"f:spec": {"f:tags": {"v:\"x\"": {}, "v:\"y\"": {}}}}),
            )],
            applied: widget(json!({"tags": ["z", "x"]})),
            force: false,
            object: Some(widget(json!({"tags": ["x", "y", "z"]}))),
            entries: expect(&[
                (
                    "kubectl",
                    "Apply",
                    json!({"f:spec": {"f:tags": {"v:\"x\"": {}, "v:\"z\"": {}}}}),
                ),
                (
                    CSA,
                    "Update",
                    json!({"f:spec": {"f:tags": {"v:\"x\"": {}, "v:\"y\"": {}}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "atomic list replaced",
            live: Some(widget(json!({"args": ["a", "b"]}))),
            managed: vec![mine(json!({"f:spec": {"f:args": {}}}))],
            applied: widget(json!({"args": ["c"]})),
            force: false,
            object: Some(widget(json!({"args": ["c"]}))),
            entries: expect(&[("kubectl", "Apply", json!({"f:spec": {"f:args": {}}}))]),
        },
        ApplyCase {
            name: "atomic map replaced",
            live: Some(widget(json!({"selector": {"a": "1", "b": "2"}}))),
            managed: vec![mine(json!({"f:spec": {"f:selector": {}}}))],
            applied: widget(json!({"selector": {"c": "3"}})),
            force: false,
            object: Some(widget(json!({"selector": {"c": "3"}}))),
            entries: expect(&[("kubectl", "Apply", json!({"f:spec": {"f:selector": {}}}))]),
        },
        ApplyCase {
            name: "granular map merged per key",
            live: Some(widget(json!({"config": {"a": "1"}}))),
            managed: vec![csa(json!({"f:spec": {"f:config": {".": {}, "f:a": {}}}}))],
            applied: widget(json!({"config": {"b": "2"}})),
            force: false,
            object: Some(widget(json!({"config": {"a": "1", "b": "2"}}))),
            entries: expect(&[
                (
                    "kubectl",
                    "Apply",
                    json!({"f:spec": {"f:config": {"f:b": {}}}}),
                ),
                (
                    CSA,
                    "Update",
                    json!({"f:spec": {"f:config": {".": {}, "f:a": {}}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "labels and annotations per key",
            live: Some(
                json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w",
                "labels": {"app": "x"}, "annotations": {"keep": "k"}}}),
            ),
            managed: vec![csa(
                json!({"f:metadata": {"f:annotations": {".": {}, "f:keep": {}},
                "f:labels": {".": {}, "f:app": {}}}}),
            )],
            applied: json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w",
                "labels": {"env": "prod"}, "annotations": {"note": "n"}}}),
            force: false,
            object: Some(
                json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w",
                "labels": {"app": "x", "env": "prod"}, "annotations": {"keep": "k", "note": "n"}}}),
            ),
            entries: expect(&[
                (
                    "kubectl",
                    "Apply",
                    json!({"f:metadata": {"f:annotations": {"f:note": {}},
                    "f:labels": {"f:env": {}}}}),
                ),
                (
                    CSA,
                    "Update",
                    json!({"f:metadata": {"f:annotations": {".": {}, "f:keep": {}},
                    "f:labels": {".": {}, "f:app": {}}}}),
                ),
            ]),
        },
        ApplyCase {
            name: "removed label deleted when unowned",
            live: Some(json!({"metadata": {"name": "w", "labels": {"app": "x", "old": "y"}}})),
            managed: vec![mine(
                json!({"f:metadata": {"f:labels": {"f:app": {}, "f:old": {}}}}),
            )],
            applied: json!({"metadata": {"name": "w", "labels": {"app": "x"}}}),
            force: false,
            object: Some(json!({"metadata": {"name": "w", "labels": {"app": "x"}}})),
            entries: expect(&[(
                "kubectl",
                "Apply",
                json!({"f:metadata": {"f:labels": {"f:app": {}}}}),
            )]),
        },
        ApplyCase {
            name: "dropping every field keeps metadata and removes the emptied spec",
            live: Some(widget(json!({"a": "1"}))),
            managed: vec![mine(json!({"f:spec": {"f:a": {}}}))],
            applied: json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
            force: false,
            object: Some(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "default"}})),
            entries: vec![],
        },
        ApplyCase {
            name: "preserve-unknown fields merge granularly",
            live: Some(widget(json!({"free": {"x": {"y": 1}}}))),
            managed: vec![],
            applied: widget(json!({"free": {"x": {"z": 2}}})),
            force: false,
            object: Some(widget(json!({"free": {"x": {"y": 1, "z": 2}}}))),
            entries: expect(&[(
                "kubectl",
                "Apply",
                json!({"f:spec": {"f:free": {"f:x": {".": {}, "f:z": {}}}}}),
            )]),
        },
    ];
    for case in &cases {
        let (object, entries) = match run(case) {
            Ok(out) => out,
            Err(e) => panic!("{}: unexpected conflict: {}", case.name, e.message()),
        };
        if let Some(expected) = &case.object {
            assert_eq!(&object, expected, "{}: object", case.name);
        }
        assert_eq!(summary(&entries), case.entries, "{}: entries", case.name);
    }
}

struct ConflictCase {
    name: &'static str,
    live: Value,
    managed: Vec<ManagedFieldsEntry>,
    applied: Value,
    message: &'static str,
    conflicts: Vec<(&'static str, &'static str)>,
}

#[test]
fn conflict_table() {
    let cases = vec![
        ConflictCase {
            name: "client-side-apply owns the changed value",
            live: widget(json!({"replicas": 1})),
            managed: vec![csa(json!({"f:spec": {".": {}, "f:replicas": {}}}))],
            applied: widget(json!({"replicas": 2})),
            message: "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .spec.replicas",
            conflicts: vec![(CSA, ".spec.replicas")],
        },
        ConflictCase {
            name: "two fields of one manager",
            live: widget(json!({"a": "1", "b": "1"})),
            managed: vec![entry("mgr", "Update", NOW, json!({"f:spec": {"f:a": {}, "f:b": {}}}))],
            applied: widget(json!({"a": "2", "b": "2"})),
            message: "Apply failed with 2 conflicts: conflicts with \"mgr\" using v1:\n- .spec.a\n- .spec.b",
            conflicts: vec![("mgr", ".spec.a"), ("mgr", ".spec.b")],
        },
        ConflictCase {
            name: "several managers, appliers without version",
            live: widget(json!({"a": "1", "b": "1", "replicas": 1})),
            managed: vec![
                entry("zeta", "Apply", NOW, json!({"f:spec": {"f:b": {}}})),
                entry("alpha", "Update", NOW, json!({"f:spec": {"f:a": {}, "f:replicas": {}}})),
            ],
            applied: widget(json!({"a": "2", "b": "2", "replicas": 2})),
            message: "Apply failed with 3 conflicts: conflicts with \"alpha\" using v1:\n- .spec.a\n- .spec.replicas\nconflicts with \"zeta\":\n- .spec.b",
            conflicts: vec![("alpha", ".spec.a"), ("alpha", ".spec.replicas"), ("zeta", ".spec.b")],
        },
        ConflictCase {
            name: "list-map element field",
            live: widget(json!({"items": [{"name": "a", "value": "1"}]})),
            managed: vec![csa(json!({"f:spec": {"f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:value": {}}}}}))],
            applied: widget(json!({"items": [{"name": "a", "value": "2"}]})),
            message: "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .spec.items[name=\"a\"].value",
            conflicts: vec![(CSA, ".spec.items[name=\"a\"].value")],
        },
        ConflictCase {
            name: "free-form data key",
            live: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"key": "a"}}),
            managed: vec![csa(json!({"f:data": {".": {}, "f:key": {}}}))],
            applied: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"key": "b"}}),
            message: "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .data.key",
            conflicts: vec![(CSA, ".data.key")],
        },
        ConflictCase {
            name: "label value",
            live: json!({"metadata": {"name": "w", "labels": {"app": "a"}}}),
            managed: vec![csa(json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}))],
            applied: json!({"metadata": {"name": "w", "labels": {"app": "b"}}}),
            message: "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .metadata.labels.app",
            conflicts: vec![(CSA, ".metadata.labels.app")],
        },
        ConflictCase {
            name: "atomic list and atomic map",
            live: widget(json!({"args": ["a"], "selector": {"a": "1"}})),
            managed: vec![csa(json!({"f:spec": {"f:args": {}, "f:selector": {}}}))],
            applied: widget(json!({"args": ["b"], "selector": {"a": "1", "b": "2"}})),
            message: "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using v1:\n- .spec.args\n- .spec.selector",
            conflicts: vec![(CSA, ".spec.args"), (CSA, ".spec.selector")],
        },
        ConflictCase {
            name: "status subresource owner",
            live: widget(json!({"a": "1"})),
            managed: vec![ManagedFieldsEntry {
                subresource: Some("status".into()),
                ..entry("ctrl", "Update", NOW, json!({"f:spec": {"f:a": {}}}))
            }],
            applied: widget(json!({"a": "2"})),
            message: "Apply failed with 1 conflict: conflict with \"ctrl\" with subresource \"status\" using v1: .spec.a",
            conflicts: vec![("ctrl", ".spec.a")],
        },
    ];
    for case in cases {
        let out = apply(
            Some(&case.live),
            &case.applied,
            case.managed,
            "kubectl",
            false,
            "v1",
            None,
            &schema(),
            LATER,
        );
        let err = out.expect_err(case.name);
        assert_eq!(err.message(), case.message, "{}", case.name);
        let got: Vec<(&str, &str)> = err
            .conflicts
            .iter()
            .map(|(m, p)| (m.as_str(), p.as_str()))
            .collect();
        assert_eq!(got, case.conflicts, "{}", case.name);
    }
}

#[test]
fn conflict_causes_and_status() {
    let err = apply(
        Some(&widget(json!({"replicas": 1}))),
        &widget(json!({"replicas": 2})),
        vec![csa(json!({"f:spec": {"f:replicas": {}}}))],
        "kubectl",
        false,
        "v1",
        None,
        &schema(),
        LATER,
    )
    .unwrap_err();
    assert_eq!(
        err.causes(),
        vec![(
            "FieldManagerConflict".to_string(),
            "conflict with \"kubectl-client-side-apply\" using v1".to_string(),
            ".spec.replicas".to_string()
        )]
    );
    let status = err.status();
    assert_eq!(status["code"], 409);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["message"], err.message());
    assert_eq!(status["details"]["causes"][0]["field"], ".spec.replicas");
    assert_eq!(err.to_string(), err.message());
}

#[test]
fn reapply_is_a_noop_and_keeps_time() {
    let config =
        widget(json!({"replicas": 1, "tags": ["a"], "items": [{"name": "a", "value": "1"}]}));
    let (live, managed) = apply(
        None,
        &config,
        vec![],
        "kubectl",
        false,
        "v1",
        None,
        &schema(),
        NOW,
    )
    .unwrap();
    assert_eq!(managed[0].time.as_deref(), Some(NOW));
    let (again, managed_again) = apply(
        Some(&live),
        &config,
        managed.clone(),
        "kubectl",
        false,
        "v1",
        None,
        &schema(),
        LATER,
    )
    .unwrap();
    assert_eq!(again, live);
    assert_eq!(managed_again, managed);
}

#[test]
fn changing_apply_restamps_time_and_update_then_apply_round_trip() {
    let created = widget(json!({"replicas": 1}));
    let managed = record_update(None, &created, vec![], CSA, "v1", None, &schema(), NOW);
    assert_eq!(
        managed[0].fields_v1,
        json!({"f:spec": {".": {}, "f:replicas": {}}})
    );
    // Taking over with force, then a conflict-free re-apply with a new value.
    let (live, managed) = apply(
        Some(&created),
        &widget(json!({"replicas": 2})),
        managed,
        "kubectl",
        true,
        "v1",
        None,
        &schema(),
        NOW,
    )
    .unwrap();
    // The creator keeps owning the `.spec` node it created.
    assert_eq!(
        summary(&managed),
        expect(&[
            ("kubectl", "Apply", json!({"f:spec": {"f:replicas": {}}})),
            (CSA, "Update", json!({"f:spec": {}})),
        ])
    );
    let (live, managed) = apply(
        Some(&live),
        &widget(json!({"replicas": 5})),
        managed,
        "kubectl",
        false,
        "v1",
        None,
        &schema(),
        LATER,
    )
    .unwrap();
    assert_eq!(live["spec"]["replicas"], 5);
    assert_eq!(managed[0].time.as_deref(), Some(LATER));
}

#[test]
fn apply_ignores_managed_fields_in_the_body_and_sorts_entries() {
    let live = widget(json!({"a": "1"}));
    let mut body = widget(json!({"b": "2"}));
    body["metadata"]["managedFields"] = json!([{"manager": "evil"}]);
    let (object, managed) = apply(
        Some(&live),
        &body,
        vec![entry(
            "late",
            "Update",
            LATER,
            json!({"f:spec": {"f:a": {}}}),
        )],
        "kubectl",
        false,
        "v1",
        None,
        &schema(),
        NOW,
    )
    .unwrap();
    assert!(object["metadata"].get("managedFields").is_none());
    let ops: Vec<&str> = managed.iter().map(|e| e.operation.as_str()).collect();
    assert_eq!(ops, ["Apply", "Update"], "Apply entries sort first");
}
