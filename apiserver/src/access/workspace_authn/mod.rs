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
//! The issuer's discovery document and key set are fetched on first use ([`fetch`], at most
//! 1 MiB each), kept for an hour, fetched again (at most every ten seconds) when a token names a
//! key the set lacks or names none and verifies with none; a failed fetch is remembered for ten
//! seconds, so tokens cannot make the server fetch in a loop.
//!
//! An issuer is a tenant's to choose, and the tokens sent to its workspaces anyone's, so what a
//! token can cost is bounded whatever the issuer serves ([`keys`], [`jwt`]):
//! - a key set keeps at most [`jwt::MAX_KEYS`] (64) keys; RSA keys kube's authenticator (Go's
//!   `crypto/rsa`: an even modulus, an exponent below 2, even or above 2^31 - 1) or ring (a
//!   modulus outside 2048 to 8192 bits) would refuse are dropped when the set is read;
//! - a token is checked against at most [`jwt::MAX_TRIED`] (4) keys: those with its `kid`, or
//!   the first ones of the set when it names none; a `kid` no key has is checked against none;
//! - a signature that verifies with no key leads to a new fetch (at most every ten seconds),
//!   and to a second check only against keys the new set has and the old one had not;
//! - verifications run on the blocking pool, one issuer's one at a time and the server's at
//!   most one per core but one, so a hostile issuer takes at most one core; a token that waits
//!   more than a second for its turn is refused (401) like any other;
//! - the key sets and the built types are each kept in a cache of 1,024 that drops its least
//!   recently used entry when full, so one tenant's many issuers or types evict one another and
//!   the least used, never everything.

pub mod config;
pub mod fetch;
pub mod issuer;
pub mod jwt;
pub mod keys;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::access::tenancy::Tenancy;
use crate::request::identity::{Identity, SCOPES_EXTRA};
use crate::storage::Store;
use config::JwtAuthenticator;
use jwt::{KeySetRead, TokenError};
use keys::{IssuerKeys, Lru};

/// The extra key naming the logical cluster a workspace-authenticated user was admitted to.
pub const CLUSTER_NAME_EXTRA: &str = "authentication.kcp.io/cluster-name";
/// The most built types kept.
const MAX_KEPT: usize = 1024;

/// The configurations of one workspace type, built.
#[derive(Clone)]
struct Built {
    /// The resource versions it was built from.
    fingerprint: String,
    /// The authenticators of every configuration, or why the type authenticates nobody.
    authenticators: Result<Arc<Vec<JwtAuthenticator>>, String>,
}

/// The per-workspace authenticators of a server.
pub struct WorkspaceAuthn {
    store: Arc<dyn Store>,
    tenancy: Arc<Tenancy>,
    built: Mutex<Lru<String, Built>>,
    /// The issuers' key sets and the signature checks.
    keys: IssuerKeys,
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
    /// The token waited too long for its turn to have its signature checked.
    #[error("issuer {0}: too many tokens waiting for a signature check")]
    Busy(String),
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
            built: Mutex::new(Lru::new(MAX_KEPT)),
            keys: IssuerKeys::new(Arc::new(|issuer, discovery| {
                Box::pin(async move { fetch_keys(&issuer, &discovery).await })
            })),
        })
    }

    /// RSA verifications done so far (every token's signature checks).
    pub fn verifications(&self) -> u64 {
        self.keys.verifications()
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
        // Several authenticators may share an issuer's key set: its signature is checked once.
        let mut checked: Vec<((String, String), bool)> = Vec::new();
        for a in authenticators.iter().filter(|a| a.issuer.url == issuer) {
            let set = keys::set_key(&a.issuer);
            let signed = match checked.iter().find(|(k, _)| *k == set) {
                Some((_, signed)) => *signed,
                None => {
                    let signed = match self.keys.verify(a, &parsed).await {
                        Ok(()) => true,
                        Err(e) => {
                            last = e;
                            false
                        }
                    };
                    checked.push((set, signed));
                    signed
                }
            };
            if !signed {
                continue;
            }
            match jwt::check_claims(a, &parsed, unix_now())
                .and_then(|()| jwt::map_user(a, &parsed.claims))
            {
                Ok(user) => return admit(user, cluster),
                Err(e) => last = e.into(),
            }
        }
        Err(last)
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
            .and_then(|mut b| b.get(&type_key).cloned())
            .filter(|b| b.fingerprint == fingerprint)
        {
            return b.authenticators.map_err(WorkspaceAuthnError::Unusable);
        }
        let authenticators = build(&type_cluster, &configs);
        if let Err(e) = &authenticators {
            tracing::info!(workspace_type = %type_key, error = %e, "workspace authentication unusable");
        }
        if let Ok(mut b) = self.built.lock() {
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
}

/// The usable keys of an issuer's key set, read through its discovery document.
async fn fetch_keys(issuer: &config::Issuer, discovery_url: &str) -> Result<KeySetRead, String> {
    let roots = fetch::roots(&issuer.certificate_authority).map_err(|e| e.to_string())?;
    let doc: Discovery = fetch::get_json(discovery_url, roots.clone())
        .await
        .map_err(|e| e.to_string())?;
    if doc.issuer != issuer.url {
        return Err(format!(
            "the discovery document names issuer {:?}, not {:?}",
            doc.issuer, issuer.url
        ));
    }
    let jwks: Value = fetch::get_json(&doc.jwks_uri, roots)
        .await
        .map_err(|e| e.to_string())?;
    Ok(jwt::read_key_set(&jwks))
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
        let obj = crate::registry::objects::decode_stored(value).map_err(|e| e.to_string())?;
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
    groups.push(crate::access::authn::AUTHENTICATED_GROUP.to_string());
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
        charged_to: None,
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
