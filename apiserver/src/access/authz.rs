//! Authorization: RBAC of the addressed logical cluster (with the per-workspace policy cache),
//! the workspace access kcp requires beyond it, the APIExport virtual workspace's rule,
//! impersonation, and the escalation check on RBAC writes.

use std::sync::Arc;

use serde_json::Value;

use crate::access::authn::{header_values, AUTHENTICATED_GROUP};
use crate::access::rbac::{Attributes, RbacPolicy, UserInfo};
use crate::meta::status::ApiError;
use crate::registry::objects;
use crate::request::identity::Identity;
use crate::request::request_info::ResourceRequest;
use crate::storage::{list_all, Store};

/// The user RBAC sees for `identity` in `cluster`. A service account used outside its own
/// logical cluster is `system:kcp:serviceaccount:<cluster>:<ns>:<name>` there, with no
/// service-account groups (kcp's rule), so another workspace's bindings for
/// `system:serviceaccounts` or for a same-named account do not reach it.
///
/// A scoped user (kcp's `authentication.kcp.io/scopes`: a user admitted by a workspace's own
/// authentication, or impersonated by someone who is not `system:masters`) is, outside the
/// clusters of its scope (and across all workspaces), `system:anonymous` in
/// `system:authenticated` only, as kcp's `EffectiveUsers` makes it.
pub fn user_info(identity: &Identity, cluster: Option<&str>) -> UserInfo {
    let in_scope = match cluster {
        Some(c) => identity.in_scope(c),
        // Across all workspaces a scoped user is in scope nowhere.
        None => !identity.is_scoped(),
    };
    if !in_scope {
        return UserInfo {
            name: "system:anonymous".into(),
            groups: vec![AUTHENTICATED_GROUP.into()],
            extra: Default::default(),
        };
    }
    let foreign = identity
        .home_cluster
        .as_deref()
        .is_some_and(|home| Some(home) != cluster);
    let (name, mut groups) = match (
        foreign,
        identity.user.strip_prefix("system:serviceaccount:"),
    ) {
        (true, Some(rest)) => (
            format!(
                "system:kcp:serviceaccount:{}:{rest}",
                identity.home_cluster.as_deref().unwrap_or_default()
            ),
            Vec::new(),
        ),
        _ => (identity.user.clone(), identity.groups.clone()),
    };
    if name != "system:anonymous" && !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        groups.push(AUTHENTICATED_GROUP.into());
    }
    if cluster.is_some() && identity.warrant.as_deref() == cluster {
        groups.push(crate::access::rbac::SYSTEM_MASTERS.into());
    }
    UserInfo {
        name,
        groups,
        extra: identity.extra.clone(),
    }
}

/// RBAC authorization of every workspace: the RBAC objects in the store, decoded once per
/// workspace and kept in the policy cache until one of them changes. A narrow handle, not the
/// whole server.
#[derive(Clone)]
pub struct Rbac {
    store: Arc<dyn Store>,
    policies: Arc<crate::access::rbac::PolicyCache>,
}

impl Rbac {
    /// Authorization over `store`, keeping policies in `policies`.
    pub fn new(store: Arc<dyn Store>, policies: Arc<crate::access::rbac::PolicyCache>) -> Self {
        Rbac { store, policies }
    }

    /// The RBAC policy of one logical cluster, with the roles every workspace shares: the kept
    /// one while its RBAC objects are unchanged, else read from the store (the watch cache's
    /// lists) and kept.
    pub async fn policy_of(&self, cluster: &str) -> Result<Arc<RbacPolicy>, ApiError> {
        if let Some(policy) = self.policies.get(cluster) {
            return Ok(policy);
        }
        let mut sets: Vec<Vec<Value>> = Vec::new();
        // Each kind is listed at its own revision: the policy counts as read at the oldest, so
        // a change that slipped in between invalidates it.
        let mut read_at = u64::MAX;
        for plural in [
            "roles",
            "clusterroles",
            "rolebindings",
            "clusterrolebindings",
        ] {
            let (items, revision) = list_all(
                self.store.as_ref(),
                &format!("{}{plural}/{cluster}/", crate::access::rbac::RBAC_PREFIX),
            )
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
            read_at = read_at.min(revision);
            sets.push(
                items
                    .iter()
                    .filter_map(|kv| objects::decode_stored(&kv.value).ok())
                    .collect(),
            );
        }
        // Every workspace also has the shared bootstrap roles; `root` is open to every user.
        let policy = Arc::new(
            RbacPolicy::from_objects(&sets[0], &sets[1], &sets[2], &sets[3])
                .with_shared_roles(cluster == crate::request::request_info::ROOT_CLUSTER),
        );
        self.policies.put(cluster, read_at, policy.clone());
        Ok(policy)
    }
}

/// Decides what a user may do in one logical cluster, as kube-apiserver's authorizers do; the
/// tenancy rules on top (workspace membership, virtual workspaces, `system:masters`) are this
/// module's functions, the same for every authorizer. [`Rbac`] is the one the server runs.
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync {
    /// The decision for `attrs` in `cluster`.
    async fn decide(
        &self,
        cluster: &str,
        attrs: &Attributes,
    ) -> Result<crate::access::rbac::Decision, ApiError>;

    /// Whether `user` is a member of `cluster`'s workspace (holds any binding there).
    async fn is_member(&self, cluster: &str, user: &UserInfo) -> Result<bool, ApiError>;
}

#[async_trait::async_trait]
impl Authorizer for Rbac {
    async fn decide(
        &self,
        cluster: &str,
        attrs: &Attributes,
    ) -> Result<crate::access::rbac::Decision, ApiError> {
        Ok(self.policy_of(cluster).await?.authorize(attrs))
    }

    async fn is_member(&self, cluster: &str, user: &UserInfo) -> Result<bool, ApiError> {
        Ok(self.policy_of(cluster).await?.is_bound(user))
    }
}

/// Where a request is evaluated: one logical cluster, every cluster, or an APIExport's virtual
/// workspace (`(export cluster, export name)`).
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// One logical cluster, by name.
    Cluster(&'a str),
    /// `/clusters/*`: every cluster at once.
    Wildcard,
    /// An APIExport's virtual workspace: the export's logical cluster and the export's name.
    VirtualWorkspace(&'a str, &'a str),
}

impl Scope<'_> {
    /// The one logical cluster whose RBAC applies (the export's for a virtual workspace).
    pub fn cluster(&self) -> Option<&str> {
        match self {
            Scope::Cluster(c) | Scope::VirtualWorkspace(c, _) => Some(c),
            Scope::Wildcard => None,
        }
    }
}

fn forbidden(attrs: &Attributes, reason: &str) -> ApiError {
    let mut e = ApiError::forbidden(crate::access::rbac::forbidden_message(attrs, reason));
    if attrs.resource_request {
        e.details = Some(Box::new(crate::meta::status::Details {
            name: attrs.name.clone(),
            group: attrs.api_group.clone(),
            kind: attrs.resource.clone(),
            ..Default::default()
        }));
    }
    e
}

/// A 403 for a resource request in `cluster`, as an authorizer denying it with `reason` words it.
pub fn forbidden_in(
    identity: &Identity,
    cluster: &str,
    rr: &ResourceRequest,
    reason: &str,
) -> ApiError {
    forbidden(
        &request_attributes(user_info(identity, Some(cluster)), rr),
        reason,
    )
}

/// What an authorizer is asked about a resource request of `user`.
pub fn request_attributes(user: UserInfo, rr: &ResourceRequest) -> Attributes {
    let mut attrs = Attributes::resource(
        user,
        rr.verb.as_str(),
        &rr.group,
        &rr.resource,
        rr.namespace.as_deref(),
    )
    .with_name(rr.name.as_deref().unwrap_or_default());
    if let Some(s) = &rr.subresource {
        attrs = attrs.with_subresource(s);
    }
    attrs
}

/// Authorizes a virtual-workspace request: the user must hold the request's verb on the
/// export's `apiexports/content` in the export's workspace (kcp's rule).
pub async fn authorize_export_content(
    authorizer: &dyn Authorizer,
    identity: &Identity,
    export_cluster: &str,
    export: &str,
    verb: &str,
) -> Result<(), ApiError> {
    let Some(user) = unless_master(identity, Some(export_cluster)) else {
        return Ok(());
    };
    let attrs = Attributes::resource(user, verb, "apis.kcp.io", "apiexports", None)
        .with_name(export)
        .with_subresource("content");
    let decision = authorizer.decide(export_cluster, &attrs).await?;
    if !decision.is_allowed() && !authorizer.is_member(export_cluster, &attrs.user).await? {
        // Not a member of the export's workspace: the same answer whether the workspace or the
        // export exist or not.
        return Err(ApiError::workspace_forbidden());
    }
    decide(&attrs, decision)
}

/// The user RBAC sees in `cluster` (`None`: across all), or `None` for `system:masters`, who
/// skip authorization.
fn unless_master(identity: &Identity, cluster: Option<&str>) -> Option<UserInfo> {
    Some(user_info(identity, cluster)).filter(|u| !u.is_master())
}

fn decide(attrs: &Attributes, decision: crate::access::rbac::Decision) -> Result<(), ApiError> {
    if decision.is_allowed() {
        Ok(())
    } else {
        Err(forbidden(attrs, decision.reason()))
    }
}

/// Authorizes a resource request with the RBAC objects of its cluster. `system:masters` skip the
/// lookup. Wildcard (`/clusters/*`) requests are for `system:masters` only; virtual-workspace
/// requests need `apiexports/content` on the export.
pub async fn authorize(
    authorizer: &dyn Authorizer,
    scope: Scope<'_>,
    identity: &Identity,
    rr: &ResourceRequest,
) -> Result<(), ApiError> {
    if let Scope::VirtualWorkspace(cluster, export) = scope {
        return authorize_export_content(authorizer, identity, cluster, export, rr.verb.as_str())
            .await;
    }
    let cluster = scope.cluster();
    let Some(user) = unless_master(identity, cluster) else {
        return Ok(());
    };
    let attrs = request_attributes(user, rr);
    let decision = match cluster {
        Some(c) => {
            let decision = authorizer.decide(c, &attrs).await?;
            if !decision.is_allowed()
                && c != crate::request::request_info::ROOT_CLUSTER
                && !authorizer.is_member(c, &attrs.user).await?
            {
                // Not a member: the answer of a workspace that does not exist.
                return Err(ApiError::workspace_forbidden());
            }
            decision
        }
        None => crate::access::rbac::Decision::Deny(
            "only system:masters may list or watch across all workspaces".into(),
        ),
    };
    decide(&attrs, decision)
}

/// Authorizes a non-resource request (discovery, OpenAPI) in a workspace: allowed in `root` (where
/// every kubeconfig starts; kube-apiserver's `system:discovery` role opens the same to every
/// authenticated user), and elsewhere when RBAC allows the path or the user has any binding there
/// (access to the workspace, as kcp's workspace content authorizer). Other workspaces are closed,
/// so their APIs stay private.
pub async fn authorize_non_resource(
    authorizer: &dyn Authorizer,
    scope: Scope<'_>,
    identity: &Identity,
    verb: &str,
    path: &str,
) -> Result<(), ApiError> {
    if let Scope::VirtualWorkspace(cluster, export) = scope {
        return authorize_export_content(authorizer, identity, cluster, export, "get").await;
    }
    let cluster = scope.cluster();
    if cluster == Some(crate::request::request_info::ROOT_CLUSTER) {
        return Ok(());
    }
    let Some(user) = unless_master(identity, cluster) else {
        return Ok(());
    };
    let attrs = Attributes::non_resource(user, verb, path);
    if let Some(c) = cluster {
        if authorizer.is_member(c, &attrs.user).await?
            || authorizer.decide(c, &attrs).await?.is_allowed()
        {
            return Ok(());
        }
    }
    Err(ApiError::workspace_forbidden())
}

/// Whether RBAC of `cluster` lets `identity` do `verb` on the named resource (`system:masters`
/// may do anything): for checks beyond the request's own, such as `bind` on an APIExport.
pub async fn allowed(
    authorizer: &dyn Authorizer,
    cluster: &str,
    identity: &Identity,
    verb: &str,
    group: &str,
    resource: &str,
    name: &str,
) -> Result<bool, ApiError> {
    let Some(user) = unless_master(identity, Some(cluster)) else {
        return Ok(true);
    };
    let attrs = Attributes::resource(user, verb, group, resource, None).with_name(name);
    Ok(authorizer.decide(cluster, &attrs).await?.is_allowed())
}

/// Authorizes a non-resource URL that is not about any one workspace (`/metrics`) with the RBAC
/// of `root`, where the platform's operators are bound.
pub async fn authorize_root_non_resource(
    authorizer: &dyn Authorizer,
    identity: &Identity,
    verb: &str,
    path: &str,
) -> Result<(), ApiError> {
    let root = crate::request::request_info::ROOT_CLUSTER;
    let Some(user) = unless_master(identity, Some(root)) else {
        return Ok(());
    };
    let attrs = Attributes::non_resource(user, verb, path);
    decide(&attrs, authorizer.decide(root, &attrs).await?)
}

/// Applies `Impersonate-*` headers: the authenticated user must be allowed to `impersonate`
/// each requested user (or service account), group, uid and extra value in the request's
/// workspace. The headers are removed. `Ok(None)` when none were sent.
pub async fn impersonate(
    rbac: &Rbac,
    cluster: Option<&str>,
    identity: &Identity,
    headers: &mut http::HeaderMap,
) -> Result<Option<Identity>, ApiError> {
    let first = |name: &str| header_values(headers, name).into_iter().next();
    let user = first("impersonate-user");
    let uid = first("impersonate-uid");
    let groups = header_values(headers, "impersonate-group");
    let extra = crate::access::authn::take_prefixed(headers, &["impersonate-extra-"]);
    for h in ["impersonate-user", "impersonate-uid", "impersonate-group"] {
        headers.remove(h);
    }
    let Some(user) = user else {
        if groups.is_empty() && uid.is_none() && extra.is_empty() {
            return Ok(None);
        }
        return Err(ApiError::bad_request(
            "Impersonate-Group, Impersonate-Uid and Impersonate-Extra need an Impersonate-User header",
        ));
    };
    check_impersonation_gate(identity, &groups, &extra)?;
    let me = user_info(identity, cluster);
    let policy = match cluster {
        Some(c) if !me.is_master() => Some(rbac.policy_of(c).await?),
        _ => None,
    };
    let check = |group: &str, resource: &str, sub: &str, ns: Option<&str>, name: &str| {
        if me.is_master() {
            return Ok(());
        }
        let mut attrs =
            Attributes::resource(me.clone(), "impersonate", group, resource, ns).with_name(name);
        if !sub.is_empty() {
            attrs = attrs.with_subresource(sub);
        }
        let decision = match &policy {
            Some(p) => p.authorize(&attrs),
            None => crate::access::rbac::Decision::Deny(String::new()),
        };
        decide(&attrs, decision)
    };
    let mut out_groups = groups.clone();
    match UserInfo::new(user.clone(), &[]).service_account_parts() {
        Some((ns, name)) => {
            check("", "serviceaccounts", "", Some(ns), name)?;
            for g in [
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
            ] {
                if !out_groups.contains(&g) {
                    out_groups.push(g);
                }
            }
        }
        None => check("", "users", "", None, &user)?,
    }
    for g in &groups {
        check("", "groups", "", None, g)?;
    }
    if let Some(uid) = &uid {
        check("authentication.k8s.io", "uids", "", None, uid)?;
    }
    for (key, vals) in &extra {
        for v in vals {
            check("authentication.k8s.io", "userextras", key, None, v)?;
        }
    }
    if user != "system:anonymous" && !out_groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        out_groups.push(AUTHENTICATED_GROUP.into());
    }
    // As kcp: only system:masters impersonates without a scope; anyone else's impersonated user
    // is confined to the cluster the impersonation was allowed in.
    let mut extra = extra;
    if let (Some(c), false) = (cluster, me.is_master()) {
        extra
            .entry(crate::request::identity::SCOPES_EXTRA.to_string())
            .or_default()
            .push(format!("cluster:{c}"));
    }
    Ok(Some(Identity {
        user,
        groups: out_groups,
        uid: uid.unwrap_or_default(),
        extra,
        home_cluster: cluster.map(str::to_string),
        warrant: None,
        // A tenant's impersonations are the tenant's own load; an administrator's act as the
        // user they name.
        charged_to: (!identity.is_unscoped_admin()).then(|| {
            identity
                .charged_to
                .clone()
                .unwrap_or_else(|| identity.budget_key())
        }),
    }))
}

/// The groups kcp's impersonation gate guards, each with its rank: a requester may impersonate
/// one only if it is itself in that group (or is an unscoped administrator, who may impersonate
/// anyone).
const GUARDED_GROUPS: [&str; 6] = [
    crate::access::rbac::SYSTEM_MASTERS,
    "system:kcp:logical-cluster-admin",
    "system:kcp:external-logical-cluster-admin",
    "system:kcp:tenancy:workspace-bootstrapper",
    "system:kcp:admin",
    AUTHENTICATED_GROUP,
];

/// kcp's impersonation gatekeeper, before RBAC's `impersonate` checks: only an unscoped
/// administrator impersonates a privileged group it is not in (`system:masters`, kcp's
/// logical-cluster and bootstrap groups, `system:authenticated`), and only it sets a reserved
/// extra (a key containing `kcp.io`: the scope, the cluster name), since those grant authority.
/// Refused with 403, as kcp's `WithImpersonationGatekeeper`; RBAC's `impersonate` on groups
/// alone would let a workspace admin become `system:masters` there.
fn check_impersonation_gate(
    requester: &Identity,
    groups: &[String],
    extra: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<(), ApiError> {
    if requester.is_unscoped_admin() {
        return Ok(());
    }
    if let Some(key) = extra
        .keys()
        .find(|k| k.to_ascii_lowercase().contains("kcp.io"))
    {
        return Err(ApiError::forbidden(format!(
            "forbidden: impersonating the extra key {key:?} is not allowed for the requestor"
        )));
    }
    let denied = groups.iter().any(|g| {
        GUARDED_GROUPS.contains(&g.as_str()) && !requester.groups.iter().any(|mine| mine == g)
    });
    if denied {
        return Err(ApiError::forbidden(
            "forbidden: impersonation is not allowed for the requestor",
        ));
    }
    Ok(())
}

/// Refuses a Role, ClusterRole or binding that would grant its writer permissions it does not
/// hold (unless it may `escalate` or `bind`), as kube-apiserver's RBAC admission does.
pub async fn check_rbac_write(
    rbac: &Rbac,
    cluster: &str,
    identity: Option<&Identity>,
    resource: &crate::registry::Resource,
    obj: &Value,
) -> Result<(), ApiError> {
    if resource.ty.group != crate::access::rbac::RBAC_GROUP {
        return Ok(());
    }
    let Some(identity) = identity else {
        return Ok(());
    };
    let user = user_info(identity, Some(cluster));
    if user.is_master() {
        return Ok(());
    }
    let policy = rbac.policy_of(cluster).await?;
    let checked = if resource.ty.kind.ends_with("Binding") {
        crate::access::rbac::check_binding_write(&user, &policy, obj)
    } else {
        crate::access::rbac::check_role_write(&user, &policy, obj)
    };
    checked.map_err(|why| {
        ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: {why}",
            resource.gr,
            objects::name(obj)
        ))
    })
}

/// The RBAC types' escalation check as their strategy: a Role, ClusterRole or binding is
/// checked against its writer's own permissions before it is stored.
pub struct RbacEscalation(pub Rbac);

impl RbacEscalation {
    /// Adds the check to the four RBAC types.
    pub fn register(rbac: &Rbac, strategies: &mut crate::registry::StrategiesBuilder) {
        let s = Arc::new(RbacEscalation(rbac.clone()));
        for plural in [
            "roles",
            "clusterroles",
            "rolebindings",
            "clusterrolebindings",
        ] {
            strategies.add(crate::access::rbac::RBAC_GROUP, plural, s.clone());
        }
    }
}

#[async_trait::async_trait]
impl crate::registry::Strategy for RbacEscalation {
    /// RBAC objects are named by path segment, as kube-apiserver's `ValidateRBACName` does
    /// (`system:controller:...`, `platform-mesh:...`).
    fn name_rule(&self) -> Option<crate::meta::names::NameRule> {
        Some(crate::meta::names::NameRule::PathSegment)
    }

    async fn prepare_for_store(
        &self,
        write: &crate::registry::WriteAttributes<'_>,
        obj: &mut Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        check_rbac_write(&self.0, write.cluster, write.user, write.resource, obj).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::rbac::Decision;
    use crate::request::request_info::Verb;

    #[test]
    fn a_warrant_makes_an_administrator_of_its_one_workspace_only() {
        let mut owner = Identity::new("owner", vec![]);
        assert!(!user_info(&owner, Some("c1")).is_master());
        owner.warrant = Some("c1".into());
        assert!(user_info(&owner, Some("c1")).is_master());
        assert!(!user_info(&owner, Some("c2")).is_master());
        assert!(
            !user_info(&owner, None).is_master(),
            "not across workspaces"
        );
        assert_eq!(
            user_info(&owner, Some("c1")).name,
            "owner",
            "still the caller"
        );
    }

    /// An authorizer that allows only `alice` to get configmaps, and counts `bob` (and alice) as
    /// members of every workspace.
    struct Table;

    #[async_trait::async_trait]
    impl Authorizer for Table {
        async fn decide(&self, _cluster: &str, attrs: &Attributes) -> Result<Decision, ApiError> {
            Ok(
                if attrs.user.name == "alice"
                    && attrs.verb == "get"
                    && attrs.resource == "configmaps"
                {
                    Decision::Allow
                } else {
                    Decision::Deny(String::new())
                },
            )
        }

        async fn is_member(&self, _cluster: &str, user: &UserInfo) -> Result<bool, ApiError> {
            Ok(user.name == "alice" || user.name == "bob")
        }
    }

    fn get_configmap() -> ResourceRequest {
        ResourceRequest {
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            namespace: Some("default".into()),
            name: Some("c".into()),
            subresource: None,
            verb: Verb::Get,
        }
    }

    /// The tenancy rules hold over any authorizer: a member refused gets kube's Forbidden, a
    /// stranger gets the answer of a workspace that does not exist (but not in `root`),
    /// `system:masters` skip authorization, and only they may read across all workspaces.
    #[tokio::test]
    async fn tenancy_rules_sit_on_top_of_any_authorizer() {
        let rr = get_configmap();
        let who = |user: &str, groups: &[&str]| {
            Identity::new(user, groups.iter().map(|g| g.to_string()).collect())
        };
        let code = |r: Result<(), ApiError>| r.map_err(|e| (e.code, e.message));
        let stranger = ApiError::workspace_forbidden().message;
        let scope = Scope::Cluster("c1");
        assert_eq!(
            code(authorize(&Table, scope, &who("alice", &[]), &rr).await),
            Ok(())
        );
        let bob = code(authorize(&Table, scope, &who("bob", &[]), &rr).await);
        assert!(matches!(&bob, Err((403, m)) if *m != stranger), "{bob:?}");
        assert_eq!(
            code(authorize(&Table, scope, &who("eve", &[]), &rr).await),
            Err((403, stranger.clone()))
        );
        let root = code(authorize(&Table, Scope::Cluster("root"), &who("eve", &[]), &rr).await);
        assert!(matches!(&root, Err((403, m)) if *m != stranger), "{root:?}");
        let master = who("admin", &["system:masters"]);
        assert_eq!(code(authorize(&Table, scope, &master, &rr).await), Ok(()));
        assert_eq!(
            code(authorize(&Table, Scope::Wildcard, &master, &rr).await),
            Ok(())
        );
        assert!(authorize(&Table, Scope::Wildcard, &who("alice", &[]), &rr)
            .await
            .is_err());
        assert!(allowed(
            &Table,
            "c1",
            &who("alice", &[]),
            "get",
            "",
            "configmaps",
            "c"
        )
        .await
        .expect("decided"));
        assert!(
            !allowed(&Table, "c1", &who("bob", &[]), "get", "", "configmaps", "c")
                .await
                .expect("decided")
        );
    }

    /// Through the server's authorizer: the store of one workspace, the policy cache, and the
    /// tenancy rules on top.
    #[tokio::test]
    async fn the_servers_authorizer_consults_the_shared_roles() {
        use crate::access::rbac::PolicyCache;
        use crate::storage::MemoryStore;
        use serde_json::json;

        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let x = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "x"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "dora"}],
        });
        store
            .create(
                "/rbac.authorization.k8s.io/clusterrolebindings/c1/x",
                crate::registry::objects::encoder(x),
            )
            .await
            .expect("stored");
        let rbac = Rbac::new(store, Arc::new(PolicyCache::new()));
        let request = |resource: &str, group: &str, verb: Verb| ResourceRequest {
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            namespace: None,
            name: None,
            subresource: None,
            verb,
        };
        let create = ResourceRequest {
            namespace: Some("default".into()),
            ..request("configmaps", "", Verb::Create)
        };
        let review = request(
            "selfsubjectaccessreviews",
            "authorization.k8s.io",
            Verb::Create,
        );
        let dora = Identity::new("dora", vec![]);
        let eve = Identity::new("eve", vec![]);
        let stranger = ApiError::workspace_forbidden().message;
        let c1 = Scope::Cluster("c1");
        assert!(authorize(&rbac, c1, &dora, &create).await.is_ok());
        assert!(authorize(&rbac, c1, &dora, &review).await.is_ok());
        // A stranger to c1 gets the one answer of a workspace it may not enter, even for what the
        // shared bindings give every authenticated user.
        for rr in [&create, &review] {
            let e = authorize(&rbac, c1, &eve, rr)
                .await
                .err()
                .map(|e| e.message);
            assert_eq!(e.as_deref(), Some(stranger.as_str()));
        }
        let e = authorize_non_resource(&rbac, c1, &eve, "get", "/api").await;
        assert_eq!(
            e.err().map(|e| e.message).as_deref(),
            Some(stranger.as_str())
        );
        // In root, open to all, the shared bindings are everyone's.
        let root = Scope::Cluster(crate::request::request_info::ROOT_CLUSTER);
        assert!(authorize(&rbac, root, &eve, &review).await.is_ok());
        assert!(authorize(&rbac, root, &eve, &create).await.is_err());
    }
}
