//! Small helpers on the objects every reconciler reads: the `ApiResource` of a kind, and the
//! conditions in an object's status.

use serde_json::Value;

/// The ApiResource of a kind given by group (empty for core), version, kind and plural.
pub fn api_resource(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A condition of an object as JSON, if it has one.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether an object's condition `type_` is `True`.
pub fn condition_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

/// `core.platform-mesh.io/v1alpha1` PlatformMesh.
pub fn platform_meshes() -> kube::api::ApiResource {
    api_resource(
        "core.platform-mesh.io",
        "v1alpha1",
        "PlatformMesh",
        "platformmeshes",
    )
}
