//! Mapping functions from a watched object to the requests it should trigger: the object
//! itself, its controlling owner, or objects in other clusters named by annotations.

use std::sync::Arc;

use kube::api::DynamicObject;

use super::request::{ClusterName, Request, ResourceKind};

/// A mapping from an object seen in a cluster to requests (possibly in other clusters).
pub type MapFn = Arc<dyn Fn(&ClusterName, &DynamicObject) -> Vec<Request> + Send + Sync>;

/// Decides whether an event on an object should trigger anything.
pub type Predicate = Arc<dyn Fn(&DynamicObject) -> bool + Send + Sync>;

/// The request for the object itself.
///
/// ```
/// use mc_runtime::mapping::request_for;
/// let cm: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})).unwrap();
/// assert_eq!(request_for(&"a".into(), &cm).unwrap().to_string(), "a|ns/c");
/// ```
pub fn request_for(cluster: &ClusterName, obj: &DynamicObject) -> Option<Request> {
    let name = obj.metadata.name.clone().filter(|n| !n.is_empty())?;
    Some(Request {
        cluster: cluster.clone(),
        namespace: obj.metadata.namespace.clone().filter(|n| !n.is_empty()),
        name,
    })
}

/// The group of an `apiVersion` (`""` for the core group `v1`).
fn group_of(api_version: &str) -> &str {
    match api_version.rsplit_once('/') {
        Some((group, _)) => group,
        None => "",
    }
}

/// Requests for the controlling owner of `obj` when that owner is of kind `owner` (as
/// controller-runtime's `Owns` does: only the reference with `controller: true` counts). The
/// owner is in the same cluster; in the child's namespace when it is namespaced.
///
/// ```
/// use mc_runtime::{mapping::owner_requests, ResourceKind};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// let child: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns",
///     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
///                          "uid": "1", "controller": true}]}})).unwrap();
/// let reqs = owner_requests(&"a".into(), &child, &ResourceKind::of::<ConfigMap>());
/// assert_eq!(reqs[0].to_string(), "a|ns/owner");
/// ```
pub fn owner_requests(
    cluster: &ClusterName,
    obj: &DynamicObject,
    owner: &ResourceKind,
) -> Vec<Request> {
    let Some(refs) = obj.metadata.owner_references.as_ref() else {
        return Vec::new();
    };
    refs.iter()
        .filter(|r| r.controller == Some(true))
        .filter(|r| r.kind == owner.api.kind && group_of(&r.api_version) == owner.api.group)
        .filter(|r| !r.name.is_empty())
        .map(|r| Request {
            cluster: cluster.clone(),
            namespace: if owner.namespaced {
                obj.metadata.namespace.clone()
            } else {
                None
            },
            name: r.name.clone(),
        })
        .collect()
}

/// A mapping that sends every event to one fixed object, e.g. a singleton configuration in a
/// home cluster.
///
/// ```
/// use mc_runtime::{mapping::to_fixed, Request};
/// let map = to_fixed(Request::cluster_scoped("home", "config"));
/// let any: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})).unwrap();
/// assert_eq!(map(&"b".into(), &any), vec![Request::cluster_scoped("home", "config")]);
/// ```
pub fn to_fixed(target: Request) -> MapFn {
    Arc::new(move |_, _| vec![target.clone()])
}

/// Annotation keys that point from an object to an object in another cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossClusterKeys {
    /// Annotation holding the target cluster (absent: the object's own cluster).
    pub cluster: String,
    /// Annotation holding the target namespace (absent: cluster-scoped target).
    pub namespace: String,
    /// Annotation holding the target name (absent: no request).
    pub name: String,
}

impl CrossClusterKeys {
    /// Keys `<prefix>/cluster`, `<prefix>/namespace` and `<prefix>/name`.
    pub fn with_prefix(prefix: &str) -> Self {
        CrossClusterKeys {
            cluster: format!("{prefix}/cluster"),
            namespace: format!("{prefix}/namespace"),
            name: format!("{prefix}/name"),
        }
    }
}

/// The request an object points to through annotations (see [`CrossClusterKeys`]): how an
/// object created in a provider's cluster leads back to the object in the consumer's cluster
/// that caused it.
///
/// ```
/// use mc_runtime::mapping::{annotated_target, CrossClusterKeys};
/// let keys = CrossClusterKeys::with_prefix("platform-mesh.io/source");
/// let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "copy", "namespace": "x",
///     "annotations": {"platform-mesh.io/source/cluster": "consumer",
///                     "platform-mesh.io/source/namespace": "default",
///                     "platform-mesh.io/source/name": "orig"}}})).unwrap();
/// assert_eq!(annotated_target(&keys, &"provider".into(), &obj)[0].to_string(), "consumer|default/orig");
/// ```
pub fn annotated_target(
    keys: &CrossClusterKeys,
    cluster: &ClusterName,
    obj: &DynamicObject,
) -> Vec<Request> {
    let Some(annotations) = obj.metadata.annotations.as_ref() else {
        return Vec::new();
    };
    let non_empty = |k: &str| annotations.get(k).filter(|v| !v.is_empty()).cloned();
    let Some(name) = non_empty(&keys.name) else {
        return Vec::new();
    };
    vec![Request {
        cluster: non_empty(&keys.cluster)
            .map(ClusterName::from)
            .unwrap_or_else(|| cluster.clone()),
        namespace: non_empty(&keys.namespace),
        name,
    }]
}

/// A predicate passing objects whose label `key` equals `value` (an empty `value` also passes
/// objects without the label), like the Platform Mesh operators' debug-label filter.
///
/// ```
/// use mc_runtime::mapping::label_equals;
/// let p = label_equals("debug.platform-mesh.io", "");
/// let o: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})).unwrap();
/// assert!(p(&o));
/// ```
pub fn label_equals(key: &str, value: &str) -> Predicate {
    let (key, value) = (key.to_string(), value.to_string());
    Arc::new(move |obj| {
        let actual = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&key))
            .map(String::as_str)
            .unwrap_or("");
        actual == value
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::ApiResource;
    use serde_json::json;

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn child_with_refs(refs: serde_json::Value) -> DynamicObject {
        object(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "child", "namespace": "ns", "ownerReferences": refs}}))
    }

    #[test]
    fn request_for_namespaced_and_cluster_scoped() {
        let cm = object(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}),
        );
        assert_eq!(
            request_for(&"a".into(), &cm),
            Some(Request::namespaced("a", "n", "c"))
        );
        let ns =
            object(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}));
        assert_eq!(
            request_for(&"a".into(), &ns),
            Some(Request::cluster_scoped("a", "n"))
        );
        let nameless = object(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}}));
        assert_eq!(request_for(&"a".into(), &nameless), None);
    }

    #[test]
    fn only_the_controlling_owner_of_the_right_kind_counts() {
        let owner = ResourceKind::of::<ConfigMap>();
        let child = child_with_refs(json!([
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-controller", "uid": "1"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "ctl", "uid": "2", "controller": true},
            {"apiVersion": "apps/v1", "kind": "ConfigMap", "name": "other-group", "uid": "3", "controller": true},
        ]));
        assert_eq!(
            owner_requests(&"a".into(), &child, &owner),
            vec![Request::namespaced("a", "ns", "ctl")]
        );
    }

    #[test]
    fn owner_group_ignores_the_version_and_cluster_scoped_owners_have_no_namespace() {
        let owner = ResourceKind::dynamic(
            ApiResource {
                group: "core.platform-mesh.io".into(),
                version: "v1alpha1".into(),
                api_version: "core.platform-mesh.io/v1alpha1".into(),
                kind: "PlatformMesh".into(),
                plural: "platformmeshes".into(),
            },
            false,
        );
        let child = child_with_refs(json!([
            {"apiVersion": "core.platform-mesh.io/v1beta1", "kind": "PlatformMesh", "name": "pm", "uid": "1", "controller": true}
        ]));
        assert_eq!(
            owner_requests(&"b".into(), &child, &owner),
            vec![Request::cluster_scoped("b", "pm")]
        );
        assert!(owner_requests(&"b".into(), &child, &ResourceKind::of::<Namespace>()).is_empty());
        let orphan =
            object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "o"}}));
        assert!(owner_requests(&"b".into(), &orphan, &owner).is_empty());
    }

    #[test]
    fn annotated_target_crosses_clusters_and_defaults_to_the_own_cluster() {
        let keys = CrossClusterKeys::with_prefix("x.io/src");
        let other = object(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c",
            "annotations": {"x.io/src/cluster": "consumer", "x.io/src/name": "orig"}}}),
        );
        assert_eq!(
            annotated_target(&keys, &"provider".into(), &other),
            vec![Request::cluster_scoped("consumer", "orig")]
        );
        let same = object(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c",
            "annotations": {"x.io/src/namespace": "ns", "x.io/src/name": "orig"}}}),
        );
        assert_eq!(
            annotated_target(&keys, &"provider".into(), &same),
            vec![Request::namespaced("provider", "ns", "orig")]
        );
        let none = object(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c",
            "annotations": {"x.io/src/cluster": "consumer", "x.io/src/name": ""}}}),
        );
        assert!(annotated_target(&keys, &"provider".into(), &none).is_empty());
    }

    #[test]
    fn fixed_target_and_label_predicate() {
        let map = to_fixed(Request::cluster_scoped("home", "cfg"));
        let o = object(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"debug": "me"}}}),
        );
        assert_eq!(
            map(&"a".into(), &o),
            vec![Request::cluster_scoped("home", "cfg")]
        );
        assert!(label_equals("debug", "me")(&o));
        assert!(!label_equals("debug", "")(&o));
        assert!(!label_equals("debug", "you")(&o));
    }
}
