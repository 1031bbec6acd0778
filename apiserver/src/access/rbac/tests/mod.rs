//! Table-driven tests of the RBAC authorizer.

use serde_json::{json, Value};

use super::*;

mod authorize;
mod escalation;
mod parsing;
mod shared_roles;

fn role(ns: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"namespace": ns, "name": name}, "rules": rules})
}

fn cluster_role(name: &str, labels: Value, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name, "labels": labels}, "rules": rules})
}

fn aggregated(name: &str, selectors: Value, stale_rules: Value) -> Value {
    json!({"kind": "ClusterRole", "metadata": {"name": name},
           "aggregationRule": {"clusterRoleSelectors": selectors}, "rules": stale_rules})
}

fn binding(ns: Option<&str>, name: &str, kind: &str, role: &str, subjects: Value) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    json!({"metadata": meta, "subjects": subjects,
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}})
}

fn user_subject(name: &str) -> Value {
    json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}])
}

fn group_subject(name: &str) -> Value {
    json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": name}])
}

fn fixture() -> RbacPolicy {
    let roles = vec![
        role(
            "default",
            "pod-reader",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        ),
        role(
            "default",
            "cm-named",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["app-config"], "verbs": ["get"]}]),
        ),
        role(
            "other",
            "secret-reader",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        ),
        role(
            "default",
            "url-role",
            json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        ),
    ];
    let cluster_roles = vec![
        cluster_role(
            "node-viewer",
            json!({}),
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]),
        ),
        cluster_role(
            "secret-admin",
            json!({}),
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]),
        ),
        cluster_role(
            "log-reader",
            json!({}),
            json!([{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "any-status",
            json!({}),
            json!([{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "widget-all",
            json!({}),
            json!([{"apiGroups": ["example.com"], "resources": ["*"], "verbs": ["*"]}]),
        ),
        cluster_role(
            "health",
            json!({}),
            json!([{"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}]),
        ),
        aggregated(
            "aggregate-view",
            json!([{"matchLabels": {"rbac.example.com/aggregate-to-view": "true"}}]),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["delete"]}]),
        ),
        cluster_role(
            "view-pods",
            json!({"rbac.example.com/aggregate-to-view": "true"}),
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "view-cms",
            json!({"rbac.example.com/aggregate-to-view": "true"}),
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]),
        ),
        aggregated(
            "gold-agg",
            json!([{"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}]),
            json!([]),
        ),
        cluster_role(
            "gold",
            json!({"tier": "gold"}),
            json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "silver",
            json!({"tier": "silver"}),
            json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["delete"]}]),
        ),
        cluster_role(
            "escalator",
            json!({}),
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "clusterroles"], "verbs": ["escalate"]}]),
        ),
        cluster_role(
            "binder",
            json!({}),
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": ["secret-admin"], "verbs": ["bind"]}]),
        ),
        cluster_role(
            "rbac-writer",
            json!({}),
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "clusterroles", "rolebindings", "clusterrolebindings"], "verbs": ["create", "update"]}]),
        ),
    ];
    let role_bindings = vec![
        binding(
            Some("default"),
            "jane-pods",
            "Role",
            "pod-reader",
            user_subject("jane"),
        ),
        binding(
            Some("default"),
            "jane-secrets",
            "ClusterRole",
            "secret-admin",
            user_subject("jane"),
        ),
        binding(
            Some("default"),
            "devs-cm",
            "Role",
            "cm-named",
            group_subject("devs"),
        ),
        binding(
            Some("default"),
            "sa-logs",
            "ClusterRole",
            "log-reader",
            json!([{"kind": "ServiceAccount", "name": "builder"}, {"kind": "ServiceAccount", "name": "deployer", "namespace": "ci"}]),
        ),
        binding(
            Some("default"),
            "ci-status",
            "ClusterRole",
            "any-status",
            group_subject("system:serviceaccounts:ci"),
        ),
        binding(
            Some("default"),
            "ghost",
            "Role",
            "nope",
            user_subject("ghost"),
        ),
        binding(
            Some("default"),
            "jane-url",
            "Role",
            "url-role",
            user_subject("jane"),
        ),
        binding(
            Some("default"),
            "alice-pods",
            "Role",
            "pod-reader",
            user_subject("alice"),
        ),
        binding(
            Some("other"),
            "alice-secrets",
            "Role",
            "secret-reader",
            user_subject("alice"),
        ),
    ];
    let cluster_role_bindings = vec![
        binding(
            None,
            "ops-nodes",
            "ClusterRole",
            "node-viewer",
            group_subject("ops"),
        ),
        binding(
            None,
            "bob-widgets",
            "ClusterRole",
            "widget-all",
            user_subject("bob"),
        ),
        binding(
            None,
            "health",
            "ClusterRole",
            "health",
            group_subject("system:authenticated"),
        ),
        binding(
            None,
            "agg",
            "ClusterRole",
            "aggregate-view",
            user_subject("agg"),
        ),
        binding(None, "gold", "ClusterRole", "gold-agg", user_subject("agg")),
        binding(None, "ghost", "ClusterRole", "gone", user_subject("ghost")),
        binding(None, "esc", "ClusterRole", "escalator", user_subject("esc")),
        binding(
            None,
            "binder",
            "ClusterRole",
            "binder",
            user_subject("binder"),
        ),
        binding(
            None,
            "alice",
            "ClusterRole",
            "rbac-writer",
            json!([
            {"kind": "User", "name": "alice"}, {"kind": "User", "name": "esc"}, {"kind": "User", "name": "binder"}]),
        ),
        binding(
            None,
            "sa-all",
            "ClusterRole",
            "node-viewer",
            json!([{"kind": "ServiceAccount", "name": "nodes-sa"}]),
        ),
    ];
    RbacPolicy::from_objects(
        &roles,
        &cluster_roles,
        &role_bindings,
        &cluster_role_bindings,
    )
}

fn u(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo::new(name, groups)
}

fn res(
    user: UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    sub: &str,
    name: &str,
    ns: &str,
) -> Attributes {
    Attributes::resource(user, verb, group, resource, (!ns.is_empty()).then_some(ns))
        .with_subresource(sub)
        .with_name(name)
}

#[test]
fn authorize_non_resource_requests() {
    let p = fixture();
    let authed = u("jane", &["system:authenticated"]);
    let cases = [
        ("exact url", "get", "/healthz", &authed, true),
        ("prefix url", "get", "/apis/example.com/v1", &authed, true),
        ("prefix root itself", "get", "/apis/", &authed, true),
        ("prefix needs slash", "get", "/apis", &authed, false),
        (
            "exact url no subpath",
            "get",
            "/healthz/ping",
            &authed,
            false,
        ),
        ("verb mismatch", "post", "/healthz", &authed, false),
        (
            "role nonResourceURLs never apply",
            "get",
            "/metrics",
            &authed,
            false,
        ),
    ];
    for (case, verb, path, user, allowed) in cases {
        let attrs = Attributes::non_resource(user.clone(), verb, path);
        assert_eq!(p.authorize(&attrs).is_allowed(), allowed, "{case}");
    }
    let masters = Attributes::non_resource(u("r", &["system:masters"]), "delete", "/x");
    assert_eq!(p.authorize(&masters), Decision::Allow);
}

#[test]
fn deny_reasons_for_missing_roles() {
    let p = fixture();
    let ghost = u("ghost", &[]);
    let cases = [
        (
            res(ghost.clone(), "get", "", "pods", "", "", ""),
            r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#,
        ),
        (
            res(ghost.clone(), "get", "", "pods", "", "", "default"),
            r#"RBAC: [clusterrole.rbac.authorization.k8s.io "gone" not found, role.rbac.authorization.k8s.io "nope" not found]"#,
        ),
        (res(u("jane", &[]), "get", "", "nodes", "", "", ""), ""),
    ];
    for (attrs, reason) in cases {
        assert_eq!(p.authorize(&attrs), Decision::Deny(reason.to_string()));
    }
    let kinds = RbacPolicy::from_objects(
        &[],
        &[],
        &[],
        &[binding(None, "b", "Thing", "x", user_subject("u"))],
    );
    assert_eq!(
        kinds.authorize(&res(u("u", &[]), "get", "", "pods", "", "", "")),
        Decision::Deny(r#"RBAC: unsupported role reference kind: "Thing""#.to_string())
    );
}

#[test]
fn forbidden_messages() {
    let jane = u("jane", &[]);
    let cases = [
        (
            res(jane.clone(), "get", "", "configmaps", "", "x", "default"),
            "",
            r#"configmaps "x" is forbidden: User "jane" cannot get resource "configmaps" in API group "" in the namespace "default""#,
        ),
        (
            res(jane.clone(), "list", "example.com", "widgets", "", "", ""),
            "",
            r#"widgets.example.com is forbidden: User "jane" cannot list resource "widgets" in API group "example.com" at the cluster scope"#,
        ),
        (
            res(jane.clone(), "get", "", "pods", "log", "p", "default"),
            "",
            r#"pods "p" is forbidden: User "jane" cannot get resource "pods/log" in API group "" in the namespace "default""#,
        ),
        (
            Attributes::non_resource(jane.clone(), "get", "/foo"),
            "",
            r#"forbidden: User "jane" cannot get path "/foo""#,
        ),
        (
            res(jane, "get", "", "nodes", "", "n", ""),
            r#"RBAC: clusterrole.rbac.authorization.k8s.io "x" not found"#,
            r#"nodes "n" is forbidden: User "jane" cannot get resource "nodes" in API group "" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "x" not found"#,
        ),
    ];
    for (attrs, reason, want) in cases {
        assert_eq!(forbidden_message(&attrs, reason), want);
    }
}
