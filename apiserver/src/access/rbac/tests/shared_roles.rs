//! The roles every workspace shares (kube's bootstrap policy as kcp keeps it in `system:admin`):
//! what they hold, how a workspace's bindings reach them, how a workspace's own roles of the
//! same name add to them without changing them, who the shared bindings reach, and the
//! escalation checks against them.

use serde_json::{json, Value};

use super::*;
use crate::access::rbac::bootstrap;

/// The policy of a workspace holding only `cluster_roles` and the bindings, with the shared
/// roles; `open` as `root` is.
fn workspace(
    cluster_roles: &[Value],
    role_bindings: &[Value],
    cluster_role_bindings: &[Value],
    open: bool,
) -> RbacPolicy {
    RbacPolicy::from_objects(&[], cluster_roles, role_bindings, cluster_role_bindings)
        .with_shared_roles(open)
}

fn crb(name: &str, role: &str, user: &str) -> Value {
    binding(None, name, "ClusterRole", role, user_subject(user))
}

fn allowed(p: &RbacPolicy, user: &str, verb: &str, group: &str, resource: &str, ns: &str) -> bool {
    p.authorize(&res(
        u(user, &["system:authenticated"]),
        verb,
        group,
        resource,
        "",
        "",
        ns,
    ))
    .is_allowed()
}

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    PolicyRule {
        verbs: v(verbs),
        api_groups: v(groups),
        resources: v(resources),
        ..PolicyRule::default()
    }
}

#[test]
fn the_shared_roles_are_kubes_with_aggregation_resolved() {
    let shared = bootstrap::shared();
    let len = |name: &str| shared.cluster_role(name).map(<[PolicyRule]>::len);
    // As kcp v0.28.1 serves them in `system:admin` (kube 1.32's bootstrap policy).
    assert_eq!(len("cluster-admin"), Some(2));
    assert_eq!(len("view"), Some(10));
    assert_eq!(len("edit"), Some(23));
    assert_eq!(len("admin"), Some(25));
    for name in [
        "system:basic-user",
        "system:discovery",
        "system:public-info-viewer",
        "system:kcp:workspace:access",
    ] {
        assert!(len(name).is_some(), "{name}");
    }
    // view ⊂ edit ⊂ admin, and admin holds what edit lacks: roles and rolebindings.
    let rules = |name: &str| shared.cluster_role(name).unwrap_or_default().to_vec();
    assert!(uncovered(&rules("edit"), &rules("view")).is_empty());
    assert!(uncovered(&rules("admin"), &rules("edit")).is_empty());
    assert!(!uncovered(&rules("edit"), &rules("admin")).is_empty());
    assert!(!uncovered(&rules("admin"), &rules("cluster-admin")).is_empty());
    // The objects as kube writes them before its aggregation controller fills them in.
    let objects = bootstrap::cluster_role_objects();
    let view = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "view")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        view["aggregationRule"],
        json!({"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]})
    );
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
}

/// `kubectl create clusterrolebinding x --clusterrole=cluster-admin --user=dora` in a workspace
/// holding no role of that name.
#[test]
fn a_binding_in_any_workspace_grants_a_shared_role() {
    let objects = [crb("x", "cluster-admin", "dora")];
    let alone = RbacPolicy::from_objects(&[], &[], &[], &objects);
    let dora = res(
        u("dora", &["system:authenticated"]),
        "create",
        "",
        "configmaps",
        "",
        "",
        "default",
    );
    assert_eq!(
        alone.authorize(&dora),
        Decision::Deny(
            r#"RBAC: clusterrole.rbac.authorization.k8s.io "cluster-admin" not found"#.into()
        ),
        "without the shared roles the binding names nothing"
    );
    let p = workspace(&[], &[], &objects, false);
    assert_eq!(p.authorize(&dora), Decision::Allow);
    assert!(allowed(&p, "dora", "delete", "apps", "deployments", ""));
    assert!(p
        .authorize(&Attributes::non_resource(u("dora", &[]), "access", "/"))
        .is_allowed());
    assert!(!allowed(&p, "eve", "list", "", "configmaps", "default"));

    // view reads and does not write; edit writes in its RoleBinding's namespace only.
    let p = workspace(
        &[],
        &[binding(
            Some("team"),
            "e",
            "ClusterRole",
            "edit",
            user_subject("ed"),
        )],
        &[crb("v", "view", "vi")],
        false,
    );
    for verb in ["get", "list", "watch"] {
        assert!(
            allowed(&p, "vi", verb, "", "configmaps", "default"),
            "{verb}"
        );
    }
    assert!(allowed(&p, "vi", "list", "apps", "deployments", ""));
    assert!(!allowed(&p, "vi", "create", "", "configmaps", "default"));
    assert!(!allowed(&p, "vi", "get", "", "secrets", "default"));
    assert!(allowed(&p, "ed", "create", "", "secrets", "team"));
    assert!(!allowed(&p, "ed", "create", "", "secrets", "default"));
    assert!(!allowed(
        &p,
        "ed",
        "create",
        "rbac.authorization.k8s.io",
        "rolebindings",
        "team"
    ));
}

#[test]
fn a_workspaces_own_role_of_a_shared_name_adds_to_it_there_only() {
    let narrow_admin = cluster_role(
        "cluster-admin",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    );
    let wider_view = cluster_role(
        "view",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]),
    );
    let labelled = cluster_role(
        "more-view",
        json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
    );
    let p = workspace(
        &[narrow_admin, wider_view, labelled],
        &[],
        &[crb("a", "cluster-admin", "ada"), crb("v", "view", "vi")],
        false,
    );
    // The shared cluster-admin still grants everything: the workspace's role takes nothing
    // away, its rules come first.
    assert!(allowed(&p, "ada", "delete", "", "secrets", "default"));
    let ca = p.cluster_role("cluster-admin").unwrap_or_default();
    assert_eq!(ca.len(), 3);
    assert_eq!(ca[0], rule(&["get"], &[""], &["configmaps"]));
    // The workspace's view adds secrets here; a role labelled to aggregate into view does
    // not reach the shared view (aggregation stays within a workspace).
    assert!(allowed(&p, "vi", "list", "", "secrets", "default"));
    assert!(allowed(&p, "vi", "list", "", "configmaps", "default"));
    assert!(!allowed(&p, "vi", "list", "", "nodes", ""));
    // Nothing shared changed: another workspace's view still lacks secrets.
    let other = workspace(&[], &[], &[crb("v", "view", "vi")], false);
    assert!(!allowed(&other, "vi", "list", "", "secrets", "default"));
    assert!(!bootstrap::shared()
        .cluster_role("view")
        .unwrap_or_default()
        .contains(&rule(&["list"], &[""], &["secrets"])));
}

#[test]
fn the_shared_bindings_reach_only_who_may_enter_the_workspace() {
    let review = |user: UserInfo| {
        res(
            user,
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "",
            "",
            "",
        )
    };
    let discovery = |user: UserInfo| Attributes::non_resource(user, "get", "/apis/example.com/v1");
    let member = u("mem", &["system:authenticated"]);
    let stranger = u("eve", &["system:authenticated"]);
    let sa = UserInfo::service_account("default", "robot");
    let p = workspace(&[], &[], &[crb("v", "view", "mem")], false);
    // system:basic-user and system:discovery, bound to system:authenticated, for the member
    // and the workspace's own service account …
    for user in [&member, &sa] {
        assert!(p.authorize(&review(user.clone())).is_allowed(), "{user:?}");
        assert!(
            p.authorize(&discovery(user.clone())).is_allowed(),
            "{user:?}"
        );
    }
    // … not for someone else, who learns nothing of the workspace and is no member of it.
    assert!(!p.authorize(&review(stranger.clone())).is_allowed());
    assert!(!p.authorize(&discovery(stranger.clone())).is_allowed());
    assert!(!p.is_bound(&stranger));
    assert!(!p.is_bound(&sa));
    // root is open to everyone.
    let root = workspace(&[], &[], &[], true);
    assert!(root.authorize(&review(stranger.clone())).is_allowed());
    assert!(!root.is_bound(&stranger));
    assert!(!root
        .authorize(&res(
            stranger.clone(),
            "list",
            "",
            "configmaps",
            "",
            "",
            "default"
        ))
        .is_allowed());
    // A member's rules start with the shared ones, as kcp's rule resolvers list them.
    let (rules, non_resource, incomplete) = p.rules_for(&member, Some("default"));
    assert!(!incomplete);
    assert_eq!(
        rules[0].resources,
        ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]
    );
    assert!(rules
        .iter()
        .any(|r| r.resources.contains(&"configmaps".to_string())));
    assert!(non_resource
        .iter()
        .any(|r| r.non_resource_urls.contains(&"/apis/*".to_string())));
    let (rules, _, _) = p.rules_for(&stranger, Some("default"));
    assert!(rules.is_empty());
}

#[test]
fn a_workspaces_role_named_like_a_shared_binding_role_does_not_widen_that_binding() {
    // The tenant's own system:basic-user grants everything, but the shared binding of
    // system:authenticated resolves the shared role only.
    let everything = cluster_role(
        "system:basic-user",
        json!({}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let p = workspace(&[everything], &[], &[crb("v", "view", "mem")], false);
    assert!(!allowed(&p, "mem", "delete", "", "secrets", "default"));
    assert!(allowed(
        &p,
        "mem",
        "create",
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        ""
    ));
}

#[test]
fn binding_a_shared_role_needs_its_rules_or_bind() {
    let role_ref = |name: &str| RoleRef {
        api_group: RBAC_GROUP.into(),
        kind: "ClusterRole".into(),
        name: name.into(),
    };
    let binder = cluster_role(
        "binder",
        json!({}),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                "resourceNames": ["cluster-admin"], "verbs": ["bind"]}]),
    );
    let p = workspace(
        &[binder],
        &[],
        &[
            crb("a", "admin", "adam"),
            crb("c", "cluster-admin", "root"),
            crb("b", "binder", "bea"),
        ],
        false,
    );
    let who = |name: &str| u(name, &["system:authenticated"]);
    // admin holds every rule of edit and view, so may bind them in a namespace …
    for role in ["edit", "view", "admin"] {
        assert_eq!(
            check_binding_escalation(&who("adam"), &p, Some("default"), &role_ref(role)),
            Ok(()),
            "{role}"
        );
    }
    // … not cluster-admin, with kube's words for the rules not held.
    let refused = check_binding_escalation(
        &who("adam"),
        &p,
        Some("default"),
        &role_ref("cluster-admin"),
    );
    assert_eq!(
        refused,
        Err("user \"adam\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}\n{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}".to_string())
    );
    // Nor may a stranger; holding cluster-admin, or `bind` on it, is enough.
    assert!(check_binding_escalation(&who("eve"), &p, None, &role_ref("view")).is_err());
    assert_eq!(
        check_binding_escalation(&who("root"), &p, None, &role_ref("cluster-admin")),
        Ok(())
    );
    assert_eq!(
        check_binding_escalation(&who("bea"), &p, None, &role_ref("cluster-admin")),
        Ok(())
    );
    assert!(check_binding_escalation(&who("bea"), &p, None, &role_ref("admin")).is_err());
    // Writing a ClusterRole named cluster-admin is writing the workspace's own role: the
    // writer must hold what it grants.
    let all = cluster_role(
        "cluster-admin",
        json!({}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    assert!(check_role_write(&who("adam"), &p, &all).is_err());
    assert_eq!(check_role_write(&who("root"), &p, &all), Ok(()));
}
