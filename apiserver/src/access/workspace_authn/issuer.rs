//! A small OpenID issuer for trying per-workspace authentication on a laptop and for the tests:
//! it serves a discovery document and its key set over HTTPS (a certificate of its own CA, for
//! `certificateAuthority`) and signs RS256 tokens with one RSA key. It logs nobody in: tokens
//! are minted by whoever holds the key ([`DevIssuer::token`], `platform-mesh oidc-issuer token`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RsaPublicKeyComponents, RSA_PKCS1_SHA256};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Why the issuer could not start or sign.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// The key is not a PKCS#8 RSA key (`BEGIN PRIVATE KEY`).
    #[error("not a PKCS#8 RSA private key: {0}")]
    Key(String),
    /// Its certificates could not be made or read.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// The TLS settings were refused.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The listener could not be opened.
    #[error("listening: {0}")]
    Io(#[from] std::io::Error),
    /// Signing failed.
    #[error("signing failed")]
    Sign,
}

/// The signing half of an issuer: its URL, key and key id.
#[derive(Clone)]
pub struct Signer {
    /// The issuer URL (`iss`).
    pub url: String,
    key: Arc<RsaKeyPair>,
    kid: String,
}

impl Signer {
    /// A signer for issuer `url` with the PKCS#8 RSA key `key_pem`.
    pub fn new(url: &str, key_pem: &str) -> Result<Signer, IssuerError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| IssuerError::Key(e.to_string()))?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|e| IssuerError::Key(e.to_string()))?;
        let n = RsaPublicKeyComponents::<Vec<u8>>::from(key.public()).n;
        let kid =
            URL_SAFE_NO_PAD.encode(&ring::digest::digest(&ring::digest::SHA256, &n).as_ref()[..12]);
        Ok(Signer {
            url: url.to_string(),
            key: Arc::new(key),
            kid,
        })
    }

    /// The key set document (`{"keys": [...]}`).
    pub fn jwks(&self) -> Value {
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(self.key.public());
        json!({"keys": [{
            "kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid,
            "n": URL_SAFE_NO_PAD.encode(&public.n),
            "e": URL_SAFE_NO_PAD.encode(&public.e),
        }]})
    }

    /// A token with `claims`; `iss` (this issuer), `iat` (now) and `exp` (in an hour) are added
    /// where `claims` has none.
    pub fn token(&self, claims: &Value) -> Result<String, IssuerError> {
        self.sign(claims, true)
    }

    /// A token as [`Signer::token`] makes, without a `kid` in its header (as some issuers with
    /// a single key sign).
    pub fn token_without_kid(&self, claims: &Value) -> Result<String, IssuerError> {
        self.sign(claims, false)
    }

    fn sign(&self, claims: &Value, with_kid: bool) -> Result<String, IssuerError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut claims = claims.clone();
        if let Some(m) = claims.as_object_mut() {
            m.entry("iss").or_insert_with(|| json!(self.url));
            m.entry("iat").or_insert_with(|| json!(now));
            m.entry("exp").or_insert_with(|| json!(now + 3600));
        }
        let header = if with_kid {
            json!({"alg": "RS256", "typ": "JWT", "kid": self.kid})
        } else {
            json!({"alg": "RS256", "typ": "JWT"})
        };
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut sig,
            )
            .map_err(|_| IssuerError::Sign)?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

/// A running issuer.
pub struct DevIssuer {
    /// What signs its tokens.
    pub signer: Signer,
    /// The PEM CA its serving certificate chains to (`certificateAuthority`).
    pub ca_pem: String,
    /// Requests served so far (discovery and keys).
    pub requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DevIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DevIssuer {
    /// Serves at `listen` (port 0 picks one) with certificates kept in `dir` (made on first
    /// start, for `localhost` and `127.0.0.1`) and the PKCS#8 RSA key `key_pem`. The issuer URL
    /// is `https://127.0.0.1:<port>` plus `path` (e.g. `/realms/acme`, or empty).
    pub async fn start(
        dir: &Path,
        listen: SocketAddr,
        path: &str,
        key_pem: &str,
    ) -> Result<DevIssuer, IssuerError> {
        Self::start_with_keys(dir, listen, path, key_pem, None).await
    }

    /// As [`DevIssuer::start`], serving `jwks` as its key set instead of its own key's (e.g. a
    /// [`hostile_jwks`], to see what a tenant's issuer can cost the server).
    pub async fn start_with_keys(
        dir: &Path,
        listen: SocketAddr,
        path: &str,
        key_pem: &str,
        jwks: Option<Value>,
    ) -> Result<DevIssuer, IssuerError> {
        let pki = certs::load_or_create(dir, &[])?;
        let listener = TcpListener::bind(listen).await?;
        let port = listener.local_addr()?.port();
        let url = format!("https://127.0.0.1:{port}{}", path.trim_end_matches('/'));
        let signer = Signer::new(&url, key_pem)?;
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pki.serving_cert_pem().as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| IssuerError::Key(e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(pki.serving_key_pem().as_bytes())
            .map_err(|e| IssuerError::Key(e.to_string()))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let discovery = Bytes::from(
            json!({"issuer": url, "jwks_uri": format!("{url}/keys"),
                   "id_token_signing_alg_values_supported": ["RS256"]})
            .to_string(),
        );
        let keys = Bytes::from(jwks.unwrap_or_else(|| signer.jwks()).to_string());
        let (well_known, keys_path) = (
            format!(
                "{}/.well-known/openid-configuration",
                path.trim_end_matches('/')
            ),
            format!("{}/keys", path.trim_end_matches('/')),
        );
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, discovery, keys, well_known, keys_path, counter) = (
                    acceptor.clone(),
                    discovery.clone(),
                    keys.clone(),
                    well_known.clone(),
                    keys_path.clone(),
                    counter.clone(),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        counter.fetch_add(1, Ordering::Relaxed);
                        let body = match req.uri().path() {
                            p if p == well_known => Some(discovery.clone()),
                            p if p == keys_path => Some(keys.clone()),
                            _ => None,
                        };
                        let response = match body {
                            Some(b) => Response::builder()
                                .header(http::header::CONTENT_TYPE, "application/json")
                                .body(Full::new(b)),
                            None => Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::new())),
                        };
                        async move { response }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(DevIssuer {
            signer,
            ca_pem: pki.ca_cert_pem().to_string(),
            requests,
            task,
        })
    }

    /// The issuer URL.
    pub fn url(&self) -> &str {
        &self.signer.url
    }

    /// A token with `claims` (see [`Signer::token`]).
    pub fn token(&self, claims: &Value) -> Result<String, IssuerError> {
        self.signer.token(claims)
    }
}

/// A key set as costly to check as a tenant's issuer can make one, of at most `max_bytes`
/// serialized: as many 8192-bit keys with the largest exponent kube takes (2^31 - 1) as fit,
/// named `k0`, `k1`, .... Their moduli are random odd numbers, not products of two primes (no
/// one can sign with them), which costs a verification what a real key of the size costs.
pub fn hostile_jwks(max_bytes: usize) -> Value {
    let rng = SystemRandom::new();
    let mut keys = Vec::new();
    let mut size = r#"{"keys":[]}"#.len();
    loop {
        let mut n = vec![0u8; 1024];
        if ring::rand::SecureRandom::fill(&rng, &mut n).is_err() {
            break;
        }
        n[0] |= 0x80;
        n[1023] |= 1;
        let key = json!({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": format!("k{}", keys.len()),
                         "n": URL_SAFE_NO_PAD.encode(&n), "e": URL_SAFE_NO_PAD.encode([0x7f, 0xff, 0xff, 0xff])});
        let more = key.to_string().len() + 1;
        if size + more > max_bytes {
            break;
        }
        size += more;
        keys.push(key);
    }
    json!({ "keys": keys })
}

/// A token of issuer `url` no key signed: no `kid` (so every key of a set is a candidate) and
/// a random 8192-bit signature.
pub fn garbage_token(url: &str) -> String {
    let mut sig = vec![0u8; 1024];
    let _ = ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut sig);
    sig[0] = 1;
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "typ": "JWT"}).to_string()),
        URL_SAFE_NO_PAD
            .encode(json!({"iss": url, "aud": "x", "exp": 4_000_000_000u64}).to_string()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}
