//! Workspace lifecycle: opaque logical-cluster names, initialization (Scheduling ->
//! Initializing -> Ready with the LogicalCluster), and deleting a cluster with everything below it.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Tenancy;
use crate::objects::{self, meta_mut};
use crate::storage::list_all;
use crate::storage::StorageError;

use super::{PATH_ANNOTATION, WORKSPACE_FINALIZER};

/// An opaque logical-cluster name for a workspace path (stable, so a re-created workspace of the
/// same path gets the same name only if its path is reused; 16 base-36 characters like kcp's).
pub(super) fn cluster_name_for(path: &str) -> String {
    let digest = Sha256::digest(format!("{path}/{}", uuid::Uuid::new_v4()).as_bytes());
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out: String = digest
        .iter()
        .take(16)
        .map(|b| ALPHABET[(*b as usize) % 36] as char)
        .collect();
    // Start with a letter so the name never looks like a number.
    out.replace_range(0..1, "c");
    out
}

pub(super) async fn ensure_logical_cluster(
    state: &Tenancy,
    name: &str,
    path: &str,
    type_ref: &super::TypeRef,
    (initializers, terminators): (&[String], &[String]),
) -> Result<(), StorageError> {
    let key = format!("/core.kcp.io/logicalclusters/{name}/cluster");
    if state.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let Some(res) = state
        .catalog
        .builtin_view()
        .registry
        .lookup("core.kcp.io", "v1alpha1", "logicalclusters")
        .cloned()
    else {
        return Ok(());
    };
    let mut lc = json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
        "metadata": {"name": "cluster", "annotations": {PATH_ANNOTATION: path}},
        "spec": {"type": {"name": type_ref.name, "path": type_ref.path},
                 "initializers": initializers, "terminators": terminators},
    });
    objects::prepare_for_create(&mut lc, &res, name);
    // Initializing until every initializer removed itself (the server's own included).
    lc["status"] = json!({"phase": "Initializing",
        "URL": format!("https://{}/clusters/{path}", state.advertise_address),
        "initializers": initializers, "terminators": terminators});
    super::initializers::set_labels(&mut lc);
    state.note_phase(name, Some(&lc));
    match state.store.create(&key, objects::encoder(lc)).await {
        Ok(_) | Err(StorageError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// kcp's `workspace-admin`: the workspace's owner (the user who created it, [`super::OWNER_ANNOTATION`])
/// gets `cluster-admin` in it, and the workspace a `cluster-admin` ClusterRole to bind.
async fn make_owner_admin(state: &Tenancy, child: &str, owner: &str) -> Result<(), StorageError> {
    let Some(user) = serde_json::from_str::<Value>(owner)
        .ok()
        .and_then(|o| o["username"].as_str().map(str::to_string))
        .filter(|u| !u.is_empty())
    else {
        return Ok(());
    };
    let view = state.catalog.builtin_view();
    let rbac = |plural: &str| {
        view.registry
            .lookup("rbac.authorization.k8s.io", "v1", plural)
            .cloned()
    };
    let (Some(roles), Some(bindings)) = (rbac("clusterroles"), rbac("clusterrolebindings")) else {
        return Ok(());
    };
    let objects_to_write = [
        (
            &roles,
            "cluster-admin",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "cluster-admin"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                          {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
        ),
        (
            &bindings,
            "workspace-admin",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "workspace-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
        ),
    ];
    for (res, name, mut obj) in objects_to_write {
        let key = format!(
            "/rbac.authorization.k8s.io/{}/{child}/{name}",
            res.ty.plural
        );
        objects::prepare_for_create(&mut obj, res, child);
        match state.store.create(&key, objects::encoder(obj)).await {
            Ok(kv) => state.policies.observe_write(&key, kv.mod_revision),
            Err(StorageError::AlreadyExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn set_phase(
    state: &Tenancy,
    cluster: &str,
    name: &str,
    phase: &str,
) -> Result<(), StorageError> {
    let key = format!("/tenancy.kcp.io/workspaces/{cluster}/{name}");
    super::initializers::update_stored(state.store.as_ref(), &key, |ws| {
        if objects::is_deleting(ws) {
            return false;
        }
        ws["status"]["phase"] = json!(phase);
        true
    })
    .await
    .map(|_| ())
}

/// Scheduling → Initializing → Ready: the logical cluster with its path and the initializers
/// its type chain names; the server binds the default APIs (its own initializer) and the
/// workspace is Ready once no initializer is left.
pub(super) async fn initialize_workspace(
    state: &Tenancy,
    cluster: &str,
    name: &str,
    child: &str,
    path: &str,
) -> Result<(), StorageError> {
    set_phase(state, cluster, name, "Initializing").await?;
    let type_ref = match state
        .store
        .get(&format!("/tenancy.kcp.io/workspaces/{cluster}/{name}"))
        .await?
    {
        Some(kv) => objects::decode_stored(&kv.value)
            .ok()
            .and_then(|v| super::TypeRef::from_json(&v["spec"]["type"]))
            .unwrap_or_else(|| super::TypeRef::new("universal", "")),
        None => return Ok(()),
    };
    let owner = match state
        .store
        .get(&format!("/tenancy.kcp.io/workspaces/{cluster}/{name}"))
        .await?
    {
        Some(kv) => objects::decode_stored(&kv.value).ok().and_then(|v| {
            v["metadata"]["annotations"][super::OWNER_ANNOTATION]
                .as_str()
                .map(str::to_string)
        }),
        None => None,
    };
    let (inits, terms) = state.lifecycle_ids(&type_ref).await;
    ensure_logical_cluster(state, child, path, &type_ref, (&inits, &terms)).await?;
    if let Some(owner) = owner {
        make_owner_admin(state, child, &owner).await?;
    }
    bind_defaults(state, child, &type_ref).await?;
    state
        .remove_initializer(child, super::initializers::APIBINDINGS_INITIALIZER)
        .await
}

/// Deletes everything in logical cluster `child` (child workspaces first), then lets the
/// Workspace go by removing its finalizer.
pub(super) async fn finish_workspace_deletion(
    state: &Tenancy,
    cluster: &str,
    name: &str,
    child: &str,
) {
    if !child.is_empty() {
        // Terminators first: the logical cluster is marked deleting and waits for each of them
        // to remove its name (through the terminating virtual workspace).
        match state.await_terminators(child).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(cluster = child, error = %e, "marking a workspace for its terminators");
                return;
            }
        }
        delete_cluster(state, child).await;
    }
    let key = format!("/tenancy.kcp.io/workspaces/{cluster}/{name}");
    for _ in 0..8 {
        let Ok(Some(kv)) = state.store.get(&key).await else {
            return;
        };
        let Ok(ws) = objects::decode_stored(&kv.value) else {
            return;
        };
        let mut remaining = objects::finalizers(&ws);
        remaining.retain(|f| f != WORKSPACE_FINALIZER);
        let result = if remaining.is_empty() {
            state
                .store
                .delete(&key, kv.mod_revision, objects::encoder(ws))
                .await
                .map(|_| ())
        } else {
            let mut ws = ws;
            meta_mut(&mut ws).insert("finalizers".into(), json!(remaining));
            state
                .store
                .update(&key, kv.mod_revision, objects::encoder(ws))
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => return,
            Err(StorageError::Conflict { .. }) => continue,
            Err(_) => return,
        }
    }
}

/// Removes every object of a logical cluster and of the workspaces below it.
pub fn delete_cluster<'a>(
    state: &'a Tenancy,
    cluster: &'a str,
) -> futures::future::BoxFuture<'a, ()> {
    Box::pin(async move {
        // Children first, many at a time, so group commit batches their deletes.
        if let Ok((children, _)) = list_all(
            state.store.as_ref(),
            &format!("/tenancy.kcp.io/workspaces/{cluster}/"),
        )
        .await
        {
            let mut pending = futures::stream::FuturesUnordered::new();
            for kv in children {
                let Ok(ws) = objects::decode_stored(&kv.value) else {
                    continue;
                };
                let child = ws["spec"]["cluster"].as_str().unwrap_or("").to_string();
                pending.push(async move {
                    if !child.is_empty() {
                        delete_cluster(state, &child).await;
                    }
                });
                if pending.len() >= 64 {
                    use futures::StreamExt;
                    pending.next().await;
                }
            }
            use futures::StreamExt;
            while pending.next().await.is_some() {}
        }
        let view = state.catalog.view(cluster);
        let mut deletes = futures::stream::FuturesUnordered::new();
        for r in view.registry.resources() {
            let Ok((items, _)) =
                list_all(state.store.as_ref(), &r.prefix(Some(cluster), None)).await
            else {
                continue;
            };
            for kv in items {
                deletes.push(async move {
                    // Watchers see the final state at the deletion revision.
                    let Ok(obj) = objects::decode_stored(&kv.value) else {
                        return;
                    };
                    let _ = state
                        .store
                        .delete(&kv.key, kv.mod_revision, objects::encoder(obj))
                        .await;
                });
            }
        }
        use futures::StreamExt;
        while deletes.next().await.is_some() {}
        state.catalog.set_cluster_resources(cluster, Vec::new());
        state.forget(cluster);
        state.namespaces.forget_cluster(cluster);
    })
}

/// Creates the APIBindings (`spec.defaultAPIBindings`) of a workspace's type and of every type
/// it extends.
async fn bind_defaults(
    state: &Tenancy,
    child: &str,
    type_ref: &super::TypeRef,
) -> Result<(), StorageError> {
    let Some(wt) = state.workspace_type_at(state, type_ref).await else {
        return Ok(());
    };
    let mut defaults: Vec<serde_json::Value> = Vec::new();
    for (_, t) in state.extended(state, type_ref, &wt).await {
        for d in t["spec"]["defaultAPIBindings"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if !defaults.iter().any(|x| x["export"] == d["export"]) {
                defaults.push(d.clone());
            }
        }
    }
    if defaults.is_empty() {
        return Ok(());
    }
    let Some(res) = state
        .catalog
        .builtin_view()
        .registry
        .lookup("apis.kcp.io", "v1alpha1", "apibindings")
        .cloned()
    else {
        return Ok(());
    };
    for d in defaults {
        let export = d["export"].as_str().unwrap_or("").to_string();
        if export.is_empty() {
            continue;
        }
        // As kcp's API binder, a type's default binding accepts every claim of its export.
        let export_cluster = match d["path"].as_str().filter(|p| !p.is_empty()) {
            None => Some(child.to_string()),
            Some(p) => match state.resolve(crate::request_info::ClusterTarget::Name(p.to_string()))
            {
                Ok(crate::request_info::ClusterTarget::Name(c)) => Some(c),
                _ => None,
            },
        };
        let claims = match export_cluster {
            Some(c) => match state
                .store
                .get(&format!("/apis.kcp.io/apiexports/{c}/{export}"))
                .await?
            {
                Some(kv) => objects::decode_stored(&kv.value)
                    .map(|e| super::claims::default_acceptance(&e))
                    .unwrap_or_default(),
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        let mut binding = json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": export},
            "spec": {"reference": {"export": {"path": d["path"], "name": export}}},
        });
        if !claims.is_empty() {
            binding["spec"]["permissionClaims"] = Value::Array(claims);
        }
        objects::prepare_for_create(&mut binding, &res, child);
        if state
            .prepare_binding_write(child, &mut binding, None, None)
            .await
            .is_err()
        {
            continue;
        }
        match state
            .store
            .create(&res.key(child, None, &export), objects::encoder(binding))
            .await
        {
            Ok(_) | Err(StorageError::AlreadyExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    super::reload_cluster_types(state, child).await;
    Ok(())
}
