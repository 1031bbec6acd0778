//! Object name, label, annotation and metadata validation with the messages Kubernetes prints.
//! Also generates names from `metadata.generateName` prefixes.

use serde_json::{Map, Value};

use crate::meta::field_error::FieldError;

/// Longest DNS-1123 subdomain (object names of most kinds).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Longest DNS-1123 label (namespace names).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Longest name part of a qualified name (label keys, annotation keys, finalizers).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// Maximum total size of all annotation keys and values, in bytes.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
/// Number of random characters appended to a `generateName` prefix.
pub const GENERATED_SUFFIX_LENGTH: usize = 5;
/// Longest prefix kept from `generateName` (63 minus the random suffix).
pub const MAX_GENERATED_PREFIX_LENGTH: usize = 63 - GENERATED_SUFFIX_LENGTH;
/// Characters the random suffix is drawn from (no vowels, no confusable digits).
pub const GENERATE_NAME_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Which naming rule a kind's `metadata.name` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NameRule {
    /// DNS-1123 subdomain: ConfigMap, Secret, ServiceAccount, Event, Lease, custom resources.
    #[default]
    DnsSubdomain,
    /// DNS-1123 label: Namespace.
    DnsLabel,
    /// Anything usable as one URL path segment.
    PathSegment,
}

/// `must be no more than N characters`.
fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// A regex-failure message with examples, in the Kubernetes wording (including its double spaces).
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, ex) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(ex);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(fmt);
    out.push_str("')");
    out
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            is_lower_alnum(f)
                && is_lower_alnum(l)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Matches the DNS-1123 subdomain regex (dot-separated labels, no length limit).
fn is_dns_subdomain_shape(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(is_dns_label_shape)
}

/// Matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// Validates a DNS-1123 subdomain (at most 253 characters); returns the problems, empty when valid.
pub fn validate_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !is_dns_subdomain_shape(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Validates a DNS-1123 label (at most 63 characters, no dots); returns the problems.
pub fn validate_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !is_dns_label_shape(value) {
        if is_dns_subdomain_shape(value) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Validates a name used as a URL path segment: not `.` or `..`, no `/` or `%`.
/// With `prefix` (a generateName prefix) the exact-name checks are skipped.
pub fn validate_path_segment_name(name: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        for bad in [".", ".."] {
            if name == bad {
                return vec![format!("may not be '{bad}'")];
            }
        }
    }
    let mut errs = Vec::new();
    for bad in ["/", "%"] {
        if name.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

/// Validates a qualified name: optional DNS-subdomain prefix and `/`, then a name part of at most
/// 63 characters. Used for label keys, annotation keys and finalizers.
pub fn validate_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for msg in validate_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {msg}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// Validates a label key (a qualified name).
pub fn validate_label_key(key: &str) -> Vec<String> {
    validate_qualified_name(key)
}

/// Validates a label value: empty, or at most 63 alphanumerics, `-`, `_`, `.` starting and ending
/// alphanumeric.
pub fn validate_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Validates a `metadata.labels` value (a map of strings) at `field`.
pub fn validate_labels(labels: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let map = match labels {
        Value::Null => return errs,
        Value::Object(m) => m,
        other => {
            errs.push(FieldError::type_invalid(
                field,
                other.clone(),
                "must be of type object",
            ));
            return errs;
        }
    };
    for (k, v) in sorted_entries(map) {
        for msg in validate_label_key(k) {
            errs.push(FieldError::invalid(field, k.as_str(), msg));
        }
        match v {
            Value::String(s) => {
                for msg in validate_label_value(s) {
                    errs.push(FieldError::invalid(field, s.as_str(), msg));
                }
            }
            other => errs.push(FieldError::type_invalid(
                format!("{field}.{k}"),
                other.clone(),
                "must be of type string",
            )),
        }
    }
    errs
}

/// Validates a `metadata.annotations` value at `field`: keys are case-insensitive qualified
/// names and all keys plus values together may use at most 256 KiB.
pub fn validate_annotations(annotations: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let map = match annotations {
        Value::Null => return errs,
        Value::Object(m) => m,
        other => {
            errs.push(FieldError::type_invalid(
                field,
                other.clone(),
                "must be of type object",
            ));
            return errs;
        }
    };
    let mut total: usize = 0;
    for (k, v) in sorted_entries(map) {
        for msg in validate_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid(field, k.as_str(), msg));
        }
        total = total.saturating_add(k.len());
        match v {
            Value::String(s) => total = total.saturating_add(s.len()),
            other => errs.push(FieldError::type_invalid(
                format!("{field}.{k}"),
                other.clone(),
                "must be of type string",
            )),
        }
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(field, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

fn sorted_entries(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// Validates a full object name under `rule`.
pub fn validate_name(name: &str, rule: NameRule) -> Vec<String> {
    match rule {
        NameRule::DnsSubdomain => validate_dns1123_subdomain(name),
        NameRule::DnsLabel => validate_dns1123_label(name),
        NameRule::PathSegment => validate_path_segment_name(name, false),
    }
}

/// Validates a `generateName` prefix under `rule`; a trailing `-` is allowed because the random
/// suffix follows it.
pub fn validate_generate_name(prefix: &str, rule: NameRule) -> Vec<String> {
    match rule {
        NameRule::DnsSubdomain => validate_dns1123_subdomain(&mask_trailing_dash(prefix)),
        NameRule::DnsLabel => validate_dns1123_label(&mask_trailing_dash(prefix)),
        NameRule::PathSegment => validate_path_segment_name(prefix, true),
    }
}

/// Replaces a final `-` with `a` so that a prefix like `web-` passes the "ends alphanumeric" rule.
fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 {
        if let Some(stripped) = name.strip_suffix('-') {
            return format!("{stripped}a");
        }
    }
    name.to_string()
}

/// Builds a name from a `generateName` prefix: the prefix cut to at most 58 bytes (on a character
/// boundary) plus five characters from `random_suffix` (expected to draw from
/// [`GENERATE_NAME_ALPHABET`]).
pub fn generate_name(prefix: &str, mut random_suffix: impl FnMut() -> char) -> String {
    let mut cut = prefix.len().min(MAX_GENERATED_PREFIX_LENGTH);
    while cut > 0 && !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = prefix.get(..cut).unwrap_or_default().to_string();
    for _ in 0..GENERATED_SUFFIX_LENGTH {
        out.push(random_suffix());
    }
    out
}

/// Validates the metadata of an object being created or updated. `namespaced` says whether the
/// kind lives in namespaces; `name_rule` is the kind's naming rule. Field paths are `metadata.*`.
pub fn validate_object_meta(
    meta: &Value,
    namespaced: bool,
    name_rule: NameRule,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let empty = Map::new();
    let m = match meta {
        Value::Object(m) => m,
        Value::Null => &empty,
        other => {
            errs.push(FieldError::type_invalid(
                "metadata",
                other.clone(),
                "must be of type object",
            ));
            return errs;
        }
    };

    // generateName
    match m.get("generateName") {
        None | Some(Value::Null) => {}
        Some(Value::String(g)) => {
            if !g.is_empty() {
                for msg in validate_generate_name(g, name_rule) {
                    errs.push(FieldError::invalid(
                        "metadata.generateName",
                        g.as_str(),
                        msg,
                    ));
                }
            }
        }
        Some(other) => errs.push(FieldError::type_invalid(
            "metadata.generateName",
            other.clone(),
            "must be of type string",
        )),
    }

    // name
    match m.get("name") {
        None | Some(Value::Null) => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(Value::String(n)) if n.is_empty() => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(Value::String(n)) => {
            for msg in validate_name(n, name_rule) {
                errs.push(FieldError::invalid("metadata.name", n.as_str(), msg));
            }
        }
        Some(other) => errs.push(FieldError::type_invalid(
            "metadata.name",
            other.clone(),
            "must be of type string",
        )),
    }

    // namespace
    let namespace = match m.get("namespace") {
        None | Some(Value::Null) => Some(""),
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => {
            errs.push(FieldError::type_invalid(
                "metadata.namespace",
                other.clone(),
                "must be of type string",
            ));
            None
        }
    };
    if let Some(ns) = namespace {
        if namespaced {
            if ns.is_empty() {
                errs.push(FieldError::required("metadata.namespace", ""));
            } else {
                for msg in validate_dns1123_label(ns) {
                    errs.push(FieldError::invalid("metadata.namespace", ns, msg));
                }
            }
        } else if !ns.is_empty() {
            errs.push(FieldError::forbidden(
                "metadata.namespace",
                "not allowed on this type",
            ));
        }
    }

    // generation
    if let Some(g) = m.get("generation") {
        match g {
            Value::Null => {}
            Value::Number(n) => {
                if n.as_f64().is_some_and(|f| f < 0.0) {
                    errs.push(FieldError::invalid(
                        "metadata.generation",
                        g.clone(),
                        "must be greater than or equal to 0",
                    ));
                }
            }
            other => errs.push(FieldError::type_invalid(
                "metadata.generation",
                other.clone(),
                "must be of type integer",
            )),
        }
    }

    if let Some(labels) = m.get("labels") {
        errs.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = m.get("annotations") {
        errs.extend(validate_annotations(annotations, "metadata.annotations"));
    }
    if let Some(refs) = m.get("ownerReferences") {
        errs.extend(validate_owner_references(refs, "metadata.ownerReferences"));
    }
    if let Some(finalizers) = m.get("finalizers") {
        errs.extend(validate_finalizers(finalizers, "metadata.finalizers"));
    }
    errs
}

/// Validates `metadata.finalizers`: each entry a qualified name; `orphan` and
/// `foregroundDeletion` may not both be present.
pub fn validate_finalizers(finalizers: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let list = match finalizers {
        Value::Null => return errs,
        Value::Array(l) => l,
        other => {
            errs.push(FieldError::type_invalid(
                field,
                other.clone(),
                "must be of type array",
            ));
            return errs;
        }
    };
    let mut orphan = false;
    let mut foreground = false;
    for (i, f) in list.iter().enumerate() {
        match f {
            Value::String(s) => {
                for msg in validate_qualified_name(s) {
                    errs.push(FieldError::invalid(field, s.as_str(), msg));
                }
                orphan |= s == "orphan";
                foreground |= s == "foregroundDeletion";
            }
            other => errs.push(FieldError::type_invalid(
                format!("{field}[{i}]"),
                other.clone(),
                "must be of type string",
            )),
        }
    }
    if orphan && foreground {
        errs.push(FieldError::invalid(
            field,
            finalizers.clone(),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

/// Validates `metadata.ownerReferences`: apiVersion (with a version), kind, name and uid are
/// required, core Events may not own objects, and at most one reference may be the controller.
pub fn validate_owner_references(refs: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let list = match refs {
        Value::Null => return errs,
        Value::Array(l) => l,
        other => {
            errs.push(FieldError::type_invalid(
                field,
                other.clone(),
                "must be of type array",
            ));
            return errs;
        }
    };
    let mut first_controller: Option<String> = None;
    for (i, r) in list.iter().enumerate() {
        let Some(obj) = r.as_object() else {
            errs.push(FieldError::type_invalid(
                format!("{field}[{i}]"),
                r.clone(),
                "must be of type object",
            ));
            continue;
        };
        let get = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or("");
        let api_version = get("apiVersion");
        let kind = get("kind");
        let name = get("name");
        let uid = get("uid");
        let (group, version) = split_api_version(api_version);
        if version.is_empty() {
            errs.push(FieldError::invalid(
                format!("{field}.apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        if kind.is_empty() {
            errs.push(FieldError::invalid(
                format!("{field}.kind"),
                kind,
                "kind must not be empty",
            ));
        }
        if name.is_empty() {
            errs.push(FieldError::invalid(
                format!("{field}.name"),
                name,
                "name must not be empty",
            ));
        }
        if uid.is_empty() {
            errs.push(FieldError::invalid(
                format!("{field}.uid"),
                uid,
                "uid must not be empty",
            ));
        }
        if group.is_empty() && version == "v1" && kind == "Event" {
            errs.push(FieldError::invalid(
                field,
                r.clone(),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if obj.get("controller").and_then(Value::as_bool) == Some(true) {
            let current = format!("{kind}/{name}");
            match &first_controller {
                Some(first) => errs.push(FieldError::invalid(
                    field,
                    refs.clone(),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {current}"
                    ),
                )),
                None => first_controller = Some(current),
            }
        }
    }
    errs
}

/// Splits `group/version` (or a bare core `version`); more than one `/` yields an empty version.
fn split_api_version(api_version: &str) -> (&str, &str) {
    let mut parts = api_version.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(v), None, _) => ("", v),
        (Some(g), Some(v), None) => (g, v),
        _ => ("", ""),
    }
}

#[cfg(test)]
mod tests;
