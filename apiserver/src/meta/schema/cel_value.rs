//! JSON → CEL value conversion guided by the schema (reference E6 type table).
//!
//! * `integer` (and untyped whole numbers, int-or-string numbers) → `int`
//!   (never `uint`: a non-negative JSON integer must still compare equal to
//!   the CEL literal `2`); `number` → `double`;
//! * strings with `format: date-time`/`datetime`/`date` → `timestamp`,
//!   `duration` → `duration`, `byte` → `bytes` (values that do not parse stay
//!   strings);
//! * objects with `properties` expose only the declared properties, with
//!   names escaped the Kubernetes way (`__dash__`, `__dot__`, `__slash__`,
//!   `__underscores__`, `__<keyword>__`; names that cannot be escaped are not
//!   visible); `additionalProperties` maps keep their keys verbatim;
//!   preserve-unknown objects without properties expose everything;
//! * at a resource root / embedded resource, `apiVersion`, `kind` and
//!   `metadata.name` / `metadata.generateName` are visible, nothing else of
//!   `metadata`.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use kube_cel::cel::{self, objects::Key};
use serde_json::Value;

use super::node::{self, Additional, MAX_DEPTH};

/// CEL reserved words, accessible only as `__<word>__`.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The CEL name of a property, or `None` when it cannot be expressed.
pub(crate) fn escape_property(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first = chars.next()?;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
    if !(first.is_ascii_alphabetic() || matches!(first, '_' | '.' | '-' | '/'))
        || !chars.all(allowed)
    {
        return None;
    }
    let mut out = String::with_capacity(name.len() + 8);
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// Converts `v` (typed by schema `s`, `None` for untyped) to a CEL value;
/// `resource` applies the resource-root visibility rules.
pub(crate) fn to_cel(v: &Value, s: Option<&Value>, resource: bool) -> cel::Value {
    convert(v, s, resource, 0)
}

fn string_value(x: &str) -> cel::Value {
    cel::Value::String(Arc::new(x.to_string()))
}

fn convert(v: &Value, s: Option<&Value>, resource: bool, depth: usize) -> cel::Value {
    if depth > MAX_DEPTH {
        return cel::Value::Null;
    }
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            let is_number = s.and_then(node::ty) == Some("number");
            match n.as_i64() {
                Some(i) if !is_number => cel::Value::Int(i),
                _ => cel::Value::Float(n.as_f64().unwrap_or(0.0)),
            }
        }
        Value::String(x) => {
            let format = s
                .filter(|s| node::ty(s) == Some("string"))
                .and_then(|s| s.get("format"))
                .and_then(Value::as_str);
            match format {
                Some("date-time" | "datetime") => {
                    super::cel::parse_with("timestamp", x).unwrap_or_else(|| string_value(x))
                }
                Some("date") => super::cel::parse_with("timestamp", &format!("{x}T00:00:00Z"))
                    .unwrap_or_else(|| string_value(x)),
                Some("duration") => {
                    super::cel::parse_with("duration", x).unwrap_or_else(|| string_value(x))
                }
                Some("byte") => match base64::engine::general_purpose::STANDARD.decode(x) {
                    Ok(b) => cel::Value::Bytes(Arc::new(b)),
                    Err(_) => string_value(x),
                },
                _ => string_value(x),
            }
        }
        Value::Array(a) => {
            let items = s.and_then(node::items);
            let list = a
                .iter()
                .map(|x| {
                    let emb = items.is_some_and(node::embedded);
                    convert(x, items, emb, depth + 1)
                })
                .collect();
            cel::Value::List(Arc::new(list))
        }
        Value::Object(m) => {
            let mut out: HashMap<Key, cel::Value> = HashMap::new();
            let Some(s) = s else {
                for (k, x) in m {
                    out.insert(Key::from(k.as_str()), convert(x, None, false, depth + 1));
                }
                return cel::Value::from(out);
            };
            let props = node::properties(s);
            for (k, x) in m {
                if resource && matches!(k.as_str(), "apiVersion" | "kind") {
                    out.insert(Key::from(k.as_str()), convert(x, None, false, depth + 1));
                    continue;
                }
                if resource && k == "metadata" {
                    out.insert(Key::from("metadata"), metadata_view(x));
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    if let Some(name) = escape_property(k) {
                        let child = convert(x, Some(ps), node::embedded(ps), depth + 1);
                        out.insert(Key::from(name), child);
                    }
                    continue;
                }
                match node::additional(s) {
                    Additional::Schema(a) => {
                        let child = convert(x, Some(a), node::embedded(a), depth + 1);
                        out.insert(Key::from(k.as_str()), child);
                    }
                    Additional::Any => {
                        out.insert(Key::from(k.as_str()), convert(x, None, false, depth + 1));
                    }
                    Additional::Absent if node::preserve_unknown(s) && props.is_none() => {
                        out.insert(Key::from(k.as_str()), convert(x, None, false, depth + 1));
                    }
                    Additional::Absent => {}
                }
            }
            cel::Value::from(out)
        }
    }
}

/// `metadata` as CEL sees it at a resource root: only `name` and
/// `generateName`.
fn metadata_view(meta: &Value) -> cel::Value {
    let mut out: HashMap<Key, cel::Value> = HashMap::new();
    if let Some(m) = meta.as_object() {
        for key in ["name", "generateName"] {
            if let Some(Value::String(x)) = m.get(key) {
                out.insert(Key::from(key), string_value(x));
            }
        }
    }
    cel::Value::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escaping_table() {
        let cases = [
            ("replicas", Some("replicas")),
            ("x-y", Some("x__dash__y")),
            ("a.b", Some("a__dot__b")),
            ("a/b", Some("a__slash__b")),
            ("a__b", Some("a__underscores__b")),
            ("namespace", Some("__namespace__")),
            ("if", Some("__if__")),
            ("1abc", None),
            ("a b", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(escape_property(name).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn integers_convert_to_int_and_numbers_to_double() {
        let s = json!({"type": "object", "properties": {
            "i": {"type": "integer"}, "n": {"type": "number"}}});
        let v = to_cel(&json!({"i": 2, "n": 2}), Some(&s), false);
        let cel::Value::Map(m) = v else {
            panic!("not a map")
        };
        assert_eq!(m.map.get(&Key::from("i")), Some(&cel::Value::Int(2)));
        assert_eq!(m.map.get(&Key::from("n")), Some(&cel::Value::Float(2.0)));
    }

    #[test]
    fn root_metadata_is_restricted() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object"}}});
        let obj = json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a", "labels": {"x": "y"}},
            "spec": {}, "extra": 1});
        let cel::Value::Map(m) = to_cel(&obj, Some(&s), true) else {
            panic!("not a map")
        };
        assert!(m.map.contains_key(&Key::from("kind")));
        assert!(!m.map.contains_key(&Key::from("extra")));
        let Some(cel::Value::Map(meta)) = m.map.get(&Key::from("metadata")) else {
            panic!("no metadata")
        };
        assert_eq!(meta.map.len(), 1);
    }
}
