//! Reading the merge semantics out of a structural OpenAPI v3 schema (CRD style):
//! which maps are atomic, which lists are sets or maps (and their keys), which keys
//! are declared fields, and the built-in `ObjectMeta` schema used for `metadata`.
//!
//! Missing or schemaless parts (`{}`, `x-kubernetes-preserve-unknown-fields`) are
//! "deduced" from the value: objects are granular maps, lists are atomic, the rest
//! are scalars.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::path::PathElement;

/// The schema used for parts of the object that the schema does not describe.
pub(crate) static DEDUCED: Value = Value::Null;

/// How a list is merged and tracked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced and owned as a whole.
    Atomic,
    /// Scalar elements, each owned separately (`v:"x"`).
    Set,
    /// Object elements identified by these key fields (`k:{"name":"a"}`).
    Map(Vec<String>),
}

/// The merge-relevant shape of a value under a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A scalar (or null): owned as a whole.
    Scalar,
    /// A JSON object; `atomic` when `x-kubernetes-map-type: atomic`.
    Map { atomic: bool },
    /// A JSON array.
    List(ListKind),
}

impl Shape {
    /// True for shapes that are owned and replaced as one unit.
    pub(crate) fn is_atomic(&self) -> bool {
        matches!(
            self,
            Shape::Scalar | Shape::Map { atomic: true } | Shape::List(ListKind::Atomic)
        )
    }

    /// Same kind of JSON value (object / array / other), ignoring granularity.
    pub(crate) fn same_kind(&self, other: &Shape) -> bool {
        matches!(
            (self, other),
            (Shape::Scalar, Shape::Scalar)
                | (Shape::Map { .. }, Shape::Map { .. })
                | (Shape::List(_), Shape::List(_))
        )
    }
}

/// The shape of `value` under `schema`.
pub(crate) fn shape(schema: &Value, value: &Value) -> Shape {
    match value {
        Value::Object(_) => Shape::Map {
            atomic: schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic"),
        },
        Value::Array(_) => Shape::List(list_kind(schema)),
        _ => Shape::Scalar,
    }
}

fn list_kind(schema: &Value) -> ListKind {
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListKind::Set,
        Some("map") => {
            let keys: Vec<String> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|keys| {
                    keys.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if keys.is_empty() {
                ListKind::Atomic
            } else {
                ListKind::Map(keys)
            }
        }
        _ => ListKind::Atomic,
    }
}

/// The schema of `key` inside an object described by `schema`, and whether `key` is a
/// declared field (a property) rather than an entry of a free-form map. `root` marks
/// the top-level object, whose `metadata` always follows `ObjectMeta`.
pub(crate) fn map_child<'a>(schema: &'a Value, key: &str, root: bool) -> (&'a Value, bool) {
    if key == "metadata"
        && (root
            || schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                .unwrap_or(false))
    {
        return (object_meta(), true);
    }
    if let Some(prop) = schema.get("properties").and_then(|p| p.get(key)) {
        return (prop, true);
    }
    match schema.get("additionalProperties") {
        Some(additional @ Value::Object(_)) => (additional, false),
        _ => (&DEDUCED, false),
    }
}

/// The schema of the elements of a list described by `schema`.
pub(crate) fn list_items(schema: &Value) -> &Value {
    match schema.get("items") {
        Some(items @ Value::Object(_)) => items,
        _ => &DEDUCED,
    }
}

/// The identity of element `index` (`item`) of a set or map list; `None` for atomic
/// lists. Elements of map lists missing every key field (and without schema defaults
/// for them) fall back to their index.
pub(crate) fn list_element(
    kind: &ListKind,
    items_schema: &Value,
    item: &Value,
    index: usize,
) -> Option<PathElement> {
    match kind {
        ListKind::Atomic => None,
        ListKind::Set => Some(PathElement::Value(item.clone())),
        ListKind::Map(keys) => {
            let Value::Object(map) = item else {
                return Some(PathElement::Index(index));
            };
            let mut fields: Vec<(String, Value)> = Vec::new();
            for key in keys {
                let value = map.get(key).cloned().or_else(|| {
                    items_schema
                        .get("properties")
                        .and_then(|p| p.get(key))
                        .and_then(|p| p.get("default"))
                        .cloned()
                });
                if let Some(value) = value {
                    fields.push((key.clone(), value));
                }
            }
            if fields.is_empty() {
                return Some(PathElement::Index(index));
            }
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            fields.dedup_by(|a, b| a.0 == b.0);
            Some(PathElement::Key(fields))
        }
    }
}

/// Identities of all elements of a set or map list, in order.
pub(crate) fn list_elements(
    kind: &ListKind,
    items_schema: &Value,
    items: &[Value],
) -> Vec<PathElement> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| list_element(kind, items_schema, item, i).unwrap_or(PathElement::Index(i)))
        .collect()
}

/// The `ObjectMeta` schema: labels/annotations are granular string maps, finalizers a
/// set, ownerReferences a map list keyed by `uid`, managedFields atomic.
pub(crate) fn object_meta() -> &'static Value {
    static META: OnceLock<Value> = OnceLock::new();
    META.get_or_init(|| {
        let string = json!({"type": "string"});
        json!({
            "type": "object",
            "properties": {
                "name": string,
                "generateName": string,
                "namespace": string,
                "selfLink": string,
                "uid": string,
                "resourceVersion": string,
                "generation": {"type": "integer"},
                "creationTimestamp": string,
                "deletionTimestamp": string,
                "deletionGracePeriodSeconds": {"type": "integer"},
                "labels": {"type": "object", "additionalProperties": string},
                "annotations": {"type": "object", "additionalProperties": string},
                "finalizers": {
                    "type": "array",
                    "x-kubernetes-list-type": "set",
                    "items": string
                },
                "ownerReferences": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["uid"],
                    "items": {
                        "type": "object",
                        "properties": {
                            "apiVersion": string,
                            "kind": string,
                            "name": string,
                            "uid": string,
                            "controller": {"type": "boolean"},
                            "blockOwnerDeletion": {"type": "boolean"}
                        }
                    }
                },
                "managedFields": {
                    "type": "array",
                    "x-kubernetes-list-type": "atomic",
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }
            }
        })
    })
}
