//! `metadata.managedFields` entries: the wire type, manager identity, decoding into
//! field sets and encoding back (dropping empty entries, capping the number of
//! `Update` entries and sorting like kube-apiserver).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fieldset::FieldSet;
use super::path::go_quote;

/// `operation` of entries written by server-side apply.
pub const OPERATION_APPLY: &str = "Apply";
/// `operation` of entries written by create / update / non-apply patch.
pub const OPERATION_UPDATE: &str = "Update";
/// The only `fieldsType` Kubernetes defines.
pub const FIELDS_TYPE_V1: &str = "FieldsV1";
/// Most `Update` entries kept; older ones are folded into [`ANCIENT_CHANGES_MANAGER`].
pub const MAX_UPDATE_MANAGERS: usize = 10;
/// Manager name of the bucket that collects the oldest `Update` entries.
pub const ANCIENT_CHANGES_MANAGER: &str = "ancient-changes";

/// One `metadata.managedFields[]` entry (`meta.k8s.io/v1 ManagedFieldsEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManagedFieldsEntry {
    /// The field manager (`fieldManager` query parameter or user-agent prefix).
    #[serde(default)]
    pub manager: String,
    /// `Apply` or `Update`.
    #[serde(default)]
    pub operation: String,
    /// The API version the fields were written with.
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    /// RFC 3339 time of the manager's last change (`None` when absent on the wire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Always `FieldsV1`.
    #[serde(rename = "fieldsType", default = "fields_type_v1")]
    pub fields_type: String,
    /// The owned fields in FieldsV1 form.
    #[serde(rename = "fieldsV1", default)]
    pub fields_v1: Value,
    /// The subresource written through (`status`, `scale`), omitted for the main resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
}

fn fields_type_v1() -> String {
    FIELDS_TYPE_V1.to_string()
}

impl ManagedFieldsEntry {
    /// An entry owning `fields`.
    pub fn new(
        manager: &str,
        operation: &str,
        api_version: &str,
        time: Option<&str>,
        fields: &FieldSet,
        subresource: Option<&str>,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: manager.to_string(),
            operation: operation.to_string(),
            api_version: api_version.to_string(),
            time: time.map(str::to_string),
            fields_type: fields_type_v1(),
            fields_v1: fields.to_fields_v1(),
            subresource: normalize_subresource(subresource).map(str::to_string),
        }
    }

    /// The owned fields; `None` when `fieldsType`/`fieldsV1` cannot be decoded.
    pub fn field_set(&self) -> Option<FieldSet> {
        if !self.fields_type.is_empty() && self.fields_type != FIELDS_TYPE_V1 {
            return None;
        }
        FieldSet::from_fields_v1(&self.fields_v1).ok()
    }

    /// How kube-apiserver names this manager in conflict messages:
    /// `"mgr"`, `"mgr" with subresource "status"`, plus ` using v1` for `Update` entries.
    pub fn describe(&self) -> String {
        let mut out = go_quote(&self.manager);
        if let Some(sub) = normalize_subresource(self.subresource.as_deref()) {
            out.push_str(" with subresource ");
            out.push_str(&go_quote(sub));
        }
        if self.operation == OPERATION_UPDATE {
            out.push_str(" using ");
            out.push_str(&self.api_version);
        }
        out
    }

    /// The manager identity as kube-apiserver encodes it (JSON of manager, operation,
    /// apiVersion for non-appliers and subresource), used for ordering.
    pub(crate) fn identifier(&self) -> String {
        let mut map = serde_json::Map::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                map.insert(k.to_string(), Value::String(v.to_string()));
            }
        };
        put("manager", &self.manager);
        put("operation", &self.operation);
        if self.operation != OPERATION_APPLY {
            put("apiVersion", &self.api_version);
        }
        put(
            "subresource",
            normalize_subresource(self.subresource.as_deref()).unwrap_or(""),
        );
        // Go's struct field order, not serde_json's sorted map order.
        let order = ["manager", "operation", "apiVersion", "subresource"];
        let parts: Vec<String> = order
            .iter()
            .filter_map(|k| map.get(*k).map(|v| format!("\"{k}\":{v}")))
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    fn same_identity(&self, other: &ManagedFieldsEntry) -> bool {
        self.identifier() == other.identifier()
    }

    fn seconds(&self) -> i64 {
        self.time
            .as_deref()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
            .map(|t| t.unix_timestamp())
            .unwrap_or(0)
    }
}

/// `Some("")` and `None` both mean "main resource".
pub(crate) fn normalize_subresource(sub: Option<&str>) -> Option<&str> {
    sub.filter(|s| !s.is_empty())
}

/// Decodes `metadata.managedFields` of an object; malformed entries are skipped.
pub fn managed_fields_of(object: &Value) -> Vec<ManagedFieldsEntry> {
    object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| serde_json::from_value(e.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `entries` into `metadata.managedFields` (removing the field when empty).
/// Does nothing when `object` or its `metadata` is not a JSON object.
pub fn set_managed_fields(object: &mut Value, entries: &[ManagedFieldsEntry]) {
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
        return;
    }
    let list: Vec<Value> = entries
        .iter()
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect();
    meta.insert("managedFields".to_string(), Value::Array(list));
}

/// A decoded entry: its metadata plus its field set.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    pub(crate) entry: ManagedFieldsEntry,
    pub(crate) set: FieldSet,
}

/// Decodes entries into owners; undecodable entries are dropped and entries with the
/// same identity are merged.
pub(crate) fn decode(entries: Vec<ManagedFieldsEntry>) -> Vec<Owner> {
    let mut owners: Vec<Owner> = Vec::new();
    for mut entry in entries {
        let Some(set) = entry.field_set() else {
            continue;
        };
        entry.subresource = normalize_subresource(entry.subresource.as_deref()).map(str::to_string);
        match owners.iter_mut().find(|o| o.entry.same_identity(&entry)) {
            Some(existing) => existing.set = existing.set.union(&set),
            None => owners.push(Owner { entry, set }),
        }
    }
    owners
}

/// Encodes owners back into entries: empty sets dropped, `Update` entries capped at
/// [`MAX_UPDATE_MANAGERS`], sorted Apply-before-Update, then by time, manager,
/// apiVersion and subresource.
pub(crate) fn encode(mut owners: Vec<Owner>) -> Vec<ManagedFieldsEntry> {
    owners.retain(|o| !o.set.is_empty());
    cap_update_owners(&mut owners);
    let mut entries: Vec<ManagedFieldsEntry> = owners
        .into_iter()
        .map(|o| ManagedFieldsEntry {
            fields_type: fields_type_v1(),
            fields_v1: o.set.to_fields_v1(),
            ..o.entry
        })
        .collect();
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| p.seconds().cmp(&q.seconds()))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    entries
}

fn is_bucket(entry: &ManagedFieldsEntry, api_version: &str) -> bool {
    entry.manager == ANCIENT_CHANGES_MANAGER
        && entry.operation == OPERATION_UPDATE
        && entry.api_version == api_version
        && entry.subresource.is_none()
}

/// Folds the oldest `Update` entries (per apiVersion) into an `ancient-changes` entry
/// until at most [`MAX_UPDATE_MANAGERS`] remain.
fn cap_update_owners(owners: &mut Vec<Owner>) {
    let mut updaters: Vec<usize> = (0..owners.len())
        .filter(|&i| owners[i].entry.operation != OPERATION_APPLY)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| {
        let (a, b) = (&owners[a].entry, &owners[b].entry);
        a.seconds()
            .cmp(&b.seconds())
            .then_with(|| a.identifier().cmp(&b.identifier()))
    });
    let mut remaining = updaters.len();
    let mut first_for_version: BTreeMap<String, usize> = BTreeMap::new();
    let mut folded: BTreeSet<usize> = BTreeSet::new();
    for idx in updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = owners[idx].entry.api_version.clone();
        let Some(&first) = first_for_version.get(&version) else {
            first_for_version.insert(version, idx);
            continue;
        };
        let bucket = (0..owners.len())
            .find(|&i| !folded.contains(&i) && is_bucket(&owners[i].entry, &version))
            .unwrap_or(first);
        if bucket == idx {
            continue;
        }
        let moved = owners[idx].set.clone();
        let time = owners[idx].entry.time.clone();
        let target = &mut owners[bucket];
        target.entry.manager = ANCIENT_CHANGES_MANAGER.to_string();
        target.entry.subresource = None;
        target.set = target.set.union(&moved);
        target.entry.time = time;
        folded.insert(idx);
        remaining -= 1;
    }
    let mut index = 0;
    owners.retain(|_| {
        let keep = !folded.contains(&index);
        index += 1;
        keep
    });
}
