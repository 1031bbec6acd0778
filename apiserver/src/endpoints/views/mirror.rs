//! Extension mode's copy of what the views are computed from: the objects a reader of the
//! upstream kcp delivers are written into this server's store under the keys its own objects
//! would have, so the views compute over them unchanged. Each object keeps its kcp fields; its
//! `resourceVersion` becomes this store's revision (the views' resourceVersions are this
//! server's own).

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use crate::registry::objects;
use crate::storage::{list_all, StorageError, Store};

/// The kinds of objects the views are computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// `ui.platform-mesh.io` ContentConfigurations (bound from the core export).
    ContentConfigurations,
    /// `ui.platform-mesh.io` ProviderMetadata (bound from the core export).
    ProviderMetadata,
    /// `apis.kcp.io` APIBindings.
    ApiBindings,
    /// `apis.kcp.io` APIExports.
    ApiExports,
}

impl SourceKind {
    /// Group, version and plural, as kcp serves them.
    pub fn resource(self) -> (&'static str, &'static str, &'static str) {
        match self {
            SourceKind::ContentConfigurations => {
                ("ui.platform-mesh.io", "v1alpha1", "contentconfigurations")
            }
            SourceKind::ProviderMetadata => {
                ("ui.platform-mesh.io", "v1alpha1", "providermetadatas")
            }
            SourceKind::ApiBindings => ("apis.kcp.io", "v1alpha1", "apibindings"),
            SourceKind::ApiExports => ("apis.kcp.io", "v1alpha1", "apiexports"),
        }
    }

    /// The kind, for clients that need it.
    pub fn kind(self) -> &'static str {
        match self {
            SourceKind::ContentConfigurations => "ContentConfiguration",
            SourceKind::ProviderMetadata => "ProviderMetadata",
            SourceKind::ApiBindings => "APIBinding",
            SourceKind::ApiExports => "APIExport",
        }
    }
}

/// Why a mirrored object was not written.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The object has no usable name or logical cluster.
    #[error("a {kind} without a usable {what}: {value:?}")]
    Unkeyed {
        /// The kind of object.
        kind: &'static str,
        /// `name` or `logical cluster`.
        what: &'static str,
        /// What it had instead.
        value: String,
    },
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Writes mirrored objects into the store the views read.
pub struct Mirror {
    store: Arc<dyn Store>,
    /// The core export's identity, which names its resources' storage.
    identity: String,
}

/// A name or logical cluster that can be part of a key.
fn usable(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && !s.contains('/') && s != "*"
}

impl Mirror {
    /// A mirror into `store`, for the core export of identity `identity`.
    pub fn new(store: Arc<dyn Store>, identity: impl Into<String>) -> Self {
        Mirror {
            store,
            identity: identity.into(),
        }
    }

    /// Where objects of `kind` live in the store (every cluster).
    fn prefix(&self, kind: SourceKind) -> String {
        let (group, _, plural) = kind.resource();
        match kind {
            SourceKind::ContentConfigurations | SourceKind::ProviderMetadata => {
                format!("/{group}/{plural}:{}/", self.identity)
            }
            SourceKind::ApiBindings | SourceKind::ApiExports => format!("/{group}/{plural}/"),
        }
    }

    fn cluster_prefix(&self, kind: SourceKind, cluster: &str) -> Result<String, MirrorError> {
        if !usable(cluster) {
            return Err(MirrorError::Unkeyed {
                kind: kind.kind(),
                what: "logical cluster",
                value: cluster.into(),
            });
        }
        Ok(format!("{}{cluster}/", self.prefix(kind)))
    }

    /// Writes one object of logical cluster `cluster` (kept as it is when unchanged).
    pub async fn put(
        &self,
        kind: SourceKind,
        cluster: &str,
        mut obj: Value,
    ) -> Result<(), MirrorError> {
        let name = objects::name(&obj).to_string();
        if !usable(&name) {
            return Err(MirrorError::Unkeyed {
                kind: kind.kind(),
                what: "name",
                value: name,
            });
        }
        let key = format!("{}{name}", self.cluster_prefix(kind, cluster)?);
        let meta = objects::meta_mut(&mut obj);
        meta.remove("managedFields");
        meta.remove("resourceVersion");
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert("kcp.io/cluster".into(), Value::String(cluster.into()));
        }
        loop {
            let result = match self.store.get(&key).await? {
                None => self
                    .store
                    .create(&key, objects::encoder(obj.clone()))
                    .await
                    .map(drop),
                Some(kv) => {
                    let unchanged = objects::decode_stored(&kv.value)
                        .is_ok_and(|old| objects::same_object(&old, &obj));
                    if unchanged {
                        return Ok(());
                    }
                    self.store
                        .update(&key, kv.mod_revision, objects::encoder(obj.clone()))
                        .await
                        .map(drop)
                }
            };
            match result {
                Err(StorageError::Conflict { .. } | StorageError::AlreadyExists(_)) => continue,
                other => return Ok(other?),
            }
        }
    }

    /// Removes one object.
    pub async fn remove(
        &self,
        kind: SourceKind,
        cluster: &str,
        name: &str,
    ) -> Result<(), MirrorError> {
        let key = format!("{}{name}", self.cluster_prefix(kind, cluster)?);
        self.remove_key(&key).await
    }

    async fn remove_key(&self, key: &str) -> Result<(), MirrorError> {
        loop {
            let Some(kv) = self.store.get(key).await? else {
                return Ok(());
            };
            let old = objects::decode_stored(&kv.value).unwrap_or(Value::Null);
            match self
                .store
                .delete(key, kv.mod_revision, objects::encoder(old))
                .await
            {
                Ok(_) | Err(StorageError::NotFound(_)) => return Ok(()),
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Makes the objects of `kind` (of logical cluster `cluster`, or of every cluster) exactly
    /// `objects`: a fresh list from kcp, after which nothing listed before may linger.
    pub async fn replace(
        &self,
        kind: SourceKind,
        cluster: Option<&str>,
        listed: Vec<(String, Value)>,
    ) -> Result<(), MirrorError> {
        let prefix = match cluster {
            Some(c) => self.cluster_prefix(kind, c)?,
            None => self.prefix(kind),
        };
        let mut keep = HashSet::new();
        for (c, obj) in listed {
            let name = objects::name(&obj).to_string();
            match self.put(kind, &c, obj).await {
                Ok(()) => {
                    keep.insert(format!("{}{name}", self.cluster_prefix(kind, &c)?));
                }
                Err(e @ MirrorError::Unkeyed { .. }) => {
                    tracing::warn!(error = %e, "not mirrored");
                }
                Err(e) => return Err(e),
            }
        }
        let (present, _) = list_all(self.store.as_ref(), &prefix).await?;
        for kv in present {
            if !keep.contains(kv.key.as_ref()) {
                self.remove_key(&kv.key).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryStore;
    use serde_json::json;

    fn cc(name: &str) -> Value {
        json!({"apiVersion": "ui.platform-mesh.io/v1alpha1", "kind": "ContentConfiguration",
               "metadata": {"name": name, "resourceVersion": "77", "managedFields": [{}]},
               "status": {"configurationResult": "{}"}})
    }

    #[tokio::test]
    async fn objects_land_under_the_keys_the_views_read() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let m = Mirror::new(store.clone(), "abc");
        m.put(SourceKind::ContentConfigurations, "c1", cc("a"))
            .await
            .unwrap();
        let kv = store
            .get("/ui.platform-mesh.io/contentconfigurations:abc/c1/a")
            .await
            .unwrap()
            .expect("mirrored");
        let stored = objects::decode_stored(&kv.value).unwrap();
        assert_eq!(stored["metadata"]["annotations"]["kcp.io/cluster"], "c1");
        assert!(stored["metadata"].get("managedFields").is_none());
        assert_eq!(
            stored["metadata"]["resourceVersion"],
            kv.mod_revision.to_string()
        );
        // Unchanged: no write.
        let before = store.current_revision();
        m.put(SourceKind::ContentConfigurations, "c1", cc("a"))
            .await
            .unwrap();
        assert_eq!(store.current_revision(), before);
        // A fresh list replaces what was there.
        m.put(SourceKind::ContentConfigurations, "c2", cc("b"))
            .await
            .unwrap();
        m.replace(
            SourceKind::ContentConfigurations,
            None,
            vec![("c2".into(), cc("b")), ("c3".into(), cc("c"))],
        )
        .await
        .unwrap();
        let (all, _) = list_all(store.as_ref(), "/ui.platform-mesh.io/")
            .await
            .unwrap();
        let keys: Vec<&str> = all.iter().map(|kv| kv.key.as_ref()).collect();
        assert_eq!(
            keys,
            [
                "/ui.platform-mesh.io/contentconfigurations:abc/c2/b",
                "/ui.platform-mesh.io/contentconfigurations:abc/c3/c"
            ]
        );
        m.remove(SourceKind::ContentConfigurations, "c3", "c")
            .await
            .unwrap();
        assert!(m
            .put(SourceKind::ApiBindings, "a/b", cc("x"))
            .await
            .is_err());
        assert!(m.put(SourceKind::ApiBindings, "*", cc("x")).await.is_err());
    }
}
