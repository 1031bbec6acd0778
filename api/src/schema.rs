//! Conversion of schemars output (k8s-openapi built-in kinds) into Kubernetes structural schemas.
//! Inlines `$ref`s, drops null unions and `nullable`, maps int-or-string and free-form objects.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

/// Structural openAPIV3Schema of a whole object of a built-in kind (`apiVersion`, `kind`,
/// `metadata`, `spec`, ...), generated from its k8s-openapi type.
///
/// `metadata` is given as a bare `{type: object}` (as in every CRD): the server validates object
/// metadata itself. [`object_meta_schema`] has the full ObjectMeta schema for documentation.
pub fn structural_schema_for<T: JsonSchema>() -> Value {
    let mut root = raw_schema_for::<T>();
    if let Some(obj) = root.as_object_mut() {
        if let Some(Value::Object(props)) = obj.get_mut("properties") {
            props.insert(
                "metadata".into(),
                json!({"type": "object", "description": "Standard object metadata."}),
            );
        }
        if let Some(Value::Array(required)) = obj.get_mut("required") {
            // k8s-openapi makes `metadata` non-optional in Rust; Kubernetes does not require it.
            required.retain(|r| r != "metadata");
            if required.is_empty() {
                obj.remove("required");
            }
        }
    }
    root
}

/// Structural schema of `metadata` (ObjectMeta), for `kubectl explain`-style documentation.
pub fn object_meta_schema() -> Value {
    raw_schema_for::<ObjectMeta>()
}

/// Generates the schema of `T` with every subschema inlined and makes it structural.
fn raw_schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut root = generator.into_root_schema_for::<T>().to_value();
    let definitions = take_definitions(&mut root);
    inline_refs(&mut root, &definitions, &mut Vec::new());
    make_structural(&mut root);
    if let Some(obj) = root.as_object_mut() {
        obj.remove("title");
    }
    root
}

/// Removes and returns every definitions table schemars may have emitted.
fn take_definitions(root: &mut Value) -> Map<String, Value> {
    let mut all = Map::new();
    let Some(obj) = root.as_object_mut() else {
        return all;
    };
    for key in ["definitions", "$defs"] {
        if let Some(Value::Object(defs)) = obj.remove(key) {
            all.extend(defs);
        }
    }
    if let Some(Value::Object(mut components)) = obj.remove("components") {
        if let Some(Value::Object(schemas)) = components.remove("schemas") {
            all.extend(schemas);
        }
    }
    obj.remove("$schema");
    all
}

/// Replaces each `$ref` by the referenced definition. A reference back into a definition that is
/// already being inlined (a recursive type) becomes a free-form object.
fn inline_refs(value: &mut Value, definitions: &Map<String, Value>, stack: &mut Vec<String>) {
    match value {
        Value::Object(obj) => {
            if let Some(Value::String(reference)) = obj.remove("$ref") {
                let name = reference.rsplit('/').next().unwrap_or_default().to_string();
                let mut target = if stack.contains(&name) {
                    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
                } else if let Some(def) = definitions.get(&name) {
                    stack.push(name);
                    let mut def = def.clone();
                    inline_refs(&mut def, definitions, stack);
                    stack.pop();
                    def
                } else {
                    json!({"x-kubernetes-preserve-unknown-fields": true})
                };
                // Sibling keys (e.g. a field description) win over the referenced schema's.
                if let Value::Object(target_obj) = &mut target {
                    for (k, v) in std::mem::take(obj) {
                        target_obj.insert(k, v);
                    }
                }
                *value = target;
                inline_refs(value, definitions, stack);
            } else {
                obj.values_mut()
                    .for_each(|v| inline_refs(v, definitions, stack));
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| inline_refs(v, definitions, stack)),
        _ => {}
    }
}

/// Rewrites one schema node (and its children) into structural form.
pub(crate) fn make_structural(value: &mut Value) {
    let Value::Object(obj) = value else {
        // `true` (anything) becomes a free-form value.
        if *value == Value::Bool(true) {
            *value = json!({"x-kubernetes-preserve-unknown-fields": true});
        }
        return;
    };
    for key in [
        "nullable",
        "title",
        "$schema",
        "examples",
        "example",
        "uniqueItems",
    ] {
        obj.remove(key);
    }
    collapse_null_union(obj);
    // `type: [X, "null"]` → `type: X`.
    if let Some(Value::Array(types)) = obj.get("type") {
        let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        match non_null.len() {
            0 => {
                obj.remove("type");
            }
            1 => {
                obj.insert("type".into(), non_null[0].clone());
            }
            _ => {}
        }
    }
    if obj.get("format").and_then(Value::as_str) == Some("int-or-string") {
        obj.remove("format");
        obj.remove("type");
        obj.insert("x-kubernetes-int-or-string".into(), Value::Bool(true));
    }
    if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        obj.remove("type");
    }
    match obj.get("additionalProperties") {
        Some(Value::Bool(true)) => {
            obj.remove("additionalProperties");
            obj.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
        }
        Some(Value::Bool(false)) => {
            obj.remove("additionalProperties");
        }
        _ => {}
    }
    let free_form_object = obj.get("type").and_then(Value::as_str) == Some("object")
        && !obj.contains_key("properties")
        && !obj.contains_key("additionalProperties");
    if free_form_object {
        obj.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    }
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        props.values_mut().for_each(make_structural);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = obj.get_mut(key) {
            make_structural(sub);
        }
    }
    sort_required(obj);
}

/// `anyOf`/`oneOf` of exactly one schema plus a null alternative → that schema, merged in.
fn collapse_null_union(obj: &mut Map<String, Value>) {
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(options)) = obj.get(key) else {
            continue;
        };
        let is_null = |v: &Value| {
            v.get("type") == Some(&json!("null")) || v.get("enum") == Some(&json!([null]))
        };
        let rest: Vec<Value> = options.iter().filter(|v| !is_null(v)).cloned().collect();
        if rest.len() == 1 && rest.len() < options.len() {
            obj.remove(key);
            if let Value::Object(inner) = &rest[0] {
                for (k, v) in inner {
                    obj.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
}

/// Sorts and deduplicates `required` so that output is stable.
fn sort_required(obj: &mut Map<String, Value>) {
    if let Some(Value::Array(required)) = obj.get_mut("required") {
        let sorted: BTreeSet<String> = required
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        *required = sorted.into_iter().map(Value::String).collect();
    }
}

/// Problems that make a schema non-structural, as `path: problem` lines (empty when fine).
pub fn structural_problems(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_node("", schema, &mut out);
    out
}

fn check_node(path: &str, node: &Value, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for key in [
        "$ref",
        "$schema",
        "definitions",
        "$defs",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "nullable",
        "uniqueItems",
        "title",
    ] {
        if obj.contains_key(key) {
            out.push(format!("{path}: forbidden key {key}"));
        }
    }
    let untyped_ok = obj.contains_key("x-kubernetes-int-or-string")
        || obj.contains_key("x-kubernetes-preserve-unknown-fields");
    match obj.get("type").and_then(Value::as_str) {
        Some("object" | "array" | "string" | "integer" | "number" | "boolean") => {}
        None if untyped_ok => {}
        other => out.push(format!("{path}: bad type {other:?}")),
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        out.push(format!("{path}: both properties and additionalProperties"));
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, sub) in props {
            check_node(&format!("{path}.{name}"), sub, out);
        }
    }
    if let Some(items) = obj.get("items") {
        check_node(&format!("{path}[]"), items, out);
    } else if obj.get("type") == Some(&json!("array")) {
        out.push(format!("{path}: array without items"));
    }
    if let Some(extra) = obj.get("additionalProperties") {
        check_node(&format!("{path}{{}}"), extra, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    #[test]
    fn config_map_schema_is_structural() {
        let s = structural_schema_for::<ConfigMap>();
        assert!(
            structural_problems(&s).is_empty(),
            "{:?}",
            structural_problems(&s)
        );
        assert_eq!(s["properties"]["metadata"]["type"], "object");
        assert_eq!(
            s["properties"]["binaryData"]["additionalProperties"]["format"],
            "byte"
        );
        assert!(s.get("required").is_none());
    }

    #[test]
    fn secret_data_is_bytes() {
        let s = structural_schema_for::<Secret>();
        assert_eq!(
            s["properties"]["data"]["additionalProperties"]["type"],
            "string"
        );
        assert_eq!(
            s["properties"]["data"]["additionalProperties"]["format"],
            "byte"
        );
    }

    #[test]
    fn object_meta_schema_has_properties() {
        let s = object_meta_schema();
        assert!(
            structural_problems(&s).is_empty(),
            "{:?}",
            structural_problems(&s)
        );
        assert_eq!(s["properties"]["name"]["type"], "string");
        assert_eq!(s["properties"]["creationTimestamp"]["format"], "date-time");
        let fields = &s["properties"]["managedFields"]["items"]["properties"]["fieldsV1"];
        assert_eq!(fields["x-kubernetes-preserve-unknown-fields"], true);
    }

    #[test]
    fn rewrites_nullable_unions_refs_and_int_or_string() {
        let mut root = json!({
            "$defs": {"Inner": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}}},
            "type": "object",
            "properties": {
                "a": {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "description": "d"},
                "b": {"type": "string", "format": "int-or-string"},
                "c": true,
                "d": {"type": "object", "additionalProperties": true}
            },
            "required": ["b", "a"]
        });
        let defs = take_definitions(&mut root);
        inline_refs(&mut root, &defs, &mut Vec::new());
        make_structural(&mut root);
        assert_eq!(
            root,
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "object", "description": "d",
                          "properties": {"x": {"type": "integer"}}},
                    "b": {"x-kubernetes-int-or-string": true},
                    "c": {"x-kubernetes-preserve-unknown-fields": true},
                    "d": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                },
                "required": ["a", "b"]
            })
        );
        assert!(structural_problems(&root).is_empty());
    }

    #[test]
    fn recursive_refs_end_in_free_form_objects() {
        let mut root = json!({
            "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
            "$ref": "#/$defs/Node"
        });
        let defs = take_definitions(&mut root);
        inline_refs(&mut root, &defs, &mut Vec::new());
        make_structural(&mut root);
        let child = &root["properties"]["child"];
        assert_eq!(child["type"], "object");
        assert_eq!(child["x-kubernetes-preserve-unknown-fields"], true);
    }

    #[test]
    fn structural_problems_are_reported_with_paths() {
        let bad =
            json!({"type": "object", "properties": {"a": {"anyOf": []}, "b": {"type": "array"}}});
        let problems = structural_problems(&bad);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(".a: forbidden key anyOf")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(".b: array without items")),
            "{problems:?}"
        );
    }
}
