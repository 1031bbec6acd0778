//! Structural pruning: drop every field the schema does not specify
//! (reference E3), reporting each dropped field for `fieldValidation` (B12).
//!
//! Rules:
//! * an object node keeps the keys declared in `properties`; other keys are
//!   kept (unvisited) under `additionalProperties: true`, visited with the
//!   `additionalProperties` schema when it is one, kept under
//!   `x-kubernetes-preserve-unknown-fields: true`, and dropped otherwise;
//! * declared properties are always visited, also below a preserve-unknown
//!   node, so unknown fields inside them are dropped again;
//! * array elements are visited with `items`;
//! * at the resource root and in `x-kubernetes-embedded-resource` objects,
//!   `apiVersion`, `kind` and `metadata` are implicitly specified; inside
//!   `metadata` only unknown top-level fields are dropped (the ObjectMeta
//!   field set is kept untouched).
//!
//! Paths are rendered like kube's pruning does for strict-decoding messages:
//! `spec.foo`, `spec.items[0].bar`, map entries as `spec.map.key.bar`.

use serde_json::{Map, Value};

use super::node::{self, Additional, IMPLICIT_RESOURCE_FIELDS, MAX_DEPTH, OBJECT_META_FIELDS};
use super::path::Path;

/// Removes fields not declared in `schema` from `obj` (an entire object, with
/// the resource-root rules applied) and returns the removed fields' paths in
/// document order.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Value::Object(m) = obj {
        prune_object(m, schema, &Path::root(), true, &mut out, 0);
    }
    out
}

/// Prunes a value that is not a resource root.
fn prune_value(v: &mut Value, s: &Value, path: &Path, out: &mut Vec<String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => prune_object(m, s, path, node::embedded(s), out, depth),
        Value::Array(a) => {
            if let Some(items) = node::items(s) {
                for (i, x) in a.iter_mut().enumerate() {
                    prune_value(x, items, &path.index(i), out, depth + 1);
                }
            } else if !node::preserve_unknown(s) && node::ty(s) == Some("array") {
                // `items` is mandatory for structural arrays; without it no
                // element field is specified.
                for (i, x) in a.iter_mut().enumerate() {
                    if let Value::Object(m) = x {
                        drop_all(m, &path.index(i), out);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Prunes an object node; `resource` marks a resource root or embedded
/// resource, where `apiVersion`, `kind` and `metadata` are implicit.
fn prune_object(
    m: &mut Map<String, Value>,
    s: &Value,
    path: &Path,
    resource: bool,
    out: &mut Vec<String>,
    depth: usize,
) {
    let preserve = node::preserve_unknown(s);
    let additional = node::additional(s);
    let mut remove = Vec::new();
    for (k, child) in m.iter_mut() {
        let child_path = path.field(k);
        if resource && IMPLICIT_RESOURCE_FIELDS.contains(&k.as_str()) {
            if k == "metadata" {
                if let Value::Object(meta) = child {
                    prune_metadata(meta, &child_path, out);
                }
            }
            continue;
        }
        if let Some(ps) = node::property(s, k) {
            prune_value(child, ps, &child_path, out, depth + 1);
            continue;
        }
        match additional {
            Additional::Schema(a) => prune_value(child, a, &path.key(k), out, depth + 1),
            Additional::Any => {}
            Additional::Absent if preserve => {}
            Additional::Absent => {
                out.push(child_path.dotted());
                remove.push(k.clone());
            }
        }
    }
    for k in remove {
        m.remove(&k);
    }
}

/// Drops unknown top-level ObjectMeta fields.
fn prune_metadata(meta: &mut Map<String, Value>, path: &Path, out: &mut Vec<String>) {
    let unknown: Vec<String> = meta
        .keys()
        .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in unknown {
        out.push(path.field(&k).dotted());
        meta.remove(&k);
    }
}

/// Drops every field of an object that has no schema at all.
fn drop_all(m: &mut Map<String, Value>, path: &Path, out: &mut Vec<String>) {
    for k in m.keys() {
        out.push(path.field(k).dotted());
    }
    m.clear();
}
