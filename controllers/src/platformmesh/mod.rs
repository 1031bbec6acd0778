//! The PlatformMesh reconciler: from a PlatformMesh object and its profile to the objects of the
//! infra, runtime and kcp clusters. `vars` builds the template data in the documented order.

pub mod controller;
pub mod deploy;
pub mod deployment;
pub mod features;
pub mod gates;
pub mod kcp;
pub mod manifests;
pub mod providersecret;
pub mod render;
pub mod resource;
pub mod review;
pub mod vars;
pub mod wait;

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
