//! One JWT authenticator at work, as kube-apiserver's OIDC authenticator behaves with kcp's
//! settings: the token's (unverified) `iss` picks the authenticator; the signature must be RS256
//! (kcp builds workspace authenticators with kube's default algorithm list, RS256 only) by a key
//! of the issuer's key set; `iss` must equal the issuer, one `aud` must be an accepted audience,
//! `exp` must be in the future and `nbf` (with five minutes' leeway) in the past; then the claim
//! rules, the mappings (a `username` claim `email` with `email_verified: false` is refused) and
//! the user rules.
//!
//! A key set comes from a tenant's issuer, so what is kept of it is bounded ([`read_key_set`]):
//! keys kube's authenticator (go-jose and Go's `crypto/rsa`) or ring would refuse are dropped
//! when the set is read, not at each verification, and at most [`MAX_KEYS`] are kept. A token
//! is checked against at most [`MAX_TRIED`] keys ([`candidates`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use kube_cel::cel;
use ring::signature::{RsaPublicKeyComponents, RSA_PKCS1_2048_8192_SHA256};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::{JwtAuthenticator, PrefixedClaimOrExpression};
use crate::meta::schema::{cel_value, evaluate_values};

/// Leeway on `nbf`, as go-oidc allows.
const NOT_BEFORE_LEEWAY: i64 = 300;
/// The largest token looked at.
pub const MAX_TOKEN: usize = 64 * 1024;
/// The most keys kept of one issuer's key set. Real issuers publish a handful (the signing key,
/// the next one and a retired one or two; large multi-tenant providers publish around ten), so
/// 64 leaves room for any rotation scheme while a set kept in memory stays under 64 KiB of
/// moduli and a hostile set of a thousand keys is cut to what is worth a look. A set with more
/// keeps its first 64 usable keys (the order the issuer lists them in).
pub const MAX_KEYS: usize = 64;
/// The most keys one token's signature is checked against. A token naming a `kid` is checked
/// against the keys with that `kid` only (one, in any sane set); a token naming none against
/// the first keys of the set. Issuers that leave `kid` out of their tokens publish a single key
/// (a `kid` is how a client picks among several), and four still covers such an issuer in the
/// middle of a rotation (old, current and next key) while capping what a garbage token costs:
/// four RSA verifications, whatever the set holds.
pub const MAX_TRIED: usize = 4;
/// The smallest and largest modulus, in bits, ring's `RSA_PKCS1_2048_8192_SHA256` verifies.
pub const MODULUS_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;
/// The largest public exponent Go's `crypto/rsa` takes (it must fit a 32-bit signed integer).
pub const MAX_EXPONENT: u64 = (1 << 31) - 1;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header and payload.
    #[error("malformed token")]
    Malformed,
    /// The header's `alg` is not RS256.
    #[error("oidc: verify token: unsupported signing algorithm {0:?}")]
    Algorithm(String),
    /// No key of the issuer's key set verifies the signature.
    #[error("oidc: verify token: failed to verify signature")]
    Signature,
    /// `iss` is not the issuer.
    #[error("oidc: verify token: id token issued by a different provider")]
    Issuer,
    /// No `aud` is accepted.
    #[error("oidc: expected audience in {0:?}")]
    Audience(Vec<String>),
    /// `exp` is missing or past.
    #[error("oidc: verify token: token is expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("oidc: verify token: current time before the nbf (not before) time")]
    NotYetValid,
    /// A claim the mappings or rules need is missing or of the wrong type.
    #[error("oidc: {0}")]
    Claim(String),
    /// An expression failed or gave the wrong type.
    #[error("oidc: {0}")]
    Expression(String),
    /// A validation rule did not hold.
    #[error("oidc: {0}")]
    Rule(String),
}

/// The parts of a token.
#[derive(Debug, Clone)]
pub struct Token {
    /// `alg` of the header.
    pub alg: String,
    /// `kid` of the header, if any.
    pub kid: Option<String>,
    /// The claims.
    pub claims: Map<String, Value>,
    signed: Arc<[u8]>,
    signature: Arc<[u8]>,
}

#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// Splits and decodes a compact JWT without verifying it.
pub fn parse(token: &str) -> Result<Token, TokenError> {
    if token.len() > MAX_TOKEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let decode = |x: &str| URL_SAFE_NO_PAD.decode(x).map_err(|_| TokenError::Malformed);
    let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
    let claims: Map<String, Value> =
        serde_json::from_slice(&decode(p)?).map_err(|_| TokenError::Malformed)?;
    Ok(Token {
        alg: header.alg,
        kid: header.kid,
        claims,
        signed: format!("{h}.{p}").into_bytes().into(),
        signature: decode(s)?.into(),
    })
}

impl Token {
    /// The unverified `iss`.
    pub fn issuer(&self) -> Option<&str> {
        self.claims.get("iss").and_then(Value::as_str)
    }
}

/// One RSA key of an issuer's key set, of a size and exponent kube and ring both accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaKey {
    /// Its `kid`.
    pub kid: Option<String>,
    /// The modulus, big-endian, without leading zeros.
    n: Vec<u8>,
    /// The exponent, big-endian, without leading zeros.
    e: Vec<u8>,
}

impl RsaKey {
    /// The key `n`, `e` (big-endian) would be, or why it is refused: the bounds of Go's
    /// `crypto/rsa` (an odd modulus; an odd exponent of at least 3 and at most 2^31 - 1) and
    /// ring's (a modulus of 2048 to 8192 bits). Leading zero bytes are ignored, as Go's
    /// big integers ignore them.
    pub fn new(kid: Option<String>, n: &[u8], e: &[u8]) -> Result<RsaKey, KeyRefusal> {
        let strip = |x: &[u8]| -> Vec<u8> {
            let first = x.iter().position(|b| *b != 0).unwrap_or(x.len());
            x[first..].to_vec()
        };
        let (n, e) = (strip(n), strip(e));
        let bits = match n.first() {
            Some(top) => n.len() * 8 - top.leading_zeros() as usize,
            None => 0,
        };
        if !MODULUS_BITS.contains(&bits) {
            return Err(KeyRefusal::ModulusSize(bits));
        }
        if n.last().is_some_and(|b| b & 1 == 0) {
            return Err(KeyRefusal::EvenModulus);
        }
        if e.len() > 8 {
            return Err(KeyRefusal::ExponentTooLarge);
        }
        let value = e.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
        if value < 2 {
            return Err(KeyRefusal::ExponentTooSmall);
        }
        if value > MAX_EXPONENT {
            return Err(KeyRefusal::ExponentTooLarge);
        }
        if value & 1 == 0 {
            return Err(KeyRefusal::EvenExponent);
        }
        Ok(RsaKey { kid, n, e })
    }

    /// The modulus size in bits.
    pub fn bits(&self) -> usize {
        self.n
            .first()
            .map_or(0, |top| self.n.len() * 8 - top.leading_zeros() as usize)
    }
}

/// Why a key of a key set was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// `n` or `e` is missing or not base64url.
    #[error("n or e is missing or not base64url")]
    Encoding,
    /// The modulus is outside 2048 to 8192 bits.
    #[error("a {0}-bit modulus (2048 to 8192 bits are verified)")]
    ModulusSize(usize),
    /// The modulus is even.
    #[error("the modulus is even")]
    EvenModulus,
    /// The exponent is below 2.
    #[error("the exponent is too small")]
    ExponentTooSmall,
    /// The exponent is above 2^31 - 1.
    #[error("the exponent is larger than 2^31 - 1")]
    ExponentTooLarge,
    /// The exponent is even.
    #[error("the exponent is even")]
    EvenExponent,
}

/// What was kept of a key set document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySetRead {
    /// The usable RSA signing keys, at most [`MAX_KEYS`], in the document's order.
    pub keys: Vec<RsaKey>,
    /// RSA signing keys dropped as unusable.
    pub refused: usize,
    /// Usable keys dropped because [`MAX_KEYS`] were already kept.
    pub beyond: usize,
}

/// The RSA signing keys of a JWKS document (`kty: RSA`, `use` absent or `sig`), bounded: keys
/// of other types are skipped, RSA keys kube or ring would refuse are dropped (each logged at
/// debug level), and only the first [`MAX_KEYS`] usable ones are kept.
pub fn read_key_set(jwks: &Value) -> KeySetRead {
    let mut out = KeySetRead::default();
    let entries = jwks["keys"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for k in entries {
        if k["kty"] != "RSA" || !(k.get("use").is_none() || k["use"] == "sig") {
            continue;
        }
        let kid = k["kid"].as_str().map(str::to_string);
        let decode = |name: &str| {
            k[name]
                .as_str()
                .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
                .ok_or(KeyRefusal::Encoding)
        };
        let key = decode("n").and_then(|n| RsaKey::new(kid.clone(), &n, &decode("e")?));
        match key {
            Ok(key) if out.keys.len() < MAX_KEYS => out.keys.push(key),
            Ok(_) => out.beyond += 1,
            Err(why) => {
                tracing::debug!(kid = ?kid, reason = %why, "workspace authentication: key skipped");
                out.refused += 1;
            }
        }
    }
    out
}

/// The usable RSA signing keys of a JWKS document ([`read_key_set`]).
pub fn rsa_keys(jwks: &Value) -> Vec<RsaKey> {
    read_key_set(jwks).keys
}

/// The keys of `keys` a token's signature is checked against: those with the token's `kid`
/// (none when no key has it: the others are not tried), or every key when the token names
/// none; at most [`MAX_TRIED`] either way.
pub fn candidates<'a, I>(token: &Token, keys: I) -> Vec<RsaKey>
where
    I: IntoIterator<Item = &'a RsaKey>,
{
    keys.into_iter()
        .filter(|k| token.kid.is_none() || k.kid == token.kid)
        .take(MAX_TRIED)
        .cloned()
        .collect()
}

/// `Err` unless the token is signed with RS256 (kube's default and kcp's only algorithm).
pub fn check_algorithm(token: &Token) -> Result<(), TokenError> {
    if token.alg != "RS256" {
        return Err(TokenError::Algorithm(token.alg.clone()));
    }
    Ok(())
}

/// The signed part and the signature of a token, cheap to clone onto another thread.
pub fn signed_parts(token: &Token) -> (Arc<[u8]>, Arc<[u8]>) {
    (token.signed.clone(), token.signature.clone())
}

/// Whether `key` made `signature` of `signed` with RS256: one RSA verification.
pub fn verify_one(key: &RsaKey, signed: &[u8], signature: &[u8]) -> bool {
    RsaPublicKeyComponents {
        n: &key.n,
        e: &key.e,
    }
    .verify(&RSA_PKCS1_2048_8192_SHA256, signed, signature)
    .is_ok()
}

/// Whether one of the [`candidates`] of `keys` signed the token with RS256, checked on the
/// calling thread. `Err` when the algorithm is not RS256.
pub fn verify_signature(token: &Token, keys: &[RsaKey]) -> Result<bool, TokenError> {
    check_algorithm(token)?;
    Ok(candidates(token, keys)
        .iter()
        .any(|k| verify_one(k, &token.signed, &token.signature)))
}

/// The user a verified token makes, before kcp's filters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    /// The username.
    pub username: String,
    /// The uid.
    pub uid: String,
    /// The groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

fn numeric(claims: &Map<String, Value>, name: &str) -> Option<i64> {
    claims
        .get(name)
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
}

/// Checks the standard claims of a token whose signature verified, at unix time `now`.
pub fn check_claims(a: &JwtAuthenticator, token: &Token, now: i64) -> Result<(), TokenError> {
    if token.issuer() != Some(a.issuer.url.as_str()) {
        return Err(TokenError::Issuer);
    }
    let auds: Vec<&str> = match token.claims.get("aud") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !auds
        .iter()
        .any(|x| a.issuer.audiences.iter().any(|y| y == x))
    {
        return Err(TokenError::Audience(a.issuer.audiences.clone()));
    }
    match numeric(&token.claims, "exp") {
        Some(exp) if exp >= now => {}
        _ => return Err(TokenError::Expired),
    }
    if numeric(&token.claims, "nbf").is_some_and(|nbf| now + NOT_BEFORE_LEEWAY < nbf) {
        return Err(TokenError::NotYetValid);
    }
    Ok(())
}

fn string_claim(claims: &Map<String, Value>, name: &str, what: &str) -> Result<String, TokenError> {
    match claims.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(TokenError::Claim(format!(
            "parse {what} claim {name:?}: not a string"
        ))),
        None => Err(TokenError::Claim(format!(
            "parse {what} claim {name:?}: claim not present"
        ))),
    }
}

fn eval(src: &str, name: &str, value: &cel::Value) -> Result<cel::Value, TokenError> {
    evaluate_values(src, &[(name, value.clone())])
        .map_err(|e| TokenError::Expression(e.to_string()))
}

fn string_list(v: &cel::Value, what: &str) -> Result<Vec<String>, TokenError> {
    match v {
        cel::Value::String(s) => Ok(vec![s.to_string()]),
        cel::Value::List(items) => items
            .iter()
            .map(|i| match i {
                cel::Value::String(s) => Ok(s.to_string()),
                _ => Err(TokenError::Expression(format!(
                    "error evaluating {what} expression: expected a list of strings"
                ))),
            })
            .collect(),
        _ => Err(TokenError::Expression(format!(
            "error evaluating {what} expression: expected a string or a list of strings"
        ))),
    }
}

fn username(
    m: &PrefixedClaimOrExpression,
    claims: &Map<String, Value>,
    all: &cel::Value,
) -> Result<String, TokenError> {
    if !m.expression.is_empty() {
        return match eval(&m.expression, "claims", all)? {
            cel::Value::String(s) if s.is_empty() => Err(TokenError::Expression(
                "empty username via CEL expression is not allowed".into(),
            )),
            cel::Value::String(s) => Ok(s.to_string()),
            _ => Err(TokenError::Expression(
                "error evaluating username claim expression: username claim expression must \
                 return a string"
                    .into(),
            )),
        };
    }
    let name = string_claim(claims, &m.claim, "username")?;
    if m.claim == "email" {
        match claims.get("email_verified") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(TokenError::Claim("email not verified".into()));
            }
            Some(_) => {
                return Err(TokenError::Claim(
                    "parse 'email_verified' claim: not a boolean".into(),
                ))
            }
        }
    }
    Ok(format!("{}{name}", m.prefix.as_deref().unwrap_or("")))
}

/// Maps the claims of a verified token to a user and runs the rules.
pub fn map_user(a: &JwtAuthenticator, claims: &Map<String, Value>) -> Result<User, TokenError> {
    // The claims as CEL sees them, converted once for every expression of the authenticator.
    let all = cel_value(&Value::Object(claims.clone()));
    let m = &a.claim_mappings;
    let mut user = User {
        username: username(&m.username, claims, &all)?,
        ..User::default()
    };
    if !m.groups.claim.is_empty() && claims.contains_key(&m.groups.claim) {
        let prefix = m.groups.prefix.as_deref().unwrap_or("");
        user.groups = match &claims[&m.groups.claim] {
            Value::String(s) => vec![format!("{prefix}{s}")],
            Value::Array(a) => a
                .iter()
                .map(|g| {
                    g.as_str().map(|g| format!("{prefix}{g}")).ok_or_else(|| {
                        TokenError::Claim(format!(
                            "parse groups claim {:?}: not a string or a list of strings",
                            m.groups.claim
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(TokenError::Claim(format!(
                    "parse groups claim {:?}: not a string or a list of strings",
                    m.groups.claim
                )))
            }
        };
    } else if !m.groups.expression.is_empty() {
        user.groups = string_list(&eval(&m.groups.expression, "claims", &all)?, "group claim")?;
    }
    if !m.uid.claim.is_empty() {
        user.uid = string_claim(claims, &m.uid.claim, "uid")?;
    } else if !m.uid.expression.is_empty() {
        user.uid =
            match eval(&m.uid.expression, "claims", &all)? {
                cel::Value::String(s) => s.to_string(),
                _ => return Err(TokenError::Expression(
                    "error evaluating uid claim expression: uid claim expression must return a \
                     string"
                        .into(),
                )),
            };
    }
    if let Some(Value::String(jti)) = claims.get("jti") {
        user.extra.insert(
            "authentication.kubernetes.io/credential-id".into(),
            vec![format!("JTI={jti}")],
        );
    }
    for x in &m.extra {
        let values = string_list(&eval(&x.value_expression, "claims", &all)?, "extra claim")?;
        if !values.is_empty() {
            user.extra.insert(x.key.clone(), values);
        }
    }
    for r in &a.claim_validation_rules {
        if !r.claim.is_empty() {
            let have = match claims.get(&r.claim) {
                None => {
                    return Err(TokenError::Rule(format!(
                        "required claim {} not present in ID token",
                        r.claim
                    )))
                }
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(TokenError::Rule(format!(
                        "parse claim {}: not a string",
                        r.claim
                    )))
                }
            };
            if have != r.required_value {
                return Err(TokenError::Rule(format!(
                    "required claim {} value does not match. Got = {have}, want = {}",
                    r.claim, r.required_value
                )));
            }
        } else {
            rule(
                &r.expression,
                &r.message,
                "claims",
                &all,
                "claim validation",
            )?;
        }
    }
    if !a.user_validation_rules.is_empty() {
        let info = cel_value(&serde_json::json!({
            "username": user.username, "uid": user.uid, "groups": user.groups, "extra": user.extra,
        }));
        for r in &a.user_validation_rules {
            rule(
                &r.expression,
                &r.message,
                "user",
                &info,
                "user info validation",
            )?;
        }
    }
    Ok(user)
}

fn rule(
    src: &str,
    message: &str,
    var: &str,
    value: &cel::Value,
    what: &str,
) -> Result<(), TokenError> {
    match eval(src, var, value)? {
        cel::Value::Bool(true) => Ok(()),
        cel::Value::Bool(false) => Err(TokenError::Rule(format!(
            "error evaluating {what} rule: validation expression failed: {message}"
        ))),
        _ => Err(TokenError::Expression(format!(
            "error evaluating {what} rule: expression must return a boolean"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::workspace_authn::issuer::Signer;
    use serde_json::json;

    const KEY: &str = include_str!("testdata/issuer-key.pem");
    const OTHER: &str = include_str!("testdata/other-key.pem");
    const ISSUER: &str = "https://idp.example/realms/acme";

    fn authenticator(mappings: Value) -> JwtAuthenticator {
        let spec = json!({"jwt": [{
            "issuer": {"url": ISSUER, "audiences": ["portal", "kubectl"], "audienceMatchPolicy": "MatchAny"},
            "claimMappings": mappings,
        }]});
        super::super::config::compile(&spec).unwrap().remove(0)
    }

    fn email() -> JwtAuthenticator {
        authenticator(json!({"username": {"claim": "email", "prefix": ""},
                             "groups": {"claim": "groups", "prefix": "oidc:"}}))
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    /// Verifies and maps as the authenticator does.
    fn run(a: &JwtAuthenticator, token: &str, keys: &[RsaKey]) -> Result<User, TokenError> {
        let t = parse(token)?;
        if !verify_signature(&t, keys)? {
            return Err(TokenError::Signature);
        }
        check_claims(a, &t, now())?;
        map_user(a, &t.claims)
    }

    #[test]
    fn a_signed_token_maps_to_its_user() {
        let s = Signer::new(ISSUER, KEY).unwrap();
        let keys = rsa_keys(&s.jwks());
        let t = s
            .token(
                &json!({"aud": "portal", "email": "ann@acme.io", "email_verified": true,
                           "groups": ["dev", "ops"], "jti": "j1"}),
            )
            .unwrap();
        let u = run(&email(), &t, &keys).unwrap();
        assert_eq!(u.username, "ann@acme.io");
        assert_eq!(u.groups, ["oidc:dev", "oidc:ops"]);
        assert_eq!(
            u.extra["authentication.kubernetes.io/credential-id"],
            ["JTI=j1"]
        );
    }

    #[test]
    fn every_broken_token_is_refused_for_its_reason() {
        let s = Signer::new(ISSUER, KEY).unwrap();
        let other = Signer::new(ISSUER, OTHER).unwrap();
        let keys = rsa_keys(&s.jwks());
        let good = json!({"aud": ["x", "kubectl"], "email": "ann@acme.io"});
        assert!(run(&email(), &s.token(&good).unwrap(), &keys).is_ok());
        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = good.clone();
            f(&mut c);
            s.token(&c).unwrap()
        };
        let cases: Vec<(&str, String, TokenError)> = vec![
            (
                "another key",
                other.token(&good).unwrap(),
                TokenError::Signature,
            ),
            (
                "another issuer",
                with(&|c| c["iss"] = json!("https://evil.example")),
                TokenError::Issuer,
            ),
            (
                "no accepted audience",
                with(&|c| c["aud"] = json!("other")),
                TokenError::Audience(vec!["portal".into(), "kubectl".into()]),
            ),
            (
                "expired",
                with(&|c| c["exp"] = json!(now() - 10)),
                TokenError::Expired,
            ),
            (
                "no exp",
                with(&|c| c["exp"] = Value::Null),
                TokenError::Expired,
            ),
            (
                "not yet valid",
                with(&|c| c["nbf"] = json!(now() + 3600)),
                TokenError::NotYetValid,
            ),
            (
                "unverified email",
                with(&|c| c["email_verified"] = json!(false)),
                TokenError::Claim("email not verified".into()),
            ),
            (
                "no email",
                with(&|c| {
                    c.as_object_mut().unwrap().remove("email");
                }),
                TokenError::Claim("parse username claim \"email\": claim not present".into()),
            ),
            (
                "groups of numbers",
                with(&|c| c["groups"] = json!([1])),
                TokenError::Claim(
                    "parse groups claim \"groups\": not a string or a list of strings".into(),
                ),
            ),
        ];
        for (what, token, want) in cases {
            assert_eq!(run(&email(), &token, &keys).unwrap_err(), want, "{what}");
        }
        // A token whose signature was cut or altered.
        let t = s.token(&good).unwrap();
        let (head, _) = t.rsplit_once('.').unwrap();
        let forged = format!("{head}.{}", URL_SAFE_NO_PAD.encode([0u8; 256]));
        assert_eq!(
            run(&email(), &forged, &keys).unwrap_err(),
            TokenError::Signature
        );
        assert_eq!(parse("a.b").unwrap_err(), TokenError::Malformed);
        // Only RS256, as kcp's workspace authenticators.
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        parts[0] = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
        assert_eq!(
            run(&email(), &parts.join("."), &keys).unwrap_err(),
            TokenError::Algorithm("none".into())
        );
    }

    #[test]
    fn expressions_map_and_rules_refuse() {
        let s = Signer::new(ISSUER, KEY).unwrap();
        let keys = rsa_keys(&s.jwks());
        let a = {
            let spec = json!({"jwt": [{
                "issuer": {"url": ISSUER, "audiences": ["portal"]},
                "claimValidationRules": [
                    {"claim": "tenant", "requiredValue": "acme"},
                    {"expression": "claims.level >= 2", "message": "level too low"}],
                "claimMappings": {
                    "username": {"expression": "'acme:' + claims.sub"},
                    "groups": {"expression": "claims.roles.map(r, 'role:' + r)"},
                    "uid": {"claim": "sub"},
                    "extra": [{"key": "acme.io/team", "valueExpression": "claims.team"},
                              {"key": "acme.io/none", "valueExpression": "[]"}]},
                "userValidationRules": [
                    {"expression": "!user.username.startsWith('acme:bad')", "message": "banned"}],
            }]});
            super::super::config::compile(&spec).unwrap().remove(0)
        };
        let base = json!({"aud": "portal", "sub": "u1", "tenant": "acme", "level": 3,
                          "roles": ["a", "b"], "team": "blue"});
        let u = run(&a, &s.token(&base).unwrap(), &keys).unwrap();
        assert_eq!(u.username, "acme:u1");
        assert_eq!(u.uid, "u1");
        assert_eq!(u.groups, ["role:a", "role:b"]);
        assert_eq!(u.extra["acme.io/team"], ["blue"]);
        assert!(!u.extra.contains_key("acme.io/none"));
        let refused = |f: &dyn Fn(&mut Value)| {
            let mut c = base.clone();
            f(&mut c);
            run(&a, &s.token(&c).unwrap(), &keys).unwrap_err()
        };
        assert!(
            matches!(refused(&|c| c["tenant"] = json!("other")), TokenError::Rule(m) if m.contains("does not match"))
        );
        assert!(
            matches!(refused(&|c| c["level"] = json!(1)), TokenError::Rule(m) if m.contains("level too low"))
        );
        assert!(
            matches!(refused(&|c| c["sub"] = json!("bad1")), TokenError::Rule(m) if m.contains("banned"))
        );
        assert!(matches!(
            refused(&|c| c["roles"] = json!("x")),
            TokenError::Expression(_)
        ));
    }
}
