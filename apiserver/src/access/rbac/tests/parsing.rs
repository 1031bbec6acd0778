//! Label selectors, aggregation edge cases and robustness.

use serde_json::json;

use super::*;
use crate::access::rbac::selector::selector_matches;

#[test]
fn label_selectors() {
    let labels: std::collections::BTreeMap<String, String> = [
        ("a".to_string(), "1".to_string()),
        ("b".to_string(), "2".to_string()),
    ]
    .into();
    let cases = [
        (json!({}), true),
        (json!(null), false),
        (json!({"matchLabels": {"a": "1"}}), true),
        (json!({"matchLabels": {"a": "2"}}), false),
        (json!({"matchLabels": {"a": "1", "c": "3"}}), false),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "9"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "z", "operator": "NotIn", "values": ["1"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "In", "values": []}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "Bogus"}]}),
            false,
        ),
        (
            json!({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}),
            true,
        ),
    ];
    for (sel, want) in cases {
        assert_eq!(selector_matches(&sel, &labels), want, "{sel}");
    }
}

#[test]
fn aggregation_edge_cases() {
    let crs = vec![
        // nested aggregation: top aggregates mid, which aggregates leaf
        aggregated("top", json!([{"matchLabels": {"level": "top"}}]), json!([])),
        json!({"metadata": {"name": "mid", "labels": {"level": "top"}},
               "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"level": "mid"}}]}}),
        cluster_role(
            "leaf",
            json!({"level": "mid"}),
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        ),
        // cycle: a <-> b
        json!({"metadata": {"name": "a", "labels": {"cyc": "b"}}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"cyc": "a"}}]},
               "rules": [{"apiGroups": [""], "resources": ["a"], "verbs": ["get"]}]}),
        json!({"metadata": {"name": "b", "labels": {"cyc": "a"}}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"cyc": "b"}}]},
               "rules": [{"apiGroups": [""], "resources": ["b"], "verbs": ["get"]}]}),
        // self-match is excluded
        aggregated("self", json!([{}]), json!([])),
    ];
    let p = RbacPolicy::from_objects(&[], &crs, &[], &[]);
    assert_eq!(p.cluster_role("top").map(<[PolicyRule]>::len), Some(1));
    assert!(p.cluster_role("a").is_some_and(|r| !r.is_empty()));
    let all_self = p.cluster_role("self").unwrap_or_default();
    assert!(all_self.iter().any(|r| r.resources == ["pods"]));
}

#[test]
fn malformed_input_never_panics() {
    let junk = vec![
        json!(null),
        json!(42),
        json!("x"),
        json!({"metadata": {"name": 5}}),
        json!({"metadata": {"name": "r", "namespace": "n"}, "rules": [null, 1, {"verbs": "get"}, {"verbs": [1, "get"], "resources": ["pods"], "apiGroups": [""]}]}),
        json!({"metadata": {"name": "c"}, "aggregationRule": {"clusterRoleSelectors": [null, 3, {"matchExpressions": "x"}]}}),
        json!({"metadata": {"name": "b", "namespace": "n"}, "subjects": [null, {"kind": 1}, {"kind": "User", "name": "u"}], "roleRef": {"kind": "Role", "name": "r"}}),
        json!({"metadata": {"name": "crb"}, "subjects": "nope", "roleRef": null}),
    ];
    let p = RbacPolicy::from_objects(&junk, &junk, &junk, &junk);
    let d = p.authorize(&res(u("u", &[]), "get", "", "pods", "", "", "n"));
    assert_eq!(d, Decision::Allow);
    let _ = p.rules_for(&u("u", &[]), Some("n"));
    let _ = check_escalation(&u("u", &[]), &p, Some("n"), &[PolicyRule::default()]);
    assert!(Attributes::from_access_review_spec(u("u", &[]), &json!(null)).is_none());
}

#[test]
fn access_review_spec_parsing() {
    let user = u("jane", &[]);
    let spec = json!({"resourceAttributes": {"namespace": "default", "verb": "get", "group": "", "resource": "pods", "subresource": "log", "name": "p"}});
    let attrs = Attributes::from_access_review_spec(user.clone(), &spec);
    assert_eq!(
        attrs,
        Some(res(user.clone(), "get", "", "pods", "log", "p", "default"))
    );
    let spec = json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}});
    let attrs = Attributes::from_access_review_spec(user.clone(), &spec);
    assert_eq!(
        attrs,
        Some(Attributes::non_resource(user, "get", "/healthz"))
    );
}
