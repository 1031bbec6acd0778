//! Who a request comes from, once authenticated (and after impersonation).

/// kcp's scope extra: a user carrying it is itself only in the logical clusters it names
/// (`cluster:<name>`, comma-separated or one per value); everywhere else it is anonymous.
pub const SCOPES_EXTRA: &str = "authentication.kcp.io/scopes";

/// The group of the server's administrators (kube's superuser group).
pub const SYSTEM_MASTERS: &str = "system:masters";

/// The authenticated user of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The user name (`admin`, `system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// The groups the user belongs to (`system:masters`, `system:authenticated`).
    pub groups: Vec<String>,
    /// The user's uid; empty when the authenticator gives none.
    pub uid: String,
    /// Extra attributes from the authenticator (`authentication.kubernetes.io/credential-id`), by key.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
    /// For service accounts: the logical cluster they live in. Elsewhere they are foreigners.
    pub home_cluster: Option<String>,
    /// kcp's warrant: a request that an APIExport's virtual workspace let into one logical
    /// cluster also carries the rights of that cluster's administrator, there and nowhere else,
    /// so the write's own checks (RBAC escalation, `use` of a workspace type in that cluster)
    /// see what kcp's do. Set by the server only, never from a request.
    pub warrant: Option<String>,
    /// For an impersonated user: the budget key of the user who authenticated and impersonated
    /// it, who pays for what the request holds (open watches, unread lists), so impersonating
    /// many names does not multiply one tenant's budgets. Set by the server only.
    pub charged_to: Option<String>,
}

impl Identity {
    /// Whether the user is itself in logical cluster `cluster` (kcp's `IsInScope`): every value
    /// of its scope extra must name that cluster; a user without scopes is in every cluster.
    pub fn in_scope(&self, cluster: &str) -> bool {
        self.extra.get(SCOPES_EXTRA).is_none_or(|values| {
            values.iter().all(|v| {
                v.split(',')
                    .any(|s| s.strip_prefix("cluster:") == Some(cluster))
            })
        })
    }

    /// The one logical cluster a scoped user is in, if it is scoped to exactly one.
    pub fn scope(&self) -> Option<&str> {
        match self.extra.get(SCOPES_EXTRA).map(Vec::as_slice) {
            Some([one]) if !one.contains(',') => one.strip_prefix("cluster:"),
            _ => None,
        }
    }

    /// Whether the user is confined to some logical clusters by kcp's scope extra (admitted by a
    /// workspace's own authentication, or impersonated by someone who is not an unscoped
    /// administrator). A scope with no values still confines: only its absence frees.
    pub fn is_scoped(&self) -> bool {
        self.extra.contains_key(SCOPES_EXTRA)
    }

    /// Whether the user is one of the server's own administrators: in `system:masters` and
    /// confined to no workspace. This, never `groups contains system:masters` alone, decides every
    /// privilege that reaches beyond one workspace: owning nothing by creating a workspace,
    /// setting reserved annotations, the per-user budgets, the not-Ready gate, requests across
    /// all workspaces and impersonation without a scope. A `system:masters` that is scoped (which
    /// the impersonation gate refuses to hand out, as kcp's) is an administrator of its scope's
    /// workspace at most, through RBAC there.
    pub fn is_unscoped_admin(&self) -> bool {
        !self.is_scoped() && self.groups.iter().any(|g| g == SYSTEM_MASTERS)
    }

    /// The key the per-user budgets count this user under: a service account's home (its name
    /// repeats across workspaces) or a scoped user's workspace (not the global user of the same
    /// name), then the name.
    pub fn budget_key(&self) -> String {
        let home = self.home_cluster.as_deref().or(self.scope()).unwrap_or("");
        format!("{home}/{}", self.user)
    }

    /// A user with groups and nothing else.
    pub fn new(user: impl Into<String>, groups: Vec<String>) -> Self {
        Identity {
            user: user.into(),
            groups,
            ..Identity::default()
        }
    }
}
