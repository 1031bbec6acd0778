//! OpenAPI documents: `/openapi/v3` (root and one document per group version, with the
//! `x-kubernetes-group-version-kind` extensions and `fieldValidation` parameter kubectl looks for)
//! and a small `/openapi/v2` in JSON and in the protobuf form client-go decodes.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};

use crate::registry::{Registry, Resource};

/// The precomputed OpenAPI documents of one registry.
#[derive(Debug)]
pub struct OpenApi {
    root: Bytes,
    documents: BTreeMap<String, (Bytes, String)>,
    v2_json: Bytes,
    v2_protobuf: Bytes,
}

/// The server's reported Kubernetes-compatible version (for `/version` and OpenAPI `info`).
pub const KUBE_VERSION: &str = "v1.33.0";

impl OpenApi {
    /// Builds every document for the resources of `registry`: one OpenAPI v3 document per group
    /// version, the v3 root listing them, and the v2 document.
    pub fn build(registry: &Registry) -> Self {
        let mut documents = BTreeMap::new();
        let mut gvs: Vec<(String, String)> = Vec::new();
        for r in registry.resources() {
            let gv = (r.ty.group.to_string(), r.ty.version.to_string());
            if !gvs.contains(&gv) {
                gvs.push(gv);
            }
        }
        let mut paths = Map::new();
        for (g, v) in &gvs {
            let doc = group_version_document(registry, g, v);
            let bytes = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
            let hash = hex_upper(&Sha512::digest(&bytes));
            let key = gv_path(g, v);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
            documents.insert(key, (bytes, hash));
        }
        let root = Bytes::from(serde_json::to_vec(&json!({"paths": paths})).unwrap_or_default());
        let v2 = json!({"swagger": "2.0", "info": {"title": "platform-mesh", "version": KUBE_VERSION}, "paths": {}});
        OpenApi {
            root,
            documents,
            v2_json: Bytes::from(serde_json::to_vec(&v2).unwrap_or_default()),
            v2_protobuf: Bytes::from(v2_protobuf("platform-mesh", KUBE_VERSION)),
        }
    }

    /// The `/openapi/v3` root: the path of each group-version document, with its hash.
    pub fn root(&self) -> Bytes {
        self.root.clone()
    }

    /// The document of one group version and its hash.
    pub fn document(&self, group: &str, version: &str) -> Option<(Bytes, &str)> {
        self.documents
            .get(&gv_path(group, version))
            .map(|(b, h)| (b.clone(), h.as_str()))
    }

    /// The `/openapi/v2` document as JSON.
    pub fn v2_json(&self) -> Bytes {
        self.v2_json.clone()
    }

    /// The `/openapi/v2` document in the protobuf encoding client-go decodes.
    pub fn v2_protobuf(&self) -> Bytes {
        self.v2_protobuf.clone()
    }
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The schema component name of a kind: the group reversed, as Kubernetes names definitions.
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    if group.is_empty() {
        return format!("io.k8s.api.core.{version}.{kind}");
    }
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        query_param("dryRun", "When present, indicates that modifications should not be persisted. Valid value: All"),
        query_param("fieldManager", "A name associated with the actor or entity that is making these changes."),
        query_param(
            "fieldValidation",
            "How the server treats unknown or duplicate fields in the body: Ignore, Warn (default) or Strict.",
        ),
    ]
}

fn list_params() -> Vec<Value> {
    [
        "allowWatchBookmarks",
        "continue",
        "fieldSelector",
        "labelSelector",
        "limit",
        "resourceVersion",
        "resourceVersionMatch",
        "sendInitialEvents",
        "timeoutSeconds",
        "watch",
    ]
    .iter()
    .map(|n| query_param(n, ""))
    .collect()
}

fn response(schema_ref: &str) -> Value {
    json!({"200": {"description": "OK", "content": {
        "application/json": {"schema": {"$ref": schema_ref}},
        "application/yaml": {"schema": {"$ref": schema_ref}},
    }}})
}

fn operation(r: &Resource, action: &str, id: &str, schema_ref: &str, params: Vec<Value>) -> Value {
    let t = &r.ty;
    json!({
        "operationId": format!("{action}{}{}", t.kind, id),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
        "parameters": params,
        "responses": response(schema_ref),
    })
}

fn patch_operation(r: &Resource, id: &str, schema_ref: &str) -> Value {
    let mut op = operation(r, "patch", id, schema_ref, write_params());
    if let Some(ps) = op["parameters"].as_array_mut() {
        ps.push(query_param(
            "force",
            "Force is going to force Apply requests.",
        ));
    }
    let mut content = Map::new();
    let mut types = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    if r.ty.strategic_merge_patch {
        types.push("application/strategic-merge-patch+json");
    }
    for t in types {
        content.insert(t.to_string(), json!({"schema": {"type": "object"}}));
    }
    op["requestBody"] = json!({"content": content, "required": true});
    op
}

fn body_operation(r: &Resource, action: &str, id: &str, schema_ref: &str) -> Value {
    let mut op = operation(r, action, id, schema_ref, write_params());
    op["requestBody"] =
        json!({"content": {"*/*": {"schema": {"$ref": schema_ref}}}, "required": true});
    op
}

fn group_version_document(registry: &Registry, group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    for r in registry.group_version(group, version) {
        let t = &r.ty;
        let def = definition_name(group, version, &t.kind);
        let list_def = format!("{def}List");
        let obj_ref = format!("#/components/schemas/{def}");
        let list_ref = format!("#/components/schemas/{list_def}");
        let gvk = json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
        let mut schema = t.schema.clone();
        if let Some(m) = schema.as_object_mut() {
            m.insert("x-kubernetes-group-version-kind".into(), gvk);
        }
        schemas.insert(def.clone(), schema);
        schemas.insert(
            list_def,
            json!({
                "type": "object",
                "description": format!("A list of {}.", t.kind),
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "items": {"type": "array", "items": {"$ref": obj_ref}},
                },
                "x-kubernetes-group-version-kind": [{"group": t.group, "version": t.version, "kind": t.list_kind}],
            }),
        );
        let scope_path = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", t.plural)
        } else {
            format!("{base}/{}", t.plural)
        };
        let scope_params = if t.namespaced {
            json!([{"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}])
        } else {
            json!([])
        };
        let mut collection = json!({
            "get": operation(r, "list", "", &list_ref, list_params()),
            "post": body_operation(r, "post", "", &obj_ref),
            "delete": operation(r, "deletecollection", "Collection", &obj_ref, list_params()),
            "parameters": scope_params.clone(),
        });
        if let Some(m) = collection.as_object_mut() {
            m.insert("parameters".into(), scope_params.clone());
        }
        paths.insert(scope_path.clone(), collection);
        let mut item_params = scope_params.as_array().cloned().unwrap_or_default();
        item_params.push(
            json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}),
        );
        paths.insert(
            format!("{scope_path}/{{name}}"),
            json!({
                "get": operation(r, "get", "", &obj_ref, vec![]),
                "put": body_operation(r, "put", "", &obj_ref),
                "patch": patch_operation(r, "", &obj_ref),
                "delete": operation(r, "delete", "", &obj_ref, write_params()),
                "parameters": item_params.clone(),
            }),
        );
        if t.status_subresource {
            paths.insert(
                format!("{scope_path}/{{name}}/status"),
                json!({
                    "get": operation(r, "get", "Status", &obj_ref, vec![]),
                    "put": body_operation(r, "put", "Status", &obj_ref),
                    "patch": patch_operation(r, "Status", &obj_ref),
                    "parameters": item_params,
                }),
            );
        }
        if t.namespaced {
            paths.insert(
                format!("{base}/{}", t.plural),
                json!({"get": operation(r, "list", "ForAllNamespaces", &list_ref, list_params())}),
            );
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "platform-mesh", "version": KUBE_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn proto_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    proto_varint(out, u64::from(field << 3 | 2));
    proto_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn proto_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A gnostic `openapi_v2.Document` with `swagger`, `info` and empty `paths`: enough for clients that
/// must download v2 before they use v3 (kubectl 1.27/1.28 `explain`), and it makes their
/// client-side validation lookups find nothing rather than fail.
fn v2_protobuf(title: &str, version: &str) -> Vec<u8> {
    let mut info = Vec::new();
    proto_field(&mut info, 1, title.as_bytes());
    proto_field(&mut info, 2, version.as_bytes());
    let mut doc = Vec::new();
    proto_field(&mut doc, 1, b"2.0");
    proto_field(&mut doc, 2, &info);
    proto_field(&mut doc, 8, &[]);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protobuf_document_bytes() {
        let b = v2_protobuf("t", "v");
        assert_eq!(
            b,
            vec![0x0a, 3, b'2', b'.', b'0', 0x12, 6, 0x0a, 1, b't', 0x12, 1, b'v', 0x42, 0]
        );
    }

    #[test]
    fn definition_names() {
        assert_eq!(
            definition_name("core.platform-mesh.io", "v1alpha1", "PlatformMesh"),
            "io.platform-mesh.core.v1alpha1.PlatformMesh"
        );
        assert_eq!(
            definition_name("", "v1", "ConfigMap"),
            "io.k8s.api.core.v1.ConfigMap"
        );
    }

    #[test]
    fn documents_carry_gvk_and_field_validation() {
        let registry = Registry::builtin();
        let api = OpenApi::build(&registry);
        let root: Value = serde_json::from_slice(&api.root()).expect("json");
        let url = root["paths"]["apis/core.platform-mesh.io/v1alpha1"]["serverRelativeURL"]
            .as_str()
            .expect("url");
        assert!(url.starts_with("/openapi/v3/apis/core.platform-mesh.io/v1alpha1?hash="));
        let (doc, _) = api
            .document("core.platform-mesh.io", "v1alpha1")
            .expect("doc");
        let doc: Value = serde_json::from_slice(&doc).expect("json");
        let item = &doc["paths"]
            ["/apis/core.platform-mesh.io/v1alpha1/namespaces/{namespace}/platformmeshes/{name}"];
        assert_eq!(
            item["patch"]["x-kubernetes-group-version-kind"]["kind"],
            "PlatformMesh"
        );
        let params = item["patch"]["parameters"].as_array().expect("params");
        assert!(params.iter().any(|p| p["name"] == "fieldValidation"));
        let content = item["patch"]["requestBody"]["content"]
            .as_object()
            .expect("content");
        assert!(!content.contains_key("application/strategic-merge-patch+json"));
        let (core, _) = api.document("", "v1").expect("core doc");
        let core: Value = serde_json::from_slice(&core).expect("json");
        let cm = &core["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"]
            ["requestBody"]["content"];
        assert!(cm.get("application/strategic-merge-patch+json").is_some());
    }
}
