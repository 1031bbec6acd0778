//! Unit tests for the parent module.

use std::sync::Arc;

use super::*;
use crate::meta::strategic_merge::{merge_keys_for, FieldStrategy};
use crate::registry::TypeInfo;

fn doc(api: &OpenApi, group: &str, version: &str) -> Value {
    let (bytes, _) = api
        .document(group, version)
        .unwrap_or_else(|| panic!("no document for {group}/{version}"));
    serde_json::from_slice(&bytes).expect("json")
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["components"]["schemas"]
        .get(name)
        .unwrap_or_else(|| panic!("no schema {name}"))
}

/// The definition a property refers to, directly or as kube's one-element `allOf`.
fn referred(property: &Value, prefix: &str) -> Option<String> {
    property
        .get("$ref")
        .or_else(|| property.pointer("/allOf/0/$ref"))
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix(prefix))
        .map(str::to_string)
}

fn all_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r.clone());
            }
            m.values().for_each(|v| all_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| all_refs(v, out)),
        _ => {}
    }
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
    let doc = doc(&api, "core.platform-mesh.io", "v1alpha1");
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
    let core = self::doc(&api, "", "v1");
    let cm = &core["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"]
        ["requestBody"]["content"];
    assert!(cm.get("application/strategic-merge-patch+json").is_some());
}

#[test]
fn kinds_refer_to_a_complete_object_meta() {
    let api = OpenApi::build(&Registry::builtin());
    for (group, version, kind) in [
        ("", "v1", "io.k8s.api.core.v1.ConfigMap"),
        ("", "v1", "io.k8s.api.core.v1.Secret"),
        ("", "v1", "io.k8s.api.core.v1.Namespace"),
        ("", "v1", "io.k8s.api.core.v1.ServiceAccount"),
        ("rbac.authorization.k8s.io", "v1", "io.k8s.api.rbac.v1.Role"),
        (
            "rbac.authorization.k8s.io",
            "v1",
            "io.k8s.api.rbac.v1.ClusterRoleBinding",
        ),
        (
            "core.platform-mesh.io",
            "v1alpha1",
            "io.platform-mesh.core.v1alpha1.Account",
        ),
        (
            "tenancy.kcp.io",
            "v1alpha1",
            "io.kcp.tenancy.v1alpha1.Workspace",
        ),
    ] {
        let doc = doc(&api, group, version);
        let metadata = &schema(&doc, kind)["properties"]["metadata"];
        assert_eq!(
            referred(metadata, SCHEMA_PREFIX).as_deref(),
            Some(defs::OBJECT_META),
            "{kind}: {metadata}"
        );
        let meta = &schema(&doc, defs::OBJECT_META)["properties"];
        assert_eq!(meta["annotations"]["type"], "object", "{kind}");
        assert_eq!(
            meta["ownerReferences"]["x-kubernetes-patch-merge-key"],
            "uid"
        );
        assert_eq!(
            meta["ownerReferences"]["x-kubernetes-patch-strategy"],
            "merge"
        );
        assert_eq!(meta["finalizers"]["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(meta["finalizers"]["x-kubernetes-list-type"], "set");
        let list = schema(&doc, &format!("{kind}List"));
        assert_eq!(
            referred(&list["properties"]["metadata"], SCHEMA_PREFIX).as_deref(),
            Some(defs::LIST_META),
            "{kind}"
        );
        for shared in [defs::STATUS, defs::DELETE_OPTIONS, defs::PATCH] {
            schema(&doc, shared);
        }
        assert_eq!(
            schema(&doc, defs::STATUS)["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Status"}])
        );
        let delete_kinds = &schema(&doc, defs::DELETE_OPTIONS)["x-kubernetes-group-version-kind"];
        assert!(
            delete_kinds.as_array().is_some_and(|k| k
                .contains(&json!({"group": group, "version": version, "kind": "DeleteOptions"}))),
            "{delete_kinds}"
        );
    }
}

#[test]
fn every_reference_of_every_document_resolves() {
    let api = OpenApi::build(&Registry::builtin());
    let root: Value = serde_json::from_slice(&api.root()).expect("json");
    for key in root["paths"].as_object().expect("paths").keys() {
        let (group, version) = match key.split('/').collect::<Vec<_>>().as_slice() {
            ["api", v] => (String::new(), v.to_string()),
            ["apis", g, v] => (g.to_string(), v.to_string()),
            other => panic!("{other:?}"),
        };
        let doc = doc(&api, &group, &version);
        let mut refs = Vec::new();
        all_refs(&doc, &mut refs);
        for r in refs {
            let name = r.strip_prefix(SCHEMA_PREFIX).expect("a v3 reference");
            schema(&doc, name);
        }
    }
    let v2: Value = serde_json::from_slice(&api.v2_json()).expect("json");
    let mut refs = Vec::new();
    all_refs(&v2, &mut refs);
    assert!(refs.len() > 100);
    for r in refs {
        let name = r.strip_prefix("#/definitions/").expect("a v2 reference");
        assert!(v2["definitions"].get(name).is_some(), "{r}");
    }
}

/// kubectl's v2 model refuses arrays without one item schema and references with a type or
/// properties beside them.
#[test]
fn v2_schemas_are_readable_by_kubectl() {
    fn check(path: &str, s: &Value) {
        let Some(obj) = s.as_object() else {
            return;
        };
        if obj.contains_key("$ref") {
            assert!(
                !obj.contains_key("type") && !obj.contains_key("properties"),
                "{path}: {s}"
            );
        }
        if obj.get("type") == Some(&json!("array")) {
            assert!(obj.get("items").is_some_and(Value::is_object), "{path}");
        }
        for key in ["allOf", "anyOf", "oneOf", "not", "nullable"] {
            assert!(!obj.contains_key(key), "{path}: {key}");
        }
        for (name, sub) in obj
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(&format!("{path}.{name}"), sub);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = obj.get(key) {
                check(&format!("{path}[{key}]"), sub);
            }
        }
    }
    let api = OpenApi::build(&Registry::builtin());
    let v2: Value = serde_json::from_slice(&api.v2_json()).expect("json");
    for (name, s) in v2["definitions"].as_object().expect("definitions") {
        check(name, s);
    }
    let patch = &v2["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert!(patch["consumes"]
        .as_array()
        .is_some_and(|c| c.contains(&json!("application/strategic-merge-patch+json"))));
    let account =
        &v2["paths"]["/apis/core.platform-mesh.io/v1alpha1/accounts/{name}"]["patch"]["consumes"];
    assert!(
        account.as_array().is_some_and(
            |c| !c.is_empty() && !c.contains(&json!("application/strategic-merge-patch+json"))
        ),
        "{account}"
    );
    let proto = api.v2_protobuf();
    assert_eq!(&proto[..5], b"\x0a\x032.0");
    assert!(proto.len() > 10_000);
}

/// The patch strategies kubectl reads from the documents are the ones the server's strategic
/// merge patch applies: every list of every built-in kind, followed through its definitions.
#[test]
fn published_patch_strategies_are_the_servers() {
    fn walk(
        doc: &Value,
        s: &Value,
        path: &mut Vec<String>,
        seen: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Option<FieldStrategy>)>,
    ) {
        if let Some(name) = referred(s, SCHEMA_PREFIX) {
            if seen.contains(&name) {
                return;
            }
            seen.push(name.clone());
            walk(doc, schema(doc, &name), path, seen, out);
            seen.pop();
            return;
        }
        if s["type"] == "array" {
            let strategy = match (
                s["x-kubernetes-patch-strategy"].as_str(),
                s["x-kubernetes-patch-merge-key"].as_str(),
            ) {
                (Some("merge"), Some(key)) => Some(FieldStrategy::MergeByKey(key.into())),
                (Some("merge"), None) => Some(FieldStrategy::MergePrimitives),
                _ => None,
            };
            out.push((path.clone(), strategy));
            walk(doc, &s["items"], path, seen, out);
        }
        for (name, sub) in s["properties"].as_object().into_iter().flatten() {
            path.push(name.clone());
            walk(doc, sub, path, seen, out);
            path.pop();
        }
    }
    let registry = Registry::builtin();
    let api = OpenApi::build(&registry);
    let mut checked = 0;
    for r in registry
        .resources()
        .iter()
        .filter(|r| r.ty.strategic_merge_patch)
    {
        let t = &r.ty;
        let doc = doc(&api, &t.group, &t.version);
        let name = defs::builtin_kind(&t.group, &t.version, &t.kind).expect("a built-in kind");
        let mut lists = Vec::new();
        walk(
            &doc,
            schema(&doc, name),
            &mut Vec::new(),
            &mut Vec::new(),
            &mut lists,
        );
        let server = merge_keys_for(&t.group, &t.kind);
        for (path, published) in lists {
            let applied = server
                .lookup(&path)
                .filter(|s| **s != FieldStrategy::Replace);
            assert_eq!(
                applied,
                published.as_ref(),
                "{} {}: {}",
                t.group,
                t.kind,
                path.join(".")
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked}");
}

#[test]
fn custom_resources_get_kube_additions() {
    let schema_in = json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": true,
                        "x-kubernetes-preserve-unknown-fields": true,
                    },
                },
            },
        },
    });
    let ty = TypeInfo {
        group: "example.com".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        list_kind: "WidgetList".into(),
        plural: "widgets".into(),
        singular: "widget".into(),
        short_names: vec![],
        categories: vec![],
        namespaced: true,
        status_subresource: false,
        strategic_merge_patch: false,
        printer_columns: vec![],
        schema: schema_in,
    };
    let api = OpenApi::build(&Registry::new(vec![Arc::new(Resource::new(ty))]));
    let doc = doc(&api, "example.com", "v1");
    let widget = schema(&doc, "com.example.v1.Widget");
    assert_eq!(
        widget["x-kubernetes-group-version-kind"],
        json!([{"group": "example.com", "version": "v1", "kind": "Widget"}])
    );
    assert!(widget["properties"]["kind"]["description"].is_string());
    let template = &widget["properties"]["spec"]["properties"]["template"];
    assert_eq!(
        referred(&template["properties"]["metadata"], SCHEMA_PREFIX).as_deref(),
        Some(defs::OBJECT_META)
    );
    assert_eq!(template["required"], json!(["apiVersion", "kind"]));
    let list = schema(&doc, "com.example.v1.WidgetList");
    assert_eq!(list["description"], "WidgetList is a list of Widget");
    assert_eq!(
        list["properties"]["items"]["items"]["$ref"],
        "#/components/schemas/com.example.v1.Widget"
    );
    // Custom resources have no watch paths, as in kube's documents; built-in kinds do.
    assert!(doc["paths"]
        .as_object()
        .is_some_and(|p| !p.keys().any(|k| k.contains("/watch/"))));
    schema(&doc, defs::API_RESOURCE_LIST);
    let core = self::doc(&OpenApi::build(&Registry::builtin()), "", "v1");
    let watch = &core["paths"]["/api/v1/watch/namespaces/{namespace}/configmaps/{name}"]["get"];
    assert_eq!(watch["x-kubernetes-action"], "watch");
    schema(&core, defs::WATCH_EVENT);
}
