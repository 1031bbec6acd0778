//! Who a request comes from, once authenticated (and after impersonation).

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
}

impl Identity {
    /// A user with groups and nothing else.
    pub fn new(user: impl Into<String>, groups: Vec<String>) -> Self {
        Identity {
            user: user.into(),
            groups,
            ..Identity::default()
        }
    }
}
