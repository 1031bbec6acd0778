//! RBAC privilege-escalation prevention (kube `ConfirmNoEscalation`,
//! `RoleEscalationAuthorized`, `BindingAuthorized`).
//!
//! A user may only write a Role/ClusterRole granting permissions it already
//! holds, unless it may `escalate` roles/clusterroles; and may only write a
//! binding to a role whose permissions it already holds, unless it may
//! `bind` that role. Members of `system:masters` may always do both.

use std::collections::BTreeSet;

use serde_json::Value;

use super::policy::{aggregate_errors, url_matches, PolicyRule, RbacPolicy, RoleRef};
use super::{go_quote, go_quote_list, Attributes, UserInfo, RBAC_GROUP};

/// Checks that `user` may create/update a Role (when `namespace` is
/// `Some`) or ClusterRole (when `None`) granting `rules_being_granted`.
///
/// Allowed for `system:masters`, for users with the `escalate` verb on
/// `roles`/`clusterroles`, or when the user's own rules (cluster-wide plus
/// `namespace`) cover every granted permission. The error text follows
/// kube: `user "alice" (groups=["g"]) is attempting to grant RBAC
/// permissions not currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}`.
pub fn check_escalation(
    user: &UserInfo,
    policy: &RbacPolicy,
    namespace: Option<&str>,
    rules_being_granted: &[PolicyRule],
) -> Result<(), String> {
    check_role_escalation(user, policy, namespace, "", rules_being_granted)
}

/// Like [`check_escalation`] for the role named `role_name`, so that an
/// `escalate` permission restricted by `resourceNames` is honoured.
pub fn check_role_escalation(
    user: &UserInfo,
    policy: &RbacPolicy,
    namespace: Option<&str>,
    role_name: &str,
    rules_being_granted: &[PolicyRule],
) -> Result<(), String> {
    let namespace = namespace.filter(|n| !n.is_empty());
    if user.is_master() {
        return Ok(());
    }
    if escalate_authorized(user, policy, namespace, role_name) {
        return Ok(());
    }
    confirm_no_escalation(user, policy, namespace, rules_being_granted)
}

/// Checks that `user` may create/update a RoleBinding in `namespace`
/// (`Some`) or a ClusterRoleBinding (`None`) referencing `role_ref`.
///
/// Allowed for `system:masters`, for users with the `bind` verb on the
/// referenced role (checked in the binding's namespace), or when the user
/// already holds every permission of the referenced role. A missing role
/// yields kube's not-found text (`clusterrole.rbac.authorization.k8s.io "x" not found`).
pub fn check_binding_escalation(
    user: &UserInfo,
    policy: &RbacPolicy,
    namespace: Option<&str>,
    role_ref: &RoleRef,
) -> Result<(), String> {
    let namespace = namespace.filter(|n| !n.is_empty());
    if user.is_master() {
        return Ok(());
    }
    let resource = match role_ref.kind.as_str() {
        "ClusterRole" => Some("clusterroles"),
        "Role" => Some("roles"),
        _ => None,
    };
    if let Some(resource) = resource {
        let group = if role_ref.api_group.is_empty() {
            RBAC_GROUP
        } else {
            role_ref.api_group.as_str()
        };
        let attrs = Attributes::resource(user.clone(), "bind", group, resource, namespace)
            .with_name(&role_ref.name);
        if policy.authorize(&attrs).is_allowed() {
            return Ok(());
        }
    }
    let rules = policy.role_ref_rules(role_ref, namespace.unwrap_or(""))?;
    confirm_no_escalation(user, policy, namespace, rules)
}

/// Checks a Role or ClusterRole object about to be created/updated by
/// `user` (namespace, name, `rules` and `aggregationRule` read from the
/// JSON; an object without `metadata.namespace` is a ClusterRole).
///
/// Beyond [`check_role_escalation`], setting an `aggregationRule` (which can
/// gather anything) requires holding `*` on everything, as in kube:
/// `must have cluster-admin privileges to use the aggregationRule`.
pub fn check_role_write(user: &UserInfo, policy: &RbacPolicy, obj: &Value) -> Result<(), String> {
    let meta = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let namespace = meta("namespace");
    let name = meta("name").unwrap_or("");
    if user.is_master() || escalate_authorized(user, policy, namespace, name) {
        return Ok(());
    }
    if namespace.is_none() && obj.get("aggregationRule").is_some_and(|a| !a.is_null()) {
        let full = [
            PolicyRule {
                verbs: vec!["*".into()],
                api_groups: vec!["*".into()],
                resources: vec!["*".into()],
                ..PolicyRule::default()
            },
            PolicyRule {
                verbs: vec!["*".into()],
                non_resource_urls: vec!["*".into()],
                ..PolicyRule::default()
            },
        ];
        let (owner, _) = policy.policy_rules_for(user, None);
        if !uncovered(&owner, &full).is_empty() {
            return Err(
                "must have cluster-admin privileges to use the aggregationRule".to_string(),
            );
        }
    }
    let rules = PolicyRule::list_from_object(obj);
    confirm_no_escalation(user, policy, namespace, &rules)
}

/// Checks a RoleBinding or ClusterRoleBinding object about to be
/// created/updated by `user` (an object without `metadata.namespace` is a
/// ClusterRoleBinding); see [`check_binding_escalation`].
pub fn check_binding_write(
    user: &UserInfo,
    policy: &RbacPolicy,
    obj: &Value,
) -> Result<(), String> {
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    check_binding_escalation(user, policy, namespace, &RoleRef::from_object(obj))
}

/// Whether `user` holds `escalate` on roles (namespaced) or clusterroles.
fn escalate_authorized(
    user: &UserInfo,
    policy: &RbacPolicy,
    namespace: Option<&str>,
    name: &str,
) -> bool {
    let resource = if namespace.is_some() {
        "roles"
    } else {
        "clusterroles"
    };
    let attrs = Attributes::resource(user.clone(), "escalate", RBAC_GROUP, resource, namespace)
        .with_name(name);
    policy.authorize(&attrs).is_allowed()
}

/// kube `ConfirmNoEscalation`: the user's rules must cover `rules`.
fn confirm_no_escalation(
    user: &UserInfo,
    policy: &RbacPolicy,
    namespace: Option<&str>,
    rules: &[PolicyRule],
) -> Result<(), String> {
    let (owner, errors) = policy.policy_rules_for(user, namespace);
    let missing = uncovered(&owner, rules);
    if missing.is_empty() {
        return Ok(());
    }
    let descriptions: BTreeSet<String> = compact(missing).iter().map(compact_string).collect();
    let mut msg = format!(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        go_quote(&user.name),
        go_quote_list(&user.groups),
        descriptions.into_iter().collect::<Vec<_>>().join("\n")
    );
    if !errors.is_empty() {
        msg.push_str(&format!(
            "; resolution errors: [{}]",
            aggregate_errors(&errors)
        ));
    }
    Err(msg)
}

/// Whether `owner` rules cover all of `servant` rules; returns the
/// uncovered atomic rules (kube `Covers`).
pub fn uncovered(owner: &[PolicyRule], servant: &[PolicyRule]) -> Vec<PolicyRule> {
    servant
        .iter()
        .flat_map(breakdown)
        .filter(|sub| !owner.iter().any(|o| rule_covers(o, sub)))
        .collect()
}

/// Splits a rule into atomic rules of one group, resource, verb and name
/// (or one URL and verb) (kube `BreakdownRule`).
fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |s: &String| vec![s.clone()];
    let mut out = Vec::new();
    for g in &rule.api_groups {
        for r in &rule.resources {
            for v in &rule.verbs {
                let base = PolicyRule {
                    verbs: one(v),
                    api_groups: one(g),
                    resources: one(r),
                    ..PolicyRule::default()
                };
                if rule.resource_names.is_empty() {
                    out.push(base);
                } else {
                    for n in &rule.resource_names {
                        out.push(PolicyRule {
                            resource_names: one(n),
                            ..base.clone()
                        });
                    }
                }
            }
        }
    }
    for u in &rule.non_resource_urls {
        for v in &rule.verbs {
            out.push(PolicyRule {
                verbs: one(v),
                non_resource_urls: one(u),
                ..PolicyRule::default()
            });
        }
    }
    out
}

/// kube `ruleCovers`: whether `owner` grants everything `sub` grants.
fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let has = |set: &[String], s: &str| set.iter().any(|x| x == s);
    let has_all = |set: &[String], items: &[String]| items.iter().all(|i| has(set, i));
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &sub.api_groups);
    let resources = has(&owner.resources, "*")
        || sub.resources.iter().all(|r| {
            has(&owner.resources, r)
                || r.split_once('/')
                    .is_some_and(|(_, subres)| has(&owner.resources, &format!("*/{subres}")))
        });
    let urls = sub
        .non_resource_urls
        .iter()
        .all(|u| owner.non_resource_urls.iter().any(|o| url_matches(o, u)));
    let names = owner.resource_names.is_empty()
        || (!sub.resource_names.is_empty() && has_all(&owner.resource_names, &sub.resource_names));
    verbs && groups && resources && urls && names
}

/// Merges atomic rules that differ only in verbs (kube `CompactRules`).
fn compact(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    let mut simple: Vec<PolicyRule> = Vec::new();
    for rule in rules {
        let is_simple = rule.non_resource_urls.is_empty()
            && rule.resource_names.len() <= 1
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1;
        if !is_simple {
            out.push(rule);
            continue;
        }
        match simple.iter_mut().find(|s| {
            s.api_groups == rule.api_groups
                && s.resources == rule.resources
                && s.resource_names == rule.resource_names
        }) {
            Some(existing) => existing.verbs.extend(rule.verbs),
            None => simple.push(rule),
        }
    }
    out.extend(simple);
    out
}

/// kube `CompactString`: `{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}`.
fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    for (label, list) in [
        ("APIGroups", &r.api_groups),
        ("Resources", &r.resources),
        ("NonResourceURLs", &r.non_resource_urls),
        ("ResourceNames", &r.resource_names),
        ("Verbs", &r.verbs),
    ] {
        if !list.is_empty() {
            parts.push(format!("{label}:{}", go_quote_list(list)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}
