//! Rules of the core kinds that carry data, as kube-apiserver's validation of ConfigMaps and
//! Secrets has them: the data add up to at most 1 MiB (`corev1.MaxSecretSize`), keys are config
//! keys, an `immutable` object keeps its data and stays immutable, a Secret keeps its type, and
//! the typed Secrets carry the keys their type needs.

use serde_json::Value;

use super::Report;
use crate::meta::field_error::FieldError;

/// The most data one ConfigMap or Secret may hold (kube's `MaxSecretSize`).
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

/// The bytes a base64 string decodes to.
fn decoded_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4 * 3 + (b64.len() % 4).saturating_sub(1)).saturating_sub(padding.min(2))
}

fn entries<'a>(obj: &'a Value, field: &str) -> impl Iterator<Item = (&'a String, &'a Value)> {
    obj.get(field)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}

/// kube's `IsConfigMapKey`: at most 253 characters of `[-._a-zA-Z0-9]`, and not `.`, `..` or
/// starting with `..`.
fn config_key_problems(key: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if key.len() > 253 {
        out.push("must be no more than 253 characters");
    }
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        out.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')");
    }
    if key == "." {
        out.push("must not be '.'");
    } else if key == ".." {
        out.push("must not be '..'");
    } else if key.starts_with("..") {
        out.push("must not start with '..'");
    }
    out
}

fn validate_keys(obj: &Value, field: &str, report: &mut Report) {
    for (key, _) in entries(obj, field) {
        for problem in config_key_problems(key) {
            report.error(FieldError::invalid(
                format!("{field}[{key}]"),
                key.as_str(),
                problem,
            ));
        }
    }
}

/// Once stored with `immutable: true`, the data fields may not change and `immutable` stays.
fn validate_immutable(obj: &Value, old: Option<&Value>, fields: &[&str], report: &mut Report) {
    let Some(old) = old.filter(|o| o.get("immutable") == Some(&Value::Bool(true))) else {
        return;
    };
    const DETAIL: &str = "field is immutable when `immutable` is set";
    if obj.get("immutable") != Some(&Value::Bool(true)) {
        report.error(FieldError::forbidden("immutable", DETAIL));
    }
    for f in fields {
        if obj.get(*f) != old.get(*f) {
            report.error(FieldError::forbidden(*f, DETAIL));
        }
    }
}

/// A ConfigMap: config keys; `data` and `binaryData` (decoded) add up to at most 1 MiB and
/// share no key; immutability.
pub fn validate_config_map(obj: &Value, old: Option<&Value>, report: &mut Report) {
    validate_keys(obj, "data", report);
    validate_keys(obj, "binaryData", report);
    for (key, _) in entries(obj, "binaryData") {
        if obj.get("data").and_then(|d| d.get(key)).is_some() {
            report.error(FieldError::invalid(
                format!("data[{key}]"),
                key.as_str(),
                "duplicate of key present in binaryData",
            ));
        }
    }
    validate_immutable(obj, old, &["data", "binaryData"], report);
    let text: usize = entries(obj, "data")
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    let binary: usize = entries(obj, "binaryData")
        .map(|(k, v)| k.len() + v.as_str().map_or(0, decoded_len))
        .sum();
    if text + binary > MAX_DATA_BYTES {
        report.error(FieldError::too_long("", MAX_DATA_BYTES));
    }
}

/// A Secret as kube-apiserver stores it: `stringData` written into `data` (base64, over any
/// value of the same key) and dropped; `type` defaults to `Opaque`.
pub fn default_secret(obj: &mut Value) {
    use base64::Engine;
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(plain)) = map.remove("stringData") {
        if !map.get("data").is_some_and(Value::is_object) {
            map.insert("data".into(), Value::Object(Default::default()));
        }
        if let Some(data) = map.get_mut("data").and_then(Value::as_object_mut) {
            for (k, v) in plain {
                let text = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                let encoded = base64::engine::general_purpose::STANDARD.encode(text);
                data.insert(k, Value::String(encoded));
            }
        }
    }
    if map
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        map.insert("type".into(), Value::String("Opaque".into()));
    }
}

/// The keys each typed Secret must have in `data` (kube's `ValidateSecret`).
const REQUIRED_KEYS: &[(&str, &[&str])] = &[
    ("kubernetes.io/tls", &["tls.crt", "tls.key"]),
    ("kubernetes.io/ssh-auth", &["ssh-privatekey"]),
    ("kubernetes.io/dockerconfigjson", &[".dockerconfigjson"]),
    ("kubernetes.io/dockercfg", &[".dockercfg"]),
];

/// A Secret: config keys; `data` (decoded) and `stringData` add up to at most 1 MiB; the type
/// is kept and typed Secrets carry their keys; immutability.
pub fn validate_secret(obj: &Value, old: Option<&Value>, report: &mut Report) {
    validate_keys(obj, "data", report);
    validate_keys(obj, "stringData", report);
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("Opaque");
    let has = |k: &str| {
        obj.get("data").and_then(|d| d.get(k)).is_some()
            || obj.get("stringData").and_then(|d| d.get(k)).is_some()
    };
    if let Some((_, keys)) = REQUIRED_KEYS.iter().find(|(t, _)| *t == ty) {
        for k in *keys {
            if !has(k) {
                report.error(FieldError::required(format!("data[{k}]"), ""));
            }
        }
    }
    if ty == "kubernetes.io/basic-auth" && !has("username") && !has("password") {
        report.error(FieldError::required("data[username]", ""));
        report.error(FieldError::required("data[password]", ""));
    }
    if let Some(old) = old {
        let old_ty = old.get("type").and_then(Value::as_str).unwrap_or("Opaque");
        if old_ty != ty {
            report.error(FieldError::invalid("type", ty, "field is immutable"));
        }
    }
    validate_immutable(obj, old, &["data"], report);
    let data: usize = entries(obj, "data")
        .map(|(_, v)| v.as_str().map_or(0, decoded_len))
        .sum();
    let string_data: usize = entries(obj, "stringData")
        .map(|(_, v)| v.as_str().map_or(0, str::len))
        .sum();
    if data + string_data > MAX_DATA_BYTES {
        report.error(FieldError::too_long("data", MAX_DATA_BYTES));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_lengths_decode_as_kube_counts_them() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("YQ=="), 1);
        assert_eq!(decoded_len("YWI="), 2);
        assert_eq!(decoded_len("YWJj"), 3);
        assert_eq!(decoded_len("YWJjZA"), 4);
    }

    #[test]
    fn a_config_map_over_one_mebibyte_is_refused_and_one_at_the_limit_is_not() {
        let at_limit = json!({"data": {"k": "x".repeat(MAX_DATA_BYTES - 1)}});
        let mut report = Report::default();
        validate_config_map(&at_limit, None, &mut report);
        assert!(report.is_ok(), "{report:?}");
        let over = json!({"data": {"k": "x".repeat(MAX_DATA_BYTES)}});
        let mut report = Report::default();
        validate_config_map(&over, None, &mut report);
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].reason(), "FieldValueTooLong");
        // binaryData counts decoded bytes, together with data.
        let split = json!({"data": {"a": "x".repeat(MAX_DATA_BYTES / 2)},
                           "binaryData": {"b": "eHh4".repeat(MAX_DATA_BYTES / 6 + 1)}});
        let mut report = Report::default();
        validate_config_map(&split, None, &mut report);
        assert!(!report.is_ok());
    }

    #[test]
    fn a_secret_counts_data_decoded_and_string_data_together() {
        let half = "eHh4".repeat(MAX_DATA_BYTES / 6 + 1);
        let ok = json!({"data": {"a": half}});
        let mut report = Report::default();
        validate_secret(&ok, None, &mut report);
        assert!(report.is_ok());
        let over =
            json!({"data": {"a": half}, "stringData": {"b": "y".repeat(MAX_DATA_BYTES / 2 + 8)}});
        let mut report = Report::default();
        validate_secret(&over, None, &mut report);
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].field, "data");
    }

    #[test]
    fn string_data_is_stored_in_data_and_the_type_defaults() {
        let mut s =
            json!({"data": {"a": "eA==", "b": "eA=="}, "stringData": {"b": "hunter2", "c": ""}});
        default_secret(&mut s);
        assert_eq!(
            s,
            json!({"data": {"a": "eA==", "b": "aHVudGVyMg==", "c": ""}, "type": "Opaque"})
        );
        let mut typed = json!({"type": "kubernetes.io/tls"});
        default_secret(&mut typed);
        assert_eq!(typed, json!({"type": "kubernetes.io/tls"}));
    }

    #[test]
    fn keys_immutability_and_types_follow_kube() {
        let mut report = Report::default();
        validate_config_map(
            &json!({"data": {"no/slash": "x", "..x": "y", "ok.key_1-": "z"}}),
            None,
            &mut report,
        );
        let fields: Vec<&str> = report.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["data[..x]", "data[no/slash]"]);

        let frozen = json!({"data": {"a": "1"}, "immutable": true});
        let mut report = Report::default();
        validate_config_map(
            &json!({"data": {"a": "2"}, "immutable": true}),
            Some(&frozen),
            &mut report,
        );
        assert_eq!(
            report.errors[0].body(),
            "Forbidden: field is immutable when `immutable` is set"
        );
        assert_eq!(report.errors[0].field, "data");
        let mut report = Report::default();
        validate_config_map(&json!({"data": {"a": "1"}}), Some(&frozen), &mut report);
        assert_eq!(report.errors[0].field, "immutable");
        let mut report = Report::default();
        validate_config_map(&frozen, Some(&frozen), &mut report);
        assert!(report.is_ok());

        let mut report = Report::default();
        validate_secret(
            &json!({"type": "kubernetes.io/tls", "data": {}}),
            None,
            &mut report,
        );
        let fields: Vec<&str> = report.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["data[tls.crt]", "data[tls.key]"]);
        let mut report = Report::default();
        validate_secret(
            &json!({"type": "kubernetes.io/basic-auth", "data": {"username": "YQ=="}}),
            Some(&json!({"data": {}})),
            &mut report,
        );
        assert_eq!(report.errors.len(), 1);
        assert_eq!(
            report.errors[0].body(),
            "Invalid value: \"kubernetes.io/basic-auth\": field is immutable"
        );
    }
}
