//! kcp's per-workspace authentication: a bearer token no global authenticator accepts may still
//! admit its holder into one workspace, when the WorkspaceType of that workspace lists
//! WorkspaceAuthenticationConfigurations (`spec.authenticationConfigurations`, each living in the
//! type's own logical cluster) with a JWT authenticator for the token's issuer.
//!
//! As kcp does (its front proxy's workspace authenticator):
//! - the authenticators are those of the workspace's own type, read (from the watch cache) when
//!   a token needs them, so a changed type or configuration applies to existing workspaces as
//!   soon as the cache has it, a moment after the write (kcp's informers lag the same way);
//! - the configurations of a type form a union; one that kube would refuse to build (see
//!   [`config`]) or that is missing makes the whole type authenticate nobody;
//! - a username starting with `system:` is refused, groups starting with `system:` and extra
//!   keys containing `kcp.io` are dropped, `system:authenticated` is added, and the user is
//!   scoped to the workspace (`authentication.kcp.io/scopes: cluster:<name>`,
//!   `authentication.kcp.io/cluster-name`): in any other workspace it is anonymous;
//! - only `/clusters/<workspace>` requests are authenticated so, never virtual workspaces.
//!
//! The issuer's discovery document and key set are fetched on first use ([`fetch`]), kept for
//! an hour, fetched again (at most every ten seconds) when a token names a key the set lacks;
//! a failed fetch is remembered for ten seconds, so tokens cannot make the server fetch in a
//! loop. What is kept is bounded in count.

pub mod config;
pub mod fetch;
pub mod issuer;
pub mod jwt;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::identity::{Identity, SCOPES_EXTRA};
use crate::storage::Store;
use crate::tenancy::Tenancy;
use config::JwtAuthenticator;
use jwt::{RsaKey, TokenError};

/// The extra key naming the logical cluster a workspace-authenticated user was admitted to.
pub const CLUSTER_NAME_EXTRA: &str = "authentication.kcp.io/cluster-name";
/// How long a key set is used before it is fetched again.
const KEYS_TTL: Duration = Duration::from_secs(3600);
/// How long a failed fetch is remembered, and the least time between two fetches of one set.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The most key sets and built types kept.
const MAX_KEPT: usize = 1024;

/// The configurations of one workspace type, built.
#[derive(Clone)]
struct Built {
    /// The resource versions it was built from.
    fingerprint: String,
    /// The authenticators of every configuration, or why the type authenticates nobody.
    authenticators: Result<Arc<Vec<JwtAuthenticator>>, String>,
}

#[derive(Default)]
struct KeySet {
    keys: Vec<RsaKey>,
    fetched: Option<Instant>,
    failed: Option<(Instant, String)>,
}

/// One issuer's key set, fetched by one request at a time.
type SharedKeySet = Arc<tokio::sync::Mutex<KeySet>>;

/// The per-workspace authenticators of a server.
pub struct WorkspaceAuthn {
    store: Arc<dyn Store>,
    tenancy: Arc<Tenancy>,
    built: Mutex<HashMap<String, Built>>,
    /// Key sets by (issuer and discovery URL, CA).
    keys: Mutex<HashMap<(String, String), SharedKeySet>>,
}

impl std::fmt::Debug for WorkspaceAuthn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceAuthn").finish_non_exhaustive()
    }
}

/// Why a token did not authenticate in a workspace (logged at debug level, never answered:
/// the client sees 401 whatever the reason).
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceAuthnError {
    /// The workspace's type lists no configuration.
    #[error("the workspace's type has no authentication configurations")]
    NotConfigured,
    /// A configuration is missing or invalid.
    #[error("{0}")]
    Unusable(String),
    /// No authenticator is for the token's issuer.
    #[error("no authenticator for issuer {0:?}")]
    NoIssuer(String),
    /// The issuer's keys could not be read.
    #[error("issuer {0}: {1}")]
    Keys(String, String),
    /// The token was refused.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The user is a system user.
    #[error("system usernames are not admitted")]
    SystemUser,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[derive(serde::Deserialize)]
struct Discovery {
    #[serde(default)]
    issuer: String,
    #[serde(default)]
    jwks_uri: String,
}

impl WorkspaceAuthn {
    /// Workspace authentication over the objects of `store`, with the workspace tree of
    /// `tenancy`.
    pub fn new(store: Arc<dyn Store>, tenancy: Arc<Tenancy>) -> Arc<Self> {
        Arc::new(WorkspaceAuthn {
            store,
            tenancy,
            built: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
        })
    }

    /// The user `token` admits into logical cluster `cluster`, or why it admits nobody.
    pub async fn authenticate(
        &self,
        cluster: &str,
        token: &str,
    ) -> Result<Identity, WorkspaceAuthnError> {
        let parsed = jwt::parse(token)?;
        let issuer = parsed.issuer().unwrap_or_default().to_string();
        let authenticators = self.authenticators_of(cluster).await?;
        let mut last = WorkspaceAuthnError::NoIssuer(issuer.clone());
        for a in authenticators.iter().filter(|a| a.issuer.url == issuer) {
            match self.try_one(a, &parsed).await {
                Ok(user) => return admit(user, cluster),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn try_one(
        &self,
        a: &JwtAuthenticator,
        token: &jwt::Token,
    ) -> Result<jwt::User, WorkspaceAuthnError> {
        let keys = self.keys_of(a, false).await?;
        let mut verified = jwt::verify_signature(token, &keys)?;
        if !verified
            && !keys
                .iter()
                .any(|k| token.kid.is_some() && k.kid == token.kid)
        {
            // A key the set lacks: the issuer may have rotated.
            verified = jwt::verify_signature(token, &self.keys_of(a, true).await?)?;
        }
        if !verified {
            return Err(TokenError::Signature.into());
        }
        jwt::check_claims(a, token, unix_now())?;
        Ok(jwt::map_user(a, &token.claims)?)
    }

    /// The JWT authenticators of the type of `cluster`'s workspace.
    async fn authenticators_of(
        &self,
        cluster: &str,
    ) -> Result<Arc<Vec<JwtAuthenticator>>, WorkspaceAuthnError> {
        let Some((type_cluster, wt, wt_revision)) = self.tenancy.type_of_workspace(cluster).await
        else {
            return Err(WorkspaceAuthnError::NotConfigured);
        };
        let names: Vec<String> = wt["spec"]["authenticationConfigurations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect();
        if names.is_empty() {
            return Err(WorkspaceAuthnError::NotConfigured);
        }
        let type_key = format!(
            "{type_cluster}/{}",
            wt["metadata"]["name"].as_str().unwrap_or("")
        );
        let mut fingerprint = format!("{wt_revision}");
        let mut configs = Vec::new();
        for name in &names {
            let key = format!(
                "/tenancy.kcp.io/workspaceauthenticationconfigurations/{type_cluster}/{name}"
            );
            match self.store.get_cached(&key).await {
                Ok(Some(kv)) => {
                    fingerprint.push_str(&format!(",{}", kv.mod_revision));
                    configs.push((name.clone(), Some(kv.value)));
                }
                _ => {
                    fingerprint.push_str(",-");
                    configs.push((name.clone(), None));
                }
            }
        }
        if let Some(b) = self
            .built
            .lock()
            .ok()
            .and_then(|b| b.get(&type_key).cloned())
            .filter(|b| b.fingerprint == fingerprint)
        {
            return b.authenticators.map_err(WorkspaceAuthnError::Unusable);
        }
        let authenticators = build(&type_cluster, &configs);
        if let Err(e) = &authenticators {
            tracing::info!(workspace_type = %type_key, error = %e, "workspace authentication unusable");
        }
        if let Ok(mut b) = self.built.lock() {
            if b.len() >= MAX_KEPT {
                b.clear();
            }
            b.insert(
                type_key,
                Built {
                    fingerprint,
                    authenticators: authenticators.clone(),
                },
            );
        }
        authenticators.map_err(WorkspaceAuthnError::Unusable)
    }

    /// The RSA keys of an authenticator's issuer; `refresh` asks for a new fetch (granted at most
    /// every [`RETRY_AFTER`]).
    async fn keys_of(
        &self,
        a: &JwtAuthenticator,
        refresh: bool,
    ) -> Result<Vec<RsaKey>, WorkspaceAuthnError> {
        let discovery = if a.issuer.discovery_url.is_empty() {
            format!(
                "{}/.well-known/openid-configuration",
                a.issuer.url.trim_end_matches('/')
            )
        } else {
            a.issuer.discovery_url.clone()
        };
        let slot = {
            let mut keys = self
                .keys
                .lock()
                .map_err(|_| WorkspaceAuthnError::Keys(a.issuer.url.clone(), "poisoned".into()))?;
            if keys.len() >= MAX_KEPT {
                keys.clear();
            }
            keys.entry((
                format!("{}\n{discovery}", a.issuer.url),
                a.issuer.certificate_authority.clone(),
            ))
            .or_default()
            .clone()
        };
        let mut set = slot.lock().await;
        let now = Instant::now();
        if let Some(fetched) = set.fetched {
            let age = now.duration_since(fetched);
            if age < KEYS_TTL && (!refresh || age < RETRY_AFTER) {
                return Ok(set.keys.clone());
            }
        }
        if let Some((at, why)) = &set.failed {
            if now.duration_since(*at) < RETRY_AFTER {
                return Err(WorkspaceAuthnError::Keys(a.issuer.url.clone(), why.clone()));
            }
        }
        match fetch_keys(a, &discovery).await {
            Ok(keys) => {
                set.keys = keys;
                set.fetched = Some(Instant::now());
                set.failed = None;
                Ok(set.keys.clone())
            }
            Err(why) => {
                tracing::info!(issuer = %a.issuer.url, error = %why, "workspace authentication: issuer keys");
                set.failed = Some((Instant::now(), why.clone()));
                Err(WorkspaceAuthnError::Keys(a.issuer.url.clone(), why))
            }
        }
    }
}

async fn fetch_keys(a: &JwtAuthenticator, discovery_url: &str) -> Result<Vec<RsaKey>, String> {
    let roots = fetch::roots(&a.issuer.certificate_authority).map_err(|e| e.to_string())?;
    let doc: Discovery = fetch::get_json(discovery_url, roots.clone())
        .await
        .map_err(|e| e.to_string())?;
    if doc.issuer != a.issuer.url {
        return Err(format!(
            "the discovery document names issuer {:?}, not {:?}",
            doc.issuer, a.issuer.url
        ));
    }
    let jwks: Value = fetch::get_json(&doc.jwks_uri, roots)
        .await
        .map_err(|e| e.to_string())?;
    Ok(jwt::rsa_keys(&jwks))
}

/// The union of a type's configurations (all present and valid, or none).
fn build(
    type_cluster: &str,
    configs: &[(String, Option<bytes::Bytes>)],
) -> Result<Arc<Vec<JwtAuthenticator>>, String> {
    let mut out = Vec::new();
    for (name, value) in configs {
        let Some(value) = value else {
            return Err(format!(
                "WorkspaceAuthenticationConfiguration {name:?} does not exist in {type_cluster}"
            ));
        };
        let obj = crate::objects::decode_stored(value).map_err(|e| e.to_string())?;
        let jwt = config::compile(&obj["spec"]).map_err(|e| {
            format!("WorkspaceAuthenticationConfiguration {name:?} in {type_cluster}: {e}")
        })?;
        out.extend(jwt);
    }
    Ok(Arc::new(out))
}

/// kcp's filters on a workspace-authenticated user, and its scope.
fn admit(user: jwt::User, cluster: &str) -> Result<Identity, WorkspaceAuthnError> {
    if user.username.starts_with("system:") {
        return Err(WorkspaceAuthnError::SystemUser);
    }
    let mut groups: Vec<String> = user
        .groups
        .into_iter()
        .filter(|g| !g.starts_with("system:"))
        .collect();
    groups.push(crate::authn::AUTHENTICATED_GROUP.to_string());
    let mut extra: BTreeMap<String, Vec<String>> = user
        .extra
        .into_iter()
        .filter(|(k, _)| !k.contains("kcp.io"))
        .collect();
    extra.insert(SCOPES_EXTRA.into(), vec![format!("cluster:{cluster}")]);
    extra.insert(CLUSTER_NAME_EXTRA.into(), vec![cluster.to_string()]);
    Ok(Identity {
        user: user.username,
        groups,
        uid: user.uid,
        extra,
        home_cluster: None,
        warrant: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kcp_filters_system_users_groups_and_kcp_extras_and_scope_the_user() {
        let mut extra = BTreeMap::new();
        extra.insert("acme.kcp.io/x".to_string(), vec!["1".to_string()]);
        extra.insert("acme.io/y".to_string(), vec!["2".to_string()]);
        let user = jwt::User {
            username: "ann".into(),
            uid: "u".into(),
            groups: vec!["dev".into(), "system:masters".into()],
            extra,
        };
        let id = admit(user.clone(), "c1").unwrap();
        assert_eq!(id.groups, ["dev", "system:authenticated"]);
        assert!(!id.extra.contains_key("acme.kcp.io/x"));
        assert_eq!(id.extra["acme.io/y"], ["2"]);
        assert_eq!(id.extra[SCOPES_EXTRA], ["cluster:c1"]);
        assert_eq!(id.extra[CLUSTER_NAME_EXTRA], ["c1"]);
        assert!(id.in_scope("c1") && !id.in_scope("c2"));
        let system = jwt::User {
            username: "system:admin".into(),
            ..user
        };
        assert!(matches!(
            admit(system, "c1"),
            Err(WorkspaceAuthnError::SystemUser)
        ));
    }
}
