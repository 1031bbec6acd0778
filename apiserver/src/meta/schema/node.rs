//! Read-only accessors for one node of an OpenAPI v3 (`openAPIV3Schema`) schema
//! held as `serde_json::Value`. Malformed keywords read as absent, so every
//! walker tolerates any schema without panicking.

use serde_json::{Map, Value};

/// Deepest schema/object nesting the walkers descend into. JSON decoded by
/// `serde_json` is already limited to 128 levels; this guards hand-built values.
pub(crate) const MAX_DEPTH: usize = 256;

/// The `metadata` fields of ObjectMeta kept at a resource root (and in
/// embedded resources); any other top-level `metadata` field is pruned.
pub(crate) const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Fields implicitly specified at a resource root or embedded resource.
pub(crate) const IMPLICIT_RESOURCE_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// What `additionalProperties` says about undeclared keys.
pub(crate) enum Additional<'a> {
    /// Keyword absent (or `false`): undeclared keys are unknown.
    Absent,
    /// `additionalProperties: true`: any key, any value, kept as is.
    Any,
    /// `additionalProperties: {schema}`: a map whose values follow the schema.
    Schema(&'a Value),
}

/// The `type` keyword, when it is a non-empty string.
pub(crate) fn ty(s: &Value) -> Option<&str> {
    s.get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
}

/// A boolean keyword (`nullable`, `x-kubernetes-*`), false when absent.
pub(crate) fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// `nullable: true`.
pub(crate) fn nullable(s: &Value) -> bool {
    flag(s, "nullable")
}

/// `x-kubernetes-preserve-unknown-fields: true`.
pub(crate) fn preserve_unknown(s: &Value) -> bool {
    flag(s, "x-kubernetes-preserve-unknown-fields")
}

/// `x-kubernetes-embedded-resource: true`.
pub(crate) fn embedded(s: &Value) -> bool {
    flag(s, "x-kubernetes-embedded-resource")
}

/// `x-kubernetes-int-or-string: true`.
pub(crate) fn int_or_string(s: &Value) -> bool {
    flag(s, "x-kubernetes-int-or-string")
}

/// The `properties` map.
pub(crate) fn properties(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

/// The schema of one declared property.
pub(crate) fn property<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    properties(s).and_then(|p| p.get(name))
}

/// The `additionalProperties` keyword.
pub(crate) fn additional(s: &Value) -> Additional<'_> {
    match s.get("additionalProperties") {
        Some(Value::Bool(true)) => Additional::Any,
        Some(v @ Value::Object(_)) => Additional::Schema(v),
        _ => Additional::Absent,
    }
}

/// The single-schema `items` keyword.
pub(crate) fn items(s: &Value) -> Option<&Value> {
    s.get("items").filter(|v| v.is_object())
}

/// A numeric keyword (`minimum`, `maxLength`, ...).
pub(crate) fn num(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(Value::as_f64)
}

/// A non-negative integer keyword (`maxLength`, `minItems`, ...).
pub(crate) fn count(s: &Value, key: &str) -> Option<u64> {
    let v = s.get(key)?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// `x-kubernetes-list-type`.
pub(crate) fn list_type(s: &Value) -> Option<&str> {
    s.get("x-kubernetes-list-type").and_then(Value::as_str)
}

/// `x-kubernetes-list-map-keys`.
pub(crate) fn list_map_keys(s: &Value) -> Vec<&str> {
    s.get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The values of a list-type `map` item's key fields (absent keys as `None`).
pub(crate) fn map_key_tuple<'a>(item: &'a Value, keys: &[&str]) -> Vec<Option<&'a Value>> {
    keys.iter().map(|k| item.get(*k)).collect()
}

/// JSON equality that compares numbers by value (`1` equals `1.0`).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Equality of two optional key tuples under [`json_eq`].
pub(crate) fn tuple_eq(a: &[Option<&Value>], b: &[Option<&Value>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(p), Some(q)) => json_eq(p, q),
            (None, None) => true,
            _ => false,
        })
}
