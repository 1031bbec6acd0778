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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use sha2::Digest;

use super::{CoreExport, ViewKind, Views};
use crate::registry::objects;
use crate::storage::{key_cluster, ListOptions, Revision, StorageError};

/// One computed object, encoded, and the newest revision of what it was made from (its
/// resourceVersion).
pub(super) struct Computed {
    /// The object as served, with its resourceVersion.
    pub value: Bytes,
    /// The newest mod revision of its sources.
    pub revision: Revision,
}

/// A view's objects by name.
pub(super) type Contents = BTreeMap<String, Computed>;

const LIST_PAGE: usize = 500;

/// What a view needs of one stored object, read once per revision of it: the views are
/// computed again after every change of their sources, and most sources did not change.
pub(super) struct Summary {
    name: String,
    content_for: Option<String>,
    entity: Option<String>,
    created: String,
    /// ContentConfigurations: whether `status.configurationResult` is set.
    rendered: bool,
    /// APIExports: whether `spec.latestResourceSchemas` lists a schema.
    has_schemas: bool,
    /// APIBindings: the export's name, the export's workspace, and whether it is Bound.
    export_name: String,
    export_cluster: String,
    bound: bool,
    /// ProviderMetadata and APIExports: the object as an entry embeds it.
    embedded: String,
}

impl Summary {
    fn of(bytes: &[u8], o: &super::ViewOptions, embed: bool) -> Option<Summary> {
        let mut v = objects::decode_stored(bytes).ok()?;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let label = |key: &str| v["metadata"]["labels"][key].as_str().map(str::to_string);
        let mut s = Summary {
            name: objects::name(&v).to_string(),
            content_for: label(&o.content_for_label),
            entity: label(&o.entity_label),
            created: text(&v["metadata"]["creationTimestamp"]),
            rendered: v["status"]
                .get("configurationResult")
                .is_some_and(|r| !r.is_null()),
            has_schemas: v["spec"]["latestResourceSchemas"]
                .as_array()
                .is_some_and(|s| !s.is_empty()),
            export_name: text(&v["spec"]["reference"]["export"]["name"]),
            export_cluster: text(&v["status"]["apiExportClusterName"]),
            bound: v["status"]["phase"] == "Bound",
            embedded: String::new(),
        };
        if embed {
            // Embedded without its managed fields, as upstream embeds it.
            if let Some(m) = v["metadata"].as_object_mut() {
                m.remove("managedFields");
            }
            s.embedded = serde_json::to_string(&v).unwrap_or_else(|_| "{}".into());
        }
        Some(s)
    }

    fn bytes(&self) -> usize {
        self.name.len() + self.created.len() + self.embedded.len() + 256
    }
}

/// Summaries by storage key, with the revision they were read at; dropped whole beyond
/// [`SUMMARY_BYTES`].
#[derive(Default)]
pub(super) struct Summaries {
    by_key: HashMap<Arc<str>, (Revision, Arc<Summary>)>,
    bytes: usize,
}

/// The most memory the summaries may take.
const SUMMARY_BYTES: usize = 64 * 1024 * 1024;

/// One stored object read for a view.
struct Source {
    cluster: String,
    summary: Arc<Summary>,
    revision: Revision,
    stored: Bytes,
}

impl Views {
    /// The objects under `prefix` at revision `at`, summarized (`embed`: with the JSON an entry
    /// embeds).
    async fn objects_at(
        &self,
        prefix: &str,
        at: Revision,
        embed: bool,
    ) -> Result<Vec<Source>, StorageError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .list(ListOptions {
                    prefix,
                    start_after: after.as_deref(),
                    limit: LIST_PAGE,
                    revision: Some(at),
                })
                .await?;
            after = page.items.last().map(|kv| kv.key.to_string());
            let known: Vec<Option<Arc<Summary>>> = match self.summaries.lock() {
                Ok(cache) => page
                    .items
                    .iter()
                    .map(|kv| {
                        cache
                            .by_key
                            .get(&kv.key)
                            .filter(|(rev, _)| *rev == kv.mod_revision)
                            .map(|(_, s)| s.clone())
                    })
                    .collect(),
                Err(_) => vec![None; page.items.len()],
            };
            let mut fresh = Vec::new();
            for (kv, known) in page.items.into_iter().zip(known) {
                let Some(cluster) = key_cluster(&kv.key).map(str::to_string) else {
                    continue;
                };
                let summary = match known {
                    Some(s) => s,
                    None => {
                        let Some(s) = Summary::of(&kv.value, &self.options, embed) else {
                            continue;
                        };
                        let s = Arc::new(s);
                        fresh.push((kv.key.clone(), kv.mod_revision, s.clone()));
                        s
                    }
                };
                out.push(Source {
                    cluster,
                    summary,
                    revision: kv.mod_revision,
                    stored: kv.value,
                });
            }
            if !fresh.is_empty() {
                if let Ok(mut cache) = self.summaries.lock() {
                    for (key, rev, s) in fresh {
                        cache.bytes += s.bytes() + key.len();
                        if cache.bytes > SUMMARY_BYTES {
                            cache.by_key.clear();
                            cache.bytes = s.bytes() + key.len();
                        }
                        cache.by_key.insert(key, (rev, s));
                    }
                }
            }
            if !page.more || after.is_none() {
                return Ok(out);
            }
        }
    }
}

/// Adds a stored object under its name unless an earlier source already named it.
fn insert_first(out: &mut Contents, source: &Source) {
    out.entry(source.summary.name.clone())
        .or_insert_with(|| Computed {
            value: source.stored.clone(),
            revision: source.revision,
        });
}

/// A deterministic uid for a computed object, so clients see one identity per entry.
fn computed_uid(cluster: &str, name: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hasher = sha2::Sha256::new();
    for part in ["marketplace/", cluster, "/", name] {
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(36);
    for (i, b) in digest.iter().take(16).enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
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
        let mut out = Contents::new();
        let Some(entity) = self.entity_type(cluster).map(str::to_string) else {
            return Ok(out);
        };
        let entity = Some(entity);
        let all = core.prefix("ui.platform-mesh.io", "contentconfigurations");
        let in_cluster = |c: &str| format!("{all}{c}/");
        for s in self.objects_at(&in_cluster(cluster), at, false).await? {
            if s.summary.content_for.is_none() && s.summary.rendered {
                insert_first(&mut out, &s);
            }
        }
        // The exports C bound, by the workspace they live in: each workspace is read once.
        let mut bound: BTreeMap<String, HashSet<String>> = BTreeMap::new();
        let bindings = self
            .objects_at(&format!("/apis.kcp.io/apibindings/{cluster}/"), at, false)
            .await?;
        for b in &bindings {
            if b.summary.export_cluster.is_empty() {
                continue;
            }
            bound
                .entry(b.summary.export_cluster.clone())
                .or_default()
                .insert(b.summary.export_name.clone());
        }
        for (export_cluster, exports) in &bound {
            for s in self
                .objects_at(&in_cluster(export_cluster), at, false)
                .await?
            {
                let c = &s.summary;
                if c.content_for.as_ref().is_some_and(|x| exports.contains(x))
                    && c.entity == entity
                    && c.rendered
                {
                    insert_first(&mut out, &s);
                }
            }
        }
        for s in self
            .objects_at(&in_cluster(&core.cluster), at, false)
            .await?
        {
            if s.summary.entity == entity && s.summary.rendered {
                insert_first(&mut out, &s);
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
        let o = &self.options;
        let bindings = self
            .objects_at("/apis.kcp.io/apibindings/", at, false)
            .await?;
        // The workspaces the core export reaches.
        let engaged: HashSet<&str> = bindings
            .iter()
            .filter(|b| {
                b.summary.bound
                    && b.summary.export_cluster == core.cluster
                    && b.summary.export_name == o.core_export
            })
            .map(|b| b.cluster.as_str())
            .collect();
        let own: Vec<&Source> = bindings.iter().filter(|b| b.cluster == cluster).collect();
        let providers = self
            .objects_at(
                &core.prefix("ui.platform-mesh.io", "providermetadatas"),
                at,
                true,
            )
            .await?;
        let exports = self
            .objects_at("/apis.kcp.io/apiexports/", at, true)
            .await?;
        // Exports by the provider they are offered by.
        let mut offered: HashMap<&str, Vec<&Source>> = HashMap::new();
        for x in &exports {
            if !engaged.contains(x.cluster.as_str()) || !x.summary.has_schemas {
                continue;
            }
            if let Some(provider) = x.summary.content_for.as_deref() {
                offered.entry(provider).or_default().push(x);
            }
        }
        // Entries whose sources did not change since the last computation for this workspace
        // are taken as they were.
        let mut before = self
            .entries
            .lock()
            .ok()
            .and_then(|mut e| e.take(cluster))
            .unwrap_or_default();
        let mut kept = Entries::new();
        let mut out = Contents::new();
        for pm in providers
            .iter()
            .filter(|p| engaged.contains(p.cluster.as_str()))
        {
            let p = &pm.summary;
            let Some(offers) = offered.get(p.name.as_str()) else {
                continue;
            };
            for x in offers {
                let name = format!("{}-{}", x.summary.name, p.name);
                if out.contains_key(&name) {
                    continue;
                }
                let installed = own.iter().find(|b| {
                    b.summary.export_name == x.summary.name && b.summary.export_cluster == x.cluster
                });
                let sources = (
                    pm.revision,
                    x.revision,
                    installed.map(|b| (b.revision, b.summary.name.clone())),
                );
                let revision = pm
                    .revision
                    .max(x.revision)
                    .max(installed.map_or(0, |b| b.revision));
                let value = match before.remove(&name) {
                    Some((was, bytes)) if was == sources => bytes,
                    _ => Bytes::from(entry(cluster, &name, p, &x.summary, installed, revision)),
                };
                kept.insert(name.clone(), (sources, value.clone()));
                out.insert(name, Computed { value, revision });
            }
        }
        if let Ok(mut e) = self.entries.lock() {
            e.keep(cluster, kept);
        }
        Ok(out)
    }
}

/// What an entry was made from: the revisions of its ProviderMetadata and APIExport, and the
/// workspace's binding to the export.
pub(super) type EntrySources = (Revision, Revision, Option<(Revision, String)>);

/// A workspace's marketplace entries by name, with what each was made from.
pub(super) type Entries = HashMap<String, (EntrySources, Bytes)>;

/// The most bytes of entries kept between computations, all workspaces together; beyond, the
/// kept entries are dropped and built again when next needed.
const ENTRY_BYTES: usize = 64 * 1024 * 1024;

/// The marketplace entries last computed for each workspace.
#[derive(Default)]
pub(super) struct EntryCache {
    by_cluster: HashMap<String, (Entries, usize)>,
    bytes: usize,
}

impl EntryCache {
    fn take(&mut self, cluster: &str) -> Option<Entries> {
        let (entries, bytes) = self.by_cluster.remove(cluster)?;
        self.bytes -= bytes;
        Some(entries)
    }

    fn keep(&mut self, cluster: &str, entries: Entries) {
        let bytes: usize = entries
            .iter()
            .map(|(name, (_, b))| name.len() + b.len() + 64)
            .sum();
        if bytes > ENTRY_BYTES {
            return;
        }
        if self.bytes + bytes > ENTRY_BYTES {
            self.by_cluster.clear();
            self.bytes = 0;
        }
        self.bytes += bytes;
        self.by_cluster
            .insert(cluster.to_string(), (entries, bytes));
    }
}

/// One MarketplaceEntry, encoded.
fn entry(
    cluster: &str,
    name: &str,
    p: &Summary,
    x: &Summary,
    installed: Option<&&Source>,
    revision: Revision,
) -> String {
    let name_json = json_string(name);
    let mut value =
        String::with_capacity(256 + name_json.len() + p.embedded.len() + x.embedded.len());
    value.push_str("{\"apiVersion\":\"marketplace.platform-mesh.io/v1alpha1\",\"kind\":\"MarketplaceEntry\",\"metadata\":{\"name\":");
    value.push_str(&name_json);
    value.push_str(",\"uid\":\"");
    value.push_str(&computed_uid(cluster, name));
    value.push_str("\",\"creationTimestamp\":");
    value.push_str(&json_string(x.created.as_str().max(p.created.as_str())));
    value.push_str(",\"resourceVersion\":\"");
    value.push_str(&revision.to_string());
    value.push_str("\"},\"spec\":{");
    if let Some(b) = installed {
        value.push_str("\"apiBindingName\":");
        value.push_str(&json_string(&b.summary.name));
        value.push(',');
    }
    value.push_str("\"providerMetadata\":");
    value.push_str(&p.embedded);
    value.push_str(",\"apiExport\":");
    value.push_str(&x.embedded);
    value.push_str("},\"status\":{}}");
    value
}
