//! The `/openapi/v2` (Swagger 2.0) document: the operations and schemas of every group version
//! in one document, written from the same [`Spec`]s as the v3 documents, and its encoding as the
//! gnostic `openapi.v2.Document` protobuf message client-go decodes.
//!
//! Schemas are written as kube-apiserver writes them for v2: references are `#/definitions/...`
//! (a one-element `allOf` of a reference is the reference), and what kubectl's v2 model cannot
//! read is dropped: `allOf`/`anyOf`/`oneOf`/`not`, and the type, items and properties of nullable
//! and unknown-field-preserving values.

use serde_json::{json, Map, Value};

use super::{In, Operation, Param, Spec, KUBE_VERSION, PRODUCES, SCHEMA_PREFIX, TITLE};

const DEFINITION_PREFIX: &str = "#/definitions/";

/// The v2 document being assembled from the group versions' specs.
#[derive(Debug, Default)]
pub(super) struct Document {
    paths: Map<String, Value>,
    definitions: Map<String, Value>,
}

impl Document {
    /// Adds the paths and definitions of one group version.
    pub(super) fn add(&mut self, spec: &Spec) {
        for (path, item) in &spec.paths {
            let mut out = Map::new();
            for op in &item.operations {
                out.insert(op.method.into(), operation(op));
            }
            if !item.parameters.is_empty() {
                out.insert(
                    "parameters".into(),
                    item.parameters.iter().map(parameter).collect(),
                );
            }
            self.paths.insert(path.clone(), Value::Object(out));
        }
        for (name, schema) in &spec.schemas {
            self.definitions.insert(name.clone(), v2_schema(schema));
        }
    }

    /// The whole document.
    pub(super) fn to_json(&self) -> Value {
        json!({
            "swagger": "2.0",
            "info": {"title": TITLE, "version": KUBE_VERSION},
            "paths": self.paths,
            "definitions": self.definitions,
        })
    }
}

fn reference(definition: &str) -> Value {
    json!({"$ref": format!("{DEFINITION_PREFIX}{definition}")})
}

fn parameter(p: &Param) -> Value {
    let mut out = json!({
        "name": p.name,
        "in": match p.location { In::Path => "path", In::Query => "query" },
        "description": p.description,
        "type": p.ty,
        "uniqueItems": true,
    });
    if p.location == In::Path {
        out["required"] = json!(true);
    }
    out
}

fn operation(op: &Operation) -> Value {
    let mut parameters: Vec<Value> = op.parameters.iter().map(parameter).collect();
    let consumes = match &op.body {
        Some(body) => {
            parameters.insert(
                0,
                json!({"name": "body", "in": "body", "required": body.required, "schema": reference(&body.schema)}),
            );
            body.content_types.clone()
        }
        None => vec!["*/*"],
    };
    let mut responses = Map::new();
    for (code, def) in &op.responses {
        responses.insert(
            code.to_string(),
            json!({"description": super::status_text(code), "schema": reference(def)}),
        );
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));
    let mut out = json!({
        "operationId": op.operation_id,
        "consumes": consumes,
        "produces": PRODUCES,
        "schemes": ["https"],
        "responses": responses,
        "x-kubernetes-action": op.action,
    });
    if !parameters.is_empty() {
        out["parameters"] = Value::Array(parameters);
    }
    if let Some((group, version, kind)) = &op.gvk {
        out["x-kubernetes-group-version-kind"] =
            json!({"group": group, "version": version, "kind": kind});
    }
    out
}

/// A v3 schema in v2 form (see the module documentation).
fn v2_schema(schema: &Value) -> Value {
    let Value::Object(obj) = schema else {
        return schema.clone();
    };
    let mut obj = obj.clone();
    if let Some(Value::Array(all_of)) = obj.get("allOf") {
        if let [Value::Object(only)] = all_of.as_slice() {
            if let Some(r) = only.get("$ref").cloned() {
                obj.remove("allOf");
                obj.insert("$ref".into(), r);
            }
        }
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        // kubectl's v2 model refuses a reference with a type or properties beside it.
        let name = r.strip_prefix(SCHEMA_PREFIX).unwrap_or(r);
        let mut out = Map::new();
        out.insert("$ref".into(), json!(format!("{DEFINITION_PREFIX}{name}")));
        for (k, v) in obj {
            if k == "description" || k.starts_with("x-") {
                out.insert(k, v);
            }
        }
        return Value::Object(out);
    }
    for key in ["allOf", "anyOf", "oneOf", "not"] {
        obj.remove(key);
    }
    if obj.remove("nullable") == Some(Value::Bool(true)) {
        for key in ["type", "items", "properties"] {
            obj.remove(key);
        }
    }
    if obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        obj.remove("items");
        obj.remove("properties");
        if obj.get("type") == Some(&json!("object")) {
            obj.remove("type");
        }
    }
    if obj.get("type") == Some(&json!("array")) && !obj.contains_key("items") {
        obj.remove("type");
    }
    let nullable = |s: &Value| s.get("nullable") == Some(&Value::Bool(true));
    let mut nullable_fields: Vec<String> = Vec::new();
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for (name, sub) in props.iter_mut() {
            if nullable(sub) {
                nullable_fields.push(name.clone());
            }
            *sub = v2_schema(sub);
        }
    }
    if obj.get("additionalProperties").is_some_and(nullable) {
        obj.remove("required");
    }
    if let Some(Value::Array(required)) = obj.get_mut("required") {
        required.retain(|r| {
            r.as_str()
                .is_none_or(|r| !nullable_fields.iter().any(|n| n == r))
        });
        if required.is_empty() {
            obj.remove("required");
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub @ Value::Object(_)) = obj.get_mut(key) {
            *sub = v2_schema(sub);
        }
    }
    Value::Object(obj)
}

/// The gnostic `openapi.v2.Document` protobuf encoding of a v2 document in JSON form.
pub(super) fn protobuf(doc: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 1, str_at(doc, "swagger"));
    let mut info = Vec::new();
    put_str(&mut info, 1, str_at(&doc["info"], "title"));
    put_str(&mut info, 2, str_at(&doc["info"], "version"));
    put_msg(&mut out, 2, &info);
    let mut paths = Vec::new();
    for (name, item) in doc["paths"].as_object().into_iter().flatten() {
        let mut named = Vec::new();
        put_str(&mut named, 1, name);
        put_msg(&mut named, 2, &path_item(item));
        put_msg(&mut paths, 2, &named);
    }
    put_msg(&mut out, 8, &paths);
    let mut definitions = Vec::new();
    for (name, schema) in doc["definitions"].as_object().into_iter().flatten() {
        put_msg(&mut definitions, 1, &named_schema(name, schema));
    }
    put_msg(&mut out, 9, &definitions);
    out
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn strings_at<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// `PathItem`: the operations by method, the shared parameters.
fn path_item(item: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (method, field) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("patch", 8),
    ] {
        if let Some(op) = item.get(method) {
            put_msg(&mut out, field, &operation_message(op));
        }
    }
    for p in item["parameters"].as_array().into_iter().flatten() {
        put_msg(&mut out, 9, &parameters_item(p));
    }
    out
}

/// `Operation`.
fn operation_message(op: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 3, str_at(op, "description"));
    put_str(&mut out, 5, str_at(op, "operationId"));
    for t in strings_at(op, "produces") {
        put_str(&mut out, 6, t);
    }
    for t in strings_at(op, "consumes") {
        put_str(&mut out, 7, t);
    }
    for p in op["parameters"].as_array().into_iter().flatten() {
        put_msg(&mut out, 8, &parameters_item(p));
    }
    let mut responses = Vec::new();
    for (code, response) in op["responses"].as_object().into_iter().flatten() {
        let mut message = Vec::new();
        put_str(&mut message, 1, str_at(response, "description"));
        if let Some(schema) = response.get("schema") {
            let mut item = Vec::new();
            put_msg(&mut item, 1, &schema_message(schema));
            put_msg(&mut message, 2, &item);
        }
        let mut value = Vec::new();
        put_msg(&mut value, 1, &message);
        let mut named = Vec::new();
        put_str(&mut named, 1, code);
        put_msg(&mut named, 2, &value);
        put_msg(&mut responses, 1, &named);
    }
    put_msg(&mut out, 9, &responses);
    for s in strings_at(op, "schemes") {
        put_str(&mut out, 10, s);
    }
    vendor_extensions(&mut out, 13, op);
    out
}

/// `ParametersItem` holding a `Parameter`: a body parameter, or a query or path parameter.
fn parameters_item(p: &Value) -> Vec<u8> {
    let location = str_at(p, "in");
    let mut sub = Vec::new();
    let parameter_field;
    if location == "body" {
        put_str(&mut sub, 1, str_at(p, "description"));
        put_str(&mut sub, 2, str_at(p, "name"));
        put_str(&mut sub, 3, location);
        put_bool(&mut sub, 4, p["required"] == true);
        if let Some(schema) = p.get("schema") {
            put_msg(&mut sub, 5, &schema_message(schema));
        }
        parameter_field = 1;
    } else {
        // QueryParameterSubSchema and PathParameterSubSchema number their fields alike up to
        // `name`; from `type` on, the query one has `allowEmptyValue` first.
        let (ty, format, unique_items, kind) = match location {
            "path" => (5, 6, 19, 4),
            _ => (6, 7, 20, 3),
        };
        put_bool(&mut sub, 1, p["required"] == true);
        put_str(&mut sub, 2, location);
        put_str(&mut sub, 3, str_at(p, "description"));
        put_str(&mut sub, 4, str_at(p, "name"));
        put_str(&mut sub, ty, str_at(p, "type"));
        put_str(&mut sub, format, str_at(p, "format"));
        put_bool(&mut sub, unique_items, p["uniqueItems"] == true);
        let mut non_body = Vec::new();
        put_msg(&mut non_body, kind, &sub);
        sub = non_body;
        parameter_field = 2;
    }
    let mut parameter = Vec::new();
    put_msg(&mut parameter, parameter_field, &sub);
    let mut out = Vec::new();
    put_msg(&mut out, 1, &parameter);
    out
}

fn named_schema(name: &str, schema: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 1, name);
    put_msg(&mut out, 2, &schema_message(schema));
    out
}

/// `Schema`.
fn schema_message(s: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 1, str_at(s, "$ref"));
    put_str(&mut out, 2, str_at(s, "format"));
    put_str(&mut out, 3, str_at(s, "title"));
    put_str(&mut out, 4, str_at(s, "description"));
    if let Some(v) = s.get("default") {
        put_msg(&mut out, 5, &any(v));
    }
    for (key, field) in [("multipleOf", 6), ("maximum", 7), ("minimum", 9)] {
        if let Some(n) = s.get(key).and_then(Value::as_f64) {
            put_double(&mut out, field, n);
        }
    }
    put_bool(&mut out, 8, s["exclusiveMaximum"] == true);
    put_bool(&mut out, 10, s["exclusiveMinimum"] == true);
    for (key, field) in [
        ("maxLength", 11),
        ("minLength", 12),
        ("maxItems", 14),
        ("minItems", 15),
        ("maxProperties", 17),
        ("minProperties", 18),
    ] {
        if let Some(n) = s.get(key).and_then(Value::as_i64) {
            put_varint_field(&mut out, field, n as u64);
        }
    }
    put_str(&mut out, 13, str_at(s, "pattern"));
    put_bool(&mut out, 16, s["uniqueItems"] == true);
    for r in strings_at(s, "required") {
        put_str(&mut out, 19, r);
    }
    for v in s["enum"].as_array().into_iter().flatten() {
        put_msg(&mut out, 20, &any(v));
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Vec::new();
            // A oneof member is encoded even when false.
            put_varint_field(&mut item, 2, u64::from(*b));
            put_msg(&mut out, 21, &item);
        }
        Some(sub @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_msg(&mut item, 1, &schema_message(sub));
            put_msg(&mut out, 21, &item);
        }
        _ => {}
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() {
        let mut item = Vec::new();
        for t in types {
            put_str(&mut item, 1, t);
        }
        put_msg(&mut out, 22, &item);
    }
    match s.get("items") {
        Some(sub @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_msg(&mut item, 1, &schema_message(sub));
            put_msg(&mut out, 23, &item);
        }
        Some(Value::Array(subs)) => {
            let mut item = Vec::new();
            for sub in subs {
                put_msg(&mut item, 1, &schema_message(sub));
            }
            put_msg(&mut out, 23, &item);
        }
        _ => {}
    }
    for sub in s["allOf"].as_array().into_iter().flatten() {
        put_msg(&mut out, 24, &schema_message(sub));
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        let mut item = Vec::new();
        for (name, sub) in props {
            put_msg(&mut item, 1, &named_schema(name, sub));
        }
        put_msg(&mut out, 25, &item);
    }
    put_str(&mut out, 26, str_at(s, "discriminator"));
    put_bool(&mut out, 27, s["readOnly"] == true);
    if let Some(v) = s.get("example") {
        put_msg(&mut out, 30, &any(v));
    }
    vendor_extensions(&mut out, 31, s);
    out
}

/// The `x-` keys of `obj` as repeated `NamedAny` in field `field`.
fn vendor_extensions(out: &mut Vec<u8>, field: u32, obj: &Value) {
    for (name, value) in obj.as_object().into_iter().flatten() {
        if name.starts_with("x-") {
            let mut named = Vec::new();
            put_str(&mut named, 1, name);
            put_msg(&mut named, 2, &any(value));
            put_msg(out, field, &named);
        }
    }
}

/// `Any` holding a value as YAML (its JSON text, which YAML reads the same).
fn any(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 2, &v.to_string());
    out
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    put_varint(out, u64::from(field << 3 | wire_type));
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    put_key(out, field, 0);
    put_varint(out, v);
}

/// A length-delimited field (always written: an empty message still marks presence).
fn put_msg(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A string field, left out when empty (its proto3 default).
fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        put_msg(out, field, s.as_bytes());
    }
}

/// A bool field, left out when false (its proto3 default).
fn put_bool(out: &mut Vec<u8>, field: u32, b: bool) {
    if b {
        put_varint_field(out, field, 1);
    }
}

fn put_double(out: &mut Vec<u8>, field: u32, v: f64) {
    put_key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_document_encodes_as_gnostic_reads_it() {
        let doc = json!({"swagger": "2.0", "info": {"title": "t", "version": "v"}, "paths": {}, "definitions": {}});
        assert_eq!(
            protobuf(&doc),
            vec![
                0x0a, 3, b'2', b'.', b'0', 0x12, 6, 0x0a, 1, b't', 0x12, 1, b'v', 0x42, 0, 0x4a, 0
            ]
        );
    }

    #[test]
    fn schemas_encode_field_by_field() {
        let s = json!({"type": "array", "items": {"$ref": "#/definitions/a"}, "x-kubernetes-list-type": "set"});
        let mut want = Vec::new();
        // type (22): TypeItem{value: "array"}
        want.extend_from_slice(&[0xb2, 0x01, 7, 0x0a, 5]);
        want.extend_from_slice(b"array");
        // items (23): ItemsItem{schema: Schema{_ref}}
        want.extend_from_slice(&[0xba, 0x01, 19, 0x0a, 17, 0x0a, 15]);
        want.extend_from_slice(b"#/definitions/a");
        // vendor_extension (31): NamedAny{name, value: Any{yaml: "\"set\""}}
        want.extend_from_slice(&[0xfa, 0x01, 33, 0x0a, 22]);
        want.extend_from_slice(b"x-kubernetes-list-type");
        want.extend_from_slice(&[0x12, 7, 0x12, 5]);
        want.extend_from_slice(b"\"set\"");
        assert_eq!(schema_message(&s), want);
    }

    #[test]
    fn v2_schemas_use_definitions_and_drop_what_kubectl_cannot_read() {
        let v3 = json!({
            "type": "object",
            "required": ["a", "n"],
            "properties": {
                "a": {"description": "d", "allOf": [{"$ref": "#/components/schemas/x.Y"}], "default": {}},
                "n": {"type": "string", "nullable": true},
                "o": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                      "properties": {"p": {"type": "string"}}},
                "e": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
            },
        });
        assert_eq!(
            v2_schema(&v3),
            json!({
                "type": "object",
                "required": ["a"],
                "properties": {
                    "a": {"description": "d", "$ref": "#/definitions/x.Y"},
                    "n": {},
                    "o": {"x-kubernetes-preserve-unknown-fields": true},
                    "e": {"x-kubernetes-int-or-string": true},
                },
            })
        );
    }
}
