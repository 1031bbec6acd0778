//! kcp providers: clusters that bind an APIExport, found through its APIExportEndpointSlice and
//! the virtual workspace URLs it publishes; plus workspace paths resolved to cluster names.

pub mod apiexport;
pub mod path_aware;

use kube::api::{ApiResource, DynamicObject};
use serde_json::Value;

use crate::runtime::ResourceKind;

pub use apiexport::{ApiExportOptions, ApiExportProvider, EndpointSource};
pub use path_aware::PathAware;

/// The annotation with an object's logical-cluster name.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";
/// The annotation with a workspace's canonical path (on its LogicalCluster, and on APIBindings).
pub const PATH_ANNOTATION: &str = "kcp.io/path";
/// The name of the one LogicalCluster in every workspace.
pub const LOGICAL_CLUSTER_NAME: &str = "cluster";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: format!("{group}/{version}"),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// `apis.kcp.io/v1alpha1` APIExportEndpointSlice (cluster-scoped).
pub fn endpoint_slice_kind() -> ResourceKind {
    ResourceKind::dynamic(
        resource(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
        ),
        false,
    )
}

/// `apis.kcp.io/v1alpha1` APIBinding (cluster-scoped): what the apiexport provider watches.
pub fn api_binding_kind() -> ResourceKind {
    ResourceKind::dynamic(
        resource("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
        false,
    )
}

/// `core.kcp.io/v1alpha1` LogicalCluster (cluster-scoped, one named `cluster` per workspace).
pub fn logical_cluster_kind() -> ResourceKind {
    ResourceKind::dynamic(
        resource(
            "core.kcp.io",
            "v1alpha1",
            "LogicalCluster",
            "logicalclusters",
        ),
        false,
    )
}

/// The virtual-workspace URLs of an endpoint slice, `status.endpoints[].url` verbatim, in order,
/// without empties or duplicates.
///
/// ```
/// use controllers::cluster_providers::kcp::endpoint_urls;
/// let slice = serde_json::json!({"status": {"endpoints": [
///     {"url": "https://shard-1:6443/services/apiexport/abc/example.kcp.io"}]}});
/// assert_eq!(endpoint_urls(&slice), vec!["https://shard-1:6443/services/apiexport/abc/example.kcp.io"]);
/// ```
pub fn endpoint_urls(slice: &Value) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    let endpoints = slice
        .pointer("/status/endpoints")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for url in endpoints
        .iter()
        .filter_map(|e| e.get("url").and_then(Value::as_str))
    {
        if !url.is_empty() && !urls.iter().any(|u| u == url) {
            urls.push(url.to_string());
        }
    }
    urls
}

/// Whether a binding is ready: condition `Ready` is `True`, or `status.phase` is `Bound`.
///
/// ```
/// use controllers::cluster_providers::kcp::binding_is_ready;
/// assert!(binding_is_ready(&serde_json::json!({"status": {"phase": "Bound"}})));
/// assert!(!binding_is_ready(&serde_json::json!({"status": {"phase": "Binding"}})));
/// ```
pub fn binding_is_ready(binding: &Value) -> bool {
    let ready_condition = binding
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conds| {
            conds.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    ready_condition || binding.pointer("/status/phase").and_then(Value::as_str) == Some("Bound")
}

/// [`binding_is_ready`] for a dynamic object.
pub fn object_is_ready(obj: &DynamicObject) -> bool {
    binding_is_ready(&obj.data)
}

fn annotation<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The logical cluster of an object (annotation `kcp.io/cluster`).
pub fn cluster_of(obj: &DynamicObject) -> Option<&str> {
    annotation(obj, CLUSTER_ANNOTATION)
}

/// The workspace path of an object (annotation `kcp.io/path`).
pub fn path_of(obj: &DynamicObject) -> Option<&str> {
    annotation(obj, PATH_ANNOTATION)
}

/// `<base>/clusters/<cluster>`, without doubled slashes.
///
/// ```
/// use controllers::cluster_providers::kcp::cluster_url;
/// assert_eq!(cluster_url("https://vw/services/apiexport/r/e/", "abc"),
///            "https://vw/services/apiexport/r/e/clusters/abc");
/// ```
pub fn cluster_url(base: &str, cluster: &str) -> String {
    format!("{}/clusters/{}", base.trim_end_matches('/'), cluster)
}

/// `<base>/clusters/*`: the wildcard endpoint across every cluster.
pub fn wildcard_url(base: &str) -> String {
    cluster_url(base, "*")
}

/// Whether `name` is a logical-cluster name (one segment, or `system:`-prefixed) rather than a
/// workspace path like `root:orgs:acme`.
///
/// ```
/// use controllers::cluster_providers::kcp::is_cluster_name;
/// assert!(is_cluster_name("2x9c1v8nh4nzl5u9"));
/// assert!(is_cluster_name("system:admin"));
/// assert!(!is_cluster_name("root:orgs"));
/// ```
pub fn is_cluster_name(name: &str) -> bool {
    name.starts_with("system:") || (!name.is_empty() && !name.contains(':'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn endpoint_urls_are_taken_verbatim_without_empties_or_duplicates() {
        let slice = json!({"status": {"endpoints": [
            {"url": "https://shard-1.example:6443/services/apiexport/2x9c/example.kcp.io"},
            {"url": ""},
            {"shards": {"matchAll": true}},
            {"url": "https://shard-2.example:6443/services/apiexport/2x9c/example.kcp.io", "shards": {}},
            {"url": "https://shard-1.example:6443/services/apiexport/2x9c/example.kcp.io"},
        ]}});
        assert_eq!(
            endpoint_urls(&slice),
            vec![
                "https://shard-1.example:6443/services/apiexport/2x9c/example.kcp.io",
                "https://shard-2.example:6443/services/apiexport/2x9c/example.kcp.io",
            ]
        );
        assert!(endpoint_urls(&json!({"status": {}})).is_empty());
        assert!(endpoint_urls(&json!({"status": {"endpoints": "nope"}})).is_empty());
        assert!(endpoint_urls(&json!({})).is_empty());
    }

    #[test]
    fn readiness_by_condition_or_phase() {
        assert!(binding_is_ready(&json!({"status": {"conditions": [
            {"type": "InitialBindingCompleted", "status": "True"},
            {"type": "Ready", "status": "True"}]}})));
        assert!(!binding_is_ready(&json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}], "phase": "Binding"}})));
        assert!(binding_is_ready(&json!({"status": {"phase": "Bound"}})));
        assert!(!binding_is_ready(&json!({"status": {"phase": ""}})));
        assert!(!binding_is_ready(&json!({})));
        assert!(!binding_is_ready(
            &json!({"status": {"conditions": [{"type": "Ready"}]}})
        ));
    }

    #[test]
    fn cluster_and_path_come_from_annotations() {
        let b: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "example.kcp.io", "annotations": {
                "kcp.io/cluster": "2x9c1v8nh4nzl5u9", "kcp.io/path": "root:orgs:acme"}}}))
        .unwrap();
        assert_eq!(cluster_of(&b), Some("2x9c1v8nh4nzl5u9"));
        assert_eq!(path_of(&b), Some("root:orgs:acme"));
        let bare: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "x", "annotations": {"kcp.io/cluster": ""}}}))
        .unwrap();
        assert_eq!(cluster_of(&bare), None);
        assert_eq!(path_of(&bare), None);
    }

    #[test]
    fn urls_join_under_clusters() {
        let vw = "https://shard-1:6443/services/apiexport/2x9c/example.kcp.io";
        assert_eq!(cluster_url(vw, "abc"), format!("{vw}/clusters/abc"));
        assert_eq!(
            cluster_url(&format!("{vw}//"), "abc"),
            format!("{vw}/clusters/abc")
        );
        assert_eq!(wildcard_url(vw), format!("{vw}/clusters/*"));
        assert_eq!(
            cluster_url("https://127.0.0.1:6443", "root"),
            "https://127.0.0.1:6443/clusters/root"
        );
    }

    #[test]
    fn kinds_have_kcp_coordinates() {
        assert_eq!(
            endpoint_slice_kind().gvr(),
            "apiexportendpointslices.apis.kcp.io/v1alpha1"
        );
        assert_eq!(api_binding_kind().gvr(), "apibindings.apis.kcp.io/v1alpha1");
        assert_eq!(
            logical_cluster_kind().api.api_version,
            "core.kcp.io/v1alpha1"
        );
        assert!(!api_binding_kind().namespaced);
    }
}
