//! ManagedProvider (`providers.platform-mesh.io`, namespaced): a Provider in
//! kcp plus Helm deployments in the runtime cluster, run by the
//! platform-mesh operator. Field names are the CRD's (upstream's README uses
//! `ocm.componentName`, which is not a field; the real one is `ocm.component`).
//!
//! Errors:
//! * `platformMeshRef.name` and `provider.name` must be non-empty object names;
//! * each `runtimeDeployments[i]` needs exactly one of `flux` or `ocm` (the
//!   type documents this; upstream silently skips an empty entry and
//!   prefers `flux` when both are set);
//! * `flux` / `ocm`: non-empty `registry`, `chart`/`component` and `version`;
//!   OCI registries are host/path without a scheme (`oci://` is added);
//!   a `helm` registry is an http(s) Helm repository URL;
//! * `providerHostOverride` (copied to `Provider.spec.hostOverride`) is an
//!   http(s) URL; Secret names and data keys are well formed.
//!
//! Defaults: `provider` = `{path: root:providers:system, name: <metadata.name>}`,
//! `providerKubeconfigSecret` = `{name: <metadata.name>-provider-kubeconfig, key: kubeconfig}`
//! (missing or empty fields), and `ocm.resourceName` = `chart`.

use serde_json::{json, Map, Value};

use super::checks::{
    data_key, dns_subdomain, http_url_problem, items, non_blank, object_name, set_str, str_of,
};
use super::provider::host_override;
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::FieldError;
use crate::meta::names;

/// Workspace path of the Provider when `spec.provider` is absent.
const DEFAULT_PROVIDER_PATH: &str = "root:providers:system";

/// Validates a ManagedProvider.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    if let Some(r) = spec.get("platformMeshRef") {
        let f = "spec.platformMeshRef.name";
        if let Some(name) = non_blank(report, r, "name", f, "the PlatformMesh in this namespace") {
            dns_subdomain(report, f, name);
        }
    }
    if let Some(p) = spec.get("provider") {
        let f = "spec.provider.name";
        if let Some(name) = non_blank(report, p, "name", f, "") {
            dns_subdomain(report, f, name);
        }
    }
    if let Some(h) = str_of(spec, "providerHostOverride").filter(|h| !h.is_empty()) {
        host_override(report, "spec.providerHostOverride", h);
    }
    if let Some(n) = set_str(spec, "runtimeKubeconfigSecretName") {
        dns_subdomain(report, "spec.runtimeKubeconfigSecretName", n);
    }
    if let Some(s) = spec.get("providerKubeconfigSecret") {
        let f = "spec.providerKubeconfigSecret";
        if let Some(n) = set_str(s, "name") {
            dns_subdomain(report, &format!("{f}.name"), n);
        }
        if let Some(k) = set_str(s, "key") {
            data_key(report, &format!("{f}.key"), k);
        }
    }
    for (i, d) in items(spec, "runtimeDeployments").iter().enumerate() {
        validate_deployment(d, &format!("spec.runtimeDeployments[{i}]"), report);
    }
}

fn present(v: &Value, key: &str) -> Option<Value> {
    v.get(key).filter(|x| !x.is_null()).cloned()
}

fn validate_deployment(d: &Value, field: &str, report: &mut Report) {
    if !d.is_object() {
        return;
    }
    let flux = present(d, "flux");
    let ocm = present(d, "ocm");
    match (&flux, &ocm) {
        (None, None) => report.error(FieldError::required(
            field,
            "one of flux or ocm is required",
        )),
        (Some(_), Some(_)) => report.error(FieldError::forbidden(
            format!("{field}.ocm"),
            "may not be set together with flux",
        )),
        _ => {}
    }
    if let Some(fx) = flux.filter(Value::is_object) {
        let f = format!("{field}.flux");
        let helm = str_of(&fx, "type") == Some("helm");
        let rf = format!("{f}.registry");
        if let Some(reg) = non_blank(report, &fx, "registry", &rf, "") {
            if helm {
                if let Some(p) = http_url_problem(reg, false) {
                    report.error(FieldError::invalid(
                        rf,
                        reg,
                        format!("{p} (the URL of a Helm repository)"),
                    ));
                }
            } else {
                scheme_less_registry(report, &rf, reg);
            }
        }
        non_blank(report, &fx, "chart", &format!("{f}.chart"), "");
        non_blank(report, &fx, "version", &format!("{f}.version"), "");
    }
    if let Some(o) = ocm.filter(Value::is_object) {
        let f = format!("{field}.ocm");
        let rf = format!("{f}.registry");
        if let Some(reg) = non_blank(report, &o, "registry", &rf, "") {
            scheme_less_registry(report, &rf, reg);
        }
        non_blank(report, &o, "component", &format!("{f}.component"), "");
        non_blank(report, &o, "version", &format!("{f}.version"), "");
    }
}

/// An OCI registry given as host and path: the operator prepends `oci://` itself.
fn scheme_less_registry(report: &mut Report, field: &str, reg: &str) {
    if reg.contains("://") {
        report.error(FieldError::invalid(
            field,
            reg,
            "must be a registry host and path without a scheme (e.g. 'ghcr.io/platform-mesh')",
        ));
    }
}

/// Fills the Provider reference, the kubeconfig Secret and OCM resource names.
pub(crate) fn default(obj: &mut Value) {
    let name = object_name(obj)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(name) = name {
        if spec.get("provider").is_none_or(Value::is_null) {
            spec.insert(
                "provider".to_string(),
                json!({"path": DEFAULT_PROVIDER_PATH, "name": name}),
            );
        }
        let secret = format!("{name}-provider-kubeconfig");
        if names::validate_dns1123_subdomain(&secret).is_empty() {
            if spec
                .get("providerKubeconfigSecret")
                .is_none_or(Value::is_null)
            {
                spec.insert("providerKubeconfigSecret".to_string(), json!({}));
            }
            if let Some(s) = spec
                .get_mut("providerKubeconfigSecret")
                .and_then(Value::as_object_mut)
            {
                fill_blank(s, "name", &secret);
                fill_blank(s, "key", "kubeconfig");
            }
        }
    }
    if let Some(list) = spec
        .get_mut("runtimeDeployments")
        .and_then(Value::as_array_mut)
    {
        for d in list {
            if let Some(o) = d.get_mut("ocm").and_then(Value::as_object_mut) {
                o.entry("resourceName").or_insert_with(|| json!("chart"));
            }
        }
    }
}

/// Sets `key` to `value` when it is missing, null or an empty string (upstream
/// treats empty strings as unset here).
fn fill_blank(m: &mut Map<String, Value>, key: &str, value: &str) {
    let blank = match m.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    };
    if blank {
        m.insert(key.to_string(), json!(value));
    }
}

const KIND: (&str, &str, &str, bool) = (
    super::PROVIDERS_GROUP,
    "ManagedProvider",
    "managedproviders",
    true,
);

fn case(
    name: &'static str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "mp-invalid", Some(spec), field, message)
}

fn with_deployment(d: Value) -> Value {
    json!({"platformMeshRef": {"name": "platform-mesh"}, "runtimeDeployments": [d]})
}

/// Invalid ManagedProvider objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    let flux = |reg: &str| json!({"flux": {"registry": reg, "chart": "example-httpbin-operator", "version": "0.5.14"}});
    vec![
        case("platform mesh ref name empty", json!({"platformMeshRef": {"name": ""}, "runtimeDeployments": []}),
            "spec.platformMeshRef.name", "Required value: the PlatformMesh in this namespace"),
        case("platform mesh ref missing", json!({"runtimeDeployments": []}),
            "spec.platformMeshRef", "Required value"),
        case("runtime deployments missing", json!({"platformMeshRef": {"name": "platform-mesh"}}),
            "spec.runtimeDeployments", "Required value"),
        case("deployment without component", with_deployment(json!({})),
            "spec.runtimeDeployments[0]", "Required value: one of flux or ocm is required"),
        case("deployment with flux and ocm", with_deployment(json!({
                "flux": {"registry": "ghcr.io/platform-mesh/helm-charts", "chart": "a", "version": "1.0.0"},
                "ocm": {"registry": "ghcr.io/platform-mesh", "component": "github.com/platform-mesh/a", "version": "1.0.0"}})),
            "spec.runtimeDeployments[0].ocm", "Forbidden: may not be set together with flux"),
        case("flux type unsupported", with_deployment(json!({"flux": {"type": "git", "registry": "r", "chart": "c", "version": "1"}})),
            "spec.runtimeDeployments[0].flux.type", "Unsupported value: \"git\": supported values: \"oci\", \"helm\""),
        case("flux chart missing", with_deployment(json!({"flux": {"registry": "ghcr.io/x", "version": "1"}})),
            "spec.runtimeDeployments[0].flux.chart", "Required value"),
        case("flux oci registry with scheme", with_deployment(flux("oci://ghcr.io/platform-mesh/helm-charts")),
            "spec.runtimeDeployments[0].flux.registry",
            "Invalid value: \"oci://ghcr.io/platform-mesh/helm-charts\": must be a registry host and path without a scheme (e.g. 'ghcr.io/platform-mesh')"),
        case("flux helm registry not a URL", with_deployment(json!({"flux": {"type": "helm", "registry": "stefanprodan.github.io/podinfo", "chart": "podinfo", "version": "6.7.1"}})),
            "spec.runtimeDeployments[0].flux.registry",
            "Invalid value: \"stefanprodan.github.io/podinfo\": must be an absolute URL with scheme http or https (the URL of a Helm repository)"),
        case("flux version empty", with_deployment(json!({"flux": {"registry": "ghcr.io/x", "chart": "c", "version": ""}})),
            "spec.runtimeDeployments[0].flux.version", "Required value"),
        case("ocm component empty", with_deployment(json!({"ocm": {"registry": "ghcr.io/platform-mesh", "component": "", "version": "0.1.0"}})),
            "spec.runtimeDeployments[0].ocm.component", "Required value"),
        case("ocm registry with scheme", with_deployment(json!({"ocm": {"registry": "https://ghcr.io/platform-mesh", "component": "github.com/platform-mesh/provider-quickstart", "version": "0.1.0"}})),
            "spec.runtimeDeployments[0].ocm.registry",
            "Invalid value: \"https://ghcr.io/platform-mesh\": must be a registry host and path without a scheme (e.g. 'ghcr.io/platform-mesh')"),
        case("provider path not a kcp path", json!({"platformMeshRef": {"name": "pm"}, "runtimeDeployments": [], "provider": {"name": "p", "path": "Root:providers"}}),
            "spec.provider.path",
            "Invalid value: \"Root:providers\": spec.provider.path in body should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(:[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'"),
        case("provider name empty", json!({"platformMeshRef": {"name": "pm"}, "runtimeDeployments": [], "provider": {"name": "", "path": "root:providers:system"}}),
            "spec.provider.name", "Required value"),
        case("provider host override not a URL", json!({"platformMeshRef": {"name": "pm"}, "runtimeDeployments": [], "providerHostOverride": "kcp.example.com:8443"}),
            "spec.providerHostOverride", "Invalid value: \"kcp.example.com:8443\": must be an absolute URL with scheme http or https"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{default as apply_default, validate as run, PROVIDERS_GROUP};

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn e2e_managed_provider_is_valid() {
        let obj = json!({"apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "ManagedProvider",
            "metadata": {"name": "my-managed-provider", "namespace": "platform-mesh-system"},
            "spec": {"platformMeshRef": {"name": "platform-mesh"}, "cleanupOnDelete": true,
                "runtimeDeployments": [
                    {"flux": {"type": "oci", "registry": "ghcr.io/platform-mesh/helm-charts", "chart": "example-httpbin-operator", "version": "0.5.14"}},
                    {"flux": {"type": "helm", "registry": "https://stefanprodan.github.io/podinfo", "chart": "podinfo", "version": "6.7.1", "values": {"replicaCount": 1}}},
                    {"ocm": {"registry": "ghcr.io/platform-mesh", "component": "github.com/platform-mesh/provider-quickstart", "version": "0.1.0",
                             "referencePath": [{"name": "x"}]}}],
                "providerHostOverride": "https://kcp.example.com:8443",
                "runtimeKubeconfigSecretName": "remote-runtime",
                "providerKubeconfigSecret": {"name": "", "key": ""}}});
        assert_valid(PROVIDERS_GROUP, "ManagedProvider", &obj);
        assert!(run(PROVIDERS_GROUP, "ManagedProvider", &obj, None)
            .warnings
            .is_empty());
    }

    #[test]
    fn more_errors() {
        let spec = json!({"platformMeshRef": {"name": "Bad_Name"}, "runtimeDeployments": [],
            "runtimeKubeconfigSecretName": "x_y", "providerKubeconfigSecret": {"name": "ok", "key": "a b"}});
        let got: Vec<String> = run(
            PROVIDERS_GROUP,
            "ManagedProvider",
            &json!({"spec": spec}),
            None,
        )
        .errors
        .iter()
        .map(|e| e.field.clone())
        .collect();
        assert_eq!(
            got,
            vec![
                "spec.platformMeshRef.name",
                "spec.runtimeKubeconfigSecretName",
                "spec.providerKubeconfigSecret.key"
            ]
        );
    }

    #[test]
    fn defaults() {
        let mut obj = json!({"metadata": {"name": "mp"}, "spec": {"platformMeshRef": {"name": "pm"},
            "runtimeDeployments": [{"ocm": {"registry": "r", "component": "c", "version": "1"}}, {"flux": {}}],
            "providerKubeconfigSecret": {"name": "", "key": "cfg"}}});
        apply_default(PROVIDERS_GROUP, "ManagedProvider", &mut obj);
        assert_eq!(
            obj["spec"]["provider"],
            json!({"path": "root:providers:system", "name": "mp"})
        );
        assert_eq!(
            obj["spec"]["providerKubeconfigSecret"],
            json!({"name": "mp-provider-kubeconfig", "key": "cfg"})
        );
        assert_eq!(
            obj["spec"]["runtimeDeployments"][0]["ocm"]["resourceName"],
            json!("chart")
        );
        assert_eq!(obj["spec"]["runtimeDeployments"][1], json!({"flux": {}}));

        let mut obj = json!({"metadata": {"name": "mp"}, "spec": {"provider": {"name": "x", "path": "root:a"}}});
        apply_default(PROVIDERS_GROUP, "ManagedProvider", &mut obj);
        assert_eq!(
            obj["spec"]["provider"],
            json!({"name": "x", "path": "root:a"})
        );
        assert_eq!(
            obj["spec"]["providerKubeconfigSecret"],
            json!({"name": "mp-provider-kubeconfig", "key": "kubeconfig"})
        );
    }
}
