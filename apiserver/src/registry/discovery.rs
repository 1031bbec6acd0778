//! API discovery documents: legacy (`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`)
//! and aggregated (`apidiscovery.k8s.io` v2 and v2beta1), built from the registry.

use serde_json::{json, Value};

use crate::registry::{Registry, Resource, CUSTOM_RESOURCE_VERBS, RESOURCE_VERBS, STATUS_VERBS};

/// The verbs of a resource, in the order kube-apiserver lists them for its kind of type.
fn verbs(r: &Resource) -> &'static [&'static str] {
    if r.ty.strategic_merge_patch {
        RESOURCE_VERBS
    } else {
        CUSTOM_RESOURCE_VERBS
    }
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// `GET /api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn api_group(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": group_version(name, v), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`.
pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .map(|g| api_group(&g.name, &g.versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let g = registry.group(name).filter(|g| !g.name.is_empty())?;
    let mut v = api_group(&g.name, &g.versions);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

/// `GET /api/v1`, `GET /apis/<group>/<version>`.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources = registry.group_version(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for r in resources {
        let t = &r.ty;
        let mut entry = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": verbs(r),
        });
        if !t.short_names.is_empty() {
            entry["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            entry["categories"] = json!(t.categories);
        }
        out.push(entry);
        if t.status_subresource {
            out.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": out,
    }))
}

fn discovery_resource(r: &Resource) -> Value {
    let t = &r.ty;
    let kind = json!({"group": t.group, "version": t.version, "kind": t.kind});
    let mut entry = json!({
        "resource": t.plural,
        "singularResource": t.singular,
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "responseKind": kind,
        "verbs": verbs(r),
    });
    if !t.short_names.is_empty() {
        entry["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        entry["categories"] = json!(t.categories);
    }
    if t.status_subresource {
        entry["subresources"] =
            json!([{"subresource": "status", "responseKind": kind, "verbs": STATUS_VERBS}]);
    }
    entry
}

fn discovery_group(registry: &Registry, name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = registry
                .group_version(name, v)
                .into_iter()
                .map(|r| discovery_resource(r))
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": name}, "versions": vs})
}

/// Aggregated discovery for `/api` (`core == true`) or `/apis`, as `apidiscovery.k8s.io/<version>`.
pub fn aggregated(registry: &Registry, core: bool, version: &str) -> Value {
    let items: Vec<Value> = if core {
        vec![discovery_group(registry, "", &["v1".to_string()])]
    } else {
        registry
            .groups()
            .map(|g| discovery_group(registry, &g.name, &g.versions))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// The `Content-Type` of an aggregated discovery answer.
pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}
