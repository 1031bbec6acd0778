//! The contents of each view, computed at one store revision by upstream's rules.
//!
//! ContentConfigurations of workspace C (entity type E from C's parent):
//! 1. C's own ContentConfigurations that carry no content-for label;
//! 2. for every APIBinding of C, those of the export's workspace labelled content-for=<export
//!    name> and entity=E;
//! 3. those of the provider workspace labelled entity=E;
//!
//! and of all these only the ones with `status.configurationResult`. Upstream concatenates the
//! three lists; a store holds one object per name, so here the first source to name an object
//! wins (local, then exports, then the provider workspace).
//!
//! MarketplaceEntries of workspace C: one per ProviderMetadata P and APIExport X labelled
//! content-for=<P's name> with a non-empty `spec.latestResourceSchemas`, both in workspaces bound
//! to the core export, named `<X>-<P>`; `spec.apiBindingName` names C's binding to X when C has
//! one (same export name, the export's workspace as `status.apiExportClusterName`).

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};
use sha2::Digest;

use super::{CoreExport, ViewKind, Views};
use crate::objects;
use crate::storage::{key_cluster, KeyValue, ListOptions, Revision, StorageError, Store};

/// One computed object and the newest revision of what it was made from.
pub(super) struct Computed {
    /// The object as served.
    pub value: Value,
    /// The newest mod revision of its sources.
    pub revision: Revision,
}

/// A view's objects by name.
pub(super) type Contents = BTreeMap<String, Computed>;

const LIST_PAGE: usize = 500;

/// Every key under `prefix` at revision `at`.
async fn list_at(
    store: &dyn Store,
    prefix: &str,
    at: Revision,
) -> Result<Vec<KeyValue>, StorageError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(ListOptions {
                prefix,
                start_after: after.as_deref(),
                limit: LIST_PAGE,
                revision: Some(at),
            })
            .await?;
        after = page.items.last().map(|kv| kv.key.to_string());
        out.extend(page.items);
        if !page.more || after.is_none() {
            return Ok(out);
        }
    }
}

/// The decoded objects under `prefix` at `at`, with their mod revisions and clusters.
async fn objects_at(
    store: &dyn Store,
    prefix: &str,
    at: Revision,
) -> Result<Vec<(String, Value, Revision)>, StorageError> {
    Ok(list_at(store, prefix, at)
        .await?
        .into_iter()
        .filter_map(|kv| {
            let cluster = key_cluster(&kv.key)?.to_string();
            let v = objects::decode_stored(&kv.value).ok()?;
            Some((cluster, v, kv.mod_revision))
        })
        .collect())
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["labels"][key].as_str()
}

/// Adds `value` under its name unless an earlier source already named it.
fn insert_first(out: &mut Contents, value: Value, revision: Revision) {
    let name = objects::name(&value).to_string();
    out.entry(name).or_insert(Computed { value, revision });
}

/// A deterministic uid for a computed object, so clients see one identity per entry.
fn computed_uid(cluster: &str, name: &str) -> String {
    let d = sha2::Sha256::digest(format!("marketplace/{cluster}/{name}").as_bytes());
    let h: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// An object embedded in an entry: without its managed fields, as upstream embeds them.
fn embedded(mut v: Value) -> Value {
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    v
}

impl Views {
    /// The contents of view `kind` for logical cluster `cluster` at revision `at`.
    pub(super) async fn compute(
        &self,
        kind: ViewKind,
        cluster: &str,
        at: Revision,
    ) -> Result<Contents, StorageError> {
        let core = self
            .core()
            .await
            .map_err(|e| StorageError::Backend(e.message))?;
        match kind {
            ViewKind::ContentConfigurations => self.content(&core, cluster, at).await,
            ViewKind::Marketplace => self.marketplace(&core, cluster, at).await,
        }
    }

    async fn content(
        &self,
        core: &CoreExport,
        cluster: &str,
        at: Revision,
    ) -> Result<Contents, StorageError> {
        let store = self.store.as_ref();
        let o = &self.options;
        let mut out = Contents::new();
        let Some(entity) = self.entity_type(cluster).map(str::to_string) else {
            return Ok(out);
        };
        let all = core.prefix("ui.platform-mesh.io", "contentconfigurations");
        let in_cluster = |c: &str| format!("{all}{c}/");
        let has_result = |v: &Value| {
            v["status"]
                .get("configurationResult")
                .is_some_and(|r| !r.is_null())
        };
        for (_, v, rev) in objects_at(store, &in_cluster(cluster), at).await? {
            if label(&v, &o.content_for_label).is_none() && has_result(&v) {
                insert_first(&mut out, v, rev);
            }
        }
        let bindings =
            objects_at(store, &format!("/apis.kcp.io/apibindings/{cluster}/"), at).await?;
        for (_, b, _) in bindings {
            let Some(export_cluster) = b["status"]["apiExportClusterName"]
                .as_str()
                .filter(|c| !c.is_empty())
            else {
                continue;
            };
            let export = b["spec"]["reference"]["export"]["name"]
                .as_str()
                .unwrap_or_default();
            for (_, v, rev) in objects_at(store, &in_cluster(export_cluster), at).await? {
                if label(&v, &o.content_for_label) == Some(export)
                    && label(&v, &o.entity_label) == Some(entity.as_str())
                    && has_result(&v)
                {
                    insert_first(&mut out, v, rev);
                }
            }
        }
        for (_, v, rev) in objects_at(store, &in_cluster(&core.cluster), at).await? {
            if label(&v, &o.entity_label) == Some(entity.as_str()) && has_result(&v) {
                insert_first(&mut out, v, rev);
            }
        }
        Ok(out)
    }

    async fn marketplace(
        &self,
        core: &CoreExport,
        cluster: &str,
        at: Revision,
    ) -> Result<Contents, StorageError> {
        let store = self.store.as_ref();
        let o = &self.options;
        let bindings = objects_at(store, "/apis.kcp.io/apibindings/", at).await?;
        // The workspaces the core export reaches.
        let engaged: HashSet<&str> = bindings
            .iter()
            .filter(|(_, b, _)| {
                b["status"]["phase"] == "Bound"
                    && b["status"]["apiExportClusterName"] == core.cluster.as_str()
                    && b["spec"]["reference"]["export"]["name"] == o.core_export.as_str()
            })
            .map(|(c, _, _)| c.as_str())
            .collect();
        let own: Vec<&(String, Value, Revision)> =
            bindings.iter().filter(|(c, _, _)| c == cluster).collect();
        let providers = objects_at(
            store,
            &core.prefix("ui.platform-mesh.io", "providermetadatas"),
            at,
        )
        .await?;
        let exports: Vec<(String, Value, Revision)> =
            objects_at(store, "/apis.kcp.io/apiexports/", at)
                .await?
                .into_iter()
                .filter(|(c, x, _)| {
                    engaged.contains(c.as_str())
                        && x["spec"]["latestResourceSchemas"]
                            .as_array()
                            .is_some_and(|s| !s.is_empty())
                })
                .collect();
        let mut out = Contents::new();
        for (pm_cluster, pm, pm_rev) in &providers {
            if !engaged.contains(pm_cluster.as_str()) {
                continue;
            }
            let pm_name = objects::name(pm);
            for (x_cluster, x, x_rev) in exports
                .iter()
                .filter(|(_, x, _)| label(x, &o.content_for_label) == Some(pm_name))
            {
                let x_name = objects::name(x);
                let installed = own.iter().find(|(_, b, _)| {
                    b["spec"]["reference"]["export"]["name"] == x_name
                        && b["status"]["apiExportClusterName"] == x_cluster.as_str()
                });
                let name = format!("{x_name}-{pm_name}");
                let created = [pm, x]
                    .iter()
                    .filter_map(|v| objects::meta_str(v, "creationTimestamp"))
                    .max()
                    .unwrap_or_default()
                    .to_string();
                let mut spec = json!({
                    "providerMetadata": embedded(pm.clone()),
                    "apiExport": embedded(x.clone()),
                });
                let mut revision = (*pm_rev).max(*x_rev);
                if let Some((_, b, b_rev)) = installed {
                    spec["apiBindingName"] = json!(objects::name(b));
                    revision = revision.max(*b_rev);
                }
                let value = json!({
                    "apiVersion": "marketplace.platform-mesh.io/v1alpha1",
                    "kind": "MarketplaceEntry",
                    "metadata": {
                        "name": name,
                        "uid": computed_uid(cluster, &name),
                        "creationTimestamp": created,
                    },
                    "spec": spec,
                    "status": {},
                });
                insert_first(&mut out, value, revision);
            }
        }
        Ok(out)
    }
}
