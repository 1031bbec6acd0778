//! ServiceAccount tokens: ES256 JSON Web Tokens the server signs and verifies itself.
//!
//! Tokens come from two places, as in kube-apiserver: the `serviceaccounts/<name>/token`
//! subresource (TokenRequest: bound, expiring) and Secrets of type
//! `kubernetes.io/service-account-token` (legacy: filled when created, valid while the Secret
//! and its ServiceAccount exist). A token names the logical cluster it was issued in; used in
//! another cluster it authenticates as `system:kcp:serviceaccount:<cluster>:<ns>:<name>` with
//! no service-account groups, so it reaches nothing there unless bound by that name (kcp's rule).
//!
//! A token is accepted only if its signature verifies with the server's key (alg pinned to
//! ES256), its issuer and one audience match, it is within its validity window, and the
//! ServiceAccount (and the Secret, for legacy tokens) still exists with the uid the token names.
//! Tokens never appear in logs or error messages.

use std::collections::BTreeMap;
use std::path::Path;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use http::{Response, StatusCode};
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED,
    ECDSA_P256_SHA256_FIXED_SIGNING,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;

use crate::meta::body::Body;
use crate::meta::field_error::FieldError;
use crate::meta::response::{error_response, json_response};
use crate::meta::status::{ApiError, Cause, GroupResource};
use crate::registry::catalog::Catalog;
use crate::registry::objects;
use crate::request::identity::Identity;
use crate::request::request_info::ResourceRequest;
use crate::storage::Store;

/// The issuer kube-apiserver clusters use by default.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc";
/// Lifetime of a requested token when the request names none (kube's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// Shortest lifetime a TokenRequest may ask for.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// Longest lifetime a TokenRequest may ask for (kube's bound: 2^32 seconds).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// The Secret type whose Secrets receive a legacy token.
pub const LEGACY_TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";
/// Annotation naming the ServiceAccount of a legacy token Secret.
pub const SERVICE_ACCOUNT_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
/// Annotation recording the uid of that ServiceAccount.
pub const SERVICE_ACCOUNT_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";
/// The extra attribute kube sets to identify the credential (never the token itself).
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.kubernetes.io/credential-id";
/// The extra attribute naming the logical cluster a service account lives in.
pub const CLUSTER_EXTRA: &str = "authentication.kcp.io/cluster-name";
/// Longest token accepted; anything longer is not ours.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A reference to an object in the token claims.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectRef {
    /// The object's name.
    pub name: String,
    /// The object's uid; a token is accepted only while an object of that name still has this uid.
    pub uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KubeClaims {
    /// The namespace of the service account.
    pub namespace: String,
    /// The service account the token authenticates as.
    pub serviceaccount: ObjectRef,
    /// The Secret the token is bound to (a legacy token's own Secret, or a TokenRequest's
    /// `boundObjectRef`); the token is valid only while it exists. `None` for an unbound token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
}

/// The claims of a service-account token.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The issuer (`iss`); must be the server's own issuer.
    pub iss: String,
    /// The subject (`sub`): `system:serviceaccount:<namespace>:<name>`.
    pub sub: String,
    /// The audiences (`aud`); one must be accepted. A single string is read as a one-element list.
    #[serde(deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    /// Absent for legacy tokens, which live as long as their Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    /// When the token was issued (`iat`), in seconds since the Unix epoch.
    pub iat: i64,
    /// The start of the validity window (`nbf`), in seconds since the Unix epoch.
    pub nbf: i64,
    /// A unique id of the token (`jti`), a random UUID.
    pub jti: String,
    /// The `kubernetes.io` claim: namespace, service account and the bound Secret, if any.
    #[serde(rename = "kubernetes.io")]
    pub kube: KubeClaims,
    /// The logical cluster the service account lives in.
    #[serde(rename = "kcp.io/cluster")]
    pub cluster: String,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Aud::deserialize(d)? {
        Aud::One(a) => vec![a],
        Aud::Many(a) => a,
    })
}

/// Why a token was refused. The text is for logs and TokenReview; it never contains the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token this server issues (not three parts, not an ES256 JWS, or too long); other
    /// authenticators may still accept it.
    #[error("not a service account token")]
    NotOurs,
    /// The signature does not verify with the server's key.
    #[error("token signature is invalid")]
    BadSignature,
    /// The signature is not valid base64, or it verified but the payload is not valid claims
    /// JSON.
    #[error("token is malformed")]
    Malformed,
    /// The expiry (`exp`) has passed.
    #[error("token has expired")]
    Expired,
    /// The validity window (`nbf`) has not started yet, even with a minute of clock leeway.
    #[error("token is not valid yet")]
    NotYetValid,
    /// None of the token's audiences is accepted.
    #[error("token audiences are not accepted")]
    WrongAudience,
    /// The issuer (`iss`) is not the server's.
    #[error("token was issued for another issuer")]
    WrongIssuer,
    /// The service account no longer exists, or exists with another uid, or is being deleted.
    #[error("the service account of the token no longer exists")]
    ServiceAccountGone,
    /// The Secret the token is bound to no longer exists, or exists with another uid, or is
    /// being deleted.
    #[error("the secret of the token no longer exists")]
    SecretGone,
}

/// The server's service-account token signer and verifier.
pub struct ServiceAccountTokens {
    key: EcdsaKeyPair,
    public_key: Vec<u8>,
    kid: String,
    issuer: String,
    /// Audiences the server accepts (`--api-audiences`; the issuer when none are given).
    audiences: Vec<String>,
    /// The CA bundle written into legacy token Secrets as `ca.crt`.
    ca_pem: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for ServiceAccountTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountTokens")
            .field("kid", &self.kid)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Why the service-account signing key cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    /// No key could be generated (the system's randomness failed).
    #[error("cannot generate a service account key")]
    Generate,
    /// The generated key could not be written.
    #[error(transparent)]
    Write(#[from] certs::CertError),
    /// The key file exists but cannot be read.
    #[error("cannot read service account key {path}: {source}")]
    Read {
        /// The key file.
        path: std::path::PathBuf,
        /// The read's failure.
        #[source]
        source: std::io::Error,
    },
    /// The key file holds no usable key.
    #[error("service account key {path}: {source}")]
    Invalid {
        /// The key file.
        path: std::path::PathBuf,
        /// What is wrong with its contents.
        #[source]
        source: KeyFormatError,
    },
}

/// What is wrong with a PEM text that should hold the service-account signing key.
#[derive(Debug, thiserror::Error)]
pub enum KeyFormatError {
    /// Not a PKCS#8 PEM block.
    #[error("expected a PKCS#8 PEM block (BEGIN PRIVATE KEY): {0}")]
    NotPkcs8(#[from] rustls_pki_types::pem::Error),
    /// A PKCS#8 key, but not for ECDSA P-256.
    #[error("not an ECDSA P-256 key: {0}")]
    NotP256(ring::error::KeyRejected),
}

impl ServiceAccountTokens {
    /// Reads the PKCS#8 P-256 key at `path`, or creates one there (mode 0600) if it is missing.
    pub fn load_or_create(
        path: &Path,
        issuer: &str,
        audiences: &[String],
        ca_pem: &str,
    ) -> Result<Self, SigningKeyError> {
        let rng = SystemRandom::new();
        let pem = match std::fs::read_to_string(path) {
            Ok(pem) => pem,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                    .map_err(|_| SigningKeyError::Generate)?;
                let pem = certs::encode_pem("PRIVATE KEY", pkcs8.as_ref());
                certs::write_private(path, pem.as_bytes())?;
                pem
            }
            Err(source) => {
                return Err(SigningKeyError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Self::from_pem(&pem, issuer, audiences, ca_pem).map_err(|source| SigningKeyError::Invalid {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A signer from a PKCS#8 PEM P-256 private key.
    pub fn from_pem(
        pem: &str,
        issuer: &str,
        audiences: &[String],
        ca_pem: &str,
    ) -> Result<Self, KeyFormatError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            der.secret_pkcs8_der(),
            &rng,
        )
        .map_err(KeyFormatError::NotP256)?;
        let public_key = key.public_key().as_ref().to_vec();
        let kid = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(&public_key));
        let audiences = if audiences.is_empty() {
            vec![issuer.to_string()]
        } else {
            audiences.to_vec()
        };
        Ok(ServiceAccountTokens {
            key,
            public_key,
            kid,
            issuer: issuer.to_string(),
            audiences,
            ca_pem: ca_pem.to_string(),
            rng,
        })
    }

    /// The CA bundle a client verifies the server with (legacy token Secrets' `ca.crt`).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The issuer written into and required of every token (`--service-account-issuer`).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The audiences accepted when a request names none (`--api-audiences`; the issuer when none
    /// are given).
    pub fn audiences(&self) -> &[String] {
        &self.audiences
    }

    /// Signs claims into a compact JWS.
    pub fn sign(&self, claims: &Claims) -> Result<String, ApiError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let mut out = String::new();
        out.push_str(&URL_SAFE_NO_PAD.encode(header.to_string()));
        out.push('.');
        let payload = serde_json::to_vec(claims).map_err(|e| ApiError::internal(e.to_string()))?;
        out.push_str(&URL_SAFE_NO_PAD.encode(payload));
        let sig = self
            .key
            .sign(&self.rng, out.as_bytes())
            .map_err(|_| ApiError::internal("signing the token failed"))?;
        out.push('.');
        out.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
        Ok(out)
    }

    /// Checks signature, issuer, validity window and audience (against `audiences`, or the
    /// server's own when empty). Existence of the service account is checked by the caller.
    pub fn verify(&self, token: &str, audiences: &[String], at: i64) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::NotOurs);
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::NotOurs);
        };
        let header: Value = URL_SAFE_NO_PAD
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::NotOurs)?;
        if header["alg"] != "ES256" {
            return Err(TokenError::NotOurs);
        }
        let sig = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| TokenError::Malformed)?;
        let signed = &token[..h.len() + 1 + p.len()];
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public_key)
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| TokenError::BadSignature)?;
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        if claims.iss != self.issuer {
            return Err(TokenError::WrongIssuer);
        }
        if claims.exp.is_some_and(|exp| exp <= at) {
            return Err(TokenError::Expired);
        }
        // A minute of leeway for clocks, as kube allows.
        if claims.nbf > at + 60 {
            return Err(TokenError::NotYetValid);
        }
        let accepted = if audiences.is_empty() {
            &self.audiences
        } else {
            audiences
        };
        if !claims.aud.iter().any(|a| accepted.contains(a)) {
            return Err(TokenError::WrongAudience);
        }
        Ok(claims)
    }

    /// Claims for a token of service account `sa` (its stored object) in `cluster`.
    fn claims_for(
        &self,
        cluster: &str,
        sa: &Value,
        audiences: Vec<String>,
        expiration: Option<i64>,
        secret: Option<ObjectRef>,
    ) -> Claims {
        let iat = now();
        let namespace = objects::meta_str(sa, "namespace")
            .unwrap_or_default()
            .to_string();
        let name = objects::name(sa).to_string();
        Claims {
            iss: self.issuer.clone(),
            sub: format!("system:serviceaccount:{namespace}:{name}"),
            aud: if audiences.is_empty() {
                self.audiences.clone()
            } else {
                audiences
            },
            exp: expiration.map(|e| iat + e),
            iat,
            nbf: iat,
            jti: uuid::Uuid::new_v4().to_string(),
            kube: KubeClaims {
                namespace,
                serviceaccount: ObjectRef {
                    name,
                    uid: objects::meta_str(sa, "uid").unwrap_or_default().to_string(),
                },
                secret,
            },
            cluster: cluster.to_string(),
        }
    }
}

/// What the service-account code reads: the store, and the built-in types to find
/// ServiceAccounts and Secrets in it. A narrow handle, not the whole server.
#[derive(Clone, Copy)]
pub struct Objects<'a> {
    /// The store objects live in.
    pub store: &'a dyn Store,
    /// What every logical cluster serves.
    pub catalog: &'a Catalog,
}

fn core_resource(
    state: Objects<'_>,
    plural: &str,
) -> Result<std::sync::Arc<crate::registry::Resource>, ApiError> {
    state
        .catalog
        .builtin_view()
        .registry
        .lookup("", "v1", plural)
        .cloned()
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))
}

/// Reads one namespaced core object.
async fn read_core(
    state: Objects<'_>,
    plural: &str,
    cluster: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, ApiError> {
    let r = core_resource(state, plural)?;
    let key = r.key(cluster, Some(namespace), name);
    match state.store.get(&key).await {
        Ok(Some(kv)) => Ok(Some(objects::decode_stored(&kv.value)?)),
        Ok(None) => Ok(None),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

fn uid_of(obj: &Value) -> &str {
    objects::meta_str(obj, "uid").unwrap_or_default()
}

/// Verifies a token completely, the service account (and Secret) included.
pub async fn verify_token(
    state: Objects<'_>,
    signer: &ServiceAccountTokens,
    token: &str,
    audiences: &[String],
) -> Result<Claims, TokenError> {
    let claims = signer.verify(token, audiences, now())?;
    let ns = &claims.kube.namespace;
    let sa = read_core(
        state,
        "serviceaccounts",
        &claims.cluster,
        ns,
        &claims.kube.serviceaccount.name,
    )
    .await
    .ok()
    .flatten()
    .filter(|sa| uid_of(sa) == claims.kube.serviceaccount.uid && !objects::is_deleting(sa))
    .ok_or(TokenError::ServiceAccountGone)?;
    drop(sa);
    if let Some(secret) = &claims.kube.secret {
        read_core(state, "secrets", &claims.cluster, ns, &secret.name)
            .await
            .ok()
            .flatten()
            .filter(|s| uid_of(s) == secret.uid && !objects::is_deleting(s))
            .ok_or(TokenError::SecretGone)?;
    }
    Ok(claims)
}

/// The logical cluster a token's payload names, read without verifying it: only to decide how
/// much a TokenReview in that cluster may say about why the token failed.
pub fn claimed_cluster(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    if payload.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("kcp.io/cluster")?.as_str().map(str::to_string)
}

/// The identity a verified token authenticates.
pub fn identity(claims: &Claims) -> Identity {
    let ns = &claims.kube.namespace;
    let mut extra = BTreeMap::new();
    extra.insert(
        CREDENTIAL_ID_EXTRA.to_string(),
        vec![format!("JTI={}", claims.jti)],
    );
    extra.insert(CLUSTER_EXTRA.to_string(), vec![claims.cluster.clone()]);
    Identity {
        user: format!(
            "system:serviceaccount:{ns}:{}",
            claims.kube.serviceaccount.name
        ),
        groups: vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
        ],
        uid: claims.kube.serviceaccount.uid.clone(),
        extra,
        home_cluster: Some(claims.cluster.clone()),
        warrant: None,
        charged_to: None,
    }
}

fn cause(e: FieldError) -> Cause {
    Cause {
        reason: e.reason().to_string(),
        message: e.body(),
        field: e.field.clone(),
    }
}

fn invalid(kind: &str, name: &str, field: &str, value: Value, message: &str) -> ApiError {
    ApiError::invalid(
        kind,
        "authentication.k8s.io",
        name,
        vec![cause(FieldError::invalid(field, value, message))],
    )
}

/// Decodes a JSON or protobuf request body of the given kind.
pub(crate) fn decode_request(body: &[u8], kind: &str) -> Result<Value, ApiError> {
    match crate::meta::protobuf::decode_json_or_protobuf(body) {
        Some(v) if v["kind"].is_null() || v["kind"] == kind => Ok(v),
        Some(v) => Err(ApiError::bad_request(format!(
            "expected a {kind}, got {}",
            v["kind"]
        ))),
        _ => Err(ApiError::bad_request(format!(
            "the {kind} in the body could not be decoded"
        ))),
    }
}

/// `POST .../namespaces/<ns>/serviceaccounts/<name>/token` (TokenRequest). The caller has
/// already been authorized for `create serviceaccounts/token`.
pub async fn token_request(
    state: Objects<'_>,
    signer: Option<&ServiceAccountTokens>,
    cluster: &str,
    rr: &ResourceRequest,
    body: &[u8],
) -> Response<Body> {
    match token_request_inner(state, signer, cluster, rr, body).await {
        Ok(v) => json_response(StatusCode::CREATED, &v),
        Err(e) => error_response(&e),
    }
}

async fn token_request_inner(
    state: Objects<'_>,
    signer: Option<&ServiceAccountTokens>,
    cluster: &str,
    rr: &ResourceRequest,
    body: &[u8],
) -> Result<Value, ApiError> {
    let gr = GroupResource::new("", "serviceaccounts");
    if rr.verb != crate::request::request_info::Verb::Create {
        return Err(ApiError::method_not_allowed(rr.verb.as_str(), &gr));
    }
    let (Some(ns), Some(name)) = (rr.namespace.as_deref(), rr.name.as_deref()) else {
        return Err(ApiError::path_not_found());
    };
    let Some(signer) = signer else {
        return Err(ApiError::new(
            503,
            "ServiceUnavailable",
            "service account tokens are not configured on this server",
        ));
    };
    let request = decode_request(body, "TokenRequest")?;
    let spec = &request["spec"];
    let expiration = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => v.as_i64().ok_or_else(|| {
            invalid(
                "TokenRequest",
                name,
                "spec.expirationSeconds",
                v.clone(),
                "must be an integer",
            )
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            "TokenRequest",
            name,
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            "TokenRequest",
            name,
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let audiences: Vec<String> = match &spec["audiences"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                invalid(
                    "TokenRequest",
                    name,
                    "spec.audiences",
                    spec["audiences"].clone(),
                    "must be a list of strings",
                )
            })?,
        other => {
            return Err(invalid(
                "TokenRequest",
                name,
                "spec.audiences",
                other.clone(),
                "must be a list of strings",
            ))
        }
    };
    let sa = read_core(state, "serviceaccounts", cluster, ns, name)
        .await?
        .filter(|sa| !objects::is_deleting(sa))
        .ok_or_else(|| ApiError::not_found(&gr, name))?;
    let mut secret = None;
    let bound = &spec["boundObjectRef"];
    if bound.is_object() {
        let kind = bound["kind"].as_str().unwrap_or_default();
        if kind != "Secret" {
            return Err(invalid(
                "TokenRequest",
                name,
                "spec.boundObjectRef.kind",
                bound["kind"].clone(),
                "only a Secret in the service account's namespace can be bound",
            ));
        }
        let secret_name = bound["name"].as_str().unwrap_or_default();
        let obj = read_core(state, "secrets", cluster, ns, secret_name)
            .await?
            .ok_or_else(|| ApiError::not_found(&GroupResource::new("", "secrets"), secret_name))?;
        if let Some(uid) = bound["uid"].as_str().filter(|u| !u.is_empty()) {
            if uid != uid_of(&obj) {
                return Err(ApiError::conflict_with(
                    &GroupResource::new("", "secrets"),
                    secret_name,
                    "the uid in boundObjectRef does not match",
                ));
            }
        }
        secret = Some(ObjectRef {
            name: secret_name.to_string(),
            uid: uid_of(&obj).to_string(),
        });
    }
    let claims = signer.claims_for(cluster, &sa, audiences, Some(expiration), secret);
    let token = signer.sign(&claims)?;
    let expires = time::OffsetDateTime::from_unix_timestamp(claims.exp.unwrap_or(claims.iat))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let mut spec = spec.clone();
    if !spec.is_object() {
        spec = json!({});
    }
    spec["audiences"] = json!(claims.aud);
    spec["expirationSeconds"] = json!(expiration);
    if spec["boundObjectRef"].is_null() {
        if let Some(o) = spec.as_object_mut() {
            o.remove("boundObjectRef");
        }
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": objects::now_rfc3339()},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

/// Fills a new `kubernetes.io/service-account-token` Secret (after its uid was assigned) with
/// `token`, `ca.crt` and `namespace`, as kube's token controller does, and records the
/// ServiceAccount's uid. A Secret whose ServiceAccount does not exist yet is left unfilled.
pub async fn fill_legacy_secret(
    state: Objects<'_>,
    signer: Option<&ServiceAccountTokens>,
    cluster: &str,
    secret: &mut Value,
) -> Result<(), ApiError> {
    if secret["type"] != LEGACY_TOKEN_SECRET_TYPE {
        return Ok(());
    }
    let name = objects::name(secret).to_string();
    let sa_name = secret["metadata"]["annotations"][SERVICE_ACCOUNT_NAME_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if sa_name.is_empty() {
        return Err(ApiError::invalid(
            "Secret",
            "",
            &name,
            vec![cause(FieldError::required(
                format!("metadata.annotations[{SERVICE_ACCOUNT_NAME_ANNOTATION}]"),
                "",
            ))],
        ));
    }
    let Some(signer) = signer else {
        return Ok(());
    };
    let ns = objects::meta_str(secret, "namespace")
        .unwrap_or_default()
        .to_string();
    let Some(sa) = read_core(state, "serviceaccounts", cluster, &ns, &sa_name).await? else {
        return Ok(());
    };
    let secret_ref = ObjectRef {
        name: name.clone(),
        uid: uid_of(secret).to_string(),
    };
    let claims = signer.claims_for(cluster, &sa, Vec::new(), None, Some(secret_ref));
    let token = signer.sign(&claims)?;
    let meta = objects::meta_mut(secret);
    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
    annotations[SERVICE_ACCOUNT_UID_ANNOTATION] = json!(uid_of(&sa));
    if !secret["data"].is_object() {
        secret["data"] = json!({});
    }
    secret["data"]["token"] = json!(STANDARD.encode(token));
    secret["data"]["ca.crt"] = json!(STANDARD.encode(&signer.ca_pem));
    secret["data"]["namespace"] = json!(STANDARD.encode(&ns));
    Ok(())
}

/// The Secret type's part of the service-account machinery: a new legacy token Secret gets its
/// token, as kube's token controller fills it.
pub struct LegacyTokenSecrets {
    /// The store objects live in.
    pub store: std::sync::Arc<dyn Store>,
    /// What every logical cluster serves.
    pub catalog: std::sync::Arc<Catalog>,
    /// The signer of the tokens; without one, Secrets stay unfilled.
    pub signer: Option<std::sync::Arc<ServiceAccountTokens>>,
}

#[async_trait::async_trait]
impl crate::registry::Strategy for LegacyTokenSecrets {
    async fn prepare_for_store(
        &self,
        write: &crate::registry::WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if old.is_some() {
            return Ok(());
        }
        let objects = Objects {
            store: self.store.as_ref(),
            catalog: &self.catalog,
        };
        fill_legacy_secret(objects, self.signer.as_deref(), write.cluster, obj).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> ServiceAccountTokens {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pem = certs::encode_pem("PRIVATE KEY", pkcs8.as_ref());
        ServiceAccountTokens::from_pem(&pem, DEFAULT_ISSUER, &[], "ca").expect("signer")
    }

    fn sa() -> Value {
        json!({"metadata": {"name": "robot", "namespace": "default", "uid": "u-1"}})
    }

    #[test]
    fn signs_and_verifies() {
        let s = signer();
        let claims = s.claims_for("root", &sa(), vec![], Some(3600), None);
        let token = s.sign(&claims).expect("sign");
        let got = s.verify(&token, &[], now()).expect("verify");
        assert_eq!(got, claims);
        assert_eq!(got.sub, "system:serviceaccount:default:robot");
        assert_eq!(got.aud, vec![DEFAULT_ISSUER.to_string()]);
        let id = identity(&got);
        assert_eq!(id.user, "system:serviceaccount:default:robot");
        assert_eq!(id.uid, "u-1");
        assert_eq!(id.home_cluster.as_deref(), Some("root"));
    }

    #[test]
    fn refuses_bad_tokens() {
        let s = signer();
        let claims = s.claims_for("root", &sa(), vec![], Some(3600), None);
        let token = s.sign(&claims).expect("sign");
        // Expired: checked at a time past exp.
        assert_eq!(
            s.verify(&token, &[], now() + 3601),
            Err(TokenError::Expired)
        );
        // A different audience.
        assert_eq!(
            s.verify(&token, &["other".to_string()], now()),
            Err(TokenError::WrongAudience)
        );
        // Tampered payload: another service account, same signature.
        let mut forged = claims.clone();
        forged.kube.serviceaccount.name = "admin".into();
        let parts: Vec<&str> = token.split('.').collect();
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).expect("json"));
        let tampered = format!("{}.{}.{}", parts[0], payload, parts[2]);
        assert_eq!(
            s.verify(&tampered, &[], now()),
            Err(TokenError::BadSignature)
        );
        // Another key signed it.
        let other = signer().sign(&claims).expect("sign");
        assert_eq!(s.verify(&other, &[], now()), Err(TokenError::BadSignature));
        // alg "none" and HS256 are not ours.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            parts[1]
        );
        assert_eq!(s.verify(&none, &[], now()), Err(TokenError::NotOurs));
        assert_eq!(s.verify("abc", &[], now()), Err(TokenError::NotOurs));
        assert_eq!(s.verify("a.b.c", &[], now()), Err(TokenError::NotOurs));
        // The debug form shows no key material.
        assert!(!format!("{s:?}").contains("PRIVATE"));
    }

    #[test]
    fn key_file_is_created_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pki/service-account.key");
        let a = ServiceAccountTokens::load_or_create(&path, DEFAULT_ISSUER, &[], "").expect("a");
        let b = ServiceAccountTokens::load_or_create(&path, DEFAULT_ISSUER, &[], "").expect("b");
        assert_eq!(a.kid, b.kid);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(dir.path().join("bad.key"), "not a key").expect("write");
        let err = ServiceAccountTokens::load_or_create(
            &dir.path().join("bad.key"),
            DEFAULT_ISSUER,
            &[],
            "",
        )
        .expect_err("bad key");
        assert!(err.to_string().contains("PKCS#8"), "{err}");
    }
}
