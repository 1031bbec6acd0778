//! Extension mode: the views served in front of a kcp this server does not own.
//!
//! The server then stores nothing of its own. What the views are computed from is mirrored
//! into its store by the caller (the binary reads kcp through the core export's endpoint slice),
//! and everything a request needs to know about kcp is asked of an [`Upstream`]: which logical
//! cluster a name or path is, whether kcp lets a user do something there (a SubjectAccessReview),
//! and who a bearer token is (a TokenReview), as an aggregated server delegates both to its
//! kube-apiserver. Answers are kept for a short while, bounded in number, so a busy client does
//! not turn each request into round trips to kcp.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::access::authn::{Authenticator, AuthnRequest};
use crate::access::authz::Authorizer;
use crate::access::rbac::{Attributes, Decision, UserInfo};
use crate::meta::status::ApiError;
use crate::request::identity::Identity;

/// A logical cluster of the upstream kcp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// Its logical cluster name.
    pub name: String,
    /// Its canonical path (`root:orgs:acme`).
    pub path: String,
}

/// Why kcp could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The request did not reach kcp or got no usable answer.
    #[error("asking kcp {what}: {reason}")]
    Unavailable {
        /// What was asked.
        what: String,
        /// What went wrong.
        reason: String,
    },
}

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> Self {
        ApiError::new(503, "ServiceUnavailable", e.to_string())
    }
}

/// What extension mode asks of the kcp it fronts.
#[async_trait::async_trait]
pub trait Upstream: Send + Sync {
    /// The logical cluster a name or a path addresses; `None` when kcp has none there (or will
    /// not say).
    async fn workspace(&self, name_or_path: &str) -> Result<Option<Workspace>, UpstreamError>;

    /// kcp's decision for `attrs` in logical cluster `cluster` (a SubjectAccessReview).
    async fn access(&self, cluster: &str, attrs: &Attributes) -> Result<Decision, UpstreamError>;

    /// Who a bearer token authenticates as, `None` if kcp does not accept it (a TokenReview).
    async fn review_token(&self, token: &str) -> Result<Option<Identity>, UpstreamError>;
}

/// Where the views learn a logical cluster's path (the entity type comes from it) and the name
/// of the provider workspace.
pub trait WorkspacePaths: Send + Sync {
    /// The canonical path of logical cluster `name`.
    fn path_of(&self, name: &str) -> Option<String>;
    /// The logical cluster at canonical path `path`.
    fn name_of(&self, path: &str) -> Option<String>;
}

impl WorkspacePaths for crate::access::tenancy::Tenancy {
    fn path_of(&self, name: &str) -> Option<String> {
        crate::access::tenancy::Tenancy::path_of(self, name)
    }

    fn name_of(&self, path: &str) -> Option<String> {
        match self.resolve(crate::request::request_info::ClusterTarget::Name(
            path.to_string(),
        )) {
            Ok(crate::request::request_info::ClusterTarget::Name(n)) => Some(n),
            _ => None,
        }
    }
}

/// How long a resolved path, an access decision or a token review is kept.
const KEPT_FOR: Duration = Duration::from_secs(10);

/// The most answers of each kind kept; beyond, the oldest half goes.
const KEPT_ANSWERS: usize = 16_384;

/// Answers by key, each kept for [`KEPT_FOR`], at most [`KEPT_ANSWERS`].
struct Kept<V> {
    answers: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> Kept<V> {
    fn new() -> Self {
        Kept {
            answers: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &str) -> Option<V> {
        let answers = self.answers.lock().ok()?;
        answers
            .get(key)
            .filter(|(at, _)| at.elapsed() < KEPT_FOR)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: String, value: V) {
        if let Ok(mut answers) = self.answers.lock() {
            if answers.len() >= KEPT_ANSWERS {
                answers.retain(|_, (at, _)| at.elapsed() < KEPT_FOR);
                if answers.len() >= KEPT_ANSWERS {
                    let mut ages: Vec<Instant> = answers.values().map(|(at, _)| *at).collect();
                    ages.sort_unstable();
                    let cut = ages[ages.len() / 2];
                    answers.retain(|_, (at, _)| *at > cut);
                }
            }
            answers.insert(key, (Instant::now(), value));
        }
    }
}

/// The upstream kcp with its answers kept for a while: what the server's request path asks.
pub struct Extension {
    upstream: Arc<dyn Upstream>,
    /// Paths of the logical clusters requests named, by name and by path (a path never changes
    /// for a logical cluster, so these are kept; there are as many as kcp has workspaces at
    /// most).
    paths: RwLock<(HashMap<String, String>, HashMap<String, String>)>,
    /// Path or name → logical cluster, as last resolved.
    resolved: Kept<Option<Workspace>>,
    decisions: Kept<Decision>,
    tokens: Kept<Option<Identity>>,
}

impl std::fmt::Debug for Extension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extension").finish_non_exhaustive()
    }
}

impl Extension {
    /// Requests answered with the help of `upstream`.
    pub fn new(upstream: Arc<dyn Upstream>) -> Arc<Self> {
        Arc::new(Extension {
            upstream,
            paths: RwLock::default(),
            resolved: Kept::new(),
            decisions: Kept::new(),
            tokens: Kept::new(),
        })
    }

    /// The logical cluster a request names (by name or path), or the answer kcp's front proxy
    /// gives for one that does not exist or may not be reached.
    pub async fn resolve(&self, name_or_path: &str) -> Result<String, ApiError> {
        let found = match self.resolved.get(name_or_path) {
            Some(found) => found,
            None => {
                let found = self.upstream.workspace(name_or_path).await?;
                self.resolved.put(name_or_path.to_string(), found.clone());
                found
            }
        };
        let ws = found.ok_or_else(ApiError::workspace_forbidden)?;
        self.remember(&ws);
        Ok(ws.name)
    }

    /// Records a logical cluster's path (every request names one: the write lock is taken only
    /// for one not seen before).
    pub fn remember(&self, ws: &Workspace) {
        if self.path_of(&ws.name).as_ref() == Some(&ws.path) {
            return;
        }
        if let Ok(mut paths) = self.paths.write() {
            paths.0.insert(ws.name.clone(), ws.path.clone());
            paths.1.insert(ws.path.clone(), ws.name.clone());
        }
    }

    /// The authenticator of bearer tokens kcp accepts.
    pub fn authenticator(self: &Arc<Self>) -> Arc<dyn Authenticator> {
        Arc::new(UpstreamTokens(self.clone()))
    }
}

impl WorkspacePaths for Extension {
    fn path_of(&self, name: &str) -> Option<String> {
        self.paths.read().ok()?.0.get(name).cloned()
    }

    fn name_of(&self, path: &str) -> Option<String> {
        self.paths.read().ok()?.1.get(path).cloned()
    }
}

/// A key for one access question: cluster, user and the attributes, unambiguously joined.
fn access_key(cluster: &str, a: &Attributes) -> String {
    let UserInfo {
        name,
        groups,
        extra,
    } = &a.user;
    serde_json::to_string(&(
        cluster,
        name,
        groups,
        extra,
        &a.verb,
        &a.api_group,
        &a.resource,
        &a.subresource,
        &a.name,
        &a.namespace,
        &a.path,
        a.resource_request,
    ))
    .unwrap_or_default()
}

#[async_trait::async_trait]
impl Authorizer for Extension {
    async fn decide(&self, cluster: &str, attrs: &Attributes) -> Result<Decision, ApiError> {
        let key = access_key(cluster, attrs);
        if let Some(d) = self.decisions.get(&key) {
            return Ok(d);
        }
        let d = self.upstream.access(cluster, attrs).await?;
        self.decisions.put(key, d.clone());
        Ok(d)
    }

    /// kcp's own membership test: `access` on the workspace's root path.
    async fn is_member(&self, cluster: &str, user: &UserInfo) -> Result<bool, ApiError> {
        let attrs = Attributes::non_resource(user.clone(), "access", "/");
        Ok(self.decide(cluster, &attrs).await?.is_allowed())
    }
}

/// Bearer tokens, reviewed by kcp.
struct UpstreamTokens(Arc<Extension>);

#[async_trait::async_trait]
impl Authenticator for UpstreamTokens {
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError> {
        let Some(token) = request.bearer() else {
            return Ok(None);
        };
        // Kept by digest: the server holds no caller's token after the request.
        let key = format!("{:x}", sha2::Sha256::digest(token.as_bytes()));
        let found = match self.0.tokens.get(&key) {
            Some(found) => found,
            None => {
                let found = self.0.upstream.review_token(token).await?;
                self.0.tokens.put(key, found.clone());
                found
            }
        };
        match found {
            Some(id) => Ok(Some(Arc::new(id))),
            None => Err(ApiError::unauthorized()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A kcp with one workspace, one allowed user and one token, counting the questions.
    #[derive(Default)]
    struct Fake {
        asked: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Upstream for Fake {
        async fn workspace(&self, target: &str) -> Result<Option<Workspace>, UpstreamError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Ok(
                matches!(target, "root:orgs:acme" | "c1").then(|| Workspace {
                    name: "c1".into(),
                    path: "root:orgs:acme".into(),
                }),
            )
        }

        async fn access(&self, _: &str, attrs: &Attributes) -> Result<Decision, UpstreamError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Ok(match attrs.user.name.as_str() {
                "alice" => Decision::Allow,
                _ => Decision::Deny("no".into()),
            })
        }

        async fn review_token(&self, token: &str) -> Result<Option<Identity>, UpstreamError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Ok((token == "good").then(|| Identity::new("alice", vec![])))
        }
    }

    #[tokio::test]
    async fn answers_are_kept_and_paths_learned() {
        let fake = Arc::new(Fake::default());
        let x = Extension::new(fake.clone());
        assert_eq!(x.resolve("root:orgs:acme").await.unwrap(), "c1");
        assert_eq!(x.resolve("root:orgs:acme").await.unwrap(), "c1");
        assert_eq!(fake.asked.load(Ordering::SeqCst), 1);
        assert_eq!(x.path_of("c1").as_deref(), Some("root:orgs:acme"));
        assert_eq!(x.name_of("root:orgs:acme").as_deref(), Some("c1"));
        let e = x.resolve("root:orgs:other").await.unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (403, crate::meta::status::WORKSPACE_FORBIDDEN)
        );

        let alice = Attributes::resource(UserInfo::new("alice", &[]), "list", "g", "r", None);
        let bob = Attributes::resource(UserInfo::new("bob", &[]), "list", "g", "r", None);
        assert!(x.decide("c1", &alice).await.unwrap().is_allowed());
        assert!(!x.decide("c1", &bob).await.unwrap().is_allowed());
        let before = fake.asked.load(Ordering::SeqCst);
        assert!(x.decide("c1", &alice).await.unwrap().is_allowed());
        assert_eq!(fake.asked.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn tokens_are_reviewed_by_kcp() {
        let x = Extension::new(Arc::new(Fake::default()));
        let auth = x.authenticator();
        let store = crate::storage::MemoryStore::new();
        let catalog = crate::registry::catalog::Catalog::new(Vec::new());
        let peer = crate::access::authn::Peer::Anonymous;
        let ask = |token: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
            headers
        };
        let (mut good, mut bad) = (ask("good"), ask("bad"));
        let objects = crate::access::serviceaccounts::Objects {
            store: &store,
            catalog: &catalog,
        };
        let mut req = AuthnRequest {
            peer: &peer,
            headers: &mut good,
            objects,
        };
        let id = auth.authenticate(&mut req).await.unwrap().unwrap();
        assert_eq!(id.user, "alice");
        let mut req = AuthnRequest {
            peer: &peer,
            headers: &mut bad,
            objects,
        };
        assert_eq!(auth.authenticate(&mut req).await.unwrap_err().code, 401);
    }
}
