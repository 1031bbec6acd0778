//! Provider (`providers.platform-mesh.io`, cluster-scoped, served in kcp):
//! the operator writes a kubeconfig whose server is
//! `<hostOverride or kcp URL>/clusters/<cluster>` into the Secret named by
//! `spec.providerKubeconfigSecret`.
//!
//! Errors: `hostOverride` must be an absolute http(s) URL without query,
//! fragment or trailing `/`; a present `providerKubeconfigSecret` needs a
//! Secret name, a namespace name and a valid data key.
//!
//! Defaults: an absent `providerKubeconfigSecret` becomes
//! `{name: <metadata.name>-provider-kubeconfig, namespace: default, key: kubeconfig}`.

use serde_json::{json, Value};

use super::checks::{
    data_key, dns_label, dns_subdomain, http_url_problem, non_blank, object_name, str_of,
};
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::FieldError;
use crate::meta::names;

/// Checks a host override URL at `field` (shared with ManagedProvider).
pub(crate) fn host_override(report: &mut Report, field: &str, value: &str) {
    if let Some(problem) = http_url_problem(value, true) {
        report.error(FieldError::invalid(field, value, problem));
    }
}

/// Validates a Provider.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    if let Some(h) = str_of(spec, "hostOverride").filter(|h| !h.is_empty()) {
        host_override(report, "spec.hostOverride", h);
    }
    if let Some(s) = spec
        .get("providerKubeconfigSecret")
        .filter(|s| s.is_object())
    {
        let f = "spec.providerKubeconfigSecret";
        if let Some(name) = non_blank(report, s, "name", &format!("{f}.name"), "") {
            dns_subdomain(report, &format!("{f}.name"), name);
        }
        if let Some(ns) = non_blank(report, s, "namespace", &format!("{f}.namespace"), "") {
            dns_label(report, &format!("{f}.namespace"), ns);
        }
        if let Some(key) = non_blank(report, s, "key", &format!("{f}.key"), "") {
            data_key(report, &format!("{f}.key"), key);
        }
    }
}

/// Fills the default kubeconfig Secret reference.
pub(crate) fn default(obj: &mut Value) {
    let secret = object_name(obj)
        .filter(|n| !n.is_empty())
        .map(|n| format!("{n}-provider-kubeconfig"))
        .filter(|s| names::validate_dns1123_subdomain(s).is_empty());
    let (Some(secret), Some(spec)) = (secret, obj.get_mut("spec").and_then(Value::as_object_mut))
    else {
        return;
    };
    if spec
        .get("providerKubeconfigSecret")
        .is_none_or(Value::is_null)
    {
        spec.insert(
            "providerKubeconfigSecret".to_string(),
            json!({"name": secret, "namespace": "default", "key": "kubeconfig"}),
        );
    }
}

const KIND: (&str, &str, &str, bool) = (super::PROVIDERS_GROUP, "Provider", "providers", false);

fn case(
    name: &'static str,
    spec: Option<Value>,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "provider-invalid", spec, field, message)
}

/// Invalid Provider objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    let secret = |name: &str, ns: &str, key: &str| json!({"providerKubeconfigSecret": {"name": name, "namespace": ns, "key": key}});
    vec![
        case("spec missing", None, "spec", "Required value"),
        case("host override without scheme", Some(json!({"hostOverride": "kcp.example.com"})),
            "spec.hostOverride", "Invalid value: \"kcp.example.com\": must be an absolute URL with scheme http or https"),
        case("host override with trailing slash", Some(json!({"hostOverride": "https://kcp.example.com/"})),
            "spec.hostOverride", "Invalid value: \"https://kcp.example.com/\": must not end with '/'"),
        case("host override with query", Some(json!({"hostOverride": "https://kcp.example.com?x=1"})),
            "spec.hostOverride", "Invalid value: \"https://kcp.example.com?x=1\": must not contain a query or a fragment"),
        case("host override with bad port", Some(json!({"hostOverride": "https://kcp.example.com:0"})),
            "spec.hostOverride", "Invalid value: \"https://kcp.example.com:0\": must have a port between 1 and 65535"),
        case("kubeconfig secret without key", Some(json!({"providerKubeconfigSecret": {"name": "a", "namespace": "default"}})),
            "spec.providerKubeconfigSecret.key", "Required value"),
        case("kubeconfig secret name empty", Some(secret("", "default", "kubeconfig")),
            "spec.providerKubeconfigSecret.name", "Required value"),
        case("kubeconfig secret namespace with dots", Some(secret("a", "my.ns", "kubeconfig")),
            "spec.providerKubeconfigSecret.namespace", "Invalid value: \"my.ns\": must not contain dots"),
        case("kubeconfig secret key with slash", Some(secret("a", "default", "a/b")),
            "spec.providerKubeconfigSecret.key",
            "Invalid value: \"a/b\": a data key may only contain letters, digits, '-', '_' and '.' (e.g. 'kubeconfig')"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{default as apply_default, PROVIDERS_GROUP};

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn valid_providers() {
        for spec in [
            json!({}),
            json!({"hostOverride": "https://kcp.example.com"}),
            json!({"hostOverride": "http://10.0.0.1:8443/base"}),
            json!({"providerKubeconfigSecret": {"name": "my-managed-provider-provider-kubeconfig",
                   "namespace": "platform-mesh-system", "key": "kubeconfig"}}),
        ] {
            let obj = json!({"apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "Provider",
                             "metadata": {"name": "certificates"}, "spec": spec});
            assert_valid(PROVIDERS_GROUP, "Provider", &obj);
        }
    }

    #[test]
    fn defaults() {
        let mut obj = json!({"metadata": {"name": "p1"}, "spec": {"hostOverride": "https://h"}});
        apply_default(PROVIDERS_GROUP, "Provider", &mut obj);
        assert_eq!(
            obj["spec"]["providerKubeconfigSecret"],
            json!({"name": "p1-provider-kubeconfig", "namespace": "default", "key": "kubeconfig"})
        );
        let mut obj = json!({"metadata": {"name": "p1"},
            "spec": {"providerKubeconfigSecret": {"name": "x", "namespace": "y", "key": "z"}}});
        let before = obj.clone();
        apply_default(PROVIDERS_GROUP, "Provider", &mut obj);
        assert_eq!(obj, before);
        // Without spec (required by the schema) nothing is added.
        let mut obj = json!({"metadata": {"name": "p1"}});
        apply_default(PROVIDERS_GROUP, "Provider", &mut obj);
        assert!(obj.get("spec").is_none());
    }
}
