//! kcp's APIBinding deletion. Every binding carries the finalizer [`FINALIZER`] (added on each
//! create and update, as kcp's admission adds it). Deleting a binding marks it, and then:
//!
//! - every object of the resources it binds (`status.boundResources`) in its workspace is
//!   deleted; an object with finalizers is marked and waited for;
//! - the binding's `BindingResourceDeleteSuccess` condition says what is left, with kcp's reasons
//!   (`SomeFinalizersRemain` or `SomeResourcesRemain`) and messages;
//! - when nothing is left the condition turns True, the finalizer goes, and so does the binding.
//!
//! Until then the resources stay served, so that the controllers holding finalizers on those
//! objects (a provider cleaning up what it made for them) can finish and release them.
//!
//! One difference from kcp: kcp looks again after 3 s, and counts what its first list found.
//! Here the objects are counted again after the deletes, and the next look comes after 1 s, so
//! an unbinding with nothing held ends in one pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{reload_cluster_types, Tenancy, TenancyError, MANAGER};
use crate::registry::objects::{self, meta_mut};
use crate::registry::Place;
use crate::storage::list_all;

/// The finalizer every APIBinding carries until what it bound is gone.
pub const FINALIZER: &str = "apis.kcp.io/apibinding-finalizer";
/// The condition reporting the deletion of what a binding bound.
pub const CONDITION: &str = "BindingResourceDeleteSuccess";
/// How soon a binding whose objects are still there is looked at again.
const RECHECK: Duration = Duration::from_secs(1);

fn binding_key(cluster: &str, name: &str) -> String {
    format!("/apis.kcp.io/apibindings/{cluster}/{name}")
}

/// Adds [`FINALIZER`] to a binding being written, unless it is being deleted.
pub(super) fn add_finalizer(obj: &mut Value) {
    if objects::is_deleting(obj) {
        return;
    }
    let meta = meta_mut(obj);
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(list) = list.as_array_mut() {
        if !list.iter().any(|f| f == FINALIZER) {
            list.push(json!(FINALIZER));
        }
    }
}

/// What is left of the objects a binding bound: the count per resource and per finalizer.
#[derive(Debug, Default, PartialEq, Eq)]
struct Remaining {
    by_resource: BTreeMap<String, usize>,
    by_finalizer: BTreeMap<String, usize>,
}

impl Remaining {
    /// The condition kcp writes for what is left.
    fn condition(&self) -> Value {
        if !self.by_finalizer.is_empty() {
            let held: Vec<String> = self
                .by_finalizer
                .iter()
                .map(|(f, n)| format!("{f} in {n} resource instances"))
                .collect();
            return json!({"type": CONDITION, "status": "False", "severity": "Error",
                "reason": "SomeFinalizersRemain",
                "message": format!("Some content in the workspace has finalizers remaining: {}", held.join(", "))});
        }
        if !self.by_resource.is_empty() {
            let left: Vec<String> = self
                .by_resource
                .iter()
                .map(|(r, n)| format!("{r} has {n} resource instances"))
                .collect();
            return json!({"type": CONDITION, "status": "False", "severity": "Error",
                "reason": "SomeResourcesRemain",
                "message": format!("Some resources are remaining: {}", left.join(", "))});
        }
        json!({"type": CONDITION, "status": "True"})
    }
}

impl Tenancy {
    /// Starts (once per binding) the deletion of what binding `name` of `cluster` bound; the
    /// binding is marked for deletion.
    pub(super) fn unbind(&self, cluster: &str, name: &str) {
        let key = (cluster.to_string(), name.to_string());
        match self.unbinding.lock() {
            Ok(mut running) => {
                if !running.insert(key.clone()) {
                    return;
                }
            }
            Err(_) => return,
        }
        let weak = self.state.clone();
        tokio::spawn(async move {
            let (cluster, name) = (&key.0, &key.1);
            loop {
                let Some(state) = weak.upgrade() else { return };
                match pass(&state, cluster, name).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(cluster, binding = name, error = %e, "deleting what an APIBinding bound")
                    }
                }
                drop(state);
                tokio::time::sleep(RECHECK).await;
            }
            if let Some(state) = weak.upgrade() {
                if let Ok(mut running) = state.unbinding.lock() {
                    running.remove(&key);
                }
            }
        });
    }

    /// Resumes the deletions of bindings that were marked when the server stopped.
    pub(super) async fn resume_unbinding(&self) -> Result<(), TenancyError> {
        for kv in list_all(self.store.as_ref(), "/apis.kcp.io/apibindings/")
            .await?
            .0
        {
            let Ok(b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&b) {
                if let Some(cluster) = crate::storage::key_cluster(&kv.key) {
                    self.unbind(cluster, objects::name(&b));
                }
            }
        }
        Ok(())
    }
}

/// One pass over a binding being deleted; true once it is gone (or not being deleted).
async fn pass(state: &Tenancy, cluster: &str, name: &str) -> Result<bool, TenancyError> {
    let key = binding_key(cluster, name);
    let Some(kv) = state.store.get(&key).await? else {
        return Ok(true);
    };
    let Ok(binding) = objects::decode_stored(&kv.value) else {
        return Ok(true);
    };
    if !objects::is_deleting(&binding) {
        return Ok(true);
    }
    let view = state.catalog.view(cluster);
    let mut resources = Vec::new();
    for br in binding["status"]["boundResources"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let group = br["group"].as_str().unwrap_or_default();
        let resource = br["resource"].as_str().unwrap_or_default();
        for version in br["storageVersions"].as_array().into_iter().flatten() {
            if let Some(r) =
                view.registry
                    .lookup(group, version.as_str().unwrap_or_default(), resource)
            {
                if !resources.iter().any(|x: &Arc<crate::registry::Resource>| {
                    x.prefix(Some(cluster), None) == r.prefix(Some(cluster), None)
                }) {
                    resources.push(r.clone());
                }
            }
        }
    }
    let generic = state.objects()?;
    let own = generic.own(MANAGER);
    for r in &resources {
        for kv in list_all(state.store.as_ref(), &r.prefix(Some(cluster), None))
            .await?
            .0
        {
            let Ok(obj) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&obj) {
                continue;
            }
            // Deleted as a client would: an object with finalizers is marked and waits.
            let place = Place {
                resource: r,
                cluster,
                namespace: obj["metadata"]["namespace"]
                    .as_str()
                    .filter(|_| r.ty.namespaced),
            };
            match own.delete(place, objects::name(&obj)).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let mut remaining = Remaining::default();
    for r in &resources {
        let (items, _) = list_all(state.store.as_ref(), &r.prefix(Some(cluster), None)).await?;
        if items.is_empty() {
            continue;
        }
        remaining
            .by_resource
            .insert(format!("{}.{}", r.gr.resource, r.gr.group), items.len());
        for kv in items {
            if let Ok(obj) = objects::decode_stored(&kv.value) {
                for f in objects::finalizers(&obj) {
                    *remaining.by_finalizer.entry(f).or_default() += 1;
                }
            }
        }
    }
    let condition = remaining.condition();
    let done = condition["status"] == "True";
    record_condition(state, &key, &condition).await?;
    let bindings = state.builtin("apis.kcp.io/v1alpha1/apibindings")?;
    let place = Place::cluster(&bindings, cluster);
    if !done {
        return Ok(false);
    }
    // Nothing is left: the finalizer goes, and with the last one the binding (the generic
    // store removes a deleting object whose last finalizer went).
    let released = own
        .update(place, name, |b| {
            let before = objects::finalizers(b);
            let after: Vec<String> = before.iter().filter(|f| *f != FINALIZER).cloned().collect();
            if after.len() == before.len() {
                return false;
            }
            meta_mut(b).insert("finalizers".into(), json!(after));
            true
        })
        .await?;
    if released.is_some_and(|b| objects::finalizers(&b).is_empty()) {
        reload_cluster_types(state, cluster).await;
    }
    // Gone, or another finalizer holds the binding: whoever owns it lets it go.
    Ok(true)
}

/// Records `condition` on the binding at `key`, unless it says so already. Written to the
/// store as it is: the binding's strategy recomputes its conditions on every write through the
/// generic store, which would drop this one.
async fn record_condition(
    state: &Tenancy,
    key: &str,
    condition: &Value,
) -> Result<(), TenancyError> {
    for _ in 0..8 {
        let Some(kv) = state.store.get(key).await? else {
            return Ok(());
        };
        let Ok(mut b) = objects::decode_stored(&kv.value) else {
            return Ok(());
        };
        let mut conditions: Vec<Value> = b["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let had = conditions.iter().find(|c| c["type"] == CONDITION);
        if had.is_some_and(|h| {
            h["status"] == condition["status"]
                && h["reason"] == condition["reason"]
                && h["message"] == condition["message"]
        }) {
            return Ok(());
        }
        let mut c = condition.clone();
        c["lastTransitionTime"] = json!(objects::now_rfc3339());
        conditions.retain(|c| c["type"] != CONDITION);
        conditions.push(c);
        b["status"]["conditions"] = Value::Array(conditions);
        match state
            .store
            .update(key, kv.mod_revision, objects::encoder(b))
            .await
        {
            Ok(_) => return Ok(()),
            Err(crate::storage::StorageError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_says_what_is_left_as_kcp_says_it() {
        let mut r = Remaining::default();
        assert_eq!(r.condition()["status"], "True");
        r.by_resource.insert("widgets.example.io".into(), 2);
        assert_eq!(r.condition()["reason"], "SomeResourcesRemain");
        assert_eq!(
            r.condition()["message"],
            "Some resources are remaining: widgets.example.io has 2 resource instances"
        );
        r.by_finalizer.insert("example.com/hold".into(), 1);
        assert_eq!(r.condition()["reason"], "SomeFinalizersRemain");
        assert_eq!(
            r.condition()["message"],
            "Some content in the workspace has finalizers remaining: example.com/hold in 1 resource instances"
        );
    }

    #[test]
    fn the_finalizer_is_added_once_and_not_to_a_binding_being_deleted() {
        let mut b = json!({"metadata": {"name": "b", "finalizers": ["other"]}});
        add_finalizer(&mut b);
        add_finalizer(&mut b);
        assert_eq!(b["metadata"]["finalizers"], json!(["other", FINALIZER]));
        let mut deleting =
            json!({"metadata": {"name": "b", "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        add_finalizer(&mut deleting);
        assert!(deleting["metadata"].get("finalizers").is_none());
    }
}
