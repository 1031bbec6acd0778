//! The kcp-style built-in types: workspaces and logical clusters, CRDs, and the APIs that
//! export and bind them. Their content is checked by the tenancy hooks, so the schemas keep
//! `spec`/`status` open.

use api::serving::PrinterColumn;
use serde_json::{json, Value};

use crate::registry::resource::{Conversion, Resource, TypeInfo};

fn open_schema(description: &str) -> Value {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": open,
            "status": open,
        },
    })
}

#[allow(clippy::too_many_arguments)]
fn cluster_scoped(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    short_names: &[&str],
    status: bool,
    columns: Vec<PrinterColumn>,
    description: &str,
) -> TypeInfo {
    TypeInfo {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec!["kcp".into()],
        namespaced: false,
        status_subresource: status,
        strategic_merge_patch: false,
        printer_columns: columns,
        schema: open_schema(description),
    }
}

/// The schema of `tenancy.kcp.io/v1alpha1` WorkspaceAuthenticationConfiguration, with the
/// validation kcp's CRD carries (required fields, non-empty strings, and the rules that a claim
/// and an expression exclude each other). What only building the authenticator finds (https
/// issuers, audiences, prefixes) is left to the workspace authenticator (`workspace_authn`), as
/// kcp leaves it to kube's authenticator: such an object is stored, and authenticates nobody.
fn workspace_authentication_schema() -> Value {
    let string = json!({"type": "string"});
    let non_empty = json!({"type": "string", "minLength": 1});
    let exclusive = json!({"rule": "!(has(self.claim) && has(self.expression))",
        "message": "claim and expression cannot both be specified"});
    let either = json!({"rule": "has(self.claim) || has(self.expression)",
        "message": "either claim or expression must be specified"});
    let prefixed = json!({
        "type": "object",
        "properties": {"claim": non_empty, "prefix": string, "expression": non_empty},
        "x-kubernetes-validations": [either, exclusive,
            {"rule": "!(has(self.prefix)) || has(self.claim)",
             "message": "prefix can only be specified when claim is specified"}],
    });
    let jwt = json!({
        "type": "object",
        "required": ["issuer", "claimMappings"],
        "properties": {
            "issuer": {
                "type": "object",
                "required": ["url"],
                "properties": {
                    "url": string,
                    "discoveryURL": string,
                    "certificateAuthority": string,
                    "audiences": {"type": "array", "items": string},
                    "audienceMatchPolicy": string,
                },
            },
            "claimValidationRules": {"type": "array", "items": {
                "type": "object",
                "properties": {"claim": non_empty, "requiredValue": non_empty,
                               "expression": non_empty, "message": non_empty},
                "x-kubernetes-validations": [either, exclusive,
                    {"rule": "(has(self.expression) && !has(self.requiredValue)) || (has(self.claim) && has(self.requiredValue))",
                     "message": "requiredValue can only be specified when claim is specified"},
                    {"rule": "(has(self.expression) && has(self.message)) || (has(self.claim) && !has(self.message))",
                     "message": "message can only be specified when expression is specified"}],
            }},
            "claimMappings": {
                "type": "object",
                "properties": {
                    "username": prefixed,
                    "groups": prefixed,
                    "uid": {"type": "object",
                            "properties": {"claim": non_empty, "expression": non_empty},
                            "x-kubernetes-validations": [exclusive]},
                    "extra": {"type": "array", "items": {
                        "type": "object", "required": ["key", "valueExpression"],
                        "properties": {"key": string, "valueExpression": string}}},
                },
            },
            "userValidationRules": {"type": "array", "items": {
                "type": "object", "required": ["expression", "message"],
                "properties": {"expression": string, "message": string}}},
        },
    });
    json!({
        "type": "object",
        "description": "JWT issuers whose tokens admit users into the workspaces of the \
            WorkspaceTypes that reference this configuration.",
        "required": ["metadata", "spec"],
        "properties": {
            "apiVersion": string,
            "kind": string,
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["jwt"],
                "properties": {"jwt": {"type": "array", "items": jwt}},
            },
        },
    })
}

/// The kcp-style types every logical cluster serves.
pub fn kcp_types() -> Vec<TypeInfo> {
    let col = |name: &str, ty: &str, path: &str| PrinterColumn::json_path(name, ty, path, "");
    vec![
        cluster_scoped(
            "tenancy.kcp.io",
            "v1alpha1",
            "Workspace",
            "workspaces",
            &["ws"],
            true,
            vec![
                col("Type", "string", ".spec.type.name"),
                col("Phase", "string", ".status.phase"),
                col("URL", "string", ".spec.URL"),
                PrinterColumn::age(),
            ],
            "A workspace: a logical cluster below its parent, with its own API surface.",
        ),
        cluster_scoped(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
            &[],
            true,
            vec![PrinterColumn::age()],
            "A kind of workspace: which parents and children it allows and which APIs it binds.",
        ),
        TypeInfo {
            schema: workspace_authentication_schema(),
            ..cluster_scoped(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceAuthenticationConfiguration",
                "workspaceauthenticationconfigurations",
                &[],
                false,
                vec![PrinterColumn::age()],
                "",
            )
        },
        cluster_scoped(
            "core.kcp.io",
            "v1alpha1",
            "LogicalCluster",
            "logicalclusters",
            &[],
            true,
            vec![
                col("Phase", "string", ".status.phase"),
                col("URL", "string", ".status.URL"),
                PrinterColumn::age(),
            ],
            "The logical cluster behind a workspace; the one named `cluster` carries its path.",
        ),
        cluster_scoped(
            "core.kcp.io",
            "v1alpha1",
            "Shard",
            "shards",
            &[],
            true,
            vec![
                col("Region", "string", ".metadata.labels['region']"),
                col("URL", "string", ".spec.baseURL"),
                col("External URL", "string", ".spec.externalURL"),
                PrinterColumn::age(),
            ],
            "A kcp shard: a server that logical clusters live on. This server is the shard `root`.",
        ),
        cluster_scoped(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            &["crd", "crds"],
            true,
            vec![col("Created At", "date", ".metadata.creationTimestamp")],
            "A custom resource type served in this logical cluster.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
            &[],
            false,
            vec![PrinterColumn::age()],
            "An immutable schema of one resource, exported by APIExports.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIExport",
            "apiexports",
            &[],
            true,
            vec![PrinterColumn::age()],
            "A set of resource schemas offered for binding into other workspaces.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIBinding",
            "apibindings",
            &[],
            true,
            vec![
                col("Export", "string", ".spec.reference.export.name"),
                col("Phase", "string", ".status.phase"),
                PrinterColumn::age(),
            ],
            "Binds an APIExport's resources into this workspace.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
            &[],
            true,
            vec![PrinterColumn::age()],
            "Where the virtual workspace of an APIExport is served.",
        ),
    ]
}

/// Second versions served from the same storage: APIExport and APIBinding `v1alpha2`
/// (stored as `v1alpha1`).
pub fn converted_types() -> Vec<Resource> {
    let mut out = Vec::new();
    for t in kcp_types() {
        if t.group != "apis.kcp.io" || !(t.plural == "apiexports" || t.plural == "apibindings") {
            continue;
        }
        let mut v2 = t.clone();
        v2.version = "v1alpha2".into();
        let conversion = if t.plural == "apiexports" {
            Conversion {
                to_served: export_to_v1alpha2,
                to_storage: export_to_v1alpha1,
            }
        } else {
            Conversion {
                to_served: |_| {},
                to_storage: binding_to_v1alpha1,
            }
        };
        out.push(Resource::new(v2).with_conversion(conversion));
    }
    out
}

const STORAGE_VERSION: &str = "apis.kcp.io/v1alpha1";

/// Where an APIExport stored as v1alpha1 keeps the verbs of its v1alpha2 permission claims.
pub const V2_CLAIMS_ANNOTATION: &str = "apis.v1alpha2.kcp.io/permission-claims";

/// `spec.latestResourceSchemas: ["v1.widgets.example.io"]` becomes
/// `spec.resources: [{group, name, schema, storage: {crd: {}}}]`.
fn export_to_v1alpha2(obj: &mut Value) {
    claims_to_v1alpha2(obj);
    if let Some(schemas) = obj["spec"]
        .get("latestResourceSchemas")
        .and_then(Value::as_array)
        .cloned()
    {
        let resources: Vec<Value> = schemas
            .iter()
            .filter_map(Value::as_str)
            .map(|schema| {
                let mut parts = schema.splitn(3, '.');
                let (_version, plural, group) = (
                    parts.next(),
                    parts.next().unwrap_or(""),
                    parts.next().unwrap_or(""),
                );
                json!({"group": group, "name": plural, "schema": schema, "storage": {"crd": {}}})
            })
            .collect();
        if let Some(spec) = obj["spec"].as_object_mut() {
            spec.remove("latestResourceSchemas");
            spec.insert("resources".into(), Value::Array(resources));
        }
    }
}

/// v1alpha1 claims (no verbs) as v1alpha2 claims: the verbs kept in the annotation, else all;
/// v1alpha1's `all` / `resourceSelector` are not part of v1alpha2.
fn claims_to_v1alpha2(obj: &mut Value) {
    let annotation = V2_CLAIMS_ANNOTATION;
    let kept: Vec<Value> = obj["metadata"]["annotations"][annotation]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    if let Some(a) = obj["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(annotation);
        if a.is_empty() {
            obj["metadata"]
                .as_object_mut()
                .map(|m| m.remove("annotations"));
        }
    }
    let same = |a: &Value, b: &Value| {
        ["group", "resource", "identityHash"]
            .iter()
            .all(|k| a[*k].as_str().unwrap_or("") == b[*k].as_str().unwrap_or(""))
    };
    let claims = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("permissionClaims"))
        .and_then(Value::as_array_mut);
    for claim in claims.into_iter().flatten() {
        if claim.get("verbs").is_none() {
            let verbs = kept
                .iter()
                .find(|k| same(k, claim))
                .map(|k| k["verbs"].clone())
                .unwrap_or_else(|| json!(["*"]));
            claim["verbs"] = verbs;
        }
        if let Some(c) = claim.as_object_mut() {
            c.remove("all");
            c.remove("resourceSelector");
            // v1alpha2 defaults both (an empty group is core, an empty identity a built-in type).
            for f in ["group", "identityHash"] {
                c.entry(f).or_insert_with(|| json!(""));
            }
        }
    }
}

/// v1alpha2 claims as stored (v1alpha1): verbs move to an annotation, as kcp keeps them.
fn claims_to_v1alpha1(obj: &mut Value) {
    let mut kept = Vec::new();
    let claims = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("permissionClaims"))
        .and_then(Value::as_array_mut);
    for claim in claims.into_iter().flatten() {
        let Some(c) = claim.as_object_mut() else {
            continue;
        };
        if let Some(verbs) = c.remove("verbs") {
            let mut k =
                json!({"resource": c.get("resource").cloned().unwrap_or_default(), "verbs": verbs});
            for f in ["group", "identityHash"] {
                if let Some(v) = c
                    .get(f)
                    .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
                {
                    k[f] = v.clone();
                }
            }
            kept.push(k);
        }
        // v1alpha1 leaves empty ones out.
        for f in ["group", "identityHash"] {
            if c.get(f).is_some_and(|v| v.as_str() == Some("")) {
                c.remove(f);
            }
        }
    }
    if !kept.is_empty() {
        let meta = crate::registry::objects::meta_mut(obj);
        if !meta.get("annotations").is_some_and(Value::is_object) {
            meta.insert("annotations".into(), json!({}));
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.insert(
                V2_CLAIMS_ANNOTATION.into(),
                json!(Value::Array(kept).to_string()),
            );
        }
    }
}

fn export_to_v1alpha1(obj: &mut Value) {
    obj["apiVersion"] = json!(STORAGE_VERSION);
    claims_to_v1alpha1(obj);
    if let Some(resources) = obj["spec"]
        .get("resources")
        .and_then(Value::as_array)
        .cloned()
    {
        let schemas: Vec<Value> = resources
            .iter()
            .filter_map(|r| r.get("schema").cloned())
            .collect();
        if let Some(spec) = obj["spec"].as_object_mut() {
            spec.remove("resources");
            spec.insert("latestResourceSchemas".into(), Value::Array(schemas));
        }
    }
}

fn binding_to_v1alpha1(obj: &mut Value) {
    obj["apiVersion"] = json!(STORAGE_VERSION);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_versions_round_trip() {
        let stored = json!({"apiVersion": STORAGE_VERSION, "kind": "APIExport", "metadata": {"name": "e"},
            "spec": {"latestResourceSchemas": ["v1.widgets.example.io"]}});
        let mut served = stored.clone();
        export_to_v1alpha2(&mut served);
        assert_eq!(
            served["spec"]["resources"][0],
            json!({"group": "example.io", "name": "widgets", "schema": "v1.widgets.example.io", "storage": {"crd": {}}})
        );
        let mut back = served.clone();
        export_to_v1alpha1(&mut back);
        assert_eq!(back, stored);
    }

    #[test]
    fn claim_verbs_survive_both_versions() {
        let served = json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": "e"},
            "spec": {"permissionClaims": [{"resource": "secrets", "verbs": ["get", "list"]},
                                           {"group": "apis.kcp.io", "resource": "apibindings", "verbs": ["*"]}]}});
        let mut stored = served.clone();
        export_to_v1alpha1(&mut stored);
        assert_eq!(
            stored["spec"]["permissionClaims"][0],
            json!({"resource": "secrets"})
        );
        let kept: Value = serde_json::from_str(
            stored["metadata"]["annotations"][V2_CLAIMS_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(kept[0]["verbs"], json!(["get", "list"]));
        let mut again = stored.clone();
        export_to_v1alpha2(&mut again);
        again["apiVersion"] = json!("apis.kcp.io/v1alpha2");
        let mut defaulted = served.clone();
        defaulted["spec"]["permissionClaims"][0]["group"] = json!("");
        for c in defaulted["spec"]["permissionClaims"]
            .as_array_mut()
            .unwrap()
        {
            c["identityHash"] = json!("");
        }
        assert_eq!(again, defaulted);
        // A v1alpha1 claim asks for every verb.
        let mut old = json!({"metadata": {"name": "e"}, "spec": {"permissionClaims": [{"resource": "configmaps", "all": true}]}});
        export_to_v1alpha2(&mut old);
        assert_eq!(
            old["spec"]["permissionClaims"][0],
            json!({"group": "", "resource": "configmaps", "verbs": ["*"], "identityHash": ""})
        );
    }
}
