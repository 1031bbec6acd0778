//! Size rules of the core kinds that carry data: kube-apiserver refuses a ConfigMap or a Secret
//! whose data add up to more than 1 MiB (`corev1.MaxSecretSize`), whatever the body limit.

use serde_json::Value;

use super::Report;
use crate::field_error::FieldError;

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

/// A ConfigMap's keys and values of `data` and `binaryData` (decoded) add up to at most 1 MiB.
pub fn validate_config_map(obj: &Value, report: &mut Report) {
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

/// A Secret's values of `data` (decoded) and `stringData` add up to at most 1 MiB.
pub fn validate_secret(obj: &Value, report: &mut Report) {
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
        validate_config_map(&at_limit, &mut report);
        assert!(report.is_ok(), "{report:?}");
        let over = json!({"data": {"k": "x".repeat(MAX_DATA_BYTES)}});
        let mut report = Report::default();
        validate_config_map(&over, &mut report);
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].reason(), "FieldValueTooLong");
        // binaryData counts decoded bytes, together with data.
        let split = json!({"data": {"a": "x".repeat(MAX_DATA_BYTES / 2)},
                           "binaryData": {"b": "eHh4".repeat(MAX_DATA_BYTES / 6 + 1)}});
        let mut report = Report::default();
        validate_config_map(&split, &mut report);
        assert!(!report.is_ok());
    }

    #[test]
    fn a_secret_counts_data_decoded_and_string_data_together() {
        let half = "eHh4".repeat(MAX_DATA_BYTES / 6 + 1);
        let ok = json!({"data": {"a": half}});
        let mut report = Report::default();
        validate_secret(&ok, &mut report);
        assert!(report.is_ok());
        let over =
            json!({"data": {"a": half}, "stringData": {"b": "y".repeat(MAX_DATA_BYTES / 2 + 8)}});
        let mut report = Report::default();
        validate_secret(&over, &mut report);
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].field, "data");
    }
}
