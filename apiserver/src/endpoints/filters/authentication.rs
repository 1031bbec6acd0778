//! Authentication: who a request is from, by client certificate, authenticating proxy, static
//! or service-account token, or the upstream kcp's TokenReview in extension mode. Credentials
//! nobody accepts are 401; no credentials at all are anonymous, which only the public paths
//! (health, version, the admission webhooks) admit.

use std::sync::Arc;

use http::Response;

use crate::access::authn::{self, Authn};
use crate::endpoints::exchange::{Exchange, Handler, Refusal};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;
use crate::registry::catalog::Catalog;
use crate::request::request_info::Target;
use crate::storage::Store;

/// Sets the exchange's user, or answers 401.
pub struct Authentication<N> {
    /// The server's authenticators.
    pub authn: Arc<Authn>,
    /// The store service-account tokens are checked against.
    pub store: Arc<dyn Store>,
    /// The built-in types, to read ServiceAccounts and Secrets with.
    pub catalog: Arc<Catalog>,
    /// Whether workspaces have issuers of their own (kcp's per-workspace authentication): a
    /// bearer token nobody here accepts is then kept for them.
    pub workspace_issuers: bool,
    /// The rest of the chain.
    pub next: N,
}

/// Paths anyone may read without credentials. Admission webhooks are called by a
/// kube-apiserver, which presents no client certificate by default; they only compute answers
/// and never touch storage.
fn is_public(target: &Target) -> bool {
    matches!(
        target,
        Target::Health { .. } | Target::Version | Target::Admission(_)
    )
}

impl<N: Handler> Handler for Authentication<N> {
    async fn handle(&self, mut x: Box<Exchange>) -> Response<Body> {
        let token = authn::bearer(
            x.parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
        )
        .map(str::to_string);
        let objects = crate::access::serviceaccounts::Objects {
            store: self.store.as_ref(),
            catalog: &self.catalog,
        };
        // A bearer token nobody accepts may still be one of the addressed workspace's own
        // issuers; that is decided once the workspace is known, and until then the refusal is
        // kept: whatever else fails, the answer stays 401, so a client without valid
        // credentials learns nothing about which workspaces exist.
        match authn::authenticate(&self.authn, objects, &x.peer, &mut x.parts.headers).await {
            Ok(user) => x.user = user,
            Err(error) => match token {
                Some(token) if self.workspace_issuers => x.refused = Some(Refusal { error, token }),
                _ => return error_response(&error),
            },
        }
        if x.user.is_none() && x.refused.is_none() && !is_public(&x.info.target) {
            return error_response(&ApiError::unauthorized());
        }
        self.next.handle(x).await
    }
}
