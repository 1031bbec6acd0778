//! Keeping a replica's view of the tenancy in step with writes made through other replicas.
//!
//! Each replica keeps derived state in memory: the workspace tree (paths of logical clusters,
//! from the Workspaces that place them)
//! and the types each logical cluster serves (from its CRDs and APIBindings). The replica that
//! handles a write updates its own view at once; [`follow`] updates every replica's view from
//! the store's watch, so that on a shared etcd any replica serves what another one created.
//! Applying an event twice is harmless: every update re-reads the current state.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::Tenancy;
use super::{reload_cluster_types, workspace_key, WORKSPACES_PREFIX};
use crate::registry::objects;
use crate::storage::{Event, EventType, Revision};

const CRDS: &str = "/apiextensions.k8s.io/customresourcedefinitions/";
const BINDINGS: &str = "/apis.kcp.io/apibindings/";
const EXPORTS: &str = "/apis.kcp.io/apiexports/";
const LOGICAL_CLUSTERS: &str = "/core.kcp.io/logicalclusters/";

/// Follows the store from `after` on, for as long as the state lives.
pub fn follow(state: &Arc<Tenancy>, after: Revision) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(Arc::downgrade(state), after))
}

async fn run(state: Weak<Tenancy>, mut after: Revision) {
    loop {
        let Some(s) = state.upgrade() else { return };
        let mut watches = Vec::new();
        let prefixes = [
            WORKSPACES_PREFIX,
            CRDS,
            BINDINGS,
            EXPORTS,
            LOGICAL_CLUSTERS,
            crate::access::rbac::RBAC_PREFIX,
        ];
        for prefix in prefixes {
            match s.store.watch(prefix, after).await {
                Ok(w) => watches.push(w),
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "tenancy follower: cannot watch");
                    break;
                }
            }
        }
        drop(s);
        if watches.len() == prefixes.len() {
            let mut events = stream::select_all(watches);
            while let Some(item) = events.next().await {
                let Some(s) = state.upgrade() else { return };
                match item {
                    Ok(event) => apply(&s, &event).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "tenancy follower: watch ended; re-reading");
                        break;
                    }
                }
            }
        }
        // Lost the thread: re-read everything from a fresh revision, then follow from there.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(s) = state.upgrade() else { return };
        match s.store.latest_revision().await {
            Ok(rev) => {
                after = rev;
                s.policies.clear();
                if let Err(e) = s.reindex(&s).await {
                    tracing::warn!(error = %e, "tenancy follower: re-reading failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "tenancy follower: store unavailable"),
        }
    }
}

/// The logical cluster segment of a key under `prefix`.
fn cluster_of<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    key.strip_prefix(prefix)?.split('/').next()
}

async fn apply(state: &Tenancy, event: &Event) {
    // The path index follows Workspaces (the server's placement records), never annotations.
    if let Some((parent, name)) = workspace_key(&event.key) {
        let Ok(ws) = objects::decode_stored(&event.value) else {
            return;
        };
        let Some(child) = ws["spec"]["cluster"].as_str().filter(|c| !c.is_empty()) else {
            return;
        };
        if event.kind == EventType::Delete {
            state.forget(child);
            state.namespaces.forget_cluster(child);
        } else if let Some(parent_path) = state.path_of(parent) {
            state.register(&format!("{parent_path}:{name}"), child);
        }
        return;
    }
    // Which workspaces are Ready, as another replica moved them on.
    if let Some(cluster) = cluster_of(&event.key, LOGICAL_CLUSTERS) {
        let lc = objects::decode_stored(&event.value).ok();
        match event.kind {
            EventType::Delete => state.note_phase(cluster, None),
            _ => state.note_phase(cluster, lc.as_ref()),
        }
        return;
    }
    // An export's claims may have changed: the kept claim sets are recomputed when next used.
    if event.key.starts_with(EXPORTS) {
        state.forget_claims();
        return;
    }
    // Another replica's RBAC change ends this replica's kept policy of that workspace.
    state.policies.observe_write(&event.key, event.revision);
    // A binding another replica marked for deletion: what it bound goes (once per replica;
    // the passes are idempotent).
    if let Some(cluster) = cluster_of(&event.key, BINDINGS) {
        if event.kind != EventType::Delete {
            if let Ok(b) = objects::decode_stored(&event.value) {
                if objects::is_deleting(&b) {
                    state.unbind(cluster, objects::name(&b));
                }
            }
        }
    }
    for prefix in [CRDS, BINDINGS] {
        if let Some(cluster) = cluster_of(&event.key, prefix) {
            reload_cluster_types(state, cluster).await;
            return;
        }
    }
}
