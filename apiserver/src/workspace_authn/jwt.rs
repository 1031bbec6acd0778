//! One JWT authenticator at work, as kube-apiserver's OIDC authenticator behaves with kcp's
//! settings: the token's (unverified) `iss` picks the authenticator; the signature must be RS256
//! (kcp builds workspace authenticators with kube's default algorithm list, RS256 only) by a key
//! of the issuer's key set; `iss` must equal the issuer, one `aud` must be an accepted audience,
//! `exp` must be in the future and `nbf` (with five minutes' leeway) in the past; then the claim
//! rules, the mappings (a `username` claim `email` with `email_verified: false` is refused) and
//! the user rules.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use kube_cel::cel;
use ring::signature::{RsaPublicKeyComponents, RSA_PKCS1_2048_8192_SHA256};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::{JwtAuthenticator, PrefixedClaimOrExpression};
use crate::schema::{cel_value, evaluate_values};

/// Leeway on `nbf`, as go-oidc allows.
const NOT_BEFORE_LEEWAY: i64 = 300;
/// The largest token looked at.
pub const MAX_TOKEN: usize = 64 * 1024;

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
    signed: Vec<u8>,
    signature: Vec<u8>,
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
        signed: format!("{h}.{p}").into_bytes(),
        signature: decode(s)?,
    })
}

impl Token {
    /// The unverified `iss`.
    pub fn issuer(&self) -> Option<&str> {
        self.claims.get("iss").and_then(Value::as_str)
    }
}

/// One RSA key of an issuer's key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaKey {
    /// Its `kid`.
    pub kid: Option<String>,
    n: Vec<u8>,
    e: Vec<u8>,
}

/// The RSA signing keys of a JWKS document (`kty: RSA`, `use` absent or `sig`); other keys are
/// skipped.
pub fn rsa_keys(jwks: &Value) -> Vec<RsaKey> {
    jwks["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["kty"] == "RSA" && (k.get("use").is_none() || k["use"] == "sig"))
        .filter_map(|k| {
            Some(RsaKey {
                kid: k["kid"].as_str().map(str::to_string),
                n: URL_SAFE_NO_PAD.decode(k["n"].as_str()?).ok()?,
                e: URL_SAFE_NO_PAD.decode(k["e"].as_str()?).ok()?,
            })
        })
        .collect()
}

/// Whether one of `keys` (the one named by `kid`, or any when the token names none) signed the
/// token with RS256. `Err` when the algorithm is not RS256.
pub fn verify_signature(token: &Token, keys: &[RsaKey]) -> Result<bool, TokenError> {
    if token.alg != "RS256" {
        return Err(TokenError::Algorithm(token.alg.clone()));
    }
    Ok(keys
        .iter()
        .filter(|k| token.kid.is_none() || k.kid == token.kid)
        .any(|k| {
            RsaPublicKeyComponents { n: &k.n, e: &k.e }
                .verify(&RSA_PKCS1_2048_8192_SHA256, &token.signed, &token.signature)
                .is_ok()
        }))
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
    use crate::workspace_authn::issuer::Signer;
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
