//! Who a request comes from, once authenticated (and after impersonation).

/// kcp's scope extra: a user carrying it is itself only in the logical clusters it names
/// (`cluster:<name>`, comma-separated or one per value); everywhere else it is anonymous.
pub const SCOPES_EXTRA: &str = "authentication.kcp.io/scopes";

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

    /// A user with groups and nothing else.
    pub fn new(user: impl Into<String>, groups: Vec<String>) -> Self {
        Identity {
            user: user.into(),
            groups,
            ..Identity::default()
        }
    }
}
