//! Path elements of managed-field paths: their total order, their FieldsV1 key form
//! (`f:name`, `k:{"name":"a"}`, `v:"x"`, `i:0`) and the human form used in conflict
//! messages (`.spec.containers[name="nginx"].image`, `.metadata.finalizers[="x"]`).

use std::cmp::Ordering;
use std::fmt::Write as _;

pub(crate) use crate::meta::field_error::{go_float, go_quote};
use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Debug, Clone)]
pub enum PathElement {
    /// A field of an object / key of a map: FieldsV1 `f:<name>`, printed `.<name>`.
    Field(String),
    /// An element of a `x-kubernetes-list-type: map` list identified by its key fields
    /// (sorted by field name): FieldsV1 `k:{"name":"a"}`, printed `[name="a"]`.
    Key(Vec<(String, Value)>),
    /// An element of a `x-kubernetes-list-type: set` list: FieldsV1 `v:"x"`, printed `[="x"]`.
    Value(Value),
    /// A list element addressed by position (only when no better identity exists):
    /// FieldsV1 `i:0`, printed `[0]`.
    Index(usize),
}

/// A field path: a sequence of [`PathElement`]s from the object root.
pub type Path = Vec<PathElement>;

impl PathElement {
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }

    /// The FieldsV1 object key for this element (`f:spec`, `k:{"name":"a"}`, `v:"x"`, `i:3`).
    pub fn to_fields_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let mut map = Map::new();
                for (name, value) in fields {
                    map.insert(name.clone(), value.clone());
                }
                format!("k:{}", Value::Object(map))
            }
            PathElement::Value(value) => format!("v:{value}"),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    /// Parses a FieldsV1 object key; `None` when it is not a valid element key.
    pub fn from_fields_key(key: &str) -> Option<PathElement> {
        let (prefix, rest) = (key.get(..2)?, key.get(2..)?);
        match prefix {
            "f:" => Some(PathElement::Field(rest.to_string())),
            "k:" => match serde_json::from_str::<Value>(rest).ok()? {
                Value::Object(map) => {
                    let mut fields: Vec<(String, Value)> = map.into_iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(&b.0));
                    Some(PathElement::Key(fields))
                }
                _ => None,
            },
            "v:" => serde_json::from_str::<Value>(rest)
                .ok()
                .map(PathElement::Value),
            "i:" => rest.parse::<usize>().ok().map(PathElement::Index),
            _ => None,
        }
    }
}

impl std::fmt::Display for PathElement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(name, value)| format!("{name}={}", go_value_string(value)))
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(value) => write!(f, "[={}]", go_value_string(value)),
            PathElement::Index(index) => write!(f, "[{index}]"),
        }
    }
}

/// Renders a path the way structured-merge-diff prints it in conflict messages,
/// e.g. `.spec.containers[name="nginx"].image`.
pub fn path_to_string(path: &[PathElement]) -> String {
    let mut out = String::new();
    for element in path {
        let _ = write!(out, "{element}");
    }
    out
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PathElement {
    /// Fields < keys < values < indices; within a kind by name / key list / value / index.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => a.len().cmp(&b.len()).then_with(|| {
                for ((an, av), (bn, bv)) in a.iter().zip(b.iter()) {
                    let c = an.cmp(bn).then_with(|| compare_values(av, bv));
                    if c != Ordering::Equal {
                        return c;
                    }
                }
                Ordering::Equal
            }),
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

fn value_rank(v: &Value) -> u8 {
    match v {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    }
}

/// A total order over JSON values: numbers < strings < booleans < lists < maps < null.
pub(crate) fn compare_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                return x.cmp(&y);
            }
            if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                return x.cmp(&y);
            }
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x.total_cmp(&y)
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (xa, ya) in x.iter().zip(y.iter()) {
                let c = compare_values(xa, ya);
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            // serde_json maps iterate in key order, so this is a sorted comparison.
            for ((xk, xv), (yk, yv)) in x.iter().zip(y.iter()) {
                let c = xk.cmp(yk).then_with(|| compare_values(xv, yv));
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Null, Value::Null) => Ordering::Equal,
        _ => value_rank(a).cmp(&value_rank(b)),
    }
}

/// Renders a value the way structured-merge-diff's `value.ToString` does (Go `%v`/`%q`).
pub(crate) fn go_value_string(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                u.to_string()
            } else {
                go_float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(go_value_string).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", go_value_string(v)))
            .collect(),
    }
}
