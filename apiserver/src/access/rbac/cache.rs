//! The RBAC policy of each workspace, decoded once and kept until an RBAC object of that
//! workspace changes, so that authorizing a request costs no store scan: a tenant with
//! thousands of Roles pays for decoding them once per change, not once per request, and other
//! tenants do not pay at all.
//!
//! Validity is by revision: a policy built from a list at revision `r` serves until a change
//! to that workspace's RBAC objects at a revision above `r` is reported ([`PolicyCache::changed`],
//! called by the store before a write is acknowledged and by the replica's watch for the writes
//! of others).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::RbacPolicy;

/// The storage prefix of the RBAC kinds.
pub const RBAC_PREFIX: &str = "/rbac.authorization.k8s.io/";

/// Decoded RBAC policies by logical cluster.
#[derive(Default)]
pub struct PolicyCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// cluster → (revision the policy was read at, policy).
    policies: HashMap<String, (u64, Arc<RbacPolicy>)>,
    /// cluster → revision of the latest change to its RBAC objects.
    changed: HashMap<String, u64>,
}

impl PolicyCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy of `cluster`, if one read after its latest change is kept.
    pub fn get(&self, cluster: &str) -> Option<Arc<RbacPolicy>> {
        let inner = self.lock();
        let (read_at, policy) = inner.policies.get(cluster)?;
        let changed = inner.changed.get(cluster).copied().unwrap_or(0);
        (changed <= *read_at).then(|| policy.clone())
    }

    /// Keeps the policy of `cluster` read at `revision`, unless a newer one is kept already.
    pub fn put(&self, cluster: &str, revision: u64, policy: Arc<RbacPolicy>) {
        let mut inner = self.lock();
        match inner.policies.get(cluster) {
            Some((kept, _)) if *kept > revision => {}
            _ => {
                inner
                    .policies
                    .insert(cluster.to_string(), (revision, policy));
            }
        }
    }

    /// Records a write at `revision` to storage key `key`; only RBAC keys matter.
    pub fn observe_write(&self, key: &str, revision: u64) {
        if let Some(cluster) = key
            .strip_prefix(RBAC_PREFIX)
            .and_then(|rest| rest.split('/').nth(1))
        {
            self.changed(cluster, revision);
        }
    }

    /// Records that an RBAC object of `cluster` changed at `revision`.
    pub fn changed(&self, cluster: &str, revision: u64) {
        let mut inner = self.lock();
        let entry = inner.changed.entry(cluster.to_string()).or_insert(0);
        *entry = (*entry).max(revision);
        if inner
            .policies
            .get(cluster)
            .is_some_and(|(read_at, _)| *read_at < revision)
        {
            inner.policies.remove(cluster);
        }
    }

    /// Drops every kept policy (after a replica lost track of the store's changes).
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.policies.clear();
    }

    /// Forgets a deleted logical cluster.
    pub fn forget_cluster(&self, cluster: &str) {
        let mut inner = self.lock();
        inner.policies.remove(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_serves_until_its_workspace_changes_after_it_was_read() {
        let cache = PolicyCache::new();
        assert!(cache.get("a").is_none());
        cache.put("a", 10, Arc::new(RbacPolicy::default()));
        assert!(cache.get("a").is_some());
        // Changes elsewhere, or already included in the read, keep it.
        cache.observe_write("/rbac.authorization.k8s.io/roles/b/default/r", 11);
        cache.observe_write("/core/configmaps/a/default/c", 12);
        cache.changed("a", 10);
        assert!(cache.get("a").is_some());
        // A change after the read ends it, also one recorded before a slower reader puts.
        cache.observe_write("/rbac.authorization.k8s.io/clusterroles/a/admin", 13);
        assert!(cache.get("a").is_none());
        cache.put("a", 12, Arc::new(RbacPolicy::default()));
        assert!(cache.get("a").is_none());
        cache.put("a", 13, Arc::new(RbacPolicy::default()));
        assert!(cache.get("a").is_some());
        // An older read never replaces a newer one.
        cache.put("a", 5, Arc::new(RbacPolicy::default()));
        assert!(cache.get("a").is_some());
    }
}
