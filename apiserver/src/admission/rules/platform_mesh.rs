//! PlatformMesh (`core.platform-mesh.io`): checks the platform-mesh operator's
//! reconcile relies on but its CRD does not express, and its code defaults.
//!
//! Errors:
//! * provider connections (`spec.kcp.providerConnections`,
//!   `spec.kcp.extraProviderConnections`): scoped connections (`adminAuth`
//!   unset or false) need `path` and exactly one of `endpointSliceName` /
//!   `apiExportName`; admin connections need `path` unless they use `rawPath`
//!   without an endpoint slice; `path` is a kcp workspace path; `secret` is a
//!   Secret name and `namespace` a namespace name; `external: true` needs
//!   `spec.exposure` (upstream dereferences it);
//! * `spec.exposure`: `port` 1–65535, `protocol` `http`/`https`, `baseDomain` a DNS name;
//! * `spec.kcp.extraWorkspaces` and `spec.kcp.extraDefaultAPIBindings`: paths
//!   of the documented `<parent>:<name>` shapes, non-empty names;
//! * `spec.profileConfigMap`, `spec.ocm` repo/component: valid object names;
//! * `spec.wait.resourceTypes`: non-empty kind/version, valid label selectors.
//!
//! Warnings: unknown feature toggles (and the two upstream ships no
//! manifests for), fields ignored in the chosen connection mode, two
//! connections writing the same Secret, wait entries that can never match.
//!
//! Defaults: `spec.profileConfigMap.name` = `<metadata.name>-profile`; in a
//! present `spec.ocm`, repo and component named `platform-mesh`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::checks::{
    dns_label, dns_subdomain, is_kcp_path, items, kcp_path, non_blank, object_name, set_str, str_of,
};
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::FieldError;
use crate::meta::names;

/// Feature toggle names upstream's operator knows.
pub(crate) const KNOWN_TOGGLES: &[&str] = &[
    "feature-accounts-in-accounts",
    "feature-disable-contentconfigurations",
    "feature-disable-email-verification",
    "feature-enable-account-iam-ui",
    "feature-enable-getting-started",
    "feature-enable-marketplace-account",
    "feature-enable-marketplace-org",
    "feature-enable-terminal-controller-manager",
];

/// Known toggles whose manifest directories do not exist upstream.
const TOGGLES_WITHOUT_MANIFESTS: &[&str] = &[
    "feature-enable-marketplace-account",
    "feature-enable-marketplace-org",
];

/// Namespace of connection Secrets when `namespace` is unset (both modes, default flags).
const DEFAULT_SECRET_NAMESPACE: &str = "platform-mesh-system";

/// Validates a PlatformMesh.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    let exposure = spec.get("exposure").filter(|e| e.is_object());
    if let Some(e) = exposure {
        validate_exposure(e, report);
    }
    if let Some(kcp) = spec.get("kcp").filter(|k| k.is_object()) {
        validate_kcp(kcp, exposure.is_some(), report);
    }
    validate_toggles(spec, report);
    if let Some(cm) = spec.get("profileConfigMap") {
        if let Some(name) = str_of(cm, "name").filter(|s| !s.is_empty()) {
            dns_subdomain(report, "spec.profileConfigMap.name", name);
        }
        if let Some(ns) = str_of(cm, "namespace").filter(|s| !s.is_empty()) {
            dns_label(report, "spec.profileConfigMap.namespace", ns);
        }
    }
    if let Some(ocm) = spec.get("ocm") {
        for part in ["repo", "component"] {
            let Some(p) = ocm.get(part) else { continue };
            let field = format!("spec.ocm.{part}.name");
            if let Some(name) = non_blank(report, p, "name", &field, "") {
                dns_subdomain(report, &field, name);
            }
        }
    }
    if let Some(wait) = spec.get("wait") {
        for (i, rt) in items(wait, "resourceTypes").iter().enumerate() {
            validate_wait_entry(rt, &format!("spec.wait.resourceTypes[{i}]"), report);
        }
    }
}

fn validate_exposure(e: &Value, report: &mut Report) {
    if let Some(port) = e.get("port").filter(|p| p.is_number()) {
        let ok = port.as_i64().is_some_and(|p| (1..=65535).contains(&p));
        if !ok {
            report.error(FieldError::invalid(
                "spec.exposure.port",
                port.clone(),
                "must be between 1 and 65535, inclusive",
            ));
        }
    }
    if let Some(p) = str_of(e, "protocol").filter(|p| !p.is_empty()) {
        if p != "http" && p != "https" {
            report.error(FieldError::not_supported(
                "spec.exposure.protocol",
                p,
                &["http", "https"],
            ));
        }
    }
    if let Some(d) = str_of(e, "baseDomain").filter(|d| !d.is_empty()) {
        dns_subdomain(report, "spec.exposure.baseDomain", d);
    }
}

fn validate_kcp(kcp: &Value, has_exposure: bool, report: &mut Report) {
    let mut secrets: BTreeMap<(String, String), String> = BTreeMap::new();
    for list in ["providerConnections", "extraProviderConnections"] {
        for (i, conn) in items(kcp, list).iter().enumerate() {
            let field = format!("spec.kcp.{list}[{i}]");
            validate_connection(conn, &field, has_exposure, report);
            if let Some(secret) = set_str(conn, "secret") {
                let ns = set_str(conn, "namespace").unwrap_or(DEFAULT_SECRET_NAMESPACE);
                let key = (ns.to_string(), secret.to_string());
                if let Some(first) = secrets.get(&key) {
                    report.warn(
                        &format!("{field}.secret"),
                        format!(
                            "Secret {ns}/{secret} is also written by {first}; the connection listed last wins"
                        ),
                    );
                } else {
                    secrets.insert(key, field.clone());
                }
            }
        }
    }
    for (i, ws) in items(kcp, "extraWorkspaces").iter().enumerate() {
        let field = format!("spec.kcp.extraWorkspaces[{i}]");
        let path_field = format!("{field}.path");
        if let Some(path) = non_blank(report, ws, "path", &path_field, "") {
            if !is_kcp_path(path, 2) {
                report.error(FieldError::invalid(
                    path_field,
                    path,
                    "must be '<parent workspace path>:<workspace name>' with kcp path segments (e.g. 'root:orgs:my-workspace')",
                ));
            }
        }
        if let Some(t) = ws.get("type") {
            non_blank(report, t, "name", &format!("{field}.type.name"), "");
            let tp = format!("{field}.type.path");
            if let Some(p) = non_blank(report, t, "path", &tp, "") {
                kcp_path(report, &tp, p);
            }
        }
    }
    for (i, b) in items(kcp, "extraDefaultAPIBindings").iter().enumerate() {
        let field = format!("spec.kcp.extraDefaultAPIBindings[{i}]");
        let wtp = format!("{field}.workspaceTypePath");
        if let Some(p) = non_blank(report, b, "workspaceTypePath", &wtp, "") {
            if !is_kcp_path(p, 2) {
                report.error(FieldError::invalid(
                    wtp,
                    p,
                    "must be '<workspace path>:<WorkspaceType name>' with kcp path segments (e.g. 'root:account')",
                ));
            }
        }
        non_blank(report, b, "export", &format!("{field}.export"), "");
        let pf = format!("{field}.path");
        if let Some(p) = non_blank(report, b, "path", &pf, "") {
            kcp_path(report, &pf, p);
        }
    }
}

/// One provider connection; the mode rules follow the operator's Secret writer.
fn validate_connection(conn: &Value, field: &str, has_exposure: bool, report: &mut Report) {
    if !conn.is_object() {
        return;
    }
    let secret_field = format!("{field}.secret");
    if let Some(secret) = non_blank(report, conn, "secret", &secret_field, "") {
        dns_subdomain(report, &secret_field, secret);
    }
    if let Some(ns) = set_str(conn, "namespace") {
        dns_label(report, &format!("{field}.namespace"), ns);
    }
    let admin = conn.get("adminAuth").and_then(Value::as_bool) == Some(true);
    let slice = set_str(conn, "endpointSliceName").is_some();
    let export = set_str(conn, "apiExportName").is_some();
    let raw = set_str(conn, "rawPath").is_some();
    let path = str_of(conn, "path").filter(|p| !p.is_empty());
    let path_field = format!("{field}.path");
    if admin {
        if export {
            report.warn(
                &format!("{field}.apiExportName"),
                "ignored when adminAuth is true; admin connections use endpointSliceName, rawPath or path",
            );
        }
        if path.is_none() && slice {
            report.error(FieldError::required(
                &path_field,
                "the workspace holding the APIExportEndpointSlice named by endpointSliceName",
            ));
        } else if path.is_none() && !raw {
            report.error(FieldError::required(
                &path_field,
                "an admin connection needs one of path, rawPath or endpointSliceName with path",
            ));
        }
    } else {
        if !slice && !export {
            report.error(FieldError::required(
                field,
                "one of endpointSliceName or apiExportName is required unless adminAuth is true",
            ));
        } else if slice && export {
            report.error(FieldError::forbidden(
                format!("{field}.apiExportName"),
                "may not be set together with endpointSliceName",
            ));
        }
        if path.is_none() {
            report.error(FieldError::required(
                &path_field,
                "the kcp workspace path is required unless adminAuth is true",
            ));
        }
        if raw {
            report.warn(
                &format!("{field}.rawPath"),
                "ignored unless adminAuth is true",
            );
        }
    }
    if let Some(p) = path {
        kcp_path(report, &path_field, p);
    }
    if conn.get("external").and_then(Value::as_bool) == Some(true) && !has_exposure {
        report.error(FieldError::invalid(
            format!("{field}.external"),
            true,
            "requires spec.exposure, from which the external kcp address is built",
        ));
    }
}

fn validate_toggles(spec: &Value, report: &mut Report) {
    for (i, t) in items(spec, "featureToggles").iter().enumerate() {
        if !t.is_object() {
            continue;
        }
        let field = format!("spec.featureToggles[{i}].name");
        let name = str_of(t, "name").unwrap_or("");
        if !KNOWN_TOGGLES.contains(&name) {
            report.warn(
                &field,
                format!(
                    "unknown feature toggle {}; known toggles: {}",
                    crate::meta::field_error::go_quote(name),
                    KNOWN_TOGGLES.join(", ")
                ),
            );
        } else if TOGGLES_WITHOUT_MANIFESTS.contains(&name) {
            report.warn(
                &field,
                format!("feature toggle {name} ships no manifests upstream, so applying it fails"),
            );
        }
    }
}

fn validate_wait_entry(rt: &Value, field: &str, report: &mut Report) {
    if !rt.is_object() {
        return;
    }
    non_blank(report, rt, "kind", &format!("{field}.kind"), "");
    non_blank(report, rt, "version", &format!("{field}.version"), "");
    for key in ["conditionType", "conditionStatus"] {
        if set_str(rt, key).is_none() {
            report.warn(
                &format!("{field}.{key}"),
                "is empty, so no matching object ever counts as ready",
            );
        }
    }
    if let Some(labels) = rt.get("matchLabels") {
        report.errors.extend(names::validate_labels(
            labels,
            &format!("{field}.matchLabels"),
        ));
    }
    for (j, req) in items(rt, "matchExpressions").iter().enumerate() {
        let rf = format!("{field}.matchExpressions[{j}]");
        if let Some(key) = str_of(req, "key") {
            for msg in names::validate_label_key(key) {
                report.error(FieldError::invalid(format!("{rf}.key"), key, msg));
            }
        }
        let has_values = !items(req, "values").is_empty();
        match str_of(req, "operator") {
            Some("In" | "NotIn") if !has_values => report.error(FieldError::required(
                format!("{rf}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            Some("Exists" | "DoesNotExist") if has_values => report.error(FieldError::forbidden(
                format!("{rf}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            Some("In" | "NotIn" | "Exists" | "DoesNotExist") | None => {}
            Some(op) => report.error(FieldError::not_supported(
                format!("{rf}.operator"),
                op,
                &["DoesNotExist", "Exists", "In", "NotIn"],
            )),
        }
    }
}

/// Fills the profile ConfigMap name and, inside a present `spec.ocm`, the OCM names.
pub(crate) fn default(obj: &mut Value) {
    let profile = object_name(obj)
        .filter(|n| !n.is_empty())
        .map(|n| format!("{n}-profile"))
        .filter(|p| names::validate_dns1123_subdomain(p).is_empty());
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    if profile.is_some() && map.get("spec").is_none_or(Value::is_null) {
        map.insert("spec".to_string(), json!({}));
    }
    let Some(spec) = map.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(p) = profile {
        if spec.get("profileConfigMap").is_none_or(Value::is_null) {
            spec.insert("profileConfigMap".to_string(), json!({ "name": p }));
        }
    }
    if let Some(ocm) = spec.get_mut("ocm").and_then(Value::as_object_mut) {
        for part in ["repo", "component"] {
            if ocm.get(part).is_none_or(Value::is_null) {
                ocm.insert(part.to_string(), json!({}));
            }
            if let Some(p) = ocm.get_mut(part).and_then(Value::as_object_mut) {
                p.entry("name").or_insert_with(|| json!("platform-mesh"));
            }
        }
    }
}

const KIND: (&str, &str, &str, bool) = (super::CORE_GROUP, "PlatformMesh", "platformmeshes", true);

fn case(
    name: &'static str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "pm-invalid", Some(spec), field, message)
}

fn conns(list: &str, conn: Value) -> Value {
    json!({ "kcp": { list: [conn] } })
}

/// Invalid PlatformMesh objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    let sys = "root:platform-mesh-system";
    vec![
        case("scoped connection without slice or export", conns("providerConnections", json!({"path": sys, "secret": "s"})),
            "spec.kcp.providerConnections[0]",
            "Required value: one of endpointSliceName or apiExportName is required unless adminAuth is true"),
        case("extra scoped connection without slice or export", conns("extraProviderConnections", json!({"path": sys, "secret": "s", "adminAuth": false})),
            "spec.kcp.extraProviderConnections[0]",
            "Required value: one of endpointSliceName or apiExportName is required unless adminAuth is true"),
        case("scoped connection with slice and export", conns("providerConnections", json!({"path": sys, "secret": "s", "endpointSliceName": "a", "apiExportName": "b"})),
            "spec.kcp.providerConnections[0].apiExportName",
            "Forbidden: may not be set together with endpointSliceName"),
        case("scoped connection without path", conns("providerConnections", json!({"secret": "s", "apiExportName": "core.platform-mesh.io"})),
            "spec.kcp.providerConnections[0].path",
            "Required value: the kcp workspace path is required unless adminAuth is true"),
        case("admin connection without any target", conns("extraProviderConnections", json!({"secret": "s", "adminAuth": true})),
            "spec.kcp.extraProviderConnections[0].path",
            "Required value: an admin connection needs one of path, rawPath or endpointSliceName with path"),
        case("admin slice connection without path", conns("providerConnections", json!({"secret": "s", "adminAuth": true, "endpointSliceName": "core.platform-mesh.io", "rawPath": "/services/x"})),
            "spec.kcp.providerConnections[0].path",
            "Required value: the workspace holding the APIExportEndpointSlice named by endpointSliceName"),
        case("connection path with upper case", conns("providerConnections", json!({"path": "Root:orgs", "secret": "s", "apiExportName": "x"})),
            "spec.kcp.providerConnections[0].path",
            "Invalid value: \"Root:orgs\": must be a kcp workspace path: ':'-separated segments of at most 63 lower case alphanumeric characters or '-', each starting and ending with an alphanumeric character (e.g. 'root:platform-mesh-system')"),
        case("connection path with empty segment", conns("extraProviderConnections", json!({"path": "root::orgs", "secret": "s", "adminAuth": true})),
            "spec.kcp.extraProviderConnections[0].path",
            "Invalid value: \"root::orgs\": must be a kcp workspace path: ':'-separated segments of at most 63 lower case alphanumeric characters or '-', each starting and ending with an alphanumeric character (e.g. 'root:platform-mesh-system')"),
        case("connection secret empty", conns("providerConnections", json!({"path": sys, "secret": "", "adminAuth": true})),
            "spec.kcp.providerConnections[0].secret", "Required value"),
        case("connection secret not a name", conns("providerConnections", json!({"path": sys, "secret": "My_Secret", "adminAuth": true})),
            "spec.kcp.providerConnections[0].secret",
            "Invalid value: \"My_Secret\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
        case("external connection without exposure", conns("extraProviderConnections", json!({"path": sys, "secret": "s", "adminAuth": true, "external": true})),
            "spec.kcp.extraProviderConnections[0].external",
            "Invalid value: true: requires spec.exposure, from which the external kcp address is built"),
        case("connection secret missing", conns("providerConnections", json!({"path": sys, "adminAuth": true})),
            "spec.kcp.providerConnections[0].secret", "Required value"),
        case("exposure port zero", json!({"exposure": {"port": 0}}),
            "spec.exposure.port", "Invalid value: 0: must be between 1 and 65535, inclusive"),
        case("exposure port too big", json!({"exposure": {"port": 70000}}),
            "spec.exposure.port", "Invalid value: 70000: must be between 1 and 65535, inclusive"),
        case("exposure port not an integer", json!({"exposure": {"port": "8443"}}),
            "spec.exposure.port",
            "Invalid value: \"string\": spec.exposure.port in body must be of type integer: \"string\""),
        case("exposure protocol unsupported", json!({"exposure": {"protocol": "ftp"}}),
            "spec.exposure.protocol", "Unsupported value: \"ftp\": supported values: \"http\", \"https\""),
        case("extra workspace path without parent", json!({"kcp": {"extraWorkspaces": [{"path": "orgs", "type": {"name": "org", "path": "root"}}]}}),
            "spec.kcp.extraWorkspaces[0].path",
            "Invalid value: \"orgs\": must be '<parent workspace path>:<workspace name>' with kcp path segments (e.g. 'root:orgs:my-workspace')"),
        case("extra workspace type missing", json!({"kcp": {"extraWorkspaces": [{"path": "root:orgs:x"}]}}),
            "spec.kcp.extraWorkspaces[0].type", "Required value"),
        case("extra default binding type path too short", json!({"kcp": {"extraDefaultAPIBindings": [{"workspaceTypePath": "account", "export": "ui.platform-mesh.io", "path": sys}]}}),
            "spec.kcp.extraDefaultAPIBindings[0].workspaceTypePath",
            "Invalid value: \"account\": must be '<workspace path>:<WorkspaceType name>' with kcp path segments (e.g. 'root:account')"),
        case("extra default binding export empty", json!({"kcp": {"extraDefaultAPIBindings": [{"workspaceTypePath": "root:account", "export": " ", "path": sys}]}}),
            "spec.kcp.extraDefaultAPIBindings[0].export", "Required value"),
        case("profile config map name empty", json!({"profileConfigMap": {"name": ""}}),
            "spec.profileConfigMap.name", "Invalid value: \"\": spec.profileConfigMap.name in body should be at least 1 chars long"),
        case("wait selector operator unknown", json!({"wait": {"resourceTypes": [{"group": "", "version": "v1", "kind": "Pod", "conditionType": "Ready", "conditionStatus": "True", "matchExpressions": [{"key": "app", "operator": "Equals", "values": ["x"]}]}]}}),
            "spec.wait.resourceTypes[0].matchExpressions[0].operator",
            "Unsupported value: \"Equals\": supported values: \"DoesNotExist\", \"Exists\", \"In\", \"NotIn\""),
        case("wait selector In without values", json!({"wait": {"resourceTypes": [{"group": "", "version": "v1", "kind": "Pod", "conditionType": "Ready", "conditionStatus": "True", "matchExpressions": [{"key": "app", "operator": "In"}]}]}}),
            "spec.wait.resourceTypes[0].matchExpressions[0].values",
            "Required value: must be specified when `operator` is 'In' or 'NotIn'"),
        case("wait kind empty", json!({"wait": {"resourceTypes": [{"group": "apps", "version": "v1", "kind": "", "conditionType": "Ready", "conditionStatus": "True"}]}}),
            "spec.wait.resourceTypes[0].kind", "Required value"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::checks::KCP_PATH_DETAIL;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{default as apply_default, validate as run, CORE_GROUP};

    fn pm(spec: Value) -> Value {
        json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
               "metadata": {"name": "platform-mesh", "namespace": "platform-mesh-system"}, "spec": spec})
    }

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn upstream_samples_and_default_connections_are_valid() {
        let sys = "root:platform-mesh-system";
        let samples = [
            // config/samples: one admin connection through the core endpoint slice.
            json!({"kcp": {"providerConnections": [{"endpointSliceName": "core.platform-mesh.io", "path": sys,
                   "secret": "platform-mesh-operator-kubeconfig", "adminAuth": true}]}}),
            // The e2e PlatformMesh.
            json!({"exposure": {"port": 8443, "baseDomain": "portal.localhost", "protocol": "https"},
                   "ocm": {"repo": {"name": "platform-mesh"}, "component": {"name": "platform-mesh"}, "referencePath": []},
                   "featureToggles": [{"name": "feature-enable-getting-started"},
                                      {"name": "feature-disable-email-verification"},
                                      {"name": "feature-accounts-in-accounts"}],
                   "kcp": {}}),
            // Shapes of the operator's built-in default connections, plus e2e extras.
            json!({"exposure": {"baseDomain": "example.com", "port": 8443},
                   "kcp": {"providerConnections": [
                {"path": sys, "secret": "account-operator-kubeconfig", "adminAuth": true},
                {"path": sys, "secret": "rebac-authz-webhook-kubeconfig", "apiExportName": "core.platform-mesh.io"},
                {"rawPath": "/services/marketplace", "secret": "virtual-workspace-clusteraccess-kubeconfig", "adminAuth": true},
                {"path": "root:orgs", "rawPath": "/services/contentconfigurations", "secret": "portal-kubeconfig", "adminAuth": true},
                {"path": "root", "secret": "security-initializer-kubeconfig", "adminAuth": true}],
                "extraProviderConnections": [
                {"path": "root:providers:provider1", "secret": "p1", "endpointSliceName": "e2e.platform-mesh.io"},
                {"path": "root:orgs:extra1", "secret": "extra1-kubeconfig", "external": true, "adminAuth": true, "namespace": "test"}],
                "extraWorkspaces": [{"path": "root:orgs:extra1", "type": {"name": "org", "path": "root"}}],
                "extraDefaultAPIBindings": [{"workspaceTypePath": "root:provider", "export": "ui.platform-mesh.io", "path": sys}]},
                   "wait": {"resourceTypes": [{"group": "helm.toolkit.fluxcd.io", "version": "v2", "kind": "HelmRelease",
                       "namespace": "default", "conditionType": "Ready", "conditionStatus": "True",
                       "matchExpressions": [{"key": "core.platform-mesh.io/operator-created", "operator": "In", "values": ["true"]}]}]},
                   "profileConfigMap": {"name": "platform-mesh-profile", "namespace": "platform-mesh-system"}}),
        ];
        for s in samples {
            let obj = pm(s);
            assert_valid(CORE_GROUP, "PlatformMesh", &obj);
            assert!(run(CORE_GROUP, "PlatformMesh", &obj, None)
                .warnings
                .is_empty());
        }
    }

    #[test]
    fn warnings() {
        let cases = [
            (json!({"featureToggles": [{"name": "feature-foo"}]}),
             vec![format!("spec.featureToggles[0].name: unknown feature toggle \"feature-foo\"; known toggles: {}", KNOWN_TOGGLES.join(", "))]),
            (json!({"featureToggles": [{"name": "feature-enable-getting-started"}, {"name": "feature-enable-marketplace-org"}]}),
             vec!["spec.featureToggles[1].name: feature toggle feature-enable-marketplace-org ships no manifests upstream, so applying it fails".to_string()]),
            (json!({"kcp": {"providerConnections": [{"path": "root", "secret": "a", "adminAuth": true, "apiExportName": "x"}]}}),
             vec!["spec.kcp.providerConnections[0].apiExportName: ignored when adminAuth is true; admin connections use endpointSliceName, rawPath or path".to_string()]),
            (json!({"kcp": {"providerConnections": [{"path": "root", "secret": "a", "apiExportName": "x", "rawPath": "/x"}]}}),
             vec!["spec.kcp.providerConnections[0].rawPath: ignored unless adminAuth is true".to_string()]),
            (json!({"kcp": {"providerConnections": [{"path": "root", "secret": "a", "adminAuth": true}],
                            "extraProviderConnections": [{"path": "root:orgs", "secret": "a", "adminAuth": true, "namespace": "platform-mesh-system"}]}}),
             vec!["spec.kcp.extraProviderConnections[0].secret: Secret platform-mesh-system/a is also written by spec.kcp.providerConnections[0]; the connection listed last wins".to_string()]),
            (json!({"wait": {"resourceTypes": [{"group": "", "version": "v1", "kind": "Pod", "conditionStatus": "True"}]}}),
             vec!["spec.wait.resourceTypes[0].conditionType: is empty, so no matching object ever counts as ready".to_string()]),
        ];
        for (spec, want) in cases {
            let r = run(CORE_GROUP, "PlatformMesh", &pm(spec.clone()), None);
            assert!(r.errors.is_empty(), "{spec}: {:?}", r.errors);
            assert_eq!(r.warnings, want, "{spec}");
        }
    }

    #[test]
    fn more_errors() {
        let sys = "root:platform-mesh-system";
        let type_path = format!(
            "spec.kcp.extraWorkspaces[0].type.path: Invalid value: \"Root\": {KCP_PATH_DETAIL}"
        );
        let cases = [
            (json!({"exposure": {"baseDomain": "Portal.localhost"}}),
             vec!["spec.exposure.baseDomain: Invalid value: \"Portal.localhost\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"]),
            (json!({"profileConfigMap": {"name": "p", "namespace": "a.b"}}),
             vec!["spec.profileConfigMap.namespace: Invalid value: \"a.b\": must not contain dots"]),
            (json!({"ocm": {"repo": {"name": ""}}}), vec!["spec.ocm.repo.name: Required value"]),
            (json!({"kcp": {"providerConnections": [{"path": sys, "secret": "s", "apiExportName": "x", "namespace": "Bad"}]}}),
             vec!["spec.kcp.providerConnections[0].namespace: Invalid value: \"Bad\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"]),
            (json!({"kcp": {"extraWorkspaces": [{"path": "", "type": {"name": "", "path": "Root"}}]}}),
             vec!["spec.kcp.extraWorkspaces[0].path: Required value",
                  "spec.kcp.extraWorkspaces[0].type.name: Required value",
                  type_path.as_str()]),
            (json!({"wait": {"resourceTypes": [{"group": "", "version": "v1", "kind": "Pod", "conditionType": "Ready", "conditionStatus": "True",
                    "matchLabels": {"a": "b c"}, "matchExpressions": [{"key": "x", "operator": "Exists", "values": ["y"]}]}]}}),
             vec!["spec.wait.resourceTypes[0].matchLabels: Invalid value: \"b c\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                  "spec.wait.resourceTypes[0].matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"]),
        ];
        for (spec, want) in cases {
            let got: Vec<String> = run(CORE_GROUP, "PlatformMesh", &pm(spec.clone()), None)
                .errors
                .iter()
                .map(|e| e.to_string())
                .collect();
            assert_eq!(got, want, "{spec}");
        }
    }

    #[test]
    fn defaults() {
        let mut obj = json!({"metadata": {"name": "demo"}});
        apply_default(CORE_GROUP, "PlatformMesh", &mut obj);
        assert_eq!(
            obj["spec"],
            json!({"profileConfigMap": {"name": "demo-profile"}})
        );

        let mut obj =
            pm(json!({"profileConfigMap": {"name": "mine"}, "ocm": {"repo": {"name": "r"}}}));
        apply_default(CORE_GROUP, "PlatformMesh", &mut obj);
        assert_eq!(
            obj["spec"],
            json!({"profileConfigMap": {"name": "mine"},
            "ocm": {"repo": {"name": "r"}, "component": {"name": "platform-mesh"}}})
        );

        let mut obj = pm(json!({"ocm": {"component": {}}}));
        apply_default(CORE_GROUP, "PlatformMesh", &mut obj);
        assert_eq!(
            obj["spec"]["ocm"],
            json!({"repo": {"name": "platform-mesh"}, "component": {"name": "platform-mesh"}})
        );

        // No name yet (generateName): nothing derived from the name.
        let mut obj = json!({"metadata": {"generateName": "pm-"}, "spec": {}});
        apply_default(CORE_GROUP, "PlatformMesh", &mut obj);
        assert_eq!(obj["spec"], json!({}));

        // A name too long for the derived ConfigMap name is left alone.
        let long = "a".repeat(250);
        let mut obj = json!({"metadata": {"name": long}});
        apply_default(CORE_GROUP, "PlatformMesh", &mut obj);
        assert!(obj.get("spec").is_none());
    }
}
