//! Small, panic-free helpers shared by the per-kind rule modules: JSON access,
//! name and path formats, URL shapes and CEL compilation.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use kube_cel::cel::Program;
use serde_json::Value;

use super::Report;
use crate::meta::field_error::FieldError;
use crate::meta::names;

/// The value at a chain of object keys, if every step is an object holding the key.
pub(crate) fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for key in path {
        cur = cur.as_object()?.get(*key)?;
    }
    Some(cur)
}

/// The string at `key` of `v`, if `v` is an object and the value is a string.
pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// The string at `key`, treating a missing, non-string or blank value as unset.
pub(crate) fn set_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    str_of(v, key).filter(|s| !s.trim().is_empty())
}

/// The elements of the array at `key` (empty when absent or not an array).
pub(crate) fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `metadata.name` of an object, when it is a string.
pub(crate) fn object_name(obj: &Value) -> Option<&str> {
    at(obj, &["metadata", "name"]).and_then(Value::as_str)
}

/// Reports `Required value` at `field` when the string at `key` of `parent` is
/// present but blank; returns the trimmed-non-empty value otherwise.
pub(crate) fn non_blank<'a>(
    report: &mut Report,
    parent: &'a Value,
    key: &str,
    field: &str,
    detail: &str,
) -> Option<&'a str> {
    match str_of(parent, key) {
        Some(s) if s.trim().is_empty() => {
            report.error(FieldError::required(field, detail));
            None
        }
        other => other,
    }
}

/// Reports an `Invalid value` per problem when `value` is not a DNS-1123 subdomain
/// (the shape of most Kubernetes object names).
pub(crate) fn dns_subdomain(report: &mut Report, field: &str, value: &str) {
    for msg in names::validate_dns1123_subdomain(value) {
        report.error(FieldError::invalid(field, value, msg));
    }
}

/// Reports an `Invalid value` per problem when `value` is not a DNS-1123 label
/// (the shape of namespace names).
pub(crate) fn dns_label(report: &mut Report, field: &str, value: &str) {
    for msg in names::validate_dns1123_label(value) {
        report.error(FieldError::invalid(field, value, msg));
    }
}

/// Reports `Invalid value` when `value` cannot be a key of a Secret's or ConfigMap's data.
pub(crate) fn data_key(report: &mut Report, field: &str, value: &str) {
    let ok_chars = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let detail = if value.len() > 253 {
        Some("must be no more than 253 characters")
    } else if value == "." || value == ".." {
        Some("must not be '.' or '..'")
    } else if value.is_empty() || !ok_chars {
        Some("a data key may only contain letters, digits, '-', '_' and '.' (e.g. 'kubeconfig')")
    } else {
        None
    };
    if let Some(d) = detail {
        report.error(FieldError::invalid(field, value, d));
    }
}

/// Whether `s` is one kcp logical-cluster path segment: `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`.
fn is_path_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            b.len() <= 63 && alnum(f) && alnum(l) && b.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Whether `s` is a kcp logical-cluster path with at least `min_segments` segments.
pub(crate) fn is_kcp_path(s: &str, min_segments: usize) -> bool {
    let mut n = 0;
    for seg in s.split(':') {
        if !is_path_segment(seg) {
            return false;
        }
        n += 1;
    }
    n >= min_segments
}

/// The detail text for a malformed kcp workspace path.
pub(crate) const KCP_PATH_DETAIL: &str = "must be a kcp workspace path: ':'-separated segments of at most 63 lower case alphanumeric characters or '-', each starting and ending with an alphanumeric character (e.g. 'root:platform-mesh-system')";

/// Reports `Invalid value` when `value` is not a kcp logical-cluster path.
pub(crate) fn kcp_path(report: &mut Report, field: &str, value: &str) {
    if !is_kcp_path(value, 1) {
        report.error(FieldError::invalid(field, value, KCP_PATH_DETAIL));
    }
}

/// What is wrong with `s` as an absolute `http`/`https` URL without query or
/// fragment, or `None` when it is fine. With `no_trailing_slash`, a final `/` is a problem too.
pub(crate) fn http_url_problem(s: &str, no_trailing_slash: bool) -> Option<&'static str> {
    let rest = match s.split_once("://") {
        Some(("http" | "https", rest)) => rest,
        _ => return Some("must be an absolute URL with scheme http or https"),
    };
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain whitespace");
    }
    if s.contains('?') || s.contains('#') {
        return Some("must not contain a query or a fragment");
    }
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Some("must name a host (without user information)");
    }
    let port = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, tail)) if !host.is_empty() => tail.strip_prefix(':'),
            _ => return Some("must name a host (without user information)"),
        }
    } else {
        match authority.split_once(':') {
            Some(("", _)) => return Some("must name a host (without user information)"),
            Some((_, p)) => Some(p),
            None => None,
        }
    };
    if let Some(p) = port {
        let valid = !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=65535).contains(&n));
        if !valid {
            return Some("must have a port between 1 and 65535");
        }
    }
    if no_trailing_slash && s.ends_with('/') {
        return Some("must not end with '/'");
    }
    None
}

/// Compiles a CEL expression, turning parser panics into errors; the error is the
/// first line of the parser's first message.
pub(crate) fn compile_cel(src: &str) -> Result<Program, String> {
    match catch_unwind(AssertUnwindSafe(|| Program::compile(src))) {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => {
            let text = e.to_string();
            Err(text.lines().next().unwrap_or("syntax error").to_string())
        }
        Err(_) => Err("the CEL parser failed on this expression".to_string()),
    }
}

/// Identifiers CEL resolves without a declaration (type names and the protobuf package root).
const CEL_BUILTIN_IDENTS: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "dyn",
    "google",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
];

/// The free variables of a compiled expression: identifiers not bound by a
/// comprehension (macro) and not a CEL type name, sorted.
pub(crate) fn free_variables(p: &Program) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut bound = Vec::new();
    collect_idents(p.expression(), &mut bound, &mut out, 0);
    out
}

fn collect_idents(e: &IdedExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>, depth: usize) {
    if depth > 200 {
        return;
    }
    let d = depth + 1;
    match &e.expr {
        Expr::Ident(name) => {
            if !name.starts_with('@')
                && !bound.iter().any(|b| b == name)
                && !CEL_BUILTIN_IDENTS.contains(&name.as_str())
            {
                out.insert(name.clone());
            }
        }
        Expr::Call(call) => {
            if let Some(t) = &call.target {
                collect_idents(t, bound, out, d);
            }
            for a in &call.args {
                collect_idents(a, bound, out, d);
            }
        }
        Expr::Comprehension(c) => {
            collect_idents(&c.iter_range, bound, out, d);
            collect_idents(&c.accu_init, bound, out, d);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            if let Some(v2) = &c.iter_var2 {
                bound.push(v2.clone());
            }
            bound.push(c.accu_var.clone());
            collect_idents(&c.loop_cond, bound, out, d);
            collect_idents(&c.loop_step, bound, out, d);
            collect_idents(&c.result, bound, out, d);
            bound.truncate(before);
        }
        Expr::List(l) => {
            for el in &l.elements {
                collect_idents(el, bound, out, d);
            }
        }
        Expr::Map(m) => {
            for entry in &m.entries {
                collect_entry(&entry.expr, bound, out, d);
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                collect_entry(&entry.expr, bound, out, d);
            }
        }
        Expr::Select(s) => collect_idents(&s.operand, bound, out, d),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn collect_entry(e: &EntryExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>, depth: usize) {
    match e {
        EntryExpr::StructField(f) => collect_idents(&f.value, bound, out, depth),
        EntryExpr::MapEntry(m) => {
            collect_idents(&m.key, bound, out, depth);
            collect_idents(&m.value, bound, out, depth);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kcp_paths() {
        for ok in [
            "root",
            "root:orgs",
            "root:platform-mesh-system",
            "2x7abc",
            "a:b:c",
        ] {
            assert!(is_kcp_path(ok, 1), "{ok}");
        }
        for bad in [
            "",
            ":",
            "root:",
            ":root",
            "Root",
            "root::orgs",
            "-a",
            "a-",
            "a_b",
            "a/b",
        ] {
            assert!(!is_kcp_path(bad, 1), "{bad}");
        }
        assert!(!is_kcp_path(&"a".repeat(64), 1));
        assert!(is_kcp_path(&"a".repeat(63), 1));
        assert!(!is_kcp_path("root", 2));
        assert!(is_kcp_path("root:account", 2));
    }

    #[test]
    fn http_urls() {
        for ok in [
            "https://kcp.example.com",
            "http://localhost:8443",
            "https://[::1]:6443/base",
            "https://kcp.example.com/",
        ] {
            assert_eq!(http_url_problem(ok, false), None, "{ok}");
        }
        assert_eq!(
            http_url_problem("https://kcp.example.com/", true),
            Some("must not end with '/'")
        );
        let cases = [
            (
                "kcp.example.com",
                "must be an absolute URL with scheme http or https",
            ),
            (
                "ftp://x",
                "must be an absolute URL with scheme http or https",
            ),
            ("https://", "must name a host (without user information)"),
            ("https://u@h", "must name a host (without user information)"),
            ("https://:80", "must name a host (without user information)"),
            ("https://h:0", "must have a port between 1 and 65535"),
            ("https://h:99999", "must have a port between 1 and 65535"),
            ("https://h:", "must have a port between 1 and 65535"),
            ("https://h?x=1", "must not contain a query or a fragment"),
            ("https://h x", "must not contain whitespace"),
            (
                "https://[::1",
                "must name a host (without user information)",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(http_url_problem(s, false), Some(want), "{s}");
        }
    }

    #[test]
    fn cel_free_variables() {
        let p = compile_cel("a.status.x == 1 && b.items.all(i, i.ready) && has(c.f)").unwrap();
        let got: Vec<String> = free_variables(&p).into_iter().collect();
        assert_eq!(got, vec!["a", "b", "c"]);
        let p = compile_cel("type(x) == int && [1, 2].exists(n, n > 1)").unwrap();
        let got: Vec<String> = free_variables(&p).into_iter().collect();
        assert_eq!(got, vec!["x"]);
        let p = compile_cel("{'k': v}.k == w").unwrap();
        let got: Vec<String> = free_variables(&p).into_iter().collect();
        assert_eq!(got, vec!["v", "w"]);
        assert!(compile_cel("1 +").is_err());
        assert!(compile_cel("").is_err());
    }

    #[test]
    fn data_keys() {
        let mut r = Report::default();
        data_key(&mut r, "k", "kubeconfig");
        data_key(&mut r, "k", "tls.crt");
        assert!(r.errors.is_empty());
        data_key(&mut r, "k", "a/b");
        data_key(&mut r, "k", "..");
        data_key(&mut r, "k", "");
        assert_eq!(r.errors.len(), 3);
    }
}
