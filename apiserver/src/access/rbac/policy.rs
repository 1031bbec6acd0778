//! The RBAC policy of one logical cluster and its evaluation.
//!
//! [`RbacPolicy::from_objects`] indexes the Role, ClusterRole, RoleBinding
//! and ClusterRoleBinding objects (as `rbac.authorization.k8s.io/v1` JSON),
//! resolving ClusterRole aggregation up front. [`RbacPolicy::authorize`]
//! then follows kube's RBAC authorizer: ClusterRoleBindings grant
//! cluster-wide, RoleBindings grant only inside their own namespace, and a
//! request is allowed as soon as one rule of one applicable role matches.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::selector::{labels_of, selector_matches};
use super::{Attributes, Decision, UserInfo, RBAC_GROUP, SERVICE_ACCOUNT_USER_PREFIX};
use crate::registry::objects::str_list;

/// `*`: matches every verb, group, resource or non-resource URL.
const ALL: &str = "*";

/// One RBAC `PolicyRule` (`rbac.authorization.k8s.io/v1`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicyRule {
    /// Verbs (`*` = all).
    pub verbs: Vec<String>,
    /// API groups (`""` = core, `*` = all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// Resources (`*`, `res`, `res/sub`, `*/sub`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Object names the rule is restricted to (empty = all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    /// Non-resource URLs (exact, or a `prefix*`).
    #[serde(rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

impl PolicyRule {
    /// Parses a rule leniently from JSON: missing or malformed fields are
    /// empty and non-string list entries are ignored.
    pub fn from_value(v: &Value) -> PolicyRule {
        PolicyRule {
            verbs: str_list(v.get("verbs")),
            api_groups: str_list(v.get("apiGroups")),
            resources: str_list(v.get("resources")),
            resource_names: str_list(v.get("resourceNames")),
            non_resource_urls: str_list(v.get("nonResourceURLs")),
        }
    }

    /// Parses the `rules` array of a Role/ClusterRole object.
    pub fn list_from_object(obj: &Value) -> Vec<PolicyRule> {
        obj.get("rules")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(PolicyRule::from_value).collect())
            .unwrap_or_default()
    }

    /// Whether this rule allows the request (kube `RuleAllows`).
    pub fn allows(&self, attrs: &Attributes) -> bool {
        if !verb_matches(&self.verbs, &attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self
                .non_resource_urls
                .iter()
                .any(|u| url_matches(u, &attrs.path));
        }
        let combined = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let group_ok = self
            .api_groups
            .iter()
            .any(|g| g == ALL || *g == attrs.api_group);
        let resource_ok = self.resources.iter().any(|r| {
            r == ALL
                || *r == combined
                || (!attrs.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
        });
        let name_ok = self.resource_names.is_empty() || self.resource_names.contains(&attrs.name);
        group_ok && resource_ok && name_ok
    }
}

/// A resource rule of a SelfSubjectRulesReview status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceRule {
    /// Allowed verbs.
    pub verbs: Vec<String>,
    /// API groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// Resources.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Resource names (empty = all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
}

/// A non-resource rule of a SelfSubjectRulesReview status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(default)]
pub struct NonResourceRule {
    /// Allowed verbs.
    pub verbs: Vec<String>,
    /// Non-resource URLs (exact or `prefix*`).
    #[serde(rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

/// The `roleRef` of a binding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleRef {
    /// Normally `rbac.authorization.k8s.io`.
    pub api_group: String,
    /// `Role` or `ClusterRole`.
    pub kind: String,
    /// The referenced role's name.
    pub name: String,
}

impl RoleRef {
    /// Parses the `roleRef` of a binding object.
    pub fn from_object(obj: &Value) -> RoleRef {
        let r = obj.get("roleRef").unwrap_or(&Value::Null);
        RoleRef {
            api_group: str_field(r, "apiGroup"),
            kind: str_field(r, "kind"),
            name: str_field(r, "name"),
        }
    }
}

/// A subject of a binding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: String,
    /// The user, group or service-account name.
    pub name: String,
    /// The service account's namespace (defaults to the binding's).
    pub namespace: String,
}

impl Subject {
    /// Whether the subject designates `user` (whose effective groups are
    /// `groups`) for a binding in `binding_ns` (`""` for cluster bindings).
    fn applies_to(&self, user: &UserInfo, groups: &[String], binding_ns: &str) -> bool {
        match self.kind.as_str() {
            "User" => user.name == self.name,
            "Group" => groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    binding_ns
                } else {
                    &self.namespace
                };
                !ns.is_empty()
                    && !self.name.is_empty()
                    && user.name == format!("{SERVICE_ACCOUNT_USER_PREFIX}{ns}:{}", self.name)
            }
            _ => false,
        }
    }
}

/// A RoleBinding or ClusterRoleBinding.
#[derive(Debug, Clone, Default)]
struct Binding {
    /// The binding namespace (`""` for ClusterRoleBindings).
    namespace: String,
    role_ref: RoleRef,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_object(obj: &Value, namespaced: bool) -> Binding {
        let subjects = obj
            .get("subjects")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| Subject {
                        kind: str_field(s, "kind"),
                        name: str_field(s, "name"),
                        namespace: str_field(s, "namespace"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Binding {
            namespace: if namespaced {
                obj.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            } else {
                String::new()
            },
            role_ref: RoleRef::from_object(obj),
            subjects,
        }
    }
}

/// The RBAC objects of one logical cluster, indexed for evaluation.
#[derive(Debug, Clone, Default)]
pub struct RbacPolicy {
    /// `(namespace, name)` → rules.
    roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    /// name → effective rules (aggregation resolved).
    cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    role_bindings: Vec<Binding>,
    cluster_role_bindings: Vec<Binding>,
    /// The roles and bindings every workspace shares (kcp's `system:admin`), if consulted.
    shared: Option<&'static RbacPolicy>,
    /// Whether every user may enter this workspace (`root`), so that the shared bindings apply
    /// to everyone rather than to the workspace's members only.
    open: bool,
}

/// A ClusterRole before aggregation is resolved.
struct RawClusterRole {
    labels: BTreeMap<String, String>,
    rules: Vec<PolicyRule>,
    selectors: Option<Vec<Value>>,
}

impl RbacPolicy {
    /// Builds the policy from the Role, ClusterRole, RoleBinding and
    /// ClusterRoleBinding objects of one logical cluster. Objects without a
    /// name (and namespaced objects without a namespace) are ignored.
    ///
    /// A ClusterRole with an `aggregationRule` gets, like kube's
    /// aggregation controller writes, the union of the rules of all other
    /// ClusterRoles whose labels match any of its `clusterRoleSelectors`
    /// (resolved transitively; its own stored rules are replaced).
    pub fn from_objects(
        roles: &[Value],
        cluster_roles: &[Value],
        role_bindings: &[Value],
        cluster_role_bindings: &[Value],
    ) -> RbacPolicy {
        let mut policy = RbacPolicy::default();
        for r in roles {
            let (ns, name) = (meta(r, "namespace"), meta(r, "name"));
            if !ns.is_empty() && !name.is_empty() {
                policy
                    .roles
                    .insert((ns, name), PolicyRule::list_from_object(r));
            }
        }
        let mut raw = BTreeMap::new();
        for cr in cluster_roles {
            let name = meta(cr, "name");
            if name.is_empty() {
                continue;
            }
            let selectors = cr
                .get("aggregationRule")
                .filter(|a| a.is_object())
                .map(|a| {
                    a.get("clusterRoleSelectors")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                });
            raw.insert(
                name,
                RawClusterRole {
                    labels: labels_of(cr),
                    rules: PolicyRule::list_from_object(cr),
                    selectors,
                },
            );
        }
        let mut memo = BTreeMap::new();
        for name in raw.keys() {
            let mut visiting = BTreeSet::new();
            let rules = resolve_aggregation(name, &raw, &mut memo, &mut visiting);
            policy.cluster_roles.insert(name.clone(), rules);
        }
        for rb in role_bindings {
            let b = Binding::from_object(rb, true);
            if !b.namespace.is_empty() {
                policy.role_bindings.push(b);
            }
        }
        for crb in cluster_role_bindings {
            policy
                .cluster_role_bindings
                .push(Binding::from_object(crb, false));
        }
        policy
    }

    /// This workspace's policy with the ClusterRoles and ClusterRoleBindings every workspace
    /// shares (`auth::bootstrap`), as kcp's authorizers consult its `system:admin` cluster:
    ///
    /// * a ClusterRole of the workspace named like a shared one grants the rules of both
    ///   (kcp's merged lister: the workspace's first, then the shared ones it lacks);
    /// * the workspace's bindings may name a shared role;
    /// * the shared bindings (`system:basic-user` for `system:authenticated`, ...) apply, with
    ///   the shared roles only, to the users who may enter the workspace: its members (a
    ///   binding of the workspace names them), its own service accounts, and everyone when
    ///   `open` (`root`). A stranger gains nothing from them, so a workspace they may not enter
    ///   stays one they learn nothing about.
    pub fn with_shared_roles(self, open: bool) -> RbacPolicy {
        self.with_roles_of(super::bootstrap::shared(), open)
    }

    fn with_roles_of(mut self, shared: &'static RbacPolicy, open: bool) -> RbacPolicy {
        for (name, rules) in &mut self.cluster_roles {
            for rule in shared.cluster_role(name).unwrap_or_default() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
        self.shared = Some(shared);
        self.open = open;
        self
    }

    /// The effective rules of ClusterRole `name`, if it exists: the workspace's own (merged with
    /// the shared one of that name), else the shared one.
    pub fn cluster_role(&self, name: &str) -> Option<&[PolicyRule]> {
        self.cluster_roles
            .get(name)
            .map(Vec::as_slice)
            .or_else(|| self.shared.and_then(|s| s.cluster_role(name)))
    }

    /// The rules of Role `namespace/name`, if it exists.
    pub fn role(&self, namespace: &str, name: &str) -> Option<&[PolicyRule]> {
        self.roles
            .get(&(namespace.to_string(), name.to_string()))
            .map(Vec::as_slice)
    }

    /// The rules a role reference grants for a binding in `namespace`
    /// (`""` for ClusterRoleBindings), or kube's error text
    /// (`clusterrole.rbac.authorization.k8s.io "x" not found`).
    pub fn role_ref_rules(
        &self,
        role_ref: &RoleRef,
        namespace: &str,
    ) -> Result<&[PolicyRule], String> {
        match role_ref.kind.as_str() {
            "Role" => self.role(namespace, &role_ref.name).ok_or_else(|| {
                format!(
                    "role.{RBAC_GROUP} {} not found",
                    super::go_quote(&role_ref.name)
                )
            }),
            "ClusterRole" => self.cluster_role(&role_ref.name).ok_or_else(|| {
                format!(
                    "clusterrole.{RBAC_GROUP} {} not found",
                    super::go_quote(&role_ref.name)
                )
            }),
            other => Err(format!(
                "unsupported role reference kind: {}",
                super::go_quote(other)
            )),
        }
    }

    /// All rules granted to `user` by ClusterRoleBindings and, if
    /// `namespace` is given, by RoleBindings in that namespace, plus the
    /// resolution errors (missing roles) met on the way. `system:masters`
    /// is not special-cased here.
    pub fn policy_rules_for(
        &self,
        user: &UserInfo,
        namespace: Option<&str>,
    ) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        self.visit(user, namespace, &mut |res| match res {
            Ok(rs) => {
                rules.extend(rs.iter().cloned());
                true
            }
            Err(e) => {
                errors.push(e);
                true
            }
        });
        (rules, errors)
    }

    /// Calls `visitor` with the rules (or the resolution error) of every
    /// binding that applies to `user`, the shared bindings first (when they apply to the user,
    /// see [`RbacPolicy::with_shared_roles`]), then cluster bindings, until the visitor returns
    /// `false`. Returns whether it went through all of them.
    fn visit<F>(&self, user: &UserInfo, namespace: Option<&str>, visitor: &mut F) -> bool
    where
        F: FnMut(Result<&[PolicyRule], String>) -> bool,
    {
        if let Some(shared) = self.shared {
            if self.admits(user) && !shared.visit(user, namespace, visitor) {
                return false;
            }
        }
        let groups = user.effective_groups();
        let ns = namespace.unwrap_or("");
        let bindings = self.cluster_role_bindings.iter().chain(
            self.role_bindings
                .iter()
                .filter(|b| !ns.is_empty() && b.namespace == ns),
        );
        for b in bindings {
            if !b
                .subjects
                .iter()
                .any(|s| s.applies_to(user, &groups, &b.namespace))
            {
                continue;
            }
            if !visitor(self.role_ref_rules(&b.role_ref, &b.namespace)) {
                return false;
            }
        }
        true
    }

    /// Whether `user` may enter this workspace, so that the shared bindings apply to it: the
    /// workspace is open, or the user is one of its service accounts (one of another workspace
    /// has another name here, see `authz::user_info`) or one of its members.
    fn admits(&self, user: &UserInfo) -> bool {
        self.open || user.service_account_parts().is_some() || self.is_bound(user)
    }

    /// Whether any RoleBinding or ClusterRoleBinding of this cluster names `user` (directly,
    /// by group or as a service account): kcp's "the user has access to the workspace". The
    /// shared bindings do not count: `system:authenticated` is not a member of every workspace.
    pub fn is_bound(&self, user: &UserInfo) -> bool {
        let groups = user.effective_groups();
        self.cluster_role_bindings
            .iter()
            .chain(&self.role_bindings)
            .any(|b| {
                b.subjects
                    .iter()
                    .any(|s| s.applies_to(user, &groups, &b.namespace))
            })
    }

    /// Authorizes a request. Members of `system:masters` may do anything;
    /// otherwise the request is allowed if a rule of a role bound to the
    /// user matches. A denial carries kube's reason text:
    /// `RBAC: <errors>` when bindings for the user pointed at missing roles,
    /// else an empty reason.
    pub fn authorize(&self, attrs: &Attributes) -> Decision {
        if attrs.user.is_master() {
            return Decision::Allow;
        }
        let namespace = if attrs.resource_request {
            attrs.namespace()
        } else {
            None
        };
        let mut allowed = false;
        let mut errors = Vec::new();
        self.visit(&attrs.user, namespace, &mut |res| match res {
            Ok(rules) => {
                allowed = rules.iter().any(|r| r.allows(attrs));
                !allowed
            }
            Err(e) => {
                errors.push(e);
                true
            }
        });
        if allowed {
            Decision::Allow
        } else if errors.is_empty() {
            Decision::Deny(String::new())
        } else {
            Decision::Deny(format!("RBAC: {}", aggregate_errors(&errors)))
        }
    }

    /// The rules that apply to `user` in `namespace` (cluster-wide plus
    /// that namespace's RoleBindings) in SelfSubjectRulesReview shape, and
    /// whether the list is incomplete (some binding's role was missing).
    /// Members of `system:masters` additionally get `*` rules.
    pub fn rules_for(
        &self,
        user: &UserInfo,
        namespace: Option<&str>,
    ) -> (Vec<ResourceRule>, Vec<NonResourceRule>, bool) {
        let namespace = namespace.filter(|n| !n.is_empty());
        let (rules, errors) = self.policy_rules_for(user, namespace);
        let mut resource_rules: Vec<ResourceRule> = Vec::new();
        let mut non_resource_rules: Vec<NonResourceRule> = Vec::new();
        if user.is_master() {
            let all = vec![ALL.to_string()];
            resource_rules.push(ResourceRule {
                verbs: all.clone(),
                api_groups: all.clone(),
                resources: all.clone(),
                resource_names: Vec::new(),
            });
            non_resource_rules.push(NonResourceRule {
                verbs: all.clone(),
                non_resource_urls: all,
            });
        }
        for r in rules {
            if !r.resources.is_empty() {
                let rr = ResourceRule {
                    verbs: r.verbs.clone(),
                    api_groups: r.api_groups.clone(),
                    resources: r.resources.clone(),
                    resource_names: r.resource_names.clone(),
                };
                if !resource_rules.contains(&rr) {
                    resource_rules.push(rr);
                }
            }
            if !r.non_resource_urls.is_empty() {
                let nr = NonResourceRule {
                    verbs: r.verbs,
                    non_resource_urls: r.non_resource_urls,
                };
                if !non_resource_rules.contains(&nr) {
                    non_resource_rules.push(nr);
                }
            }
        }
        (resource_rules, non_resource_rules, !errors.is_empty())
    }

    /// The `status` of a SelfSubjectRulesReview for `user` in `namespace`:
    /// `{resourceRules, nonResourceRules, incomplete, evaluationError?}`.
    pub fn rules_review_status(&self, user: &UserInfo, namespace: Option<&str>) -> Value {
        let (rr, nr, incomplete) = self.rules_for(user, namespace);
        let mut status = json!({
            "resourceRules": rr,
            "nonResourceRules": nr,
            "incomplete": incomplete,
        });
        if incomplete {
            let (_, errors) = self.policy_rules_for(user, namespace.filter(|n| !n.is_empty()));
            status["evaluationError"] = Value::String(aggregate_errors(&errors));
        }
        status
    }
}

/// Resolves the effective rules of ClusterRole `name` (aggregation).
fn resolve_aggregation(
    name: &str,
    raw: &BTreeMap<String, RawClusterRole>,
    memo: &mut BTreeMap<String, Vec<PolicyRule>>,
    visiting: &mut BTreeSet<String>,
) -> Vec<PolicyRule> {
    if let Some(rules) = memo.get(name) {
        return rules.clone();
    }
    let Some(role) = raw.get(name) else {
        return Vec::new();
    };
    let Some(selectors) = &role.selectors else {
        return role.rules.clone();
    };
    if !visiting.insert(name.to_string()) {
        // Aggregation cycle: fall back to the stored (materialised) rules.
        return role.rules.clone();
    }
    let mut rules: Vec<PolicyRule> = Vec::new();
    for sel in selectors {
        for (other, other_role) in raw {
            if other == name || !selector_matches(sel, &other_role.labels) {
                continue;
            }
            for r in resolve_aggregation(other, raw, memo, visiting) {
                if !rules.contains(&r) {
                    rules.push(r);
                }
            }
        }
    }
    visiting.remove(name);
    memo.insert(name.to_string(), rules.clone());
    rules
}

/// Formats errors like Go's `utilerrors.NewAggregate(errs).Error()`:
/// a single message as is, several as `[a, b]` (duplicates removed).
pub(crate) fn aggregate_errors(errors: &[String]) -> String {
    let mut seen = BTreeSet::new();
    let unique: Vec<&str> = errors
        .iter()
        .filter(|e| seen.insert(e.as_str()))
        .map(String::as_str)
        .collect();
    match unique.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// kube `VerbMatches`.
pub(crate) fn verb_matches(verbs: &[String], verb: &str) -> bool {
    verbs.iter().any(|v| v == ALL || v == verb)
}

/// kube `NonResourceURLMatches` for one rule URL.
pub(crate) fn url_matches(rule_url: &str, path: &str) -> bool {
    rule_url == ALL
        || rule_url == path
        || rule_url
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix.trim_end_matches('*')))
}

fn str_field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn meta(obj: &Value, key: &str) -> String {
    obj.get("metadata")
        .map(|m| str_field(m, key))
        .unwrap_or_default()
}
