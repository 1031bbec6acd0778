//! Field paths and Go-compatible value formatting shared by the schema engine.
//!
//! Kubernetes renders the same location differently depending on which code
//! produced the error:
//!
//! * kube-openapi (OpenAPI value validation, pruning) joins object keys with
//!   `.` and array indices with `[i]`, also for `additionalProperties` entries
//!   (`spec.labels.app`, `spec.items[2].name`);
//! * apimachinery `field.Path` (CEL rules, list-type checks) renders
//!   `additionalProperties` entries as `[key]` (`spec.labels[app]`).
//!
//! [`Path`] keeps the segments apart so both renderings are available.
//! Value formatting (Go `%q`, `%v`) comes from [`crate::meta::field_error`].

use serde_json::Value;

/// One step of a [`Path`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A declared property (`properties`) or implicit field (`apiVersion`).
    Field(String),
    /// An array index.
    Index(usize),
    /// An entry of a map typed by `additionalProperties`.
    Key(String),
}

/// A location inside an object, from its root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Path(Vec<Seg>);

impl Path {
    /// The object root (renders as the empty string).
    pub(crate) fn root() -> Self {
        Path(Vec::new())
    }

    /// True when this path designates the object root.
    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path of a declared property below this one.
    pub(crate) fn field(&self, name: &str) -> Self {
        self.with(Seg::Field(name.to_string()))
    }

    /// The path of an array element below this one.
    pub(crate) fn index(&self, i: usize) -> Self {
        self.with(Seg::Index(i))
    }

    /// The path of an `additionalProperties` map entry below this one.
    pub(crate) fn key(&self, k: &str) -> Self {
        self.with(Seg::Key(k.to_string()))
    }

    fn with(&self, seg: Seg) -> Self {
        let mut v = self.0.clone();
        v.push(seg);
        Path(v)
    }

    /// kube-openapi rendering: map entries as `.key`, indices as `[i]`.
    pub(crate) fn dotted(&self) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Field(n) | Seg::Key(n) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(n);
                }
                Seg::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        out
    }

    /// apimachinery `field.Path` rendering: map entries as `[key]`.
    pub(crate) fn bracketed(&self) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Field(n) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(n);
                }
                Seg::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
                Seg::Key(k) => {
                    out.push('[');
                    out.push_str(k);
                    out.push(']');
                }
            }
        }
        out
    }
}

/// The JSON-schema type name of a value as kube-openapi reports it
/// (`integer` for whole JSON integers, `number` for other numbers).
pub(crate) fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() {
                "integer"
            } else {
                "number"
            }
        }
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_renderings() {
        let p = Path::root()
            .field("spec")
            .field("items")
            .index(2)
            .field("labels")
            .key("app");
        assert_eq!(p.dotted(), "spec.items[2].labels.app");
        assert_eq!(p.bracketed(), "spec.items[2].labels[app]");
        assert_eq!(Path::root().dotted(), "");
        assert_eq!(Path::root().index(0).dotted(), "[0]");
    }
}
