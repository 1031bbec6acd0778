//! OpenAPI value validation with kube-apiserver's error texts (reference E5,
//! B6), plus the list-type uniqueness checks of E7.
//!
//! Per node the checks run in kube-openapi's order: type/nullable, then
//! `anyOf`/`oneOf`/`allOf`/`not`, string keywords (`maxLength`, `minLength`,
//! `pattern`), `format`, number keywords (`multipleOf`, `maximum`,
//! `minimum`), array items then `minItems`/`maxItems` and list-type
//! duplicates, `enum`, and object keywords (`maxProperties`,
//! `minProperties`, `required`, then the properties in document order). A
//! node whose type is wrong gets only the type error. All errors are
//! collected.
//!
//! Paths: errors from OpenAPI keywords use kube-openapi's rendering
//! (`spec.items[2].name`, map entries `spec.labels.app`); list-type
//! duplicates use apimachinery's (`spec.labels[app]`). Errors of
//! `anyOf`/`oneOf`/`allOf`/`not` are, as in kube, not tied to a field: their
//! field is `<nil>`, their value `""` and the quoted path is in the message.

use std::cell::RefCell;
use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::formats;
use super::node::{self, Additional, MAX_DEPTH};
use super::path::{json_type_name, Path};
use crate::meta::field_error::{go_float, go_quote, FieldError, FieldErrorKind};

/// Field name kube gives errors that have no field path.
const NIL_FIELD: &str = "<nil>";

/// Validates `obj` (an entire object, with the resource-root rules applied)
/// against `schema` and returns every violation.
///
/// At the resource root and in embedded resources, only `metadata.name` and
/// `metadata.generateName` are checked against the schema (ObjectMeta has its
/// own validation); embedded resources additionally need `apiVersion` and
/// `kind`.
pub fn validate(obj: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check(obj, schema, &Path::root(), true, 0, &mut errs);
    errs
}

fn field_of(path: &Path) -> String {
    if path.is_root() {
        NIL_FIELD.to_string()
    } else {
        path.dotted()
    }
}

/// `"<path> in body"`, the subject kube-openapi messages start with.
fn subject(path: &Path) -> String {
    if path.is_root() {
        "in body".to_string()
    } else {
        format!("{} in body", path.dotted())
    }
}

fn invalid(path: &Path, value: Value, detail: String) -> FieldError {
    FieldError::new(field_of(path), FieldErrorKind::Invalid, Some(value), detail)
}

fn type_invalid(path: &Path, value: Value, detail: String) -> FieldError {
    FieldError::new(
        field_of(path),
        FieldErrorKind::TypeInvalid,
        Some(value),
        detail,
    )
}

fn composite(path: &Path, what: &str) -> FieldError {
    FieldError::new(
        NIL_FIELD,
        FieldErrorKind::Invalid,
        Some(Value::String(String::new())),
        format!("{} {what}", go_quote(&path.dotted())),
    )
}

/// Allowed JSON types of a node as kube-openapi spells them, if constrained.
fn expected_type(s: &Value) -> Option<String> {
    if node::int_or_string(s) {
        Some("integer,string".to_string())
    } else {
        node::ty(s).map(str::to_string)
    }
}

fn type_matches(v: &Value, s: &Value) -> bool {
    if node::int_or_string(s) {
        return is_integer(v) || v.is_string();
    }
    match node::ty(s) {
        None => true,
        Some("integer") => is_integer(v),
        Some("number") => v.is_number(),
        Some("string") => v.is_string(),
        Some("boolean") => v.is_boolean(),
        Some("array") => v.is_array(),
        Some("object") => v.is_object(),
        Some(_) => true,
    }
}

/// Whole numbers are integers, also when written as `2.0`.
fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn check(
    v: &Value,
    s: &Value,
    path: &Path,
    resource: bool,
    depth: usize,
    errs: &mut Vec<FieldError>,
) {
    if depth > MAX_DEPTH {
        return;
    }
    if v.is_null() {
        if !node::nullable(s) {
            if let Some(t) = expected_type(s) {
                let detail = format!("{} must be of type {t}: \"null\"", subject(path));
                errs.push(type_invalid(path, Value::String("null".into()), detail));
            }
        }
        return;
    }
    if !type_matches(v, s) {
        let t = expected_type(s).unwrap_or_default();
        let actual = json_type_name(v);
        let detail = format!(
            "{} must be of type {t}: {}",
            subject(path),
            go_quote(actual)
        );
        errs.push(type_invalid(path, Value::String(actual.into()), detail));
        return;
    }
    composites(v, s, path, depth, errs);
    match v {
        Value::String(st) => {
            string_keywords(st, s, path, errs);
            if let Some(format) = s.get("format").and_then(Value::as_str) {
                if !formats::check(format, st) {
                    let detail = format!(
                        "{} must be of type {format}: {}",
                        subject(path),
                        go_quote(st)
                    );
                    errs.push(type_invalid(path, v.clone(), detail));
                }
            }
        }
        Value::Number(_) => number_keywords(v, s, path, errs),
        Value::Array(a) => array_keywords(a, s, path, depth, errs),
        _ => {}
    }
    enum_keyword(v, s, path, errs);
    if let Value::Object(m) = v {
        object_keywords(m, s, path, resource, depth, errs);
    }
}

/// Validates `v` against a sub-schema (a composite branch) in isolation.
fn sub(v: &Value, s: &Value, path: &Path, depth: usize) -> Vec<FieldError> {
    let mut e = Vec::new();
    check(v, s, path, false, depth + 1, &mut e);
    e
}

fn branches<'a>(s: &'a Value, key: &str) -> Vec<&'a Value> {
    s.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter(|b| b.is_object()).collect())
        .unwrap_or_default()
}

/// The failure with the fewest errors stands in for kube-openapi's "best
/// failure" (the branch with the most passing checks).
fn best(failures: Vec<Vec<FieldError>>) -> Vec<FieldError> {
    failures
        .into_iter()
        .min_by_key(Vec::len)
        .unwrap_or_default()
}

fn composites(v: &Value, s: &Value, path: &Path, depth: usize, errs: &mut Vec<FieldError>) {
    let any_of = branches(s, "anyOf");
    if !any_of.is_empty() {
        let mut failures = Vec::new();
        let mut ok = false;
        for b in any_of {
            let e = sub(v, b, path, depth);
            if e.is_empty() {
                ok = true;
                break;
            }
            failures.push(e);
        }
        if !ok {
            errs.push(composite(path, "must validate at least one schema (anyOf)"));
            errs.extend(best(failures));
        }
    }
    let one_of = branches(s, "oneOf");
    if !one_of.is_empty() {
        let mut failures = Vec::new();
        let mut valid = 0;
        for b in one_of {
            let e = sub(v, b, path, depth);
            if e.is_empty() {
                valid += 1;
            } else {
                failures.push(e);
            }
        }
        if valid == 0 {
            errs.push(composite(
                path,
                "must validate one and only one schema (oneOf). Found none valid",
            ));
            errs.extend(best(failures));
        } else if valid > 1 {
            errs.push(composite(
                path,
                &format!("must validate one and only one schema (oneOf). Found {valid} valid alternatives"),
            ));
        }
    }
    let all_of = branches(s, "allOf");
    if !all_of.is_empty() {
        let total = all_of.len();
        let mut valid = 0;
        for b in all_of {
            let e = sub(v, b, path, depth);
            if e.is_empty() {
                valid += 1;
            }
            errs.extend(e);
        }
        if valid != total {
            let extra = if valid == 0 { ". None validated" } else { "" };
            errs.push(composite(
                path,
                &format!("must validate all the schemas (allOf){extra}"),
            ));
        }
    }
    if let Some(not) = s.get("not").filter(|n| n.is_object()) {
        if sub(v, not, path, depth).is_empty() {
            errs.push(composite(path, "must not validate the schema (not)"));
        }
    }
}

thread_local! {
    static REGEXES: RefCell<HashMap<String, Option<Regex>>> = RefCell::new(HashMap::new());
}

/// Matches `s` against an ECMA/RE2-style `pattern`, compiling once per
/// thread. A pattern that does not compile is treated as matching (kube
/// rejects such schemas when they are defined).
fn pattern_matches(pattern: &str, s: &str) -> bool {
    REGEXES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.len() > 1024 {
            cache.clear();
        }
        let re = cache
            .entry(pattern.to_string())
            .or_insert_with(|| Regex::new(pattern).ok());
        re.as_ref().is_none_or(|re| re.is_match(s))
    })
}

fn string_keywords(st: &str, s: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let len = st.chars().count() as u64;
    if let Some(max) = node::count(s, "maxLength") {
        if len > max {
            let unit = if max == 1 { "byte" } else { "bytes" };
            errs.push(FieldError::new(
                field_of(path),
                FieldErrorKind::TooLong,
                None,
                format!("may not be more than {max} {unit}"),
            ));
        }
    }
    if let Some(min) = node::count(s, "minLength") {
        if len < min {
            let detail = format!("{} should be at least {min} chars long", subject(path));
            errs.push(invalid(path, Value::String(st.to_string()), detail));
        }
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        if !pattern_matches(p, st) {
            let detail = format!("{} should match '{p}'", subject(path));
            errs.push(invalid(path, Value::String(st.to_string()), detail));
        }
    }
}

fn is_multiple(x: f64, factor: f64) -> bool {
    if factor == 0.0 {
        return true;
    }
    let m = if factor < 1.0 {
        x * (1.0 / factor)
    } else {
        x / factor
    };
    m.is_finite() && m.fract() == 0.0
}

fn number_keywords(v: &Value, s: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(x) = v.as_f64() else { return };
    if let Some(f) = node::num(s, "multipleOf") {
        let exact_int = match (v.as_i64(), s.get("multipleOf").and_then(Value::as_i64)) {
            (Some(a), Some(b)) if b != 0 => Some(a % b == 0),
            _ => None,
        };
        if !exact_int.unwrap_or_else(|| is_multiple(x, f)) {
            let detail = format!("{} should be a multiple of {}", subject(path), go_float(f));
            errs.push(invalid(path, v.clone(), detail));
        }
    }
    if let Some(max) = node::num(s, "maximum") {
        let exclusive = node::flag(s, "exclusiveMaximum");
        if (exclusive && x >= max) || x > max {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            let detail = format!("{} should be {rel} {}", subject(path), go_float(max));
            errs.push(invalid(path, v.clone(), detail));
        }
    }
    if let Some(min) = node::num(s, "minimum") {
        let exclusive = node::flag(s, "exclusiveMinimum");
        if (exclusive && x <= min) || x < min {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            let detail = format!("{} should be {rel} {}", subject(path), go_float(min));
            errs.push(invalid(path, v.clone(), detail));
        }
    }
}

fn array_keywords(a: &[Value], s: &Value, path: &Path, depth: usize, errs: &mut Vec<FieldError>) {
    if let Some(items) = node::items(s) {
        let embedded = node::embedded(items);
        for (i, x) in a.iter().enumerate() {
            check(x, items, &path.index(i), embedded, depth + 1, errs);
        }
    }
    let n = a.len() as u64;
    if let Some(min) = node::count(s, "minItems") {
        if n < min {
            let detail = format!("{} should have at least {min} items", subject(path));
            errs.push(invalid(path, Value::from(n), detail));
        }
    }
    if let Some(max) = node::count(s, "maxItems") {
        if n > max {
            errs.push(FieldError::new(
                field_of(path),
                FieldErrorKind::TooMany,
                Some(Value::from(n)),
                format!("must have at most {max} items"),
            ));
        }
    }
    if node::flag(s, "uniqueItems") {
        let dup = a
            .iter()
            .enumerate()
            .any(|(i, x)| a[..i].iter().any(|y| node::json_eq(x, y)));
        if dup {
            let detail = format!("{} shouldn't contain duplicates", subject(path));
            errs.push(invalid(path, Value::Array(a.to_vec()), detail));
        }
    }
    list_type_duplicates(a, s, path, errs);
}

/// `x-kubernetes-list-type: set` (unique items) and `map` (unique key tuples).
fn list_type_duplicates(a: &[Value], s: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    match node::list_type(s) {
        Some("set") => {
            for (i, x) in a.iter().enumerate() {
                if a[..i].iter().any(|y| node::json_eq(x, y)) {
                    errs.push(FieldError::new(
                        path.index(i).bracketed(),
                        FieldErrorKind::Duplicate,
                        Some(x.clone()),
                        "",
                    ));
                }
            }
        }
        Some("map") => {
            let keys = node::list_map_keys(s);
            if keys.is_empty() {
                return;
            }
            let tuples: Vec<Option<Vec<Option<&Value>>>> = a
                .iter()
                .map(|x| x.is_object().then(|| node::map_key_tuple(x, &keys)))
                .collect();
            for (i, t) in tuples.iter().enumerate() {
                let Some(t) = t else { continue };
                let seen = tuples[..i].iter().flatten().any(|u| node::tuple_eq(t, u));
                if seen {
                    let key_value: Map<String, Value> = keys
                        .iter()
                        .zip(t)
                        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.clone())))
                        .collect();
                    errs.push(FieldError::new(
                        path.index(i).bracketed(),
                        FieldErrorKind::Duplicate,
                        Some(Value::Object(key_value)),
                        "",
                    ));
                }
            }
        }
        _ => {}
    }
}

fn enum_keyword(v: &Value, s: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(allowed) = s.get("enum").and_then(Value::as_array) else {
        return;
    };
    if allowed.iter().any(|a| node::json_eq(a, v)) {
        return;
    }
    let quoted: Vec<String> = allowed
        .iter()
        .map(|a| match a {
            Value::String(x) => go_quote(x),
            other => go_quote(&other.to_string()),
        })
        .collect();
    let detail = if quoted.is_empty() {
        String::new()
    } else {
        format!("supported values: {}", quoted.join(", "))
    };
    errs.push(FieldError::new(
        field_of(path),
        FieldErrorKind::NotSupported,
        Some(v.clone()),
        detail,
    ));
}

fn object_keywords(
    m: &Map<String, Value>,
    s: &Value,
    path: &Path,
    resource: bool,
    depth: usize,
    errs: &mut Vec<FieldError>,
) {
    let n = m.len() as u64;
    if let Some(max) = node::count(s, "maxProperties") {
        if n > max {
            errs.push(FieldError::new(
                field_of(path),
                FieldErrorKind::TooMany,
                Some(Value::from(n)),
                format!("must have at most {max} items"),
            ));
        }
    }
    if let Some(min) = node::count(s, "minProperties") {
        if n < min {
            let detail = format!("{} should have at least {min} properties", subject(path));
            errs.push(invalid(path, Value::from(n), detail));
        }
    }
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !m.contains_key(r) {
                errs.push(FieldError::required(path.field(r).dotted(), ""));
            }
        }
    }
    if resource && !path.is_root() {
        embedded_type_meta(m, path, errs);
    }
    for (k, child) in m {
        let child_path = path.field(k);
        if resource && k == "metadata" {
            metadata_names(
                child,
                node::property(s, "metadata"),
                &child_path,
                depth,
                errs,
            );
            continue;
        }
        if let Some(ps) = node::property(s, k) {
            check(child, ps, &child_path, node::embedded(ps), depth + 1, errs);
        } else if let Additional::Schema(a) = node::additional(s) {
            check(child, a, &path.key(k), node::embedded(a), depth + 1, errs);
        }
    }
}

/// The only schema constraints kube applies inside `metadata`.
fn metadata_names(
    meta: &Value,
    meta_schema: Option<&Value>,
    path: &Path,
    depth: usize,
    errs: &mut Vec<FieldError>,
) {
    let (Some(meta), Some(ms)) = (meta.as_object(), meta_schema) else {
        return;
    };
    for key in ["name", "generateName"] {
        if let (Some(v), Some(ps)) = (meta.get(key), node::property(ms, key)) {
            check(v, ps, &path.field(key), false, depth + 1, errs);
        }
    }
}

/// `apiVersion` and `kind` of a non-empty embedded resource.
fn embedded_type_meta(m: &Map<String, Value>, path: &Path, errs: &mut Vec<FieldError>) {
    if m.is_empty() {
        return;
    }
    for key in ["apiVersion", "kind"] {
        let p = path.field(key).dotted();
        match m.get(key) {
            None => errs.push(FieldError::required(p, "must not be empty")),
            Some(Value::String(x)) if x.is_empty() => {
                errs.push(FieldError::invalid(p, x.as_str(), "must not be empty"));
            }
            Some(Value::String(x)) => {
                if key == "apiVersion" && x.matches('/').count() > 1 {
                    let detail = format!("unexpected GroupVersion string: {x}");
                    errs.push(FieldError::invalid(p, x.as_str(), detail));
                }
            }
            Some(other) => errs.push(FieldError::invalid(p, other.clone(), "must be a string")),
        }
    }
}
