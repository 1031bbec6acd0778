//! Workspace lifecycle: opaque logical-cluster names, initialization (Scheduling ->
//! Initializing -> Ready with the LogicalCluster), and deleting a cluster with everything below it.

use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{Tenancy, TenancyError, MANAGER};
use crate::registry::objects;
use crate::registry::Place;
use crate::storage::list_all;

use super::{PATH_ANNOTATION, WORKSPACE_FINALIZER};
use crate::request::request_info::ROOT_CLUSTER;

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

/// The annotation kcp keeps a logical cluster's workspace type in.
pub const TYPE_ANNOTATION: &str = "internal.tenancy.kcp.io/type";

pub(super) async fn ensure_logical_cluster(
    state: &Tenancy,
    name: &str,
    path: &str,
    type_ref: &super::TypeRef,
    (initializers, terminators): (&[String], &[String]),
) -> Result<(), TenancyError> {
    let key = super::initializers::logical_cluster_key(name);
    if state.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let res = state.builtin("core.kcp.io/v1alpha1/logicalclusters")?;
    let mut lc = json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
        "metadata": {"name": "cluster", "annotations": {
            PATH_ANNOTATION: path,
            // kcp's record of the workspace type, as `<path>:<name>`.
            TYPE_ANNOTATION: format!(
                "{}:{}",
                if type_ref.path.is_empty() { ROOT_CLUSTER } else { &type_ref.path },
                type_ref.name
            ),
        }},
        "spec": {"type": {"name": type_ref.name, "path": type_ref.path},
                 "initializers": initializers, "terminators": terminators},
        // Initializing until every initializer removed itself (the server's own included).
        "status": {"phase": "Initializing",
            "URL": format!("https://{}/clusters/{path}", state.advertise_address),
            "initializers": initializers, "terminators": terminators},
    });
    super::initializers::set_labels(&mut lc);
    state.note_phase(name, Some(&lc));
    let generic = state.objects()?;
    generic
        .own(MANAGER)
        .create_missing(Place::cluster(&res, name), lc)
        .await?;
    Ok(())
}

/// kcp's `workspace-admin`: the workspace's owner (the user who created it, [`super::OWNER_ANNOTATION`])
/// gets `cluster-admin` in it. The role itself is not written: `cluster-admin` is one of the
/// roles every workspace shares (`auth::bootstrap`), and, as on kcp, not an object of the
/// workspace.
async fn make_owner_admin(state: &Tenancy, child: &str, user: &str) -> Result<(), TenancyError> {
    let bindings = state.builtin("rbac.authorization.k8s.io/v1/clusterrolebindings")?;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "workspace-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    let generic = state.objects()?;
    generic
        .own(MANAGER)
        .create_missing(Place::cluster(&bindings, child), binding)
        .await?;
    Ok(())
}

async fn set_phase(
    state: &Tenancy,
    cluster: &str,
    name: &str,
    phase: &str,
) -> Result<(), TenancyError> {
    let workspaces = state.builtin("tenancy.kcp.io/v1alpha1/workspaces")?;
    let generic = state.objects()?;
    generic
        .own(MANAGER)
        .update(Place::cluster(&workspaces, cluster), name, |ws| {
            if objects::is_deleting(ws) {
                return false;
            }
            ws["status"]["phase"] = json!(phase);
            true
        })
        .await?;
    Ok(())
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
) -> Result<(), TenancyError> {
    set_phase(state, cluster, name, "Initializing").await?;
    let Some(ws) = state
        .store
        .get(&format!("/tenancy.kcp.io/workspaces/{cluster}/{name}"))
        .await?
        .and_then(|kv| objects::decode_stored(&kv.value).ok())
    else {
        return Ok(());
    };
    let type_ref = super::TypeRef::from_json(&ws["spec"]["type"])
        .unwrap_or_else(|| super::TypeRef::new("universal", ""));
    let owner = ws["metadata"]["annotations"][super::OWNER_ANNOTATION]
        .as_str()
        .and_then(owner_identity);
    let (inits, terms) = state.lifecycle_ids(&type_ref).await;
    ensure_logical_cluster(state, child, path, &type_ref, (&inits, &terms)).await?;
    if let Some(owner) = &owner {
        make_owner_admin(state, child, &owner.user).await?;
    }
    finish_default_bindings(state, child, &type_ref, owner.as_ref()).await
}

/// The owner recorded in [`super::OWNER_ANNOTATION`], as the identity kcp binds as.
fn owner_identity(owner: &str) -> Option<crate::request::identity::Identity> {
    let v: Value = serde_json::from_str(owner).ok()?;
    let user = v["username"].as_str().filter(|u| !u.is_empty())?;
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let mut who = crate::request::identity::Identity::new(user, strings(&v["groups"]));
    who.uid = v["uid"].as_str().unwrap_or_default().to_string();
    if let Some(extra) = v["extra"].as_object() {
        who.extra = extra.iter().map(|(k, v)| (k.clone(), strings(v))).collect();
    }
    Some(who)
}

/// Binds the workspace type's default APIs as the workspace's owner (kcp's API binder creates
/// them as the owner, so the owner needs `bind` on each export), then lets the workspace move
/// on. A binding the owner may not make keeps the workspace Initializing with kcp's
/// `APIBindingsInitialized` condition, and is tried again with a growing pause until it works
/// (an administrator granted `bind`) or the workspace is gone.
async fn finish_default_bindings(
    state: &Tenancy,
    child: &str,
    type_ref: &super::TypeRef,
    owner: Option<&crate::request::identity::Identity>,
) -> Result<(), TenancyError> {
    let refused = bind_defaults(state, child, type_ref, owner).await?;
    set_bindings_condition(state, child, &refused).await?;
    if refused.is_empty() {
        return state
            .remove_initializer(child, super::initializers::APIBINDINGS_INITIALIZER)
            .await;
    }
    let (Some(tenancy), Some(owner)) = (state.state(), owner.cloned()) else {
        return Ok(());
    };
    let weak = Arc::downgrade(&tenancy);
    let (child, type_ref) = (child.to_string(), type_ref.clone());
    tokio::spawn(async move {
        let mut pause = std::time::Duration::from_secs(1);
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(60));
            let Some(state) = weak.upgrade() else { return };
            let waiting = match state
                .store
                .get(&super::initializers::logical_cluster_key(&child))
                .await
            {
                Ok(Some(kv)) => objects::decode_stored(&kv.value).ok().is_some_and(|lc| {
                    !objects::is_deleting(&lc)
                        && super::initializers::waiting(
                            &lc,
                            super::initializers::Lifecycle::Initializing,
                        )
                        .iter()
                        .any(|i| i == super::initializers::APIBINDINGS_INITIALIZER)
                }),
                Ok(None) => false,
                Err(_) => true,
            };
            if !waiting {
                return;
            }
            let refused = match bind_defaults(&state, &child, &type_ref, Some(&owner)).await {
                Ok(refused) => refused,
                Err(_) => continue,
            };
            if set_bindings_condition(&state, &child, &refused)
                .await
                .is_err()
            {
                continue;
            }
            if refused.is_empty() {
                if let Err(e) = state
                    .remove_initializer(&child, super::initializers::APIBINDINGS_INITIALIZER)
                    .await
                {
                    tracing::warn!(cluster = %child, error = %e, "finishing the default bindings");
                }
                return;
            }
        }
    });
    Ok(())
}

/// kcp's `APIBindingsInitialized` condition of the LogicalCluster: False with reason
/// `APIBindingErrors` naming each refused binding, True once none is.
async fn set_bindings_condition(
    state: &Tenancy,
    child: &str,
    refused: &[String],
) -> Result<(), TenancyError> {
    let condition = match refused.is_empty() {
        true => json!({"type": "APIBindingsInitialized", "status": "True"}),
        false => json!({"type": "APIBindingsInitialized", "status": "False",
            "reason": "APIBindingErrors", "severity": "Error",
            "message": format!("encountered errors: {}", refused.join(", "))}),
    };
    state
        .update_logical_cluster(child, |lc| {
            let mut conditions: Vec<Value> = lc["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let had = conditions
                .iter()
                .find(|c| c["type"] == "APIBindingsInitialized")
                .cloned();
            if had.as_ref().is_some_and(|h| {
                h["status"] == condition["status"] && h["message"] == condition["message"]
            }) || (had.is_none() && refused.is_empty())
            {
                return false;
            }
            let mut c = condition.clone();
            c["lastTransitionTime"] = json!(objects::now_rfc3339());
            conditions.retain(|c| c["type"] != "APIBindingsInitialized");
            conditions.push(c);
            lc["status"]["conditions"] = Value::Array(conditions);
            true
        })
        .await
        .map(|_| ())
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
    let Ok(workspaces) = state.builtin("tenancy.kcp.io/v1alpha1/workspaces") else {
        return;
    };
    let Ok(generic) = state.objects() else { return };
    let own = generic.own(MANAGER);
    let place = Place::cluster(&workspaces, cluster);
    let released = own
        .update(place, name, |ws| {
            let before = objects::finalizers(ws);
            let mut remaining = before.clone();
            remaining.retain(|f| f != WORKSPACE_FINALIZER);
            if remaining == before {
                return false;
            }
            objects::meta_mut(ws).insert("finalizers".into(), json!(remaining));
            true
        })
        .await;
    if let Err(e) = released {
        tracing::warn!(cluster, workspace = name, error = %e, "releasing a deleted workspace");
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
        let Ok(generic) = state.objects() else { return };
        let view = state.catalog.view(cluster);
        let mut deletes = futures::stream::FuturesUnordered::new();
        for r in view.registry.resources() {
            let Ok((items, _)) =
                list_all(state.store.as_ref(), &r.prefix(Some(cluster), None)).await
            else {
                continue;
            };
            for kv in items {
                let generic = generic.clone();
                deletes.push(async move {
                    let Ok(obj) = objects::decode_stored(&kv.value) else {
                        return;
                    };
                    let namespace = obj["metadata"]["namespace"].as_str();
                    let place = Place {
                        resource: r,
                        cluster,
                        namespace: namespace.filter(|_| r.ty.namespaced),
                    };
                    // Nothing is left to finalize it: it goes with its logical cluster.
                    let _ = generic
                        .own(MANAGER)
                        .remove(place, objects::name(&obj))
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
    owner: Option<&crate::request::identity::Identity>,
) -> Result<Vec<String>, TenancyError> {
    let mut refused = Vec::new();
    let Some(wt) = state.workspace_type_at(state, type_ref).await else {
        return Ok(refused);
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
        return Ok(refused);
    }
    let res = state.builtin("apis.kcp.io/v1alpha1/apibindings")?;
    let generic = state.objects()?;
    for d in defaults {
        let export = d["export"].as_str().unwrap_or("").to_string();
        if export.is_empty() {
            continue;
        }
        // As kcp's API binder, a type's default binding accepts every claim of its export.
        let export_cluster = match d["path"].as_str().filter(|p| !p.is_empty()) {
            None => Some(child.to_string()),
            Some(p) => match state.resolve(crate::request::request_info::ClusterTarget::Name(
                p.to_string(),
            )) {
                Ok(crate::request::request_info::ClusterTarget::Name(c)) => Some(c),
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
        // A workspace without an owner was created by the server itself or by one of its
        // unscoped administrators (the only creators who own nothing, see `prepare_workspace`),
        // as kcp skips the owner for `system:masters`; their choice of type is theirs. Every
        // other creator is the owner, and binds as itself.
        if let Some(owner) = owner {
            if let Err(e) = state
                .check_bind(
                    child,
                    &export,
                    &binding["spec"]["reference"]["export"],
                    owner,
                )
                .await
            {
                refused.push(e.message);
                continue;
            }
        }
        // The binding's strategy completes it (its path, its phase); one it refuses is left
        // out, as before any owner check.
        match generic
            .own(MANAGER)
            .create_missing(Place::cluster(&res, child), binding)
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == 422 || e.code == 403 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    super::reload_cluster_types(state, child).await;
    Ok(refused)
}
