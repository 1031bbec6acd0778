//! Edge cases: formatting helpers, orderings, subresources, metadata lists, legacy
//! objects and deep inputs.

use serde_json::{json, Value};

use super::{entry, expect, schema, summary, widget, LATER, NOW};
use crate::meta::apply::path::{compare_values, go_float, go_quote};
use crate::meta::apply::*;

fn apply_as(
    live: Option<&Value>,
    applied: &Value,
    managed: Vec<ManagedFieldsEntry>,
    manager: &str,
    force: bool,
) -> Result<(Value, Vec<ManagedFieldsEntry>), ApplyConflicts> {
    apply(
        live,
        applied,
        managed,
        manager,
        force,
        "v1",
        None,
        &schema(),
        LATER,
    )
}

#[test]
fn dot_alone_decodes_to_a_member() {
    let set = FieldSet::from_fields_v1(&json!({"f:spec": {".": {}}})).unwrap();
    assert!(set.contains(&[PathElement::Field("spec".into())]));
    assert_eq!(set.to_fields_v1(), json!({"f:spec": {}}));
}

#[test]
fn go_float_formatting() {
    let cases = [
        (1.5, "1.5"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (123456.0, "123456"),
        (1234567.0, "1.234567e+06"),
        (-2.25, "-2.25"),
        (1e21, "1e+21"),
    ];
    for (f, s) in cases {
        assert_eq!(go_float(f), s, "{f}");
    }
}

#[test]
fn go_quote_escapes() {
    assert_eq!(go_quote("plain"), "\"plain\"");
    assert_eq!(go_quote("tab\there"), "\"tab\\there\"");
    assert_eq!(go_quote("\u{1}"), "\"\\x01\"");
    assert_eq!(go_quote("ünïcode"), "\"ünïcode\"");
}

#[test]
fn element_and_value_order() {
    let field = PathElement::Field("z".into());
    let key = PathElement::Key(vec![("a".into(), json!(1))]);
    let value = PathElement::Value(json!("a"));
    let index = PathElement::Index(0);
    assert!(field < key && key < value && value < index);
    let ordered = [
        json!(1),
        json!(2.5),
        json!("a"),
        json!(false),
        json!([1]),
        json!({"a": 1}),
        Value::Null,
    ];
    for pair in ordered.windows(2) {
        assert_eq!(
            compare_values(&pair[0], &pair[1]),
            std::cmp::Ordering::Less,
            "{pair:?}"
        );
    }
}

#[test]
fn conflict_paths_list_members_before_children() {
    let live = widget(json!({"template": {"image": "a"}, "zeta": "1"}));
    let managed = vec![entry(
        "m",
        "Update",
        NOW,
        json!({"f:spec": {"f:template": {"f:image": {}}, "f:zeta": {}}}),
    )];
    let err = apply_as(
        Some(&live),
        &widget(json!({"template": {"image": "b"}, "zeta": "2"})),
        managed,
        "kubectl",
        false,
    )
    .unwrap_err();
    assert_eq!(
        err.message(),
        "Apply failed with 2 conflicts: conflicts with \"m\" using v1:\n- .spec.zeta\n- .spec.template.image"
    );
}

#[test]
fn own_update_entry_is_another_manager() {
    let live = widget(json!({"a": "1"}));
    let managed = vec![entry(
        "kubectl",
        "Update",
        NOW,
        json!({"f:spec": {"f:a": {}}}),
    )];
    let err = apply_as(
        Some(&live),
        &widget(json!({"a": "2"})),
        managed,
        "kubectl",
        false,
    )
    .unwrap_err();
    assert_eq!(
        err.conflicts,
        vec![("kubectl".to_string(), ".spec.a".to_string())]
    );
}

#[test]
fn apply_entries_are_per_subresource() {
    let live = json!({"spec": {"a": "1"}, "status": {"phase": "A"}});
    let managed = vec![entry("ctrl", "Apply", NOW, json!({"f:spec": {"f:a": {}}}))];
    let (object, entries) = apply(
        Some(&live),
        &json!({"status": {"phase": "B"}}),
        managed,
        "ctrl",
        false,
        "v1",
        Some("status"),
        &schema(),
        LATER,
    )
    .unwrap();
    assert_eq!(
        object,
        json!({"spec": {"a": "1"}, "status": {"phase": "B"}}),
        "main-resource apply set untouched"
    );
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].subresource.as_deref(), Some("status"));
    assert_eq!(entries[1].fields_v1, json!({"f:status": {"f:phase": {}}}));
}

#[test]
fn two_appliers_share_and_one_leaves() {
    let config = widget(json!({"a": "1"}));
    let (live, managed) = apply_as(None, &config, vec![], "one", false).unwrap();
    let (live, managed) = apply_as(Some(&live), &config, managed, "two", false).unwrap();
    assert_eq!(managed.len(), 2, "shared ownership");
    let (live, managed) = apply_as(Some(&live), &widget(json!({})), managed, "one", false).unwrap();
    assert_eq!(live["spec"]["a"], "1", "still owned by two");
    let (live, managed) = apply_as(Some(&live), &widget(json!({})), managed, "two", false).unwrap();
    assert_eq!(live["spec"], json!({}), "nobody owns it any more");
    assert_eq!(
        summary(&managed),
        expect(&[
            ("one", "Apply", json!({"f:spec": {}})),
            ("two", "Apply", json!({"f:spec": {}}))
        ])
    );
}

#[test]
fn force_takes_from_several_managers() {
    let live = widget(json!({"a": "1", "b": "1"}));
    let managed = vec![
        entry("x", "Update", NOW, json!({"f:spec": {"f:a": {}}})),
        entry("y", "Apply", NOW, json!({"f:spec": {"f:b": {}}})),
    ];
    let (object, entries) = apply_as(
        Some(&live),
        &widget(json!({"a": "2", "b": "2"})),
        managed,
        "kubectl",
        true,
    )
    .unwrap();
    assert_eq!(object["spec"], json!({"a": "2", "b": "2"}));
    assert_eq!(
        summary(&entries),
        expect(&[(
            "kubectl",
            "Apply",
            json!({"f:spec": {"f:a": {}, "f:b": {}}})
        )])
    );
}

#[test]
fn set_element_no_longer_applied_is_removed() {
    let live = widget(json!({"tags": ["a", "b", "c"]}));
    let managed = vec![
        entry(
            "kubectl",
            "Apply",
            NOW,
            json!({"f:spec": {"f:tags": {"v:\"a\"": {}, "v:\"b\"": {}}}}),
        ),
        entry(
            "other",
            "Update",
            NOW,
            json!({"f:spec": {"f:tags": {"v:\"c\"": {}}}}),
        ),
    ];
    let (object, _) = apply_as(
        Some(&live),
        &widget(json!({"tags": ["a"]})),
        managed,
        "kubectl",
        false,
    )
    .unwrap();
    assert_eq!(object["spec"]["tags"], json!(["a", "c"]));
}

#[test]
fn finalizers_and_owner_references_merge() {
    let live = json!({"metadata": {"name": "w", "finalizers": ["x"],
        "ownerReferences": [{"uid": "1", "name": "a", "kind": "K"}]}});
    let applied = json!({"metadata": {"name": "w", "finalizers": ["y"],
        "ownerReferences": [{"uid": "2", "name": "b"}, {"uid": "1", "name": "a"}]}});
    let (object, entries) = apply_as(Some(&live), &applied, vec![], "kubectl", false).unwrap();
    assert_eq!(object["metadata"]["finalizers"], json!(["x", "y"]));
    assert_eq!(
        object["metadata"]["ownerReferences"],
        json!([{"uid": "1", "name": "a", "kind": "K"}, {"uid": "2", "name": "b"}])
    );
    assert_eq!(
        entries[0].fields_v1,
        json!({"f:metadata": {"f:finalizers": {"v:\"y\"": {}}, "f:ownerReferences": {
            "k:{\"uid\":\"1\"}": {".": {}, "f:name": {}, "f:uid": {}},
            "k:{\"uid\":\"2\"}": {".": {}, "f:name": {}, "f:uid": {}}}}})
    );
}

#[test]
fn dropping_all_labels_removes_the_map() {
    let live = json!({"metadata": {"name": "w", "labels": {"app": "x"}}, "spec": {"a": "1"}});
    let managed = vec![entry(
        "kubectl",
        "Apply",
        NOW,
        json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:a": {}}}),
    )];
    let (object, _) = apply_as(
        Some(&live),
        &json!({"metadata": {"name": "w"}, "spec": {"a": "1"}}),
        managed,
        "kubectl",
        false,
    )
    .unwrap();
    assert_eq!(
        object,
        json!({"metadata": {"name": "w"}, "spec": {"a": "1"}})
    );
}

#[test]
fn legacy_fields_without_owner_are_left_alone() {
    // Nobody owns `.spec.b` (object predates managedFields): apply neither conflicts nor removes it.
    let live = widget(json!({"a": "1", "b": "1"}));
    let (object, entries) = apply_as(
        Some(&live),
        &widget(json!({"a": "2"})),
        vec![],
        "kubectl",
        false,
    )
    .unwrap();
    assert_eq!(object["spec"], json!({"a": "2", "b": "1"}));
    assert_eq!(
        summary(&entries),
        expect(&[("kubectl", "Apply", json!({"f:spec": {"f:a": {}}}))])
    );
}

#[test]
fn type_change_in_update_is_owned() {
    let old = widget(json!({"free": {"x": "scalar"}}));
    let new = widget(json!({"free": {"x": {"nested": 1}}}));
    let managed = vec![entry(
        "old",
        "Update",
        NOW,
        json!({"f:spec": {"f:free": {"f:x": {}}}}),
    )];
    let out = record_update(
        Some(&old),
        &new,
        managed,
        "new",
        "v1",
        None,
        &schema(),
        LATER,
    );
    assert_eq!(
        summary(&out),
        expect(&[(
            "new",
            "Update",
            json!({"f:spec": {"f:free": {"f:x": {".": {}, "f:nested": {}}}}})
        )])
    );
}

#[test]
fn create_with_empty_spec_owns_the_empty_map() {
    let out = record_update(
        None,
        &widget(json!({})),
        vec![],
        "c",
        "v1",
        None,
        &schema(),
        NOW,
    );
    assert_eq!(
        summary(&out),
        expect(&[("c", "Update", json!({"f:spec": {}}))])
    );
}

#[test]
fn null_values_are_applied_and_owned() {
    let live = widget(json!({"a": "1"}));
    let (object, entries) = apply_as(
        Some(&live),
        &widget(json!({"a": null})),
        vec![],
        "kubectl",
        false,
    )
    .unwrap();
    assert_eq!(object["spec"], json!({"a": null}));
    assert_eq!(entries[0].fields_v1, json!({"f:spec": {"f:a": {}}}));
}

#[test]
fn message_for_hand_built_conflicts() {
    let conflicts = ApplyConflicts {
        conflicts: vec![("m".into(), ".spec.a".into())],
        managers: vec![],
    };
    assert_eq!(
        conflicts.message(),
        "Apply failed with 1 conflict: conflict with \"m\": .spec.a"
    );
    assert_eq!(conflicts.len(), 1);
    assert!(!conflicts.is_empty());
}

#[test]
fn entry_without_fields_type_decodes() {
    let e: ManagedFieldsEntry = serde_json::from_value(
        json!({"manager": "m", "operation": "Update", "fieldsV1": {"f:a": {}}}),
    )
    .unwrap();
    assert_eq!(e.fields_type, "FieldsV1");
    assert!(e.field_set().is_some());
    let other = ManagedFieldsEntry {
        fields_type: "FieldsV2".into(),
        ..e
    };
    assert!(other.field_set().is_none());
}

#[test]
fn deep_values_do_not_overflow() {
    let mut deep = json!("leaf");
    for _ in 0..400 {
        deep = json!({ "k": deep });
    }
    let object = widget(json!({"free": deep}));
    let set = FieldSet::from_object(&object, &schema());
    assert!(!set.is_empty());
    let (merged, _) = apply_as(Some(&object), &object, vec![], "kubectl", false).unwrap();
    assert_eq!(merged, object);
    let _ = record_update(None, &object, vec![], "m", "v1", None, &schema(), NOW);
    let mut nested = json!({});
    for _ in 0..300 {
        nested = json!({ "f:k": nested });
    }
    assert_eq!(
        FieldSet::from_fields_v1(&nested),
        Err(FieldsV1Error::TooDeep)
    );
}
