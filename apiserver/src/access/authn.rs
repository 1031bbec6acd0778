//! Authentication: who a request comes from.
//!
//! The chain, in kube-apiserver's order: request headers set by a trusted authenticating proxy
//! (kube-apiserver's aggregator), the client certificate, then a bearer token (the static token
//! file, then ServiceAccount tokens). Request headers count only on connections whose client
//! certificate chains to `--requestheader-client-ca-file` with an allowed common name; everywhere
//! else they are removed unread. Tokens are compared in constant time and never logged.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderMap;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::access::serviceaccounts::Objects;
use crate::access::serviceaccounts::{ServiceAccountTokens, TokenError};
use crate::meta::status::ApiError;
use crate::request::identity::Identity;

/// The group every authenticated user belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Every way the server can authenticate a request.
#[derive(Default)]
pub struct Authn {
    /// Bearer tokens from `--token-auth-file`.
    pub tokens: StaticTokens,
    /// The ServiceAccount token signer and verifier.
    pub service_accounts: Option<Arc<ServiceAccountTokens>>,
    /// Request-header authentication for an authenticating proxy.
    pub request_header: Option<RequestHeader>,
    /// Verifies client certificates against the client CA (when the TLS layer also accepts the
    /// request-header CA, a certificate must be told apart).
    pub client_ca: Option<Arc<ClientCa>>,
    /// Bearer tokens some other server reviews (the kcp fronted in extension mode), asked last.
    pub delegated: Option<Arc<dyn Authenticator>>,
}

impl std::fmt::Debug for Authn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authn")
            .field("tokens", &self.tokens)
            .field("service_accounts", &self.service_accounts)
            .field("request_header", &self.request_header)
            .finish_non_exhaustive()
    }
}

impl Authn {
    /// What a connection's client certificate chain (leaf first) makes its peer.
    pub fn peer(&self, chain: Option<&[CertificateDer<'_>]>) -> Peer {
        let Some(chain) = chain.filter(|c| !c.is_empty()) else {
            return Peer::Anonymous;
        };
        if let Some(rh) = &self.request_header {
            if rh.is_proxy(chain) {
                return Peer::Proxy;
            }
        }
        // The handshake takes any certificate (see `AnyClientCertificate`): here one that no
        // CA vouches for is untrusted, and its requests are 401 unless a token says who they
        // are, as kube-apiserver answers.
        let Some(ca) = &self.client_ca else {
            return Peer::Untrusted;
        };
        if !chain_verifies(ca.get().as_ref(), chain) {
            return Peer::Untrusted;
        }
        match chain.first().map(|c| certs::client_identity(c.as_ref())) {
            Some(Ok(id)) => Peer::Client(Arc::new(Identity::new(id.user, id.groups))),
            _ => Peer::Untrusted,
        }
    }
}

/// The verifier of users' client certificates, replaced when the client CA file changes.
pub struct ClientCa(std::sync::RwLock<Arc<dyn ClientCertVerifier>>);

impl ClientCa {
    /// Verifies against `verifier` until [`ClientCa::replace`].
    pub fn new(verifier: Arc<dyn ClientCertVerifier>) -> Self {
        ClientCa(std::sync::RwLock::new(verifier))
    }

    /// The current verifier.
    pub fn get(&self) -> Arc<dyn ClientCertVerifier> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Verifies against `verifier` from now on.
    pub fn replace(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = verifier;
    }
}

/// What the TLS layer learned about the peer of a connection.
#[derive(Clone, Debug, Default)]
pub enum Peer {
    /// No client certificate (or one no authenticator accepts).
    #[default]
    Anonymous,
    /// A client certificate from the client CA: CN is the user, O the groups.
    Client(Arc<Identity>),
    /// A client certificate of the authenticating proxy: the request headers say who.
    Proxy,
    /// A client certificate no CA of the server vouches for (or one naming no user): not
    /// anonymous, 401 unless a bearer token authenticates the request.
    Untrusted,
}

/// `--requestheader-*`: whom to trust as an authenticating proxy and which headers it sets.
pub struct RequestHeader {
    verifier: Arc<dyn ClientCertVerifier>,
    /// Common names a proxy certificate may have; empty means any.
    pub allowed_names: Vec<String>,
    /// Headers that carry the user name; the first non-empty value wins (default `X-Remote-User`).
    pub username_headers: Vec<String>,
    /// Headers that carry the user's uid; the first non-empty value wins (default `X-Remote-Uid`).
    pub uid_headers: Vec<String>,
    /// Headers whose values are all the user's groups (default `X-Remote-Group`).
    pub group_headers: Vec<String>,
    /// Lower-cased prefixes of headers that carry extra attributes, keyed by the rest of the name
    /// (default `x-remote-extra-`).
    pub extra_prefixes: Vec<String>,
}

impl std::fmt::Debug for RequestHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHeader")
            .field("allowed_names", &self.allowed_names)
            .field("username_headers", &self.username_headers)
            .field("group_headers", &self.group_headers)
            .field("extra_prefixes", &self.extra_prefixes)
            .finish_non_exhaustive()
    }
}

/// Why a CA bundle cannot be used to verify client certificates.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The bundle is not PEM.
    #[error("{what} is not valid PEM: {source}")]
    Pem {
        /// Which bundle (e.g. "client CA").
        what: &'static str,
        /// What the PEM reader found.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A certificate of the bundle is not a usable trust anchor.
    #[error("{what}: certificate rejected: {source}")]
    Rejected {
        /// Which bundle.
        what: &'static str,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
    /// The bundle holds no certificate.
    #[error("{what} holds no certificate")]
    Empty {
        /// Which bundle.
        what: &'static str,
    },
    /// rustls refused to build a verifier from the bundle.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Parses a PEM CA bundle into a root store; `what` names it in errors.
pub fn root_store(pem: &str, what: &'static str) -> Result<RootCertStore, CaError> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let ca = ca.map_err(|source| CaError::Pem { what, source })?;
        roots
            .add(ca)
            .map_err(|source| CaError::Rejected { what, source })?;
    }
    if roots.is_empty() {
        return Err(CaError::Empty { what });
    }
    Ok(roots)
}

/// A verifier of client certificates chaining to `roots` (used per connection, after the
/// handshake, to tell which CA a certificate belongs to).
pub fn chain_verifier(roots: RootCertStore) -> Result<Arc<dyn ClientCertVerifier>, CaError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?)
}

/// The handshake's verifier: it asks for a client certificate (hinting the CAs of `inner`),
/// checks that the client holds the certificate's key, and takes any chain, which
/// [`Authn::peer`] then verifies against the CAs of the moment. A certificate of an unknown CA
/// thus gets kube-apiserver's answer, 401 Unauthorized, instead of a failed handshake that
/// clients report as a TLS error.
#[derive(Debug)]
pub struct AnyClientCertificate {
    inner: Arc<dyn ClientCertVerifier>,
}

impl AnyClientCertificate {
    /// Wraps the verifier whose CA hints and signature checks it uses.
    pub fn new(inner: Arc<dyn ClientCertVerifier>) -> Arc<Self> {
        Arc::new(AnyClientCertificate { inner })
    }
}

impl ClientCertVerifier for AnyClientCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether `chain` (leaf first) verifies with `verifier` now.
pub fn chain_verifies(verifier: &dyn ClientCertVerifier, chain: &[CertificateDer<'_>]) -> bool {
    match chain.split_first() {
        Some((leaf, intermediates)) => verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok(),
        None => false,
    }
}

/// The headers kube-apiserver's aggregator sets, used when no others are configured.
pub fn default_header_names() -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    (
        vec!["X-Remote-User".into()],
        vec!["X-Remote-Uid".into()],
        vec!["X-Remote-Group".into()],
        vec!["X-Remote-Extra-".into()],
    )
}

impl RequestHeader {
    /// Trusts proxies whose client certificate chains to `ca_pem` and has one of
    /// `allowed_names` as common name (any when empty). Empty header lists take kube's names.
    pub fn new(
        ca_pem: &str,
        allowed_names: Vec<String>,
        username_headers: Vec<String>,
        uid_headers: Vec<String>,
        group_headers: Vec<String>,
        extra_prefixes: Vec<String>,
    ) -> Result<Self, CaError> {
        let verifier = chain_verifier(root_store(ca_pem, "request-header client CA")?)?;
        let (du, di, dg, de) = default_header_names();
        let or = |v: Vec<String>, d: Vec<String>| if v.is_empty() { d } else { v };
        Ok(RequestHeader {
            verifier,
            allowed_names,
            username_headers: or(username_headers, du),
            uid_headers: or(uid_headers, di),
            group_headers: or(group_headers, dg),
            // Header names arrive lower-cased; so are the prefixes, once.
            extra_prefixes: or(extra_prefixes, de)
                .iter()
                .map(|p| p.to_ascii_lowercase())
                .collect(),
        })
    }

    /// Whether a client certificate chain is the authenticating proxy's.
    pub fn is_proxy(&self, chain: &[CertificateDer<'_>]) -> bool {
        if !chain_verifies(self.verifier.as_ref(), chain) {
            return false;
        }
        if self.allowed_names.is_empty() {
            return true;
        }
        chain
            .first()
            .and_then(|c| certs::client_identity(c.as_ref()).ok())
            .is_some_and(|id| self.allowed_names.contains(&id.user))
    }

    /// Removes every request-header the proxy could set, returning the identity they carry
    /// (if `trusted` and a user name is present).
    pub fn take(&self, headers: &mut HeaderMap, trusted: bool) -> Option<Identity> {
        let first = |names: &[String]| {
            names
                .iter()
                .flat_map(|h| header_values(headers, h))
                .find(|v| !v.is_empty())
        };
        let user = first(&self.username_headers);
        let uid = first(&self.uid_headers);
        let groups: Vec<String> = self
            .group_headers
            .iter()
            .flat_map(|h| header_values(headers, h))
            .collect();
        let extra = take_prefixed(headers, &self.extra_prefixes);
        for h in self
            .username_headers
            .iter()
            .chain(&self.uid_headers)
            .chain(&self.group_headers)
        {
            headers.remove(h.as_str());
        }
        let user = user.filter(|_| trusted)?;
        Some(Identity {
            user,
            groups,
            uid: uid.unwrap_or_default(),
            extra,
            home_cluster: None,
            warrant: None,
            charged_to: None,
        })
    }
}

/// The values of every `name` header.
pub fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect()
}

/// Removes the headers whose names start with one of the lower-case `prefixes` and returns their
/// values by the rest of the name, %-unescaped (the rule for `X-Remote-Extra-*` and
/// `Impersonate-Extra-*`).
pub fn take_prefixed<S: AsRef<str>>(
    headers: &mut HeaderMap,
    prefixes: &[S],
) -> BTreeMap<String, Vec<String>> {
    let matched: Vec<(http::HeaderName, usize)> = headers
        .keys()
        .filter_map(|n| {
            prefixes
                .iter()
                .find(|p| n.as_str().starts_with(p.as_ref()))
                .map(|p| (n.clone(), p.as_ref().len()))
        })
        .collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, len) in matched {
        let key = percent_encoding::percent_decode_str(&name.as_str()[len..])
            .decode_utf8_lossy()
            .to_string();
        out.entry(key)
            .or_default()
            .extend(header_values(headers, name.as_str()));
        headers.remove(&name);
    }
    out
}

/// What an [`Authenticator`] sees of a request.
pub struct AuthnRequest<'a> {
    /// Who the TLS layer says the peer is.
    pub peer: &'a Peer,
    /// The request's headers; an authenticator removes those it consumes.
    pub headers: &'a mut HeaderMap,
    /// Stored objects an authenticator may need (ServiceAccounts and their Secrets).
    pub objects: Objects<'a>,
}

impl AuthnRequest<'_> {
    /// The bearer token of the `Authorization` header, if any.
    pub fn bearer(&self) -> Option<&str> {
        bearer(
            self.headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
        )
    }
}

/// One way of telling who sent a request, as kube-apiserver's union of authenticators.
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync {
    /// The user, if the request carries a credential of this authenticator's kind that it
    /// accepts; `Ok(None)` if it carries none it knows (the next one is asked); an error if it
    /// carries one of its kind that is invalid (the request is refused).
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError>;
}

/// The authenticating proxy's headers, trusted only on a connection from the proxy (and removed
/// from every other request, so that no client can pass them on).
#[async_trait::async_trait]
impl Authenticator for RequestHeader {
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError> {
        let trusted = matches!(request.peer, Peer::Proxy);
        Ok(self.take(request.headers, trusted).map(Arc::new))
    }
}

/// A client certificate from the client CA: its CN is the user, its O the groups.
pub struct ClientCertificates;

#[async_trait::async_trait]
impl Authenticator for ClientCertificates {
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError> {
        Ok(match request.peer {
            Peer::Client(id) => Some(id.clone()),
            _ => None,
        })
    }
}

/// Bearer tokens of `--token-auth-file`.
#[async_trait::async_trait]
impl Authenticator for StaticTokens {
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError> {
        Ok(request
            .bearer()
            .and_then(|t| StaticTokens::authenticate(self, t))
            .map(Arc::new))
    }
}

/// Bearer tokens this server signed for ServiceAccounts that still exist (a token of another
/// issuer is not this authenticator's; one of ours that does not verify is refused).
#[async_trait::async_trait]
impl Authenticator for ServiceAccountTokens {
    async fn authenticate(
        &self,
        request: &mut AuthnRequest<'_>,
    ) -> Result<Option<Arc<Identity>>, ApiError> {
        let Some(token) = request.bearer() else {
            return Ok(None);
        };
        match crate::access::serviceaccounts::verify_token(request.objects, self, token, &[]).await
        {
            Ok(claims) => Ok(Some(Arc::new(crate::access::serviceaccounts::identity(
                &claims,
            )))),
            Err(TokenError::NotOurs) => Ok(None),
            Err(e) => {
                tracing::debug!(reason = %e, "service account token refused");
                Err(ApiError::unauthorized())
            }
        }
    }
}

impl Authn {
    /// The authenticators in the order they are asked: the proxy's headers first (they are
    /// removed from every request), then the client certificate, static tokens and
    /// service-account tokens.
    pub fn chain(&self) -> impl Iterator<Item = &dyn Authenticator> {
        [
            self.request_header
                .as_ref()
                .map(|r| r as &dyn Authenticator),
            Some(&ClientCertificates as &dyn Authenticator),
            Some(&self.tokens as &dyn Authenticator),
            self.service_accounts
                .as_deref()
                .map(|s| s as &dyn Authenticator),
            self.delegated.as_deref(),
        ]
        .into_iter()
        .flatten()
    }
}

/// Who a request is: the first authenticator of [`Authn::chain`] that knows its credential.
/// `Ok(None)` is an anonymous request (no credential at all); a bearer token nobody accepts, or
/// a client certificate no CA vouches for, is 401, as kube-apiserver answers.
pub async fn authenticate(
    authn: &Authn,
    objects: Objects<'_>,
    peer: &Peer,
    headers: &mut HeaderMap,
) -> Result<Option<Arc<Identity>>, ApiError> {
    let mut request = AuthnRequest {
        peer,
        headers,
        objects,
    };
    for authenticator in authn.chain() {
        if let Some(id) = authenticator.authenticate(&mut request).await? {
            return Ok(Some(id));
        }
    }
    match (request.bearer(), peer) {
        (Some(_), _) | (None, Peer::Untrusted) => Err(ApiError::unauthorized()),
        (None, _) => Ok(None),
    }
}

/// Answers a TokenReview: who the token authenticates, for the given audiences.
/// The status of a TokenReview sent to logical cluster `cluster`. In `root` every token the
/// server accepts is reviewed; in any other workspace only the service-account tokens of that
/// workspace are, and every other token, valid or not, gets the same "not valid" answer, so a
/// workspace admin learns nothing about another tenant's tokens.
pub async fn review_token(
    authn: &Authn,
    objects: Objects<'_>,
    cluster: &str,
    token: &str,
    audiences: &[String],
) -> serde_json::Value {
    let status = review_any_token(authn, objects, token, audiences).await;
    if cluster == crate::request::request_info::ROOT_CLUSTER {
        return status;
    }
    let home = if status["authenticated"] == true {
        status["user"]["extra"][crate::access::serviceaccounts::CLUSTER_EXTRA][0]
            .as_str()
            .map(str::to_string)
    } else {
        crate::access::serviceaccounts::claimed_cluster(token)
    };
    if home.as_deref() == Some(cluster) {
        return status;
    }
    serde_json::json!({"authenticated": false, "user": {}, "error": "token is not valid"})
}

async fn review_any_token(
    authn: &Authn,
    objects: Objects<'_>,
    token: &str,
    audiences: &[String],
) -> serde_json::Value {
    use serde_json::json;
    if audiences.is_empty()
        || audiences.iter().any(|a| {
            authn
                .service_accounts
                .as_ref()
                .is_some_and(|s| s.audiences().contains(a))
        })
    {
        if let Some(id) = authn.tokens.authenticate(token) {
            return json!({"authenticated": true, "user": user_json(&id), "audiences": audiences});
        }
    }
    let error = match &authn.service_accounts {
        Some(signer) => {
            match crate::access::serviceaccounts::verify_token(objects, signer, token, audiences)
                .await
            {
                Ok(claims) => {
                    let id = crate::access::serviceaccounts::identity(&claims);
                    let aud: Vec<&String> = if audiences.is_empty() {
                        claims
                            .aud
                            .iter()
                            .filter(|a| signer.audiences().contains(a))
                            .collect()
                    } else {
                        claims
                            .aud
                            .iter()
                            .filter(|a| audiences.contains(a))
                            .collect()
                    };
                    return json!({"authenticated": true, "user": user_json(&id), "audiences": aud});
                }
                Err(e) => e.to_string(),
            }
        }
        None => "token is not valid".to_string(),
    };
    json!({"authenticated": false, "user": {}, "error": error})
}

/// The `UserInfo` JSON of an identity, `system:authenticated` included.
pub fn user_json(id: &Identity) -> serde_json::Value {
    let mut groups = id.groups.clone();
    if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        groups.push(AUTHENTICATED_GROUP.into());
    }
    let mut out = serde_json::json!({"username": id.user, "groups": groups});
    if !id.uid.is_empty() {
        out["uid"] = serde_json::json!(id.uid);
    }
    if !id.extra.is_empty() {
        out["extra"] = serde_json::json!(id.extra);
    }
    out
}

/// Tokens and who they authenticate.
#[derive(Default)]
pub struct StaticTokens {
    entries: Vec<(Vec<u8>, Identity)>,
}

impl std::fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        write!(f, "StaticTokens({} entries)", self.entries.len())
    }
}

/// Splits one CSV line, honouring double quotes (a quoted field may contain commas).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    out.push(field);
    out
}

/// Constant-time equality, so response timing reveals nothing about a token.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// A line of a token file that is not `token,user,uid[,"group1,group2"]`.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: expected token,user,uid[,\"group1,group2\"]")]
pub struct TokenFileError {
    /// The line's number, from 1.
    pub line: usize,
}

impl StaticTokens {
    /// Parses a token file; a bad line is an error naming its number.
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f = csv_fields(line);
            if f.len() < 3 || f[0].is_empty() || f[1].is_empty() {
                return Err(TokenFileError { line: i + 1 });
            }
            let groups = f
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            entries.push((
                f[0].as_bytes().to_vec(),
                Identity {
                    user: f[1].clone(),
                    groups,
                    uid: f[2].clone(),
                    ..Identity::default()
                },
            ));
        }
        Ok(StaticTokens { entries })
    }

    /// Who a bearer token authenticates, if anyone. Every entry is compared.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        let mut found = None;
        for (t, id) in &self.entries {
            if same(t, token.as_bytes()) && found.is_none() {
                found = Some(id.clone());
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain's order and outcomes, as kube-apiserver's union: the proxy's headers are
    /// honoured only from the proxy and stripped from everyone else, a client certificate wins
    /// over a bearer token, a token nobody accepts is 401, and no credential is anonymous.
    #[tokio::test]
    async fn the_chain_asks_in_order_and_refuses_unknown_tokens() {
        let store = crate::storage::MemoryStore::new();
        let catalog = crate::registry::catalog::Catalog::new(Vec::new());
        let objects = Objects {
            store: &store,
            catalog: &catalog,
        };
        let authn = Authn {
            tokens: StaticTokens::parse("secret,bob,uid-1\n").expect("tokens"),
            ..Authn::default()
        };
        let cert = Peer::Client(Arc::new(Identity::new("carol", Vec::new())));
        let headers = |token: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert("x-remote-user", "mallory".parse().expect("header"));
            if let Some(t) = token {
                h.insert(
                    http::header::AUTHORIZATION,
                    format!("Bearer {t}").parse().expect("header"),
                );
            }
            h
        };
        let who = |r: Result<Option<Arc<Identity>>, ApiError>| {
            r.map(|id| id.map(|i| i.user.clone())).map_err(|e| e.code)
        };
        // (peer, bearer token, the user or the error code)
        type Case<'a> = (&'a Peer, Option<&'a str>, Result<Option<String>, u16>);
        let cases: [Case; 6] = [
            (&Peer::Anonymous, None, Ok(None)),
            (&cert, Some("secret"), Ok(Some("carol".into()))),
            (&Peer::Anonymous, Some("secret"), Ok(Some("bob".into()))),
            (&Peer::Anonymous, Some("wrong"), Err(401)),
            (&cert, Some("wrong"), Ok(Some("carol".into()))),
            (&cert, None, Ok(Some("carol".into()))),
        ];
        for (peer, token, want) in cases {
            let mut h = headers(token);
            let got = who(authenticate(&authn, objects, peer, &mut h).await);
            assert_eq!(got, want, "{peer:?} {token:?}");
        }
        // With a proxy configured, its headers count only from the proxy and are stripped.
        let ca = certs::Pki::load_or_create(
            &tempfile::tempdir().expect("tempdir").path().join("pki"),
            &[],
        )
        .expect("pki");
        let proxied = Authn {
            request_header: Some(
                RequestHeader::new(
                    ca.ca_cert_pem(),
                    Vec::new(),
                    Vec::new(),
                    Vec::new(),
                    Vec::new(),
                    Vec::new(),
                )
                .expect("request header"),
            ),
            ..Authn::default()
        };
        let mut h = headers(None);
        let got = who(authenticate(&proxied, objects, &Peer::Proxy, &mut h).await);
        assert_eq!(got, Ok(Some("mallory".into())));
        let mut h = headers(None);
        let got = who(authenticate(&proxied, objects, &cert, &mut h).await);
        assert_eq!(got, Ok(Some("carol".into())));
        assert!(
            h.get("x-remote-user").is_none(),
            "the proxy's header is stripped"
        );
    }

    #[test]
    fn parses_and_authenticates() {
        let t =
            StaticTokens::parse("# comment\nsecret,bob,uid-1,\"viewers,dev\"\nother,carol,uid-2\n")
                .expect("parse");
        let bob = t.authenticate("secret").expect("bob");
        assert_eq!(bob.user, "bob");
        assert_eq!(bob.groups, vec!["viewers".to_string(), "dev".to_string()]);
        assert_eq!(
            t.authenticate("other").map(|i| i.user),
            Some("carol".to_string())
        );
        assert!(t.authenticate("secre").is_none());
        assert!(t.authenticate("secrets").is_none());
        assert!(t.authenticate("").is_none());
        assert!(StaticTokens::parse("just-a-token\n").is_err());
        assert_eq!(format!("{t:?}"), "StaticTokens(2 entries)");
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
