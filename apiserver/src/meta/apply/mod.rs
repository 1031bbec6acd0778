//! Server-side apply and `metadata.managedFields` tracking.
//!
//! Pure functions over `serde_json::Value`, driven by the object's structural OpenAPI v3
//! schema (a CRD `openAPIV3Schema`), modelled on sigs.k8s.io/structured-merge-diff:
//!
//! * [`FieldSet`]: sets of field paths, encoded as FieldsV1
//!   (`{"f:spec":{".":{},"f:replicas":{}}}`). Objects are granular per key unless
//!   `x-kubernetes-map-type: atomic`; lists are atomic unless
//!   `x-kubernetes-list-type: map` (elements `k:{"name":"a"}`) or `set` (`v:"x"`).
//!   `metadata` follows `ObjectMeta` (labels/annotations per key, finalizers a set,
//!   ownerReferences keyed by `uid`); `apiVersion`, `kind` and the identity fields of
//!   `metadata` (name, namespace, uid, resourceVersion, generation, creationTimestamp,
//!   selfLink, managedFields) are never tracked.
//! * [`record_update`]: ownership bookkeeping for create / update / non-apply patch.
//! * [`apply`]: server-side apply with conflict detection ([`ApplyConflicts`]),
//!   merge, and removal of fields the applier stopped applying.
//!
//! Not modelled: version conversion of managed field sets (entries of other API
//! versions are compared as if they were the same version), reset fields of
//! subresources (the caller strips `status` / non-status as its strategy requires)
//! and unions.

mod conflict;
mod fieldset;
mod managed;
mod path;
mod schema;
mod walk;

#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

pub use conflict::{ApplyConflicts, CAUSE_FIELD_MANAGER_CONFLICT};
pub use fieldset::{FieldSet, FieldsV1Error};
pub use managed::{
    managed_fields_of, set_managed_fields, ManagedFieldsEntry, ANCIENT_CHANGES_MANAGER,
    FIELDS_TYPE_V1, MAX_UPDATE_MANAGERS, OPERATION_APPLY, OPERATION_UPDATE,
};
pub use path::{path_to_string, Path, PathElement};

use managed::{decode, encode, normalize_subresource, Owner};
use walk::{compare, field_set_of, is_list_key_field, is_protected, lookup, merge, remove_path};

impl FieldSet {
    /// The fields `object` sets under `schema` (what an applier of `object` owns),
    /// without the untracked root/metadata fields.
    pub fn from_object(object: &Value, schema: &Value) -> FieldSet {
        field_set_of(object, schema)
    }
}

fn without_managed_fields(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    copy
}

/// Records a non-apply write (create, update, JSON/merge/strategic patch) in the
/// managed fields.
///
/// The fields that differ between `old` and `new` (every set field when `old` is
/// `None`) become owned by `manager` (operation `Update`, merged into its existing
/// entry for the same apiVersion and subresource, stamped `now`) and are taken away
/// from every other entry, as are removed fields. Entries left owning nothing are
/// dropped. A write that changes nothing leaves the entries (and times) unchanged.
#[allow(clippy::too_many_arguments)]
pub fn record_update(
    old: Option<&Value>,
    new: &Value,
    managed: Vec<ManagedFieldsEntry>,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    schema: &Value,
    now: &str,
) -> Vec<ManagedFieldsEntry> {
    let empty = Value::Object(Map::new());
    let old = old.unwrap_or(&empty);
    let diff = compare(old, new, schema);
    let touched = diff.modified.union(&diff.added);
    let mut owners = decode(managed);
    for owner in owners.iter_mut() {
        owner.set = owner.set.difference(&touched).difference(&diff.removed);
    }
    if !touched.is_empty() {
        let mine = ManagedFieldsEntry::new(
            manager,
            OPERATION_UPDATE,
            api_version,
            Some(now),
            &FieldSet::new(),
            subresource,
        );
        let id = mine.identifier();
        match owners.iter_mut().find(|o| o.entry.identifier() == id) {
            Some(owner) => {
                owner.set = owner.set.union(&touched);
                owner.entry.time = Some(now.to_string());
            }
            None => owners.push(Owner {
                entry: mine,
                set: touched,
            }),
        }
    }
    encode(owners)
}

/// Server-side apply of `applied` (the parsed apply-patch body) by `manager`.
///
/// * The field set of `applied` becomes exactly `manager`'s `Apply` entry (for this
///   subresource), stamped `now` when the object changes (otherwise it keeps its time, or
///   has none when it is new).
/// * A field the apply changes (or adds) that another entry owns is a conflict;
///   with `force` its ownership moves to `manager` instead. Equal values are shared.
/// * The result is `live` with `applied` merged in (maps per key, map lists per key
///   keeping live order and appending new elements in applied order, sets unioned,
///   atomic lists and scalars replaced); without `live` it is `applied` itself.
/// * Fields in `manager`'s previous `Apply` entry that it no longer applies are
///   removed when no other entry owns them (or anything below them); parents emptied
///   by that removal and owned by nobody go too.
///
/// `metadata.managedFields` of `applied` is ignored; the returned object keeps
/// `live`'s value of it — store the returned entries there
/// (see [`set_managed_fields`]).
#[allow(clippy::too_many_arguments)]
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    managed: Vec<ManagedFieldsEntry>,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: Option<&str>,
    schema: &Value,
    now: &str,
) -> Result<(Value, Vec<ManagedFieldsEntry>), ApplyConflicts> {
    let applied = without_managed_fields(applied);
    let applied_set = field_set_of(&applied, schema);
    let mine = ManagedFieldsEntry::new(
        manager,
        OPERATION_APPLY,
        api_version,
        Some(now),
        &FieldSet::new(),
        subresource,
    );
    let id = mine.identifier();
    let mut owners = decode(managed);
    let previous = owners
        .iter()
        .position(|o| o.entry.identifier() == id)
        .map(|i| owners.remove(i));

    let empty = Value::Object(Map::new());
    let base = live.unwrap_or(&empty);
    let mut result = match live {
        Some(live) => merge(live, &applied, schema),
        None => applied.clone(),
    };
    if let Some(previous) = &previous {
        let owned = owners
            .iter()
            .fold(applied_set.clone(), |acc, o| acc.union(&o.set));
        prune(&mut result, &previous.set, &owned, schema);
    }

    let diff = compare(base, &result, schema);
    let changed = diff.modified.union(&diff.added);
    let conflicts = collect_conflicts(&owners, &changed);
    if !force && !conflicts.is_empty() {
        return Err(conflicts);
    }
    for owner in owners.iter_mut() {
        owner.set = owner.set.difference(&changed).difference(&diff.removed);
    }

    let object_changed =
        live.is_none_or(|l| without_managed_fields(l) != without_managed_fields(&result));
    // As kube-apiserver: the time moves only when the apply changes the object; a new entry for
    // an apply that changes nothing (sharing fields at their current values) has none.
    let time = match &previous {
        _ if object_changed => Some(now.to_string()),
        Some(p) => p.entry.time.clone(),
        None => None,
    };
    owners.push(Owner {
        entry: ManagedFieldsEntry {
            time,
            api_version: api_version.to_string(),
            subresource: normalize_subresource(subresource).map(str::to_string),
            ..mine
        },
        set: applied_set,
    });
    Ok((result, encode(owners)))
}

/// Removes what `last` owned that nobody in `owned` owns any more.
fn prune(object: &mut Value, last: &FieldSet, owned: &FieldSet, schema: &Value) {
    for path in last.paths() {
        if owned.contains_at_or_below(&path) || is_protected(&path) || is_list_key_field(&path) {
            continue;
        }
        if !remove_path(object, &path, schema) {
            continue;
        }
        // Drop parents this removal left empty, unless someone owns them.
        for depth in (1..path.len()).rev() {
            let parent = &path[..depth];
            if is_protected(parent) || owned.contains_at_or_below(parent) {
                break;
            }
            let empty = match lookup(object, parent, schema) {
                Some(Value::Object(map)) => map.is_empty(),
                Some(Value::Array(items)) => items.is_empty(),
                _ => false,
            };
            if !empty || !remove_path(object, parent, schema) {
                break;
            }
        }
    }
}

/// Conflicts of `changed` with every owner, ordered like kube-apiserver's message.
fn collect_conflicts(owners: &[Owner], changed: &FieldSet) -> ApplyConflicts {
    let mut found: Vec<(String, &Owner, FieldSet)> = owners
        .iter()
        .filter_map(|o| {
            let clash = o.set.intersection(changed);
            (!clash.is_empty()).then(|| (o.entry.identifier(), o, clash))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = ApplyConflicts::default();
    for (_, owner, clash) in found {
        let described = owner.entry.describe();
        for path in clash.path_strings() {
            out.conflicts.push((owner.entry.manager.clone(), path));
            out.managers.push(described.clone());
        }
    }
    out
}
