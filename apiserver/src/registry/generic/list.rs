//! Reading a collection through the generic store: which objects a request selects (label and
//! field selectors, a namespace or a name the key prefix cannot express), and consistent pages
//! of them at one revision with `limit` and continue tokens, as kube-apiserver's
//! `Store.List` reads its storage.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::GenericStore;
use crate::meta::selectors::{FieldSelector, LabelSelector, SelectorError};
use crate::meta::status::ApiError;
use crate::registry::{objects, storage_status, Resource};
use crate::storage::{KeyValue, ListOptions, Revision, StorageError, Store};

/// Page size used when reading the store for a filtered list.
const STORE_PAGE: usize = 500;

/// Which objects of a collection a read selects.
pub struct Selection {
    label: Option<LabelSelector>,
    field: Option<FieldSelector>,
    /// Namespace to keep when the key prefix cannot express it (wildcard cluster).
    namespace: Option<String>,
    /// Single object name (URL name of a watch, or `metadata.name=` field selector).
    name: Option<String>,
}

/// Field selector labels every type supports, plus a few per built-in kind.
fn selectable_fields(resource: &Resource) -> Vec<&'static str> {
    let mut f = vec!["metadata.name", "metadata.namespace"];
    match (resource.ty.group.as_str(), resource.ty.kind.as_str()) {
        ("", "Secret") => f.push("type"),
        ("", "Namespace") => f.push("status.phase"),
        ("", "Event") => f.extend([
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]),
        ("events.k8s.io", "Event") => f.extend([
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ]),
        _ => {}
    }
    f
}

impl Selection {
    /// The objects of `resource` a request selects: those `labels` and `fields` (selector
    /// strings) match, with the `name` of its URL, and in `namespace` when the request reads
    /// across every cluster (`wildcard`), where the key prefix cannot say it.
    pub fn new(
        resource: &Resource,
        wildcard: bool,
        namespace: Option<&str>,
        name: Option<&str>,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Self, ApiError> {
        let label = match labels {
            Some(s) => {
                Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            None => None,
        };
        let field = match fields {
            Some(s) => {
                let f =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let allowed = selectable_fields(resource);
                f.validate_fields(&allowed).map_err(|e| match e {
                    // Built-in kinds with only the metadata fields say it kube-apiserver's way
                    // (its default field label conversion); the others as the error says.
                    SelectorError::UnsupportedField(field)
                        if resource.ty.strategic_merge_patch && allowed.len() == 2 =>
                    {
                        ApiError::bad_request(format!(
                            "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                        ))
                    }
                    e => ApiError::bad_request(e.to_string()),
                })?;
                Some(f)
            }
            None => None,
        };
        let name = name.map(str::to_string).or_else(|| {
            field
                .as_ref()
                .and_then(|f| f.requested_name().map(str::to_string))
        });
        Ok(Selection {
            label,
            field,
            namespace: namespace.filter(|_| wildcard).map(str::to_string),
            name,
        })
    }

    /// Whether the selection can only be decided on the decoded object.
    pub fn needs_object(&self) -> bool {
        self.label.is_some() || self.field.is_some()
    }

    /// Whether a key below the type's prefix (`prefix_len` bytes long) may be selected; the
    /// object decides the rest.
    pub fn matches_key(&self, prefix_len: usize, key: &str) -> bool {
        let rest = key.get(prefix_len..).unwrap_or("");
        let parts: Vec<&str> = rest.split('/').collect();
        let name = parts.last().copied().unwrap_or("");
        if let Some(n) = &self.name {
            if n != name {
                return false;
            }
        }
        if let Some(ns) = &self.namespace {
            // Wildcard keys are `<cluster>/<namespace>/<name>` below the type prefix.
            if parts.len() != 3 || parts[1] != ns {
                return false;
            }
        }
        true
    }

    /// Whether a stored object matches. A label selector alone reads only the object's labels
    /// (skipping the rest of the JSON without building it); a field selector decodes it whole.
    pub fn matches_stored(&self, stored: &[u8]) -> Result<bool, ApiError> {
        if self.field.is_none() {
            if let Some(l) = &self.label {
                #[derive(serde::Deserialize)]
                struct Meta {
                    #[serde(default)]
                    labels: Option<serde_json::Map<String, Value>>,
                }
                #[derive(serde::Deserialize)]
                struct Labels {
                    #[serde(default)]
                    metadata: Option<Meta>,
                }
                let only: Labels = serde_json::from_slice(stored)
                    .map_err(|e| ApiError::internal(format!("stored object: {e}")))?;
                let labels = only.metadata.and_then(|m| m.labels).map(Value::Object);
                return Ok(l.matches(labels.as_ref()));
            }
            return Ok(true);
        }
        Ok(self.matches_object(&objects::decode_stored(stored)?))
    }

    /// Whether a decoded object matches the selectors.
    pub fn matches_object(&self, obj: &Value) -> bool {
        if let Some(l) = &self.label {
            if !l.matches(obj.get("metadata").and_then(|m| m.get("labels"))) {
                return false;
            }
        }
        if let Some(f) = &self.field {
            if !f.matches(obj) {
                return false;
            }
        }
        true
    }
}

/// The opaque continue token: snapshot revision and last key read.
fn encode_continue(rev: Revision, key: &str) -> String {
    let raw = json!({"rv": rev, "start": key}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// Where a continue token resumes: its snapshot revision and the last key read.
pub fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .to_string();
    Ok((rev, start))
}

/// What a read of a collection addresses.
#[derive(Clone, Copy)]
pub struct Collection<'a> {
    /// The type read.
    pub resource: &'a Resource,
    /// One logical cluster, or `None` for every cluster.
    pub cluster: Option<&'a str>,
    /// One namespace, for a namespaced type.
    pub namespace: Option<&'a str>,
    /// The name of the request's URL, which storage errors name.
    pub name: &'a str,
}

impl Collection<'_> {
    /// The storage key prefix of the collection.
    pub fn prefix(&self) -> String {
        self.resource.prefix(self.cluster, self.namespace)
    }

    /// Maps a storage error to the client's Status.
    pub fn status(&self, e: StorageError) -> ApiError {
        storage_status(&self.resource.gr, self.name, e)
    }
}

/// One page of selected objects.
pub struct Page {
    /// The objects, in key order.
    pub items: Vec<KeyValue>,
    /// The revision the page was read at.
    pub revision: Revision,
    /// Where the next page starts, when more objects follow.
    pub continue_token: Option<String>,
}

impl GenericStore {
    /// A page of at most `limit` (0: all) objects of `collection` that `selection` selects,
    /// after the key `start` and at revision `at` (a continue token's, or the latest).
    pub async fn list(
        &self,
        collection: Collection<'_>,
        selection: &Selection,
        limit: usize,
        start: Option<String>,
        at: Option<Revision>,
    ) -> Result<Page, ApiError> {
        let prefix = collection.prefix();
        let type_prefix_len = collection.resource.all_clusters_prefix().len();
        let mut items = Vec::new();
        let mut start_after = start;
        let mut revision = at;
        loop {
            let want = if limit == 0 {
                STORE_PAGE
            } else {
                (limit - items.len()).max(1)
            };
            let page = self
                .store
                .list(ListOptions {
                    prefix: &prefix,
                    start_after: start_after.as_deref(),
                    limit: if selection.needs_object()
                        || selection.namespace.is_some()
                        || selection.name.is_some()
                    {
                        STORE_PAGE.max(want)
                    } else {
                        want
                    },
                    revision,
                })
                .await
                .map_err(|e| collection.status(e))?;
            revision = Some(page.revision);
            let mut last_key = None;
            let mut filled = false;
            for kv in page.items {
                last_key = Some(kv.key.to_string());
                if selection.matches_key(type_prefix_len, &kv.key) {
                    let keep = if selection.needs_object() {
                        selection.matches_stored(&kv.value)?
                    } else {
                        true
                    };
                    if keep {
                        items.push(kv);
                    }
                }
                if limit != 0 && items.len() >= limit {
                    filled = true;
                    break;
                }
            }
            let rev = page.revision;
            if filled {
                // More may follow if the store page had more or we stopped inside it.
                let k = last_key.unwrap_or_default();
                let probe = self
                    .store
                    .list(ListOptions {
                        prefix: &prefix,
                        start_after: Some(&k),
                        limit: 1,
                        revision: Some(rev),
                    })
                    .await
                    .map_err(|e| collection.status(e))?;
                let token = (!probe.items.is_empty()).then(|| encode_continue(rev, &k));
                return Ok(Page {
                    items,
                    revision: rev,
                    continue_token: token,
                });
            }
            if !page.more || last_key.is_none() {
                return Ok(Page {
                    items,
                    revision: rev,
                    continue_token: None,
                });
            }
            start_after = last_key;
        }
    }

    /// Every object of `collection` that `selection` selects, at one revision.
    pub async fn list_all(
        &self,
        collection: Collection<'_>,
        selection: &Selection,
    ) -> Result<(Vec<KeyValue>, Revision), ApiError> {
        let page = self.list(collection, selection, 0, None, None).await?;
        Ok((page.items, page.revision))
    }

    /// Waits briefly for the store to reach `rev`; a client that saw a newer revision
    /// elsewhere (another replica) gets 504 if it never comes.
    pub async fn wait_for_revision(
        &self,
        collection: Collection<'_>,
        rev: Revision,
    ) -> Result<(), ApiError> {
        wait_for(self.store.as_ref(), rev)
            .await
            .map_err(|e| collection.status(e))
    }
}

async fn wait_for(store: &dyn Store, rev: Revision) -> Result<(), StorageError> {
    for _ in 0..30 {
        let current = store.latest_revision().await?;
        if current >= rev {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(StorageError::FutureRevision {
        requested: rev,
        current: store.current_revision(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_round_trip() {
        let t = encode_continue(42, "/core/configmaps/root/default/a");
        assert_eq!(
            decode_continue(&t).ok(),
            Some((42, "/core/configmaps/root/default/a".to_string()))
        );
        assert!(decode_continue("garbage!").is_err());
    }
}
