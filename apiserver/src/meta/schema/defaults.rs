//! Structural defaulting (reference E4).
//!
//! * A declared property that is absent gets a deep copy of its `default`,
//!   at every level: object properties, `additionalProperties` values and
//!   array items. Walking is top-down, so a defaulted object then receives
//!   its own children's defaults.
//! * `null` handling (kube 1.20+): a `null` in a field that is not
//!   `nullable: true` is replaced by the field's default when it has one and
//!   removed otherwise (array elements, which cannot be removed, are only
//!   replaced); with `nullable: true` the `null` is kept and not defaulted.
//! * `apiVersion`, `kind` and `metadata` of a resource root or embedded
//!   resource are never defaulted.

use serde_json::{Map, Value};

use super::node::{self, Additional, IMPLICIT_RESOURCE_FIELDS, MAX_DEPTH};

/// Applies the schema's `default` values to `obj` (an entire object, with
/// the resource-root rules applied).
pub fn default(obj: &mut Value, schema: &Value) {
    apply(obj, schema, true, 0);
}

fn apply(v: &mut Value, s: &Value, resource: bool, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => apply_object(m, s, resource, depth),
        Value::Array(a) => {
            let Some(items) = node::items(s) else { return };
            let item_default = items.get("default");
            for x in a.iter_mut() {
                if x.is_null() && !node::nullable(items) {
                    if let Some(d) = item_default {
                        *x = d.clone();
                    }
                }
                apply(x, items, node::embedded(items), depth + 1);
            }
        }
        _ => {}
    }
}

fn apply_object(m: &mut Map<String, Value>, s: &Value, resource: bool, depth: usize) {
    let implicit = |k: &str| resource && IMPLICIT_RESOURCE_FIELDS.contains(&k);
    if let Some(props) = node::properties(s) {
        for (k, ps) in props {
            if implicit(k) {
                continue;
            }
            fill(m, k, ps);
        }
    }
    if let Additional::Schema(a) = node::additional(s) {
        let keys: Vec<String> = m
            .keys()
            .filter(|k| node::property(s, k).is_none() && !implicit(k))
            .cloned()
            .collect();
        for k in keys {
            fill(m, &k, a);
        }
    }
    for (k, child) in m.iter_mut() {
        if implicit(k) {
            continue;
        }
        let child_schema = match node::property(s, k) {
            Some(ps) => ps,
            None => match node::additional(s) {
                Additional::Schema(a) => a,
                _ => continue,
            },
        };
        apply(child, child_schema, node::embedded(child_schema), depth + 1);
    }
}

/// Defaults one key of an object: absent → default; non-nullable `null` →
/// default or removed.
fn fill(m: &mut Map<String, Value>, k: &str, s: &Value) {
    match m.get(k) {
        None => {
            if let Some(d) = s.get("default") {
                m.insert(k.to_string(), d.clone());
            }
        }
        Some(Value::Null) if !node::nullable(s) => match s.get("default") {
            Some(d) => {
                m.insert(k.to_string(), d.clone());
            }
            None => {
                m.remove(k);
            }
        },
        Some(_) => {}
    }
}
