//! The resource broker: consumers ask for a resource ("a certificate for app.internal.corp"),
//! providers say what they accept (AcceptAPIs), and the broker copies each consumer object to
//! an accepting provider, brings the provider's status and related resources (the Secret of a
//! certificate) back, moves objects when the accepting provider changes, and runs staged
//! migrations for those moves.
//!
//! Clusters have roles: consumers (where objects are asked for), providers (where they are
//! fulfilled, holding AcceptAPIs) and one coordination cluster (holding MigrationConfigurations
//! and Migrations). Each role has its own [`Manager`](crate::runtime::Manager) and cluster
//! provider, so a cluster only needs the APIs of its role.
//!
//! - [`accept`]: filters, the registry of AcceptAPIs and the choice among providers;
//! - [`generic`]: the brokering reconciler, for any kind;
//! - [`copy`]: how objects are copied between clusters;
//! - [`migration`]: MigrationConfigurations and the staged Migration state machine;
//! - [`wiring`]: the managers and their controllers;
//! - [`kcp`]: the roles over kcp workspaces (consumers bind the brokered APIExport, providers
//!   hold AcceptAPIs).

pub mod accept;
pub mod copy;
pub mod generic;
pub mod kcp;
pub mod migration;
pub mod wiring;

use api::common::GroupVersionKind;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Finalizer on consumer objects and their provider copies.
pub const GENERIC_FINALIZER: &str = "broker.platform-mesh.io/generic-finalizer";
/// Consumer annotation: the provider cluster holding the object.
pub const PROVIDER_CLUSTER: &str = "broker.platform-mesh.io/provider-cluster";
/// Consumer annotation: the provider cluster the object is moving to.
pub const NEW_PROVIDER_CLUSTER: &str = "broker.platform-mesh.io/new-provider-cluster";
/// Consumer annotation: the related resources copied to the consumer, as JSON.
pub const RELATED_RESOURCES: &str = "broker.platform-mesh.io/related-resources";
/// Provider-copy (and Migration) annotation: the consumer cluster of the object.
pub const CONSUMER_CLUSTER: &str = "broker.platform-mesh.io/consumer-cluster";
/// Provider-copy (and Migration) annotation: the consumer object's name.
pub const CONSUMER_NAME: &str = "broker.platform-mesh.io/consumer-name";

/// Prefix of consumer cluster names, as hashed into provider-side names.
pub const CONSUMER_PREFIX: &str = "consumer#";
/// Prefix of provider cluster names.
pub const PROVIDER_PREFIX: &str = "provider#";

/// The first 12 hex digits of the SHA-256 of `name`: the prefix that keeps objects of different
/// consumers apart on a provider (upstream's `SanitizeClusterName`).
///
/// ```
/// use controllers::broker::cluster_hash;
/// assert_eq!(cluster_hash("consumer#/kubeconfigs/consumer/kubeconfig+default"), "d480f64dc494");
/// ```
pub fn cluster_hash(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The provider-side name of consumer object `name` of `consumer` (a cluster name with its
/// `consumer#` prefix).
pub fn provider_name(consumer: &str, name: &str) -> String {
    format!("{}-{name}", cluster_hash(consumer))
}

/// Parses `Kind.version.group` (`Kind.v1.core` for the core group), as `--watch-kind` takes it.
///
/// ```
/// use controllers::broker::parse_kind;
/// let gvk = parse_kind("Certificate.v1alpha1.example.platform-mesh.io").unwrap();
/// assert_eq!((gvk.kind.as_str(), gvk.version.as_str(), gvk.group.as_str()),
///            ("Certificate", "v1alpha1", "example.platform-mesh.io"));
/// assert_eq!(parse_kind("ConfigMap.v1.core").unwrap().group, "");
/// assert!(parse_kind("ConfigMap").is_err());
/// ```
pub fn parse_kind(text: &str) -> Result<GroupVersionKind, String> {
    let mut parts = text.splitn(3, '.');
    let (kind, version, group) = (parts.next(), parts.next(), parts.next());
    match (kind, version, group) {
        (Some(k), Some(v), Some(g)) if !k.is_empty() && !v.is_empty() && !g.is_empty() => {
            Ok(GroupVersionKind {
                group: if g == "core" { String::new() } else { g.into() },
                version: v.into(),
                kind: k.into(),
            })
        }
        _ => Err(format!(
            "{text:?} is not Kind.version.group (for example Certificate.v1alpha1.example.platform-mesh.io, or ConfigMap.v1.core for the core group)"
        )),
    }
}

/// Adds or removes finalizer `f` of a typed object (no write when already so).
pub(crate) async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    f: &str,
    present: bool,
) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let has = obj.finalizers().iter().any(|x| x == f);
    if has == present {
        return Ok(());
    }
    let mut all: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|x| *x != f)
        .cloned()
        .collect();
    if present {
        all.push(f.to_string());
    }
    let patch = json!({"metadata": {"finalizers": all, "resourceVersion": obj.resource_version()}});
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("writing finalizers: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_upstream_names() {
        assert_eq!(
            cluster_hash("consumer#/kubeconfigs/consumer/kubeconfig+default"),
            "d480f64dc494"
        );
        assert_eq!(cluster_hash("consumer#consumer#cluster"), "a8b70b353e97");
        assert_eq!(
            provider_name("consumer#consumer#cluster", "test-vm"),
            "a8b70b353e97-test-vm"
        );
    }

    #[test]
    fn bad_kinds_say_what_to_write() {
        for bad in ["", "A", "A.v1", "A..g", ".v1.g"] {
            let err = parse_kind(bad).unwrap_err();
            assert!(err.contains("Kind.version.group"), "{err}");
        }
    }
}
