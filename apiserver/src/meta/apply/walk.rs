//! Schema-driven walks over objects: the field set of an object, the comparison of two
//! versions (added / modified / removed paths), the apply merge, and path removal.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::fieldset::{FieldSet, MAX_DEPTH};
use super::path::{Path, PathElement};
use super::schema::{list_elements, list_items, map_child, shape, ListKind, Shape};

/// `metadata` fields that are never tracked in managedFields.
const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
];

fn field(name: &str) -> PathElement {
    PathElement::Field(name.to_string())
}

/// Drops the paths Kubernetes never tracks: root `apiVersion`/`kind`, the `metadata`
/// node itself and its identity/bookkeeping fields.
pub(crate) fn strip_untracked(set: &mut FieldSet) {
    set.remove_subtree(&[field("apiVersion")]);
    set.remove_subtree(&[field("kind")]);
    set.remove(&[field("metadata")]);
    for name in UNTRACKED_METADATA {
        set.remove_subtree(&[field("metadata"), field(name)]);
    }
}

/// True for paths that apply must never delete (untracked identity fields and their parents).
pub(crate) fn is_protected(path: &[PathElement]) -> bool {
    match path {
        [PathElement::Field(top)] => top == "apiVersion" || top == "kind" || top == "metadata",
        [PathElement::Field(top), PathElement::Field(name), ..] if top == "metadata" => {
            UNTRACKED_METADATA.contains(&name.as_str())
        }
        _ => false,
    }
}

/// The set of fields `obj` sets (what an applier owns for an applied configuration).
/// Declared fields holding non-empty objects/lists are not members themselves; map
/// entries and list elements are.
pub(crate) fn field_set_of(obj: &Value, schema: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    let mut path = Vec::new();
    collect(obj, schema, &mut path, &mut out, false);
    strip_untracked(&mut out);
    out
}

fn collect(value: &Value, schema: &Value, path: &mut Path, out: &mut FieldSet, member: bool) {
    let deep = path.len() >= MAX_DEPTH;
    match (shape(schema, value), value) {
        (Shape::Map { atomic: false }, Value::Object(map)) if !map.is_empty() && !deep => {
            if member {
                out.insert(path);
            }
            let root = path.is_empty();
            for (key, child) in map {
                let (child_schema, named) = map_child(schema, key, root);
                path.push(PathElement::Field(key.clone()));
                collect(child, child_schema, path, out, !named);
                path.pop();
            }
        }
        (Shape::List(kind), Value::Array(items))
            if kind != ListKind::Atomic && !items.is_empty() && !deep =>
        {
            if member {
                out.insert(path);
            }
            let items_schema = list_items(schema);
            for (pe, item) in list_elements(&kind, items_schema, items)
                .into_iter()
                .zip(items)
            {
                path.push(pe);
                collect(item, items_schema, path, out, true);
                path.pop();
            }
        }
        _ => out.insert(path),
    }
}

/// The difference between two versions of an object.
#[derive(Debug, Clone, Default)]
pub(crate) struct Comparison {
    /// Paths present only in the new version (including new parents).
    pub(crate) added: FieldSet,
    /// Leaves (scalars, atomic values) whose value changed.
    pub(crate) modified: FieldSet,
    /// Paths present only in the old version.
    pub(crate) removed: FieldSet,
}

/// Compares `old` with `new` under `schema` (untracked paths stripped).
pub(crate) fn compare(old: &Value, new: &Value, schema: &Value) -> Comparison {
    let mut c = Comparison::default();
    let mut path = Vec::new();
    compare_at(Some(old), Some(new), schema, &mut path, &mut c);
    strip_untracked(&mut c.added);
    strip_untracked(&mut c.modified);
    strip_untracked(&mut c.removed);
    c
}

fn is_empty_or_absent(v: Option<&Value>) -> bool {
    match v {
        None => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    }
}

fn compare_at(
    old: Option<&Value>,
    new: Option<&Value>,
    schema: &Value,
    path: &mut Path,
    c: &mut Comparison,
) {
    let old_shape = old.map(|v| shape(schema, v));
    let new_shape = new.map(|v| shape(schema, v));
    if let (Some(a), Some(b)) = (&old_shape, &new_shape) {
        if !a.same_kind(b) {
            // A type change: the old value goes away, the new one arrives.
            compare_at(old, None, schema, path, c);
            compare_at(None, new, schema, path, c);
            return;
        }
    }
    let Some(sh) = new_shape.or(old_shape) else {
        return;
    };
    let leaf = sh.is_atomic()
        || path.len() >= MAX_DEPTH
        || (is_empty_or_absent(old) && is_empty_or_absent(new));
    if leaf {
        match (old, new) {
            (None, Some(_)) => c.added.insert(path),
            (Some(_), None) => c.removed.insert(path),
            (Some(a), Some(b)) if a != b => c.modified.insert(path),
            _ => {}
        }
        return;
    }
    match sh {
        Shape::Map { .. } => {
            let root = path.is_empty();
            let old_map = old.and_then(Value::as_object);
            let new_map = new.and_then(Value::as_object);
            let keys: BTreeSet<&String> = old_map
                .into_iter()
                .flat_map(|m| m.keys())
                .chain(new_map.into_iter().flat_map(|m| m.keys()))
                .collect();
            for key in keys {
                let (child_schema, _) = map_child(schema, key, root);
                path.push(PathElement::Field(key.clone()));
                compare_at(
                    old_map.and_then(|m| m.get(key)),
                    new_map.and_then(|m| m.get(key)),
                    child_schema,
                    path,
                    c,
                );
                path.pop();
            }
        }
        Shape::List(kind) => {
            let items_schema = list_items(schema);
            let old_items = old
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let new_items = new
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let old_pes = list_elements(&kind, items_schema, old_items);
            let new_pes = list_elements(&kind, items_schema, new_items);
            let old_index = first_occurrences(&old_pes, old_items);
            let new_index = first_occurrences(&new_pes, new_items);
            for (pe, item) in &new_index {
                path.push((*pe).clone());
                compare_at(
                    old_index.get(pe).copied(),
                    Some(item),
                    items_schema,
                    path,
                    c,
                );
                path.pop();
            }
            for (pe, item) in &old_index {
                if !new_index.contains_key(pe) {
                    path.push((*pe).clone());
                    compare_at(Some(item), None, items_schema, path, c);
                    path.pop();
                }
            }
        }
        Shape::Scalar => {}
    }
    if !path.is_empty() {
        if old.is_none() {
            c.added.insert(path);
        } else if new.is_none() {
            c.removed.insert(path);
        }
    }
}

fn first_occurrences<'a>(
    pes: &'a [PathElement],
    items: &'a [Value],
) -> BTreeMap<&'a PathElement, &'a Value> {
    let mut index = BTreeMap::new();
    for (pe, item) in pes.iter().zip(items) {
        index.entry(pe).or_insert(item);
    }
    index
}

/// Merges an applied configuration into the live object: granular maps per key,
/// set/map lists per element (live order kept, new elements appended in applied
/// order), everything else replaced by the applied value.
pub(crate) fn merge(live: &Value, applied: &Value, schema: &Value) -> Value {
    merge_at(live, applied, schema, 0)
}

fn merge_at(live: &Value, applied: &Value, schema: &Value, depth: usize) -> Value {
    if depth >= MAX_DEPTH {
        return applied.clone();
    }
    match (live, applied, shape(schema, applied)) {
        (Value::Object(lm), Value::Object(am), Shape::Map { atomic: false }) => {
            let mut out = lm.clone();
            for (key, av) in am {
                let (child_schema, _) = map_child(schema, key, depth == 0);
                let merged = match lm.get(key) {
                    Some(lv) => merge_at(lv, av, child_schema, depth + 1),
                    None => av.clone(),
                };
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(la), Value::Array(aa), Shape::List(kind)) if kind != ListKind::Atomic => {
            let items_schema = list_items(schema);
            let live_pes = list_elements(&kind, items_schema, la);
            let applied_pes = list_elements(&kind, items_schema, aa);
            let applied_index = first_occurrences(&applied_pes, aa);
            let live_set: BTreeSet<&PathElement> = live_pes.iter().collect();
            let mut out = Vec::with_capacity(la.len() + aa.len());
            for (pe, lv) in live_pes.iter().zip(la) {
                match applied_index.get(pe) {
                    Some(av) => out.push(merge_at(lv, av, items_schema, depth + 1)),
                    None => out.push(lv.clone()),
                }
            }
            let mut appended = BTreeSet::new();
            for (pe, av) in applied_pes.iter().zip(aa) {
                if !live_set.contains(pe) && appended.insert(pe) {
                    out.push(av.clone());
                }
            }
            Value::Array(out)
        }
        _ => applied.clone(),
    }
}

/// The value at `path`, if present.
pub(crate) fn lookup<'v>(
    value: &'v Value,
    path: &[PathElement],
    schema: &Value,
) -> Option<&'v Value> {
    let mut current = value;
    let mut schema = schema;
    for (depth, pe) in path.iter().enumerate() {
        match (pe, current) {
            (PathElement::Field(key), Value::Object(map)) => {
                schema = map_child(schema, key, depth == 0).0;
                current = map.get(key)?;
            }
            (_, Value::Array(items)) => {
                let Shape::List(kind) = shape(schema, current) else {
                    return None;
                };
                let items_schema = list_items(schema);
                let pes = list_elements(&kind, items_schema, items);
                let position = pes.iter().position(|p| p == pe)?;
                schema = items_schema;
                current = items.get(position)?;
            }
            _ => return None,
        }
    }
    Some(current)
}

/// Removes the value at `path` (every matching list element); true when something went.
pub(crate) fn remove_path(value: &mut Value, path: &[PathElement], schema: &Value) -> bool {
    remove_at(value, path, schema, true)
}

fn remove_at(value: &mut Value, path: &[PathElement], schema: &Value, root: bool) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let kind = match shape(schema, value) {
        Shape::List(kind) => Some(kind),
        _ => None,
    };
    match (first, value) {
        (PathElement::Field(key), Value::Object(map)) => {
            if rest.is_empty() {
                return map.remove(key).is_some();
            }
            let (child_schema, _) = map_child(schema, key, root);
            match map.get_mut(key) {
                Some(child) => remove_at(child, rest, child_schema, false),
                None => false,
            }
        }
        (_, Value::Array(items)) => {
            let Some(kind) = kind.filter(|k| *k != ListKind::Atomic) else {
                return false;
            };
            let items_schema = list_items(schema);
            let pes = list_elements(&kind, items_schema, items);
            if rest.is_empty() {
                let before = items.len();
                let old = std::mem::take(items);
                *items = old
                    .into_iter()
                    .zip(pes)
                    .filter(|(_, pe)| pe != first)
                    .map(|(item, _)| item)
                    .collect();
                return items.len() != before;
            }
            let mut removed = false;
            for (item, pe) in items.iter_mut().zip(pes) {
                if pe == *first {
                    removed |= remove_at(item, rest, items_schema, false);
                }
            }
            removed
        }
        _ => false,
    }
}

/// True when `path` names a key field of a map-list element (`…[name="a"].name`),
/// which must stay while the element stays.
pub(crate) fn is_list_key_field(path: &[PathElement]) -> bool {
    match path {
        [.., PathElement::Key(keys), PathElement::Field(name)] => {
            keys.iter().any(|(k, _)| k == name)
        }
        _ => false,
    }
}
