//! Authorization for the platform-mesh API server.
//!
//! This module holds a pure (I/O free) implementation of Kubernetes RBAC
//! (`rbac.authorization.k8s.io/v1`) evaluated over the Role, ClusterRole,
//! RoleBinding and ClusterRoleBinding objects of one logical cluster:
//!
//! * [`UserInfo`], [`Attributes`] and [`Decision`] describe an authorization
//!   question and its answer, mirroring kube's `authorizer.Attributes`.
//! * [`RbacPolicy`] is built from the JSON objects of one logical cluster and
//!   answers [`RbacPolicy::authorize`] (SubjectAccessReview / request
//!   filtering) and [`RbacPolicy::rules_for`] (SelfSubjectRulesReview,
//!   `kubectl auth can-i --list`).
//! * [`check_escalation`] and [`check_binding_escalation`] (and their
//!   object-level forms [`check_role_write`] and [`check_binding_write`])
//!   implement kube's privilege-escalation prevention for writes of roles
//!   and bindings.
//! * [`forbidden_message`] renders the text of a 403 `Forbidden` status the
//!   way kube-apiserver does.
//!
//! * [`RbacPolicy::with_shared_roles`] adds the ClusterRoles and bindings every workspace
//!   shares (kube's bootstrap policy, as kcp keeps it in its `system:admin` cluster):
//!   `cluster-admin`, `admin`, `edit`, `view`, `system:basic-user`, `system:discovery`, ...
//!
//! Nothing in this module performs I/O or panics on malformed input:
//! malformed objects are skipped, malformed fields are treated as empty.

mod bootstrap;
mod cache;
mod escalation;
mod policy;
mod selector;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub(crate) use crate::meta::field_error::go_quote;
use serde_json::Value;

pub use cache::{PolicyCache, RBAC_PREFIX};
pub use escalation::{
    check_binding_escalation, check_binding_write, check_escalation, check_role_escalation,
    check_role_write, uncovered,
};
pub use policy::{NonResourceRule, PolicyRule, RbacPolicy, ResourceRule, RoleRef, Subject};

/// The group whose members are allowed to do everything (kube's "privileged groups"
/// authorizer); in a workspace only, for a scoped user (see [`Identity::is_unscoped_admin`]).
///
/// [`Identity::is_unscoped_admin`]: crate::request::identity::Identity::is_unscoped_admin
pub use crate::request::identity::SYSTEM_MASTERS;

/// The API group of the RBAC objects.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Prefix of the user names of service accounts.
pub const SERVICE_ACCOUNT_USER_PREFIX: &str = "system:serviceaccount:";

/// The group every service account belongs to.
pub const ALL_SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// The identity of a requester, as produced by authentication.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name (`system:serviceaccount:<ns>:<name>` for service accounts).
    pub name: String,
    /// The groups of the user.
    pub groups: Vec<String>,
    /// Extra authentication attributes (`X-Remote-Extra-*`).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with the given name and groups and no extra attributes.
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }

    /// The identity of service account `name` in `namespace`, carrying the
    /// groups kube's service-account authenticator assigns.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            name: format!("{SERVICE_ACCOUNT_USER_PREFIX}{namespace}:{name}"),
            groups: vec![
                ALL_SERVICE_ACCOUNTS_GROUP.to_string(),
                format!("{ALL_SERVICE_ACCOUNTS_GROUP}:{namespace}"),
                "system:authenticated".to_string(),
            ],
            extra: BTreeMap::new(),
        }
    }

    /// If the user name is a service-account user name, its namespace and name.
    pub fn service_account_parts(&self) -> Option<(&str, &str)> {
        let rest = self.name.strip_prefix(SERVICE_ACCOUNT_USER_PREFIX)?;
        let (ns, name) = rest.split_once(':')?;
        if ns.is_empty() || name.is_empty() || name.contains(':') {
            return None;
        }
        Some((ns, name))
    }

    /// The groups used for RBAC subject matching: the user's groups plus,
    /// for service-account users, `system:serviceaccounts` and
    /// `system:serviceaccounts:<ns>` (which kube's authenticators and
    /// impersonation always add for service accounts).
    pub fn effective_groups(&self) -> Vec<String> {
        let mut groups = self.groups.clone();
        if let Some((ns, _)) = self.service_account_parts() {
            for g in [
                ALL_SERVICE_ACCOUNTS_GROUP.to_string(),
                format!("{ALL_SERVICE_ACCOUNTS_GROUP}:{ns}"),
            ] {
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
        }
        groups
    }

    /// Whether the user is in the `system:masters` group.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == SYSTEM_MASTERS)
    }
}

/// The attributes of a request to authorize (kube `authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Who is asking.
    pub user: UserInfo,
    /// The verb (`get`, `list`, `create`, … or a lowercase HTTP method for
    /// non-resource requests).
    pub verb: String,
    /// The API group (`""` for the core group).
    pub api_group: String,
    /// The plural resource name.
    pub resource: String,
    /// The subresource (`""` if none).
    pub subresource: String,
    /// The object name (`""` if none, e.g. list/create).
    pub name: String,
    /// The namespace; `None` (or `Some("")`) for cluster-scoped requests.
    pub namespace: Option<String>,
    /// The URL path of a non-resource request.
    pub path: String,
    /// Whether this is a resource request (otherwise a non-resource one).
    pub resource_request: bool,
}

impl Attributes {
    /// A resource request without name or subresource.
    pub fn resource(
        user: UserInfo,
        verb: &str,
        api_group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Self {
        Attributes {
            user,
            verb: verb.to_string(),
            api_group: api_group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.map(str::to_string),
            resource_request: true,
            ..Attributes::default()
        }
    }

    /// A non-resource request for `path`.
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Self {
        Attributes {
            user,
            verb: verb.to_string(),
            path: path.to_string(),
            resource_request: false,
            ..Attributes::default()
        }
    }

    /// Sets the object name.
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Sets the subresource.
    pub fn with_subresource(mut self, subresource: &str) -> Self {
        self.subresource = subresource.to_string();
        self
    }

    /// The namespace, with `Some("")` normalised to `None`.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref().filter(|ns| !ns.is_empty())
    }

    /// Builds attributes from the `spec` of a (Self)SubjectAccessReview
    /// (`resourceAttributes` or `nonResourceAttributes`) for `user`.
    /// Returns `None` when neither attribute set is present.
    pub fn from_access_review_spec(user: UserInfo, spec: &Value) -> Option<Self> {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
            let ns = s(ra, "namespace");
            return Some(Attributes {
                user,
                verb: s(ra, "verb"),
                api_group: s(ra, "group"),
                resource: s(ra, "resource"),
                subresource: s(ra, "subresource"),
                name: s(ra, "name"),
                namespace: (!ns.is_empty()).then_some(ns),
                path: String::new(),
                resource_request: true,
            });
        }
        let nra = spec
            .get("nonResourceAttributes")
            .filter(|v| v.is_object())?;
        Some(Attributes::non_resource(
            user,
            &s(nra, "verb"),
            &s(nra, "path"),
        ))
    }
}

/// The answer of an authorizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The request is allowed.
    Allow,
    /// The request is denied; the reason may be empty (kube appends it to
    /// the forbidden message only when non-empty).
    Deny(String),
    /// The authorizer has no opinion (for chaining authorizers).
    NoOpinion,
}

impl Decision {
    /// Whether the decision is [`Decision::Allow`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    /// The reason of a denial (empty for other decisions).
    pub fn reason(&self) -> &str {
        match self {
            Decision::Deny(r) => r,
            _ => "",
        }
    }
}

/// The message of kube's 403 Forbidden status for a denied request
/// (`handlers/responsewriters/errors.go forbiddenMessage` wrapped by
/// `errors.NewForbidden`), with `: <reason>` appended when `reason` is
/// non-empty.
///
/// ```text
/// configmaps "x" is forbidden: User "jane" cannot get resource "configmaps" in API group "" in the namespace "default"
/// ```
pub fn forbidden_message(attrs: &Attributes, reason: &str) -> String {
    let user = go_quote(&attrs.user.name);
    let mut detail = if !attrs.resource_request {
        format!(
            "User {user} cannot {} path {}",
            attrs.verb,
            go_quote(&attrs.path)
        )
    } else {
        let mut resource = attrs.resource.clone();
        if !attrs.subresource.is_empty() {
            resource = format!("{resource}/{}", attrs.subresource);
        }
        let scope = match attrs.namespace() {
            Some(ns) => format!("in the namespace {}", go_quote(ns)),
            None => "at the cluster scope".to_string(),
        };
        format!(
            "User {user} cannot {} resource {} in API group {} {scope}",
            attrs.verb,
            go_quote(&resource),
            go_quote(&attrs.api_group)
        )
    };
    if !reason.is_empty() {
        detail = format!("{detail}: {reason}");
    }
    let qualified = if !attrs.resource_request || attrs.resource.is_empty() {
        String::new()
    } else if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    if qualified.is_empty() {
        format!("forbidden: {detail}")
    } else if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {detail}")
    } else {
        format!(
            "{qualified} {} is forbidden: {detail}",
            go_quote(&attrs.name)
        )
    }
}

/// Formats a string list like Go's `%q` on a `[]string`: `["a" "b"]`.
pub(crate) fn go_quote_list(items: &[String]) -> String {
    let parts: Vec<String> = items.iter().map(|s| go_quote(s)).collect();
    format!("[{}]", parts.join(" "))
}
