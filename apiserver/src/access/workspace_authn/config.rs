//! A WorkspaceAuthenticationConfiguration's JWT authenticators, read and checked as
//! kube-apiserver checks the `jwt` entries of its AuthenticationConfiguration before it builds
//! them (kcp builds workspace authenticators with kube's code, so a configuration kube would
//! refuse authenticates nobody there either). The object's schema has already refused what kcp's
//! CRD refuses; what is checked here is what only building finds: https issuers, at least one
//! audience, a prefix beside every claim, extra keys outside Kubernetes' domains, expressions
//! that compile, and `claims.email_verified` consulted wherever `claims.email` names the user.

use serde::Deserialize;

use crate::meta::schema::check_expression;

/// `spec` of a WorkspaceAuthenticationConfiguration.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    /// The JWT authenticators.
    #[serde(default)]
    pub jwt: Vec<JwtAuthenticator>,
}

/// One JWT authenticator.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JwtAuthenticator {
    /// Who issues the tokens and for whom.
    #[serde(default)]
    pub issuer: Issuer,
    /// Rules every token's claims must pass.
    #[serde(default)]
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    /// How claims become the user.
    #[serde(default)]
    pub claim_mappings: ClaimMappings,
    /// Rules the mapped user must pass.
    #[serde(default)]
    pub user_validation_rules: Vec<UserValidationRule>,
}

/// The issuer of an authenticator.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Issuer {
    /// Must equal the tokens' `iss` and the discovery document's `issuer`.
    #[serde(default)]
    pub url: String,
    /// Where the discovery document is, when not under `url`.
    #[serde(default, rename = "discoveryURL")]
    pub discovery_url: String,
    /// PEM CA bundle for the issuer's TLS; the system's roots when empty.
    #[serde(default)]
    pub certificate_authority: String,
    /// Accepted `aud` values.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// `MatchAny` (the only policy).
    #[serde(default)]
    pub audience_match_policy: String,
}

/// A claim that must have a value, or an expression that must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimValidationRule {
    /// The claim.
    #[serde(default)]
    pub claim: String,
    /// Its required value.
    #[serde(default)]
    pub required_value: String,
    /// A CEL expression over `claims`.
    #[serde(default)]
    pub expression: String,
    /// The message when the expression is false.
    #[serde(default)]
    pub message: String,
}

/// Username, groups, uid and extra from claims.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMappings {
    /// The username.
    #[serde(default)]
    pub username: PrefixedClaimOrExpression,
    /// The groups.
    #[serde(default)]
    pub groups: PrefixedClaimOrExpression,
    /// The uid.
    #[serde(default)]
    pub uid: ClaimOrExpression,
    /// Extra attributes.
    #[serde(default)]
    pub extra: Vec<ExtraMapping>,
}

/// A claim (with a prefix) or a CEL expression.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PrefixedClaimOrExpression {
    /// The claim.
    #[serde(default)]
    pub claim: String,
    /// The prefix of the claim's value; required beside a claim (may be empty).
    #[serde(default)]
    pub prefix: Option<String>,
    /// A CEL expression over `claims`.
    #[serde(default)]
    pub expression: String,
}

/// A claim or a CEL expression.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimOrExpression {
    /// The claim.
    #[serde(default)]
    pub claim: String,
    /// A CEL expression over `claims`.
    #[serde(default)]
    pub expression: String,
}

/// One extra attribute.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtraMapping {
    /// The key, domain-prefixed and lowercase.
    #[serde(default)]
    pub key: String,
    /// A CEL expression over `claims`: a string or a list of strings.
    #[serde(default)]
    pub value_expression: String,
}

/// A rule the mapped user must pass.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UserValidationRule {
    /// A CEL expression over `user`.
    #[serde(default)]
    pub expression: String,
    /// The message when it is false.
    #[serde(default)]
    pub message: String,
}

/// Why a configuration authenticates nobody: the first problem building it found, with the
/// field it is in, in kube-apiserver's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The field, as `jwt[0].issuer.url`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// Reads `spec` and checks every authenticator as kube does when it builds them.
pub fn compile(spec: &serde_json::Value) -> Result<Vec<JwtAuthenticator>, ConfigError> {
    let spec: Spec = serde_json::from_value(spec.clone())
        .map_err(|e| problem("spec", format!("not a valid configuration: {e}")))?;
    let mut urls = std::collections::HashSet::new();
    let mut discovery = std::collections::HashSet::new();
    for (i, a) in spec.jwt.iter().enumerate() {
        let at = format!("jwt[{i}]");
        if !urls.insert(a.issuer.url.clone()) {
            return Err(problem(format!("{at}.issuer.url"), "Duplicate value"));
        }
        if !a.issuer.discovery_url.is_empty() && !discovery.insert(a.issuer.discovery_url.clone()) {
            return Err(problem(
                format!("{at}.issuer.discoveryURL"),
                "Duplicate value",
            ));
        }
        check(a, &at)?;
    }
    Ok(spec.jwt)
}

fn https_url(field: &str, url: &str) -> Result<(), ConfigError> {
    if url.is_empty() {
        return Err(problem(field, "Required value"));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|_| problem(field, format!("{url:?}: not a valid URL")))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(problem(field, format!("{url:?}: URL scheme must be https")));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(problem(
            field,
            format!("{url:?}: URL must not contain a username or password"),
        ));
    }
    if uri.query().is_some() {
        return Err(problem(
            field,
            format!("{url:?}: URL must not contain a query"),
        ));
    }
    if url.contains('#') {
        return Err(problem(
            field,
            format!("{url:?}: URL must not contain a fragment"),
        ));
    }
    Ok(())
}

fn expression(field: &str, src: &str) -> Result<(), ConfigError> {
    check_expression(src).map_err(|e| problem(field, e.to_string()))
}

/// Whether a CEL source reads claim `name` (`claims.name`, not a longer name).
pub fn reads_claim(src: &str, name: &str) -> bool {
    let needle = format!("claims.{name}");
    src.match_indices(&needle).any(|(i, _)| {
        let before = src[..i].chars().next_back();
        let after = src[i + needle.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn check(a: &JwtAuthenticator, at: &str) -> Result<(), ConfigError> {
    https_url(&format!("{at}.issuer.url"), &a.issuer.url)?;
    if !a.issuer.discovery_url.is_empty() {
        let field = format!("{at}.issuer.discoveryURL");
        https_url(&field, &a.issuer.discovery_url)?;
        if a.issuer.discovery_url.trim_end_matches('/') == a.issuer.url.trim_end_matches('/') {
            return Err(problem(field, "discoveryURL must be different from URL"));
        }
    }
    let auds = &a.issuer.audiences;
    let field = format!("{at}.issuer.audiences");
    if auds.is_empty() {
        return Err(problem(&field, format!("at least one {field} is required")));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, aud) in auds.iter().enumerate() {
        if aud.is_empty() {
            return Err(problem(format!("{field}[{i}]"), "Required value"));
        }
        if !seen.insert(aud) {
            return Err(problem(format!("{field}[{i}]"), "Duplicate value"));
        }
    }
    let policy = a.issuer.audience_match_policy.as_str();
    if auds.len() > 1 && policy != "MatchAny" {
        return Err(problem(
            format!("{at}.issuer.audienceMatchPolicy"),
            "audienceMatchPolicy must be MatchAny for multiple audiences",
        ));
    }
    if !policy.is_empty() && policy != "MatchAny" {
        return Err(problem(
            format!("{at}.issuer.audienceMatchPolicy"),
            "audienceMatchPolicy must be empty or MatchAny for single audience",
        ));
    }
    if !a.issuer.certificate_authority.is_empty() {
        super::fetch::roots(&a.issuer.certificate_authority)
            .map_err(|e| problem(format!("{at}.issuer.certificateAuthority"), e.to_string()))?;
    }
    let mut email_verified = false;
    for (i, r) in a.claim_validation_rules.iter().enumerate() {
        let field = format!("{at}.claimValidationRules[{i}]");
        match (r.claim.is_empty(), r.expression.is_empty()) {
            (false, false) => return Err(problem(field, "claim and expression can't both be set")),
            (true, true) => return Err(problem(field, "claim or expression is required")),
            (false, true) if !r.message.is_empty() => {
                return Err(problem(
                    format!("{field}.message"),
                    "may not be specified when claim is set",
                ))
            }
            (true, false) if !r.required_value.is_empty() => {
                return Err(problem(
                    format!("{field}.requiredValue"),
                    "may not be specified when expression is set",
                ))
            }
            (true, false) => {
                expression(&format!("{field}.expression"), &r.expression)?;
                email_verified |= reads_claim(&r.expression, "email_verified");
            }
            _ => {}
        }
    }
    let m = &a.claim_mappings;
    mapping(&format!("{at}.claimMappings.username"), &m.username, true)?;
    mapping(&format!("{at}.claimMappings.groups"), &m.groups, false)?;
    let uid = format!("{at}.claimMappings.uid");
    match (m.uid.claim.is_empty(), m.uid.expression.is_empty()) {
        (false, false) => return Err(problem(uid, "claim and expression can't both be set")),
        (true, false) => expression(&format!("{uid}.expression"), &m.uid.expression)?,
        _ => {}
    }
    let mut keys = std::collections::HashSet::new();
    for (i, x) in m.extra.iter().enumerate() {
        let field = format!("{at}.claimMappings.extra[{i}]");
        extra_key(&format!("{field}.key"), &x.key)?;
        if !keys.insert(x.key.as_str()) {
            return Err(problem(format!("{field}.key"), "Duplicate value"));
        }
        if x.value_expression.is_empty() {
            return Err(problem(
                format!("{field}.valueExpression"),
                "Required value",
            ));
        }
        expression(&format!("{field}.valueExpression"), &x.value_expression)?;
        email_verified |= reads_claim(&x.value_expression, "email_verified");
    }
    let user = &m.username.expression;
    email_verified |= reads_claim(user, "email_verified");
    if reads_claim(user, "email") && !email_verified {
        return Err(problem(
            format!("{at}.claimMappings.username.expression"),
            "claims.email_verified must be used in claimMappings.username.expression or \
             claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when \
             claims.email is used in claimMappings.username.expression",
        ));
    }
    for (i, r) in a.user_validation_rules.iter().enumerate() {
        let field = format!("{at}.userValidationRules[{i}].expression");
        if r.expression.is_empty() {
            return Err(problem(field, "Required value"));
        }
        expression(&field, &r.expression)?;
    }
    Ok(())
}

fn mapping(field: &str, m: &PrefixedClaimOrExpression, required: bool) -> Result<(), ConfigError> {
    match (m.claim.is_empty(), m.expression.is_empty()) {
        (false, false) => Err(problem(field, "claim and expression can't both be set")),
        (true, true) if required => Err(problem(field, "claim or expression is required")),
        (true, false) => {
            if m.prefix.is_some() {
                return Err(problem(
                    format!("{field}.prefix"),
                    "may not be specified when expression is set",
                ));
            }
            expression(&format!("{field}.expression"), &m.expression)
        }
        (false, true) if m.prefix.is_none() => Err(problem(
            format!("{field}.prefix"),
            "prefix is required when claim is set. It can be set to an empty string to disable \
             prefixing",
        )),
        _ => Ok(()),
    }
}

/// An extra key: `<domain>/<path>`, lowercase, not in Kubernetes' domains.
fn extra_key(field: &str, key: &str) -> Result<(), ConfigError> {
    let Some((domain, path)) = key.split_once('/') else {
        return Err(problem(
            field,
            format!("{key:?}: must be a domain-prefixed path (such as \"acme.io/foo\")"),
        ));
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.len() > 253 || !domain.contains('.') || !domain.split('.').all(label_ok) {
        return Err(problem(
            field,
            format!("{key:?}: must be a domain-prefixed path (such as \"acme.io/foo\")"),
        ));
    }
    if path.is_empty() {
        return Err(problem(
            field,
            format!("{key:?}: must be a domain-prefixed path (such as \"acme.io/foo\")"),
        ));
    }
    if key != key.to_lowercase() {
        return Err(problem(field, format!("{key:?}: must be lowercase")));
    }
    let reserved = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    if reserved("kubernetes.io") || reserved("k8s.io") {
        return Err(problem(
            field,
            format!("{key:?}: k8s.io, kubernetes.io and their subdomains are reserved for Kubernetes use"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(jwt: serde_json::Value) -> Result<Vec<JwtAuthenticator>, ConfigError> {
        compile(&json!({"jwt": [jwt]}))
    }

    fn base() -> serde_json::Value {
        json!({"issuer": {"url": "https://idp.example", "audiences": ["portal"]},
               "claimMappings": {"username": {"claim": "email", "prefix": ""}}})
    }

    #[test]
    fn a_minimal_configuration_builds() {
        assert_eq!(one(base()).unwrap().len(), 1);
    }

    #[test]
    fn what_kube_refuses_to_build_is_refused_with_the_field() {
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "http issuer",
                Box::new(|v| v["issuer"]["url"] = json!("http://idp.example")),
                "jwt[0].issuer.url",
            ),
            (
                "query",
                Box::new(|v| v["issuer"]["url"] = json!("https://idp.example?x=1")),
                "jwt[0].issuer.url",
            ),
            (
                "no audiences",
                Box::new(|v| v["issuer"]["audiences"] = json!([])),
                "jwt[0].issuer.audiences",
            ),
            (
                "duplicate audience",
                Box::new(|v| v["issuer"]["audiences"] = json!(["a", "a"])),
                "jwt[0].issuer.audiences[1]",
            ),
            (
                "two audiences without MatchAny",
                Box::new(|v| v["issuer"]["audiences"] = json!(["a", "b"])),
                "jwt[0].issuer.audienceMatchPolicy",
            ),
            (
                "claim without prefix",
                Box::new(|v| v["claimMappings"]["username"] = json!({"claim": "sub"})),
                "jwt[0].claimMappings.username.prefix",
            ),
            (
                "no username",
                Box::new(|v| v["claimMappings"]["username"] = json!({})),
                "jwt[0].claimMappings.username",
            ),
            (
                "prefix with expression",
                Box::new(|v| {
                    v["claimMappings"]["username"] =
                        json!({"expression": "claims.sub", "prefix": "x:"})
                }),
                "jwt[0].claimMappings.username.prefix",
            ),
            (
                "email without email_verified",
                Box::new(|v| {
                    v["claimMappings"]["username"] = json!({"expression": "claims.email"})
                }),
                "jwt[0].claimMappings.username.expression",
            ),
            (
                "bad CEL",
                Box::new(|v| v["claimMappings"]["groups"] = json!({"expression": "claims.("})),
                "jwt[0].claimMappings.groups.expression",
            ),
            (
                "kubernetes extra key",
                Box::new(|v| {
                    v["claimMappings"]["extra"] =
                        json!([{"key": "kubernetes.io/x", "valueExpression": "'a'"}])
                }),
                "jwt[0].claimMappings.extra[0].key",
            ),
            (
                "extra key without domain",
                Box::new(|v| {
                    v["claimMappings"]["extra"] = json!([{"key": "team", "valueExpression": "'a'"}])
                }),
                "jwt[0].claimMappings.extra[0].key",
            ),
            (
                "discovery equal to url",
                Box::new(|v| v["issuer"]["discoveryURL"] = json!("https://idp.example/")),
                "jwt[0].issuer.discoveryURL",
            ),
        ];
        for (what, edit, field) in cases {
            let mut v = base();
            edit(&mut v);
            let e = one(v).expect_err(what);
            assert_eq!(e.field, field, "{what}: {e}");
        }
    }

    #[test]
    fn email_in_an_expression_is_accepted_when_email_verified_is_checked() {
        let mut v = base();
        v["claimMappings"]["username"] = json!({"expression": "claims.email"});
        v["claimValidationRules"] = json!([{"expression": "!has(claims.email_verified) || claims.email_verified == true || claims.email_verified == false", "message": "m"}]);
        one(v).unwrap();
        assert!(reads_claim("claims.email", "email"));
        assert!(!reads_claim("claims.email_verified", "email"));
        assert!(!reads_claim("xclaims.email", "email"));
    }

    #[test]
    fn issuers_are_unique_across_authenticators() {
        let e = compile(&json!({"jwt": [base(), base()]})).unwrap_err();
        assert_eq!(e.field, "jwt[1].issuer.url");
    }
}
