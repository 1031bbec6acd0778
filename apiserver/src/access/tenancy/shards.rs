//! Shards (`core.kcp.io/v1alpha1`): the server is one kcp shard, `root`, and says so as kcp
//! does. At start it creates or updates the Shard `root` in the root workspace with its
//! addresses (kcp's server start does the same for its own shard), and every Workspace it
//! schedules carries the shard's name hash in `internal.tenancy.kcp.io/shard` and its logical
//! cluster in `internal.tenancy.kcp.io/cluster`, the annotations kcp's workspace scheduler
//! writes and its clients (kcp's e2e fixtures among them) read to find a workspace's shard.

use serde_json::{json, Value};
use sha2::{Digest, Sha224};

use super::{Tenancy, TenancyError, MANAGER};
use crate::registry::{objects, Place};
use crate::request::request_info::ROOT_CLUSTER;

/// The name of the one shard this server is.
pub const ROOT_SHARD: &str = "root";
/// The annotation with the hash of a workspace's shard name (kcp's scheduler sets it).
pub const SHARD_ANNOTATION: &str = "internal.tenancy.kcp.io/shard";
/// The annotation with a workspace's logical cluster name (kcp's scheduler sets it).
pub const CLUSTER_ANNOTATION: &str = "internal.tenancy.kcp.io/cluster";

/// kcp's hash of a shard name in workspace annotations: the SHA-224 of the name as one
/// big-endian number written in base 36 (lower case), its first eight digits.
pub fn shard_name_hash(name: &str) -> String {
    let digest = Sha224::digest(name.as_bytes());
    let mut digits = base36(&digest);
    digits.truncate(8);
    digits
}

/// `bytes` as one big-endian number in base 36, lower case, with a `0` for each leading zero
/// byte (as the base36 package kcp uses writes it).
fn base36(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut number: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
    let mut reversed = Vec::new();
    while !number.is_empty() {
        // Divide the number by 36 in place, keeping the remainder.
        let mut remainder = 0u32;
        for byte in number.iter_mut() {
            let value = (remainder << 8) | u32::from(*byte);
            *byte = (value / 36) as u8;
            remainder = value % 36;
        }
        reversed.push(ALPHABET[remainder as usize]);
        let zeros = number.iter().take_while(|b| **b == 0).count();
        number.drain(..zeros);
    }
    let leading = bytes.iter().take_while(|b| **b == 0).count();
    let mut out = String::with_capacity(leading + reversed.len());
    out.extend(std::iter::repeat_n('0', leading));
    out.extend(reversed.iter().rev().map(|b| *b as char));
    out
}

/// The annotations kcp's scheduler gives a workspace placed on this server's shard.
pub(super) fn annotate_workspace(obj: &mut Value, cluster: &str) {
    let a = annotations_mut(obj);
    a.insert(SHARD_ANNOTATION.into(), json!(shard_name_hash(ROOT_SHARD)));
    a.insert(CLUSTER_ANNOTATION.into(), json!(cluster));
}

/// The annotations map of `obj`, made an empty one when it is missing or not a map.
fn annotations_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    let annotations = objects::meta_mut(obj)
        .entry("annotations")
        .or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations
        .as_object_mut()
        .expect("annotations made a map just above")
}

/// Keeps the scheduler's annotations of `old` on an update of a workspace: they say where the
/// workspace is, which no client chooses once it exists.
pub(super) fn keep_placement(obj: &mut Value, old: &Value) {
    let a = annotations_mut(obj);
    for key in [SHARD_ANNOTATION, CLUSTER_ANNOTATION] {
        match old["metadata"]["annotations"][key].as_str() {
            Some(v) => a.insert(key.into(), json!(v)),
            None => a.remove(key),
        };
    }
}

impl Tenancy {
    /// Creates the Shard `root` in the root workspace, or brings its addresses up to date.
    pub(super) async fn ensure_root_shard(&self) -> Result<(), TenancyError> {
        let res = self.builtin("core.kcp.io/v1alpha1/shards")?;
        let generic = self.objects()?;
        let own = generic.own(MANAGER);
        let place = Place::cluster(&res, ROOT_CLUSTER);
        let url = format!("https://{}", self.advertise_address);
        let spec = json!({"baseURL": url, "externalURL": url, "virtualWorkspaceURL": url});
        let shard = json!({
            "apiVersion": "core.kcp.io/v1alpha1", "kind": "Shard",
            "metadata": {"name": ROOT_SHARD, "labels": {"name": ROOT_SHARD}},
            "spec": spec,
        });
        // Another replica on the same store may have created it meanwhile: then it is
        // brought up to date like one from an earlier start.
        if own.create_missing(place, shard).await? {
            return Ok(());
        }
        own.update(place, ROOT_SHARD, |shard| {
            let mut changed = false;
            for f in ["baseURL", "externalURL", "virtualWorkspaceURL"] {
                if shard["spec"][f] != spec[f] {
                    shard["spec"][f] = spec[f].clone();
                    changed = true;
                }
            }
            changed
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_hash_is_kcps() {
        // kcp's scheduler and its e2e fixtures compute these for the shard names below
        // (sha224, base 36, first eight digits).
        assert_eq!(shard_name_hash("root"), "1pfxsevk");
        assert_eq!(base36(&[0, 0, 1]), "001");
        assert_eq!(base36(&[36]), "10");
        assert_eq!(base36(&[]), "");
    }
}
