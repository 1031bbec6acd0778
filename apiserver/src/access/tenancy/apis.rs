//! The API types of tenancy: CRDs and APIResourceSchemas turned into served types, APIExport
//! identities, what a cluster serves through its bindings, and an export's virtual workspace.

use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Tenancy;
use crate::meta::status::{ApiError, Cause};
use crate::registry::objects;
use crate::registry::{Resource, TypeInfo};
use crate::storage::{list_all, Store};

use super::invalid;

/// The identity hash of an APIExport.
pub(super) fn export_identity(cluster: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{cluster}/{name}/{}", uuid::Uuid::new_v4()).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn prepare_crd(r: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let name = objects::name(obj).to_string();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    let mut causes = Vec::new();
    let mut req = |field: &str| {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: field.into(),
        })
    };
    if group.is_empty() {
        req("spec.group");
    }
    if plural.is_empty() {
        req("spec.names.plural");
    }
    if spec["names"]["kind"].as_str().unwrap_or("").is_empty() {
        req("spec.names.kind");
    }
    if spec["versions"].as_array().is_none_or(|v| v.is_empty()) {
        req("spec.versions");
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(r.kind(), &r.ty.group, &name, causes));
    }
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            r,
            &name,
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    // As kube-apiserver: every CEL rule compiles and is estimated within the cost limits.
    let causes: Vec<Cause> = spec["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .flat_map(|(i, v)| {
            let field = format!("spec.versions[{i}].schema.openAPIV3Schema");
            crate::meta::schema::check_rule_costs(&v["schema"]["openAPIV3Schema"], &field)
        })
        .map(|e| Cause {
            reason: e.reason().into(),
            message: e.body(),
            field: e.field,
        })
        .collect();
    if !causes.is_empty() {
        return Err(ApiError::invalid(r.kind(), &r.ty.group, &name, causes));
    }
    let mut names = spec["names"].clone();
    if names.get("singular").is_none() {
        names["singular"] = json!(spec["names"]["kind"].as_str().unwrap_or("").to_lowercase());
    }
    if names.get("listKind").is_none() {
        names["listKind"] = json!(format!(
            "{}List",
            spec["names"]["kind"].as_str().unwrap_or("")
        ));
    }
    let now = objects::now_rfc3339();
    let stored: Vec<Value> = spec["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    obj["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
    Ok(())
}

/// A type description from a CRD-shaped spec (CRDs and APIResourceSchemas), one per served version.
pub(crate) fn types_from_spec(spec: &Value) -> Vec<TypeInfo> {
    let names = &spec["names"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let kind = s(&names["kind"]);
    let strings = |v: &Value| objects::str_list(Some(v));
    let mut out = Vec::new();
    for v in spec["versions"].as_array().cloned().unwrap_or_default() {
        if v["served"] == false {
            continue;
        }
        // CRDs nest the schema under openAPIV3Schema; APIResourceSchemas do not.
        let mut schema = match v["schema"].get("openAPIV3Schema") {
            Some(s) => s.clone(),
            None => v["schema"].clone(),
        };
        if !schema.is_object() {
            schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        }
        if let Some(props) = schema
            .as_object_mut()
            .map(|m| m.entry("properties").or_insert_with(|| json!({})))
        {
            for (k, t) in [
                ("apiVersion", "string"),
                ("kind", "string"),
                ("metadata", "object"),
            ] {
                if props.get(k).is_none() {
                    props[k] = json!({"type": t});
                }
            }
        }
        let mut columns: Vec<api::serving::PrinterColumn> = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| {
                        // Without a description, kube-apiserver describes the column by its path.
                        let description = match s(&c["description"]) {
                            d if d.is_empty() => format!(
                                "Custom resource definition column (in JSONPath format): {}",
                                s(&c["jsonPath"])
                            ),
                            d => d,
                        };
                        let mut col = api::serving::PrinterColumn::json_path(
                            &s(&c["name"]),
                            &s(&c["type"]),
                            &s(&c["jsonPath"]),
                            &description,
                        );
                        col.priority = c["priority"].as_i64().unwrap_or(0) as i32;
                        col
                    })
                    .collect()
            })
            .unwrap_or_default();
        if columns.is_empty() {
            columns.push(api::serving::PrinterColumn::age());
        }
        out.push(TypeInfo {
            group: s(&spec["group"]),
            version: s(&v["name"]),
            kind: kind.clone(),
            list_kind: names["listKind"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{kind}List")),
            plural: s(&names["plural"]),
            singular: names["singular"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| kind.to_lowercase()),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            namespaced: spec["scope"] != "Cluster",
            status_subresource: v["subresources"].get("status").is_some(),
            strategic_merge_patch: false,
            printer_columns: columns,
            schema,
        });
    }
    out
}

/// Recomputes the types a cluster serves beyond the built-ins: its CRDs and bound APIs.
pub async fn reload_cluster_types(state: &Tenancy, cluster: &str) {
    let mut extra = Vec::new();
    if let Ok((crds, _)) = list_all(
        state.store.as_ref(),
        &format!("/apiextensions.k8s.io/customresourcedefinitions/{cluster}/"),
    )
    .await
    {
        for kv in crds {
            let Ok(crd) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&crd) {
                continue;
            }
            for t in types_from_spec(&crd["spec"]) {
                extra.push(Arc::new(Resource::new(t)));
            }
        }
    }
    let bindings: Option<Vec<Value>> = list_all(
        state.store.as_ref(),
        &format!("/apis.kcp.io/apibindings/{cluster}/"),
    )
    .await
    .ok()
    .map(|(kvs, _)| {
        kvs.iter()
            .filter_map(|kv| objects::decode_stored(&kv.value).ok())
            .collect()
    });
    if let Some(bindings) = &bindings {
        for b in bindings {
            if b["status"]["phase"] != "Bound" {
                continue;
            }
            let export_cluster = b["status"]["apiExportClusterName"].as_str().unwrap_or("");
            for br in b["status"]["boundResources"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let schema_name = br["schema"]["name"].as_str().unwrap_or("");
                let identity = br["schema"]["identityHash"].as_str().unwrap_or("");
                let Ok(Some(skv)) = state
                    .store
                    .get(&format!(
                        "/apis.kcp.io/apiresourceschemas/{export_cluster}/{schema_name}"
                    ))
                    .await
                else {
                    continue;
                };
                let Ok(schema) = objects::decode_stored(&skv.value) else {
                    continue;
                };
                for t in types_from_spec(&schema["spec"]) {
                    let storage = format!("{}:{identity}", t.plural);
                    extra.push(Arc::new(Resource::with_storage_name(t, &storage)));
                }
            }
        }
    }
    state.catalog.set_cluster_resources(cluster, extra);
    if let Some(bindings) = &bindings {
        state.refresh_claims(cluster, bindings).await;
    }
}

/// The API surface of an APIExport's virtual workspace: the exported resources (stored under
/// the export's identity), the resources it claims (built-in ones, kcp's, or another export's
/// by identity), each filtered by the export's claim label, and the APIBindings (those bound
/// to the export, by their reflexive label, plus any a claim reaches).
pub async fn export_view(
    state: &Tenancy,
    export_cluster: &str,
    export: &str,
) -> Result<crate::registry::catalog::ExportView, ApiError> {
    let not_found = || {
        ApiError::not_found(
            &crate::meta::status::GroupResource::new("apis.kcp.io", "apiexports"),
            export,
        )
    };
    let kv = state
        .store
        .get(&format!(
            "/apis.kcp.io/apiexports/{export_cluster}/{export}"
        ))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .ok_or_else(not_found)?;
    // Schemas are immutable, so the export's revision decides the view.
    let cache_key = format!("{export_cluster}/{export}");
    if let Some(hit) = state
        .catalog
        .cached_export_view(&cache_key, kv.mod_revision)
    {
        return Ok(hit);
    }
    let exp = objects::decode_stored(&kv.value)?;
    let identity = exp["status"]["identityHash"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut resources: Vec<Arc<Resource>> = Vec::new();
    for (_, schema) in exported_schemas(state, export_cluster, &exp).await {
        for t in types_from_spec(&schema["spec"]) {
            let storage = format!("{}:{identity}", t.plural);
            resources.push(Arc::new(Resource::with_storage_name(t, &storage)));
        }
    }
    let key = super::claims::claim_label_key(export_cluster, export);
    let mut selectors = std::collections::HashMap::new();
    let builtin = state.catalog.builtin_view();
    let mut binding_values = vec![super::claims::reflexive_value()];
    let mut other_exports: Option<Vec<Value>> = None;
    for claim in super::claims::export_claims(&exp) {
        let c = &claim.claimed;
        // A claim on the export's own resources is ignored, as kcp ignores it.
        if c.identity_hash == identity
            && resources
                .iter()
                .any(|r| r.ty.group == c.group && r.ty.plural == c.resource)
        {
            continue;
        }
        if c.group == "apis.kcp.io" && c.resource == "apibindings" {
            binding_values.push(c.label_value());
            continue;
        }
        let mut found: Vec<Arc<Resource>> = Vec::new();
        if c.identity_hash.is_empty() {
            found.extend(
                builtin
                    .registry
                    .resources()
                    .iter()
                    .filter(|r| r.ty.group == c.group && r.ty.plural == c.resource)
                    .cloned(),
            );
        } else {
            if other_exports.is_none() {
                let (all, _) = list_all(state.store.as_ref(), "/apis.kcp.io/apiexports/")
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                other_exports = Some(
                    all.iter()
                        .filter_map(|kv| {
                            let v = objects::decode_stored(&kv.value).ok()?;
                            let cluster = crate::storage::key_cluster(&kv.key)?.to_string();
                            Some(json!({"cluster": cluster, "export": v}))
                        })
                        .collect(),
                );
            }
            let defining = other_exports
                .iter()
                .flatten()
                .find(|e| e["export"]["status"]["identityHash"] == c.identity_hash.as_str());
            if let Some(d) = defining {
                let cluster = d["cluster"].as_str().unwrap_or("");
                for (_, schema) in exported_schemas(state, cluster, &d["export"]).await {
                    for t in types_from_spec(&schema["spec"]) {
                        if t.group == c.group && t.plural == c.resource {
                            let storage = format!("{}:{}", t.plural, c.identity_hash);
                            found.push(Arc::new(Resource::with_storage_name(t, &storage)));
                        }
                    }
                }
            }
        }
        for r in found {
            selectors.insert(
                crate::registry::catalog::ExportApi::selector_key(&r),
                format!("{key} in ({})", c.label_value()),
            );
            resources.push(r);
        }
    }
    for b in builtin
        .registry
        .resources()
        .iter()
        .filter(|r| r.ty.group == "apis.kcp.io" && r.ty.plural == "apibindings")
    {
        selectors.insert(
            crate::registry::catalog::ExportApi::selector_key(b),
            format!("{key} in ({})", binding_values.join(",")),
        );
        resources.push(b.clone());
    }
    let view = Arc::new(crate::registry::catalog::ExportApi {
        view: Arc::new(crate::registry::catalog::ApiView::new(resources)),
        identity,
        selectors,
    });
    state
        .catalog
        .cache_export_view(cache_key, kv.mod_revision, view.clone());
    Ok(view)
}

/// Whether logical cluster `cluster` has a Bound APIBinding to the export `export_cluster` /
/// `export`: what lets the export's virtual workspace reach it. The binding's status is the
/// server's (recomputed on every write) and creating it took `bind` on the export.
pub async fn is_bound(
    state: &Tenancy,
    cluster: &str,
    export_cluster: &str,
    export: &str,
) -> Result<bool, ApiError> {
    is_bound_in(state.store.as_ref(), cluster, export_cluster, export).await
}

/// [`is_bound`], read from `store` (the views' copy of a kcp in extension mode).
pub async fn is_bound_in(
    store: &dyn Store,
    cluster: &str,
    export_cluster: &str,
    export: &str,
) -> Result<bool, ApiError> {
    let (bindings, _) = list_all(store, &format!("/apis.kcp.io/apibindings/{cluster}/"))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(bindings.iter().any(|kv| {
        objects::decode_stored(&kv.value).is_ok_and(|b| {
            b["status"]["phase"] == "Bound"
                && b["status"]["apiExportClusterName"] == export_cluster
                && b["spec"]["reference"]["export"]["name"] == export
        })
    }))
}

/// Clusters with an APIBinding to the export `cluster`/`name`.
pub async fn bound_clusters(state: &Tenancy, cluster: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok((bindings, _)) = list_all(state.store.as_ref(), "/apis.kcp.io/apibindings/").await {
        for kv in bindings {
            let Ok(b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if b["status"]["apiExportClusterName"] == cluster
                && b["spec"]["reference"]["export"]["name"] == name
            {
                if let Some(c) = crate::storage::key_cluster(&kv.key) {
                    out.push(c.to_string());
                }
            }
        }
    }
    out
}

/// The APIResourceSchemas an APIExport lists, by name, as stored in the export's cluster.
pub(super) async fn exported_schemas(
    state: &Tenancy,
    export_cluster: &str,
    export: &Value,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for name in export["spec"]["latestResourceSchemas"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let Some(name) = name.as_str() else { continue };
        let Ok(Some(kv)) = state
            .store
            .get(&format!(
                "/apis.kcp.io/apiresourceschemas/{export_cluster}/{name}"
            ))
            .await
        else {
            continue;
        };
        if let Ok(schema) = objects::decode_stored(&kv.value) {
            out.push((name.to_string(), schema));
        }
    }
    out
}
