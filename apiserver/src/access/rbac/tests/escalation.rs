//! SelfSubjectRulesReview and escalation-prevention tables.

use serde_json::{json, Value};

use super::*;

/// (case, user, namespace, granted rules, expected result)
type RoleCase<'a> = (
    &'a str,
    UserInfo,
    Option<&'a str>,
    Vec<PolicyRule>,
    Result<(), &'a str>,
);

/// (case, user, binding namespace, role reference, expected result)
type BindingCase<'a> = (
    &'a str,
    UserInfo,
    Option<&'a str>,
    RoleRef,
    Result<(), &'a str>,
);

fn rr(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> ResourceRule {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    ResourceRule {
        verbs: v(verbs),
        api_groups: v(groups),
        resources: v(resources),
        resource_names: v(names),
    }
}

#[test]
fn rules_for_union() {
    let p = fixture();
    let jane = u("jane", &["system:authenticated"]);
    let (resource, non_resource, incomplete) = p.rules_for(&jane, Some("default"));
    assert!(!incomplete);
    assert_eq!(
        resource,
        vec![
            rr(&["get", "list", "watch"], &[""], &["pods"], &[]),
            rr(&["*"], &[""], &["secrets"], &[]),
        ]
    );
    // Role nonResourceURLs are reported (like kube) even though they never match.
    assert_eq!(non_resource.len(), 2);
    assert_eq!(
        serde_json::to_value(&non_resource[0]).unwrap_or_default(),
        json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]})
    );
    let (resource, _, _) = p.rules_for(&jane, Some("other"));
    assert!(resource.is_empty());
    let (resource, _, _) = p.rules_for(&u("alice", &[]), Some("other"));
    assert_eq!(resource.len(), 2, "cluster rules + namespace rules");

    let (_, _, incomplete) = p.rules_for(&u("ghost", &[]), None);
    assert!(incomplete);
    let status = p.rules_review_status(&u("ghost", &[]), Some("default"));
    assert_eq!(status["incomplete"], json!(true));
    assert_eq!(
        status["evaluationError"],
        json!(
            r#"[clusterrole.rbac.authorization.k8s.io "gone" not found, role.rbac.authorization.k8s.io "nope" not found]"#
        )
    );

    let (resource, non_resource, _) = p.rules_for(&u("r", &["system:masters"]), None);
    assert_eq!(resource, vec![rr(&["*"], &["*"], &["*"], &[])]);
    assert_eq!(
        serde_json::to_value(&non_resource).unwrap_or_default(),
        json!([{"verbs": ["*"], "nonResourceURLs": ["*"]}])
    );
    let named = p.rules_for(&u("d", &["devs"]), Some("default")).0;
    assert_eq!(
        serde_json::to_value(&named).unwrap_or_default(),
        json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["app-config"]}])
    );
}

fn pr(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule::from_value(
        &json!({"verbs": verbs, "apiGroups": groups, "resources": resources, "resourceNames": names}),
    )
}

#[test]
fn role_escalation() {
    let p = fixture();
    let alice = u("alice", &["g"]);
    let cases: Vec<RoleCase> = vec![
        ("held in namespace", alice.clone(), Some("default"), vec![pr(&["get", "list"], &[""], &["pods"], &[])], Ok(())),
        ("held subset with names", alice.clone(), Some("default"), vec![pr(&["get"], &[""], &["pods"], &["p1"])], Ok(())),
        ("cluster role needs cluster rules", alice.clone(), None, vec![pr(&["get"], &[""], &["pods"], &[])],
            Err("user \"alice\" (groups=[\"g\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\"]}")),
        ("not held", alice.clone(), Some("default"), vec![pr(&["get"], &[""], &["secrets"], &[])],
            Err("user \"alice\" (groups=[\"g\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}")),
        ("partially held, verbs compacted", alice.clone(), Some("default"), vec![pr(&["get", "delete", "patch"], &[""], &["pods", "secrets"], &[])],
            Err("user \"alice\" (groups=[\"g\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\" \"patch\"]}\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"delete\" \"patch\"]}")),
        ("wildcard covers", u("bob", &[]), None, vec![pr(&["get"], &["example.com"], &["widgets", "gadgets/status"], &["a"])], Ok(())),
        ("wildcard verb not held", alice.clone(), Some("default"), vec![pr(&["*"], &[""], &["pods"], &[])],
            Err("user \"alice\" (groups=[\"g\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"*\"]}")),
        ("names held do not cover all names", u("d", &["devs"]), Some("default"), vec![pr(&["get"], &[""], &["configmaps"], &[])],
            Err("user \"d\" (groups=[\"devs\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"configmaps\"], Verbs:[\"get\"]}")),
        ("*/status covers sub", u("system:serviceaccount:ci:x", &[]), Some("default"), vec![pr(&["get"], &["apps"], &["deployments/status"], &[])], Ok(())),
        ("non-resource covered by prefix", u("h", &["system:authenticated"]), None,
            vec![PolicyRule::from_value(&json!({"verbs": ["get"], "nonResourceURLs": ["/apis/foo", "/apis/x*"]}))], Ok(())),
        ("non-resource not covered", u("h", &["system:authenticated"]), None,
            vec![PolicyRule::from_value(&json!({"verbs": ["get"], "nonResourceURLs": ["/metrics"]}))],
            Err("user \"h\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}")),
        ("escalate verb", u("esc", &[]), Some("default"), vec![pr(&["*"], &["*"], &["*"], &[])], Ok(())),
        ("escalate verb cluster", u("esc", &[]), None, vec![pr(&["*"], &["*"], &["*"], &[])], Ok(())),
        ("system:masters", u("root", &["system:masters"]), None, vec![pr(&["*"], &["*"], &["*"], &[])], Ok(())),
        ("resolution errors appended", u("ghost", &[]), None, vec![pr(&["get"], &[""], &["pods"], &[])],
            Err("user \"ghost\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\"]}; resolution errors: [clusterrole.rbac.authorization.k8s.io \"gone\" not found]")),
        ("nothing granted", alice, None, vec![], Ok(())),
    ];
    for (case, user, ns, rules, want) in cases {
        let got = check_escalation(&user, &p, ns, &rules);
        assert_eq!(got, want.map_err(str::to_string), "{case}");
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
    }
}

#[test]
fn binding_escalation() {
    let p = fixture();
    let cases: Vec<BindingCase> = vec![
        ("holds role rules", u("alice", &[]), Some("default"), role_ref("Role", "pod-reader"), Ok(())),
        ("holds clusterrole rules in ns", u("jane", &[]), Some("default"), role_ref("ClusterRole", "secret-admin"), Ok(())),
        ("lacks clusterrole rules cluster-wide", u("jane", &[]), None, role_ref("ClusterRole", "secret-admin"),
            Err("user \"jane\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"*\"]}")),
        ("bind verb on named clusterrole", u("binder", &[]), None, role_ref("ClusterRole", "secret-admin"), Ok(())),
        ("bind verb on named clusterrole in ns", u("binder", &[]), Some("x"), role_ref("ClusterRole", "secret-admin"), Ok(())),
        ("bind verb restricted by name", u("binder", &[]), None, role_ref("ClusterRole", "widget-all"),
            Err("user \"binder\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"example.com\"], Resources:[\"*\"], Verbs:[\"*\"]}")),
        ("missing role", u("alice", &[]), Some("default"), role_ref("Role", "nope"),
            Err("role.rbac.authorization.k8s.io \"nope\" not found")),
        ("missing clusterrole", u("alice", &[]), None, role_ref("ClusterRole", "gone"),
            Err("clusterrole.rbac.authorization.k8s.io \"gone\" not found")),
        ("escalate does not imply bind", u("esc", &[]), None, role_ref("ClusterRole", "node-viewer"),
            Err("user \"esc\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"get\" \"list\"]}")),
        ("masters", u("root", &["system:masters"]), None, role_ref("ClusterRole", "gone"), Ok(())),
    ];
    for (case, user, ns, rr, want) in cases {
        let got = check_binding_escalation(&user, &p, ns, &rr);
        assert_eq!(got, want.map_err(str::to_string), "{case}");
    }
}

/// (case, policy, user, object written, expected result)
type WriteCase<'a> = (
    &'a str,
    &'a RbacPolicy,
    UserInfo,
    &'a Value,
    Result<(), &'a str>,
);

#[test]
fn object_level_write_checks() {
    let p = fixture();
    let admin_crb = binding(None, "admin", "ClusterRole", "all", user_subject("admin"));
    let all = cluster_role(
        "all",
        json!({}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
    );
    let admin_policy = RbacPolicy::from_objects(&[], &[all], &[], &[admin_crb]);
    let agg = aggregated("agg", json!([{}]), json!([]));
    let pods_role = role(
        "default",
        "r",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    let secrets_role = role(
        "default",
        "r",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
    );
    let agg_err = "must have cluster-admin privileges to use the aggregationRule";
    let cases: Vec<WriteCase> = vec![
        ("role held", &p, u("alice", &[]), &pods_role, Ok(())),
        ("role not held", &p, u("alice", &[]), &secrets_role,
            Err("user \"alice\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}")),
        ("aggregationRule needs full authority", &p, u("bob", &[]), &agg, Err(agg_err)),
        ("aggregationRule with escalate", &p, u("esc", &[]), &agg, Ok(())),
        ("aggregationRule as cluster admin", &admin_policy, u("admin", &[]), &agg, Ok(())),
    ];
    for (case, policy, user, obj, want) in cases {
        assert_eq!(
            check_role_write(&user, policy, obj),
            want.map_err(str::to_string),
            "{case}"
        );
    }
    let rb = binding(
        Some("default"),
        "b",
        "ClusterRole",
        "secret-admin",
        user_subject("x"),
    );
    assert_eq!(check_binding_write(&u("jane", &[]), &p, &rb), Ok(()));
    let crb = binding(None, "b", "ClusterRole", "secret-admin", user_subject("x"));
    assert!(check_binding_write(&u("jane", &[]), &p, &crb).is_err());
    assert_eq!(check_binding_write(&u("binder", &[]), &p, &crb), Ok(()));
}
