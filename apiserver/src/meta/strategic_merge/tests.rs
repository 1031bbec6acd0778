//! Unit tests for the parent module.

use super::*;
use serde_json::json;

fn cm() -> MergeKeys {
    merge_keys_for("", "ConfigMap")
}

fn ok(original: Value, patch: Value, mk: &MergeKeys) -> Value {
    apply(&original, &patch, mk).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn kubectl_label_patch() {
    let original = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"x": "y"}}, "data": {"k": "v"}});
    let got = ok(original, json!({"metadata": {"labels": {"a": "b"}}}), &cm());
    assert_eq!(
        got,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"x": "y", "a": "b"}}, "data": {"k": "v"}})
    );
}

#[test]
fn kubectl_label_removal_and_creation() {
    let original = json!({"metadata": {"name": "c", "labels": {"x": "y", "a": "b"}}});
    let got = ok(
        original,
        json!({"metadata": {"labels": {"a": null}}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"name": "c", "labels": {"x": "y"}}})
    );
    // labels map did not exist yet
    let got = ok(
        json!({"metadata": {"name": "c"}}),
        json!({"metadata": {"labels": {"a": "b", "gone": null}}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"name": "c", "labels": {"a": "b"}}})
    );
}

#[test]
fn kubectl_apply_configmap_patch() {
    let original = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "default", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{old}", "other": "x"}},
        "data": {"k": "v1", "old": "o", "keep": "k"}
    });
    let patch = json!({
        "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"v2\"}}\n"}},
        "data": {"k": "v2", "old": null}
    });
    let got = ok(original, patch, &cm());
    assert_eq!(
        got,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"v2\"}}\n", "other": "x"}},
            "data": {"k": "v2", "keep": "k"}
        })
    );
}

#[test]
fn null_deletes_and_missing_null_ignored() {
    let got = ok(
        json!({"a": 1, "b": {"c": 2}}),
        json!({"a": null, "b": null, "z": null}),
        &cm(),
    );
    assert_eq!(got, json!({}));
}

#[test]
fn scalars_and_type_changes_replace() {
    let got = ok(
        json!({"a": 1, "b": "s", "c": {"x": 1}, "d": [1, 2]}),
        json!({"a": "one", "b": {"n": 1, "m": null}, "c": 5, "d": {"k": "v"}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"a": "one", "b": {"n": 1}, "c": 5, "d": {"k": "v"}})
    );
}

#[test]
fn plain_lists_replace() {
    let ns = merge_keys_for("", "Namespace");
    let got = ok(
        json!({"spec": {"finalizers": ["kubernetes", "x"]}}),
        json!({"spec": {"finalizers": ["y"]}}),
        &ns,
    );
    assert_eq!(got, json!({"spec": {"finalizers": ["y"]}}));
    let sa = merge_keys_for("", "ServiceAccount");
    let got = ok(
        json!({"imagePullSecrets": [{"name": "a"}, {"name": "b"}]}),
        json!({"imagePullSecrets": [{"name": "c"}]}),
        &sa,
    );
    assert_eq!(got, json!({"imagePullSecrets": [{"name": "c"}]}));
}

#[test]
fn finalizers_union_without_order_directive() {
    // patch items lead unless the live list orders them
    let got = ok(
        json!({"metadata": {"finalizers": ["a", "b"]}}),
        json!({"metadata": {"finalizers": ["c"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["c", "a", "b"]}}));
    let got = ok(
        json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
        json!({"metadata": {"finalizers": ["b", "d"]}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"finalizers": ["a", "b", "d", "c"]}})
    );
    let got = ok(
        json!({"metadata": {"finalizers": ["a"]}}),
        json!({"metadata": {"finalizers": ["a", "a"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["a"]}}));
}

#[test]
fn finalizers_with_set_element_order_kubectl_129() {
    let original = json!({"metadata": {"name": "c", "finalizers": ["a", "b"]}});
    let patch =
        json!({"metadata": {"$setElementOrder/finalizers": ["a", "b", "c"], "finalizers": ["c"]}});
    let got = ok(original, patch, &cm());
    assert_eq!(
        got,
        json!({"metadata": {"name": "c", "finalizers": ["a", "b", "c"]}})
    );
}

#[test]
fn set_element_order_with_deletions_design_example() {
    // live list reordered by the server, user removes c and adds f
    let original = json!({"metadata": {"finalizers": ["b", "e", "a", "c", "d"]}});
    let patch = json!({"metadata": {
        "$setElementOrder/finalizers": ["a", "b", "f"],
        "$deleteFromPrimitiveList/finalizers": ["c"],
        "finalizers": ["f"]
    }});
    let got = ok(original, patch, &cm());
    let list = got["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // every wanted item present, c gone, a before b before f
    assert_eq!(list.len(), 5);
    assert!(!list.contains(&json!("c")));
    let pos = |s: &str| list.iter().position(|v| v == s).unwrap_or(usize::MAX);
    assert!(pos("a") < pos("b") && pos("b") < pos("f"));
    assert!(pos("e") < pos("a"));
    assert!(got["metadata"].get("$setElementOrder/finalizers").is_none());
    assert!(got["metadata"]
        .get("$deleteFromPrimitiveList/finalizers")
        .is_none());
}

#[test]
fn set_element_order_only_reorders() {
    let got = ok(
        json!({"metadata": {"finalizers": ["b", "a"]}}),
        json!({"metadata": {"$setElementOrder/finalizers": ["a", "b"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["a", "b"]}}));
    // ordered items follow the directive; server-only items keep their live position where
    // the live list relates them (an order entry that does not exist is ignored)
    let got = ok(
        json!({"metadata": {"finalizers": ["c", "b", "d", "a", "e"]}}),
        json!({"metadata": {"$setElementOrder/finalizers": ["z", "a", "b"], "finalizers": ["a", "b"]}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"finalizers": ["c", "d", "a", "b", "e"]}})
    );
    // neither list exists: directive silently dropped
    let got = ok(
        json!({"metadata": {}}),
        json!({"metadata": {"$setElementOrder/finalizers": ["a"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {}}));
    // list added from scratch
    let got = ok(
        json!({"metadata": {}}),
        json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"], "finalizers": ["a", "b"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["b", "a"]}}));
}

#[test]
fn delete_from_primitive_list() {
    let got = ok(
        json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "zz"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["a", "c"]}}));
    let got = ok(
        json!({"metadata": {}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {}}));
    assert_eq!(
        apply(
            &json!({"metadata": {"finalizers": ["a"]}}),
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            &cm()
        ),
        Err(PatchError::BadPrimitiveList)
    );
}

#[test]
fn owner_references_merge_by_uid() {
    let original = json!({"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "1"},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "b", "uid": "2"}
    ]}});
    let patch = json!({"metadata": {"ownerReferences": [
        {"uid": "2", "controller": true},
        {"apiVersion": "v1", "kind": "Secret", "name": "c", "uid": "3"}
    ]}});
    let got = ok(original, patch, &cm());
    assert_eq!(
        got,
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "1"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "b", "uid": "2", "controller": true},
            {"apiVersion": "v1", "kind": "Secret", "name": "c", "uid": "3"}
        ]}})
    );
}

#[test]
fn owner_references_delete_and_replace_directives() {
    let original = json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}, {"uid": "2", "name": "b"}]}});
    let got = ok(
        original.clone(),
        json!({"metadata": {"ownerReferences": [{"uid": "1", "$patch": "delete"}]}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]}})
    );
    let got = ok(
        original.clone(),
        json!({"metadata": {"ownerReferences": [{"$patch": "replace"}, {"uid": "9", "name": "z"}]}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"ownerReferences": [{"uid": "9", "name": "z"}]}})
    );
    let got = ok(
        original.clone(),
        json!({"metadata": {"ownerReferences": [{"uid": "1", "$patch": "merge", "x": 1}]}}),
        &cm(),
    );
    assert_eq!(
        got["metadata"]["ownerReferences"][0],
        json!({"uid": "1", "name": "a", "x": 1})
    );
    assert!(matches!(
        apply(
            &original,
            &json!({"metadata": {"ownerReferences": [{"$patch": "delete"}]}}),
            &cm()
        ),
        Err(PatchError::NoMergeKey { .. })
    ));
    let e = apply(
        &original,
        &json!({"metadata": {"ownerReferences": [{"name": "x"}]}}),
        &cm(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "map: {\"name\":\"x\"} does not contain declared merge key: uid"
    );
    assert!(matches!(
        apply(
            &original,
            &json!({"metadata": {"ownerReferences": [{"uid": "1", "$patch": "bogus"}]}}),
            &cm()
        ),
        Err(PatchError::BadPatchType { .. })
    ));
}

#[test]
fn owner_references_set_element_order() {
    let original = json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}, {"uid": "1", "name": "a"}, {"uid": "3", "name": "s"}]}});
    let patch = json!({"metadata": {
        "$setElementOrder/ownerReferences": [{"uid": "1"}, {"uid": "2"}, {"uid": "4"}],
        "ownerReferences": [{"uid": "4", "name": "d"}]
    }});
    let got = ok(original, patch, &cm());
    let uids: Vec<&str> = got["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| a.iter().filter_map(|o| o["uid"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(uids, vec!["1", "2", "4", "3"]);
}

#[test]
fn service_account_secrets_merge_by_name() {
    let sa = merge_keys_for("", "ServiceAccount");
    let got = ok(
        json!({"secrets": [{"name": "a"}, {"name": "b"}]}),
        json!({"secrets": [{"name": "c"}, {"name": "a", "$patch": "delete"}]}),
        &sa,
    );
    assert_eq!(got, json!({"secrets": [{"name": "c"}, {"name": "b"}]}));
}

#[test]
fn namespace_conditions_merge_by_type() {
    let ns = merge_keys_for("", "Namespace");
    let got = ok(
        json!({"status": {"phase": "Active", "conditions": [{"type": "A", "status": "True"}]}}),
        json!({"status": {"conditions": [{"type": "A", "status": "False"}]}}),
        &ns,
    );
    assert_eq!(
        got,
        json!({"status": {"phase": "Active", "conditions": [{"type": "A", "status": "False"}]}})
    );
}

#[test]
fn map_directives() {
    let got = ok(
        json!({"data": {"a": "1", "b": "2"}}),
        json!({"data": {"$patch": "replace", "c": "3", "d": null}}),
        &cm(),
    );
    assert_eq!(got, json!({"data": {"c": "3"}}));
    let got = ok(
        json!({"data": {"a": "1"}, "x": 1}),
        json!({"data": {"$patch": "delete"}}),
        &cm(),
    );
    assert_eq!(got, json!({"data": {}, "x": 1}));
    let got = ok(
        json!({"data": {"a": "1"}}),
        json!({"data": {"$patch": "merge", "b": "2"}}),
        &cm(),
    );
    assert_eq!(got, json!({"data": {"a": "1", "b": "2"}}));
    let got = ok(json!({"a": 1}), json!({"$patch": "replace", "b": 2}), &cm());
    assert_eq!(got, json!({"b": 2}));
    let e = apply(
        &json!({"data": {}}),
        &json!({"data": {"$patch": "nope"}}),
        &cm(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown patch type: nope in map: {\"$patch\":\"nope\"}"
    );
    // directives in brand-new values are applied too
    let got = ok(
        json!({}),
        json!({"data": {"$patch": "replace", "a": "1"}}),
        &cm(),
    );
    assert_eq!(got, json!({"data": {"a": "1"}}));
}

#[test]
fn retain_keys() {
    let got = ok(
        json!({"spec": {"a": 1, "b": 2, "c": 3}}),
        json!({"spec": {"$retainKeys": ["a", "d"], "d": 4, "gone": null}}),
        &cm(),
    );
    assert_eq!(got, json!({"spec": {"a": 1, "d": 4}}));
    assert_eq!(
        apply(
            &json!({"spec": {}}),
            &json!({"spec": {"$retainKeys": ["a"], "b": 1}}),
            &cm()
        ),
        Err(PatchError::BadRetainKeys)
    );
    assert_eq!(
        apply(
            &json!({"spec": {}}),
            &json!({"spec": {"$retainKeys": "a"}}),
            &cm()
        ),
        Err(PatchError::BadRetainKeys)
    );
}

#[test]
fn new_lists_are_cleaned() {
    let got = ok(
        json!({"metadata": {}}),
        json!({"metadata": {"ownerReferences": [{"uid": "1", "x": null}, {"uid": "2", "$patch": "delete"}]}}),
        &cm(),
    );
    assert_eq!(
        got,
        json!({"metadata": {"ownerReferences": [{"uid": "1"}]}})
    );
    let got = ok(
        json!({"items": [1]}),
        json!({"items": [{"$patch": "replace"}, {"a": null, "b": 1}]}),
        &cm(),
    );
    assert_eq!(got, json!({"items": [{"b": 1}]}));
}

#[test]
fn scalar_list_replace_directive() {
    let got = ok(
        json!({"metadata": {"finalizers": ["a", "b"]}}),
        json!({"metadata": {"finalizers": [{"$patch": "replace"}, "c"]}}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata": {"finalizers": ["c"]}}));
}

#[test]
fn errors() {
    assert!(matches!(
        apply(&json!({}), &json!([1]), &cm()),
        Err(PatchError::NotAnObject(_))
    ));
    assert!(matches!(
        apply(&json!("s"), &json!({}), &cm()),
        Err(PatchError::NotAnObject(_))
    ));
    assert_eq!(ok(Value::Null, json!({"a": 1}), &cm()), json!({"a": 1}));
    assert_eq!(
        apply(
            &json!({"metadata": {"finalizers": [["a"]]}}),
            &json!({"metadata": {"finalizers": ["b"]}}),
            &cm()
        ),
        Err(PatchError::ListOfLists)
    );
    assert!(matches!(
        apply(
            &json!({"metadata": {"finalizers": ["a"]}}),
            &json!({"metadata": {"finalizers": [{"x": 1}]}}),
            &cm()
        ),
        Err(PatchError::MixedListTypes(_))
    ));
    let mk = MergeKeys::new().with("list", FieldStrategy::MergePrimitives);
    assert_eq!(
        apply(
            &json!({"list": [{"a": 1}]}),
            &json!({"list": [{"a": 2}]}),
            &mk
        ),
        Err(PatchError::MergeWithoutKey("list".into()))
    );
    assert_eq!(
        apply(
            &json!({"metadata": {}}),
            &json!({"metadata": {"$setElementOrder/finalizers": "x"}}),
            &cm()
        ),
        Err(PatchError::BadSetElementOrder)
    );
}

#[test]
fn replace_strategy_for_maps() {
    let mk = MergeKeys::new().with("spec.selector", FieldStrategy::Replace);
    let got = ok(
        json!({"spec": {"selector": {"a": "1"}, "other": {"x": 1}}}),
        json!({"spec": {"selector": {"b": "2"}, "other": {"y": 2}}}),
        &mk,
    );
    assert_eq!(
        got,
        json!({"spec": {"selector": {"b": "2"}, "other": {"x": 1, "y": 2}}})
    );
}

#[test]
fn merge_key_table() {
    let mk = merge_keys_for("", "ConfigMap");
    let p = |s: &str| s.split('.').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        mk.lookup(&p("metadata.ownerReferences")),
        Some(&FieldStrategy::MergeByKey("uid".into()))
    );
    assert_eq!(
        mk.lookup(&p("metadata.finalizers")),
        Some(&FieldStrategy::MergePrimitives)
    );
    assert_eq!(mk.lookup(&p("data")), None);
    let sa = merge_keys_for("", "ServiceAccount");
    assert_eq!(
        sa.lookup(&p("secrets")),
        Some(&FieldStrategy::MergeByKey("name".into()))
    );
    assert_eq!(sa.lookup(&p("imagePullSecrets")), None);
    for (g, k) in [
        ("", "Secret"),
        ("", "Event"),
        ("events.k8s.io", "Event"),
        ("coordination.k8s.io", "Lease"),
        ("", "Namespace"),
    ] {
        assert_eq!(
            merge_keys_for(g, k).lookup(&p("metadata.finalizers")),
            Some(&FieldStrategy::MergePrimitives)
        );
    }
    let mut m = MergeKeys::new();
    m.insert("a", FieldStrategy::Replace);
    m.insert("a", FieldStrategy::MergePrimitives);
    assert_eq!(m.lookup(&p("a")), Some(&FieldStrategy::MergePrimitives));
    // a key containing dots is not confused with a nested path
    let got = ok(
        json!({"metadata.finalizers": ["a"]}),
        json!({"metadata.finalizers": ["b"]}),
        &cm(),
    );
    assert_eq!(got, json!({"metadata.finalizers": ["b"]}));
}

#[test]
fn event_and_lease_patches() {
    let lease = merge_keys_for("coordination.k8s.io", "Lease");
    let got = ok(
        json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2024-01-01T00:00:00.000000Z"}}),
        json!({"spec": {"holderIdentity": "b", "renewTime": "2024-01-01T00:00:10.000000Z"}}),
        &lease,
    );
    assert_eq!(
        got,
        json!({"spec": {"holderIdentity": "b", "leaseDurationSeconds": 15, "renewTime": "2024-01-01T00:00:10.000000Z"}})
    );
    let ev = merge_keys_for("", "Event");
    let got = ok(
        json!({"count": 1, "series": {"count": 2}, "involvedObject": {"kind": "Pod", "name": "p"}}),
        json!({"count": 2, "series": {"lastObservedTime": "t"}}),
        &ev,
    );
    assert_eq!(
        got,
        json!({"count": 2, "series": {"count": 2, "lastObservedTime": "t"}, "involvedObject": {"kind": "Pod", "name": "p"}})
    );
}

/// Long lists merge in linear time: 100,000 live finalizers and 100,000 patched ones (with an
/// overlap) finish at once; the quadratic lookups this replaced needed about 10^10 comparisons
/// here, minutes of one core held by one request.
#[test]
fn long_lists_merge_in_linear_time() {
    let live: Vec<String> = (0..100_000).map(|i| format!("f{i}")).collect();
    let patch: Vec<String> = (50_000..150_000).map(|i| format!("f{i}")).collect();
    let original = json!({"metadata": {"name": "x", "finalizers": live,
        "ownerReferences": (0..50_000).map(|i| json!({"uid": format!("u{i}"), "name": "a"})).collect::<Vec<_>>()}});
    let p = json!({"metadata": {"finalizers": patch,
        "ownerReferences": (25_000..75_000).map(|i| json!({"uid": format!("u{i}"), "name": "b"})).collect::<Vec<_>>()}});
    let merged = apply(&original, &p, &MergeKeys::object_meta()).expect("merge");
    let finalizers = merged["metadata"]["finalizers"]
        .as_array()
        .expect("finalizers");
    assert_eq!(finalizers.len(), 150_000);
    let owners = merged["metadata"]["ownerReferences"]
        .as_array()
        .expect("owners");
    assert_eq!(owners.len(), 75_000);
    assert_eq!(owners.iter().filter(|o| o["name"] == "b").count(), 50_000);
}
