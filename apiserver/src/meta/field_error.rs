//! Field-level validation errors shared by every validator in the server (metadata, schemas, options).
//! They render like Kubernetes field errors: `<field>: <Type>[: <value>][: <detail>]`, and become Status causes.

use std::fmt;

use serde_json::{json, Value};

/// The category of a [`FieldError`]; decides the rendered type text and the Status cause reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// A required field is missing or empty.
    Required,
    /// A value is malformed or out of range.
    Invalid,
    /// A value is not one of an enumerated set.
    NotSupported,
    /// A field may not be set (or not set to this value) in this context.
    Forbidden,
    /// A value is longer than allowed.
    TooLong,
    /// A list or map has more entries than allowed.
    TooMany,
    /// A value is repeated where it must be unique.
    Duplicate,
    /// A referenced item does not exist.
    NotFound,
    /// A value has the wrong JSON type.
    TypeInvalid,
    /// The server failed for reasons unrelated to the input.
    Internal,
}

impl FieldErrorKind {
    /// The Status cause `reason` string (e.g. `FieldValueRequired`).
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::NotFound => "FieldValueNotFound",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::Internal => "InternalError",
        }
    }

    /// The human-readable type text that starts an error body (e.g. `Required value`).
    pub fn label(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::NotFound => "Not found",
            FieldErrorKind::Internal => "Internal error",
        }
    }

    /// Whether the offending value is printed in the body (never for these four kinds).
    fn shows_value(self) -> bool {
        !matches!(
            self,
            FieldErrorKind::Required
                | FieldErrorKind::Forbidden
                | FieldErrorKind::TooLong
                | FieldErrorKind::Internal
        )
    }
}

/// One validation failure at one field path.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// Dotted field path, e.g. `metadata.name` or `spec.items[0].port`.
    pub field: String,
    /// The error category.
    pub kind: FieldErrorKind,
    /// The offending value; `None` omits it from the message.
    pub value: Option<Value>,
    /// Extra explanation appended after the value.
    pub detail: String,
}

impl FieldError {
    /// Builds an error from all parts.
    pub fn new(
        field: impl Into<String>,
        kind: FieldErrorKind,
        value: Option<Value>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            kind,
            value,
            detail: detail.into(),
        }
    }

    /// `Required value[: detail]`.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Required, None, detail)
    }

    /// `Invalid value: <value>[: detail]`.
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(field, FieldErrorKind::Invalid, Some(value.into()), detail)
    }

    /// `Unsupported value: <value>: supported values: "a", "b"` (no detail when `supported` is empty).
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(
            field,
            FieldErrorKind::NotSupported,
            Some(value.into()),
            detail,
        )
    }

    /// `Forbidden[: detail]`.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Forbidden, None, detail)
    }

    /// `Too long: must have at most <max_bytes> bytes`.
    pub fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        Self::new(
            field,
            FieldErrorKind::TooLong,
            None,
            format!("must have at most {max_bytes} bytes"),
        )
    }

    /// `Too many[: <actual>]: must have at most <max> items` (`has too many items` without a max).
    pub fn too_many(field: impl Into<String>, actual: Option<i64>, max: Option<i64>) -> Self {
        let detail = match max {
            Some(m) => format!("must have at most {m} items"),
            None => "has too many items".to_string(),
        };
        Self::new(
            field,
            FieldErrorKind::TooMany,
            actual.map(Value::from),
            detail,
        )
    }

    /// `Duplicate value: <value>`.
    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::new(field, FieldErrorKind::Duplicate, Some(value.into()), "")
    }

    /// `Not found: <value>`.
    pub fn not_found(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::new(field, FieldErrorKind::NotFound, Some(value.into()), "")
    }

    /// `Invalid value: <value>: detail` with the type-mismatch reason.
    pub fn type_invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(
            field,
            FieldErrorKind::TypeInvalid,
            Some(value.into()),
            detail,
        )
    }

    /// `Internal error: detail`.
    pub fn internal(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Internal, None, detail)
    }

    /// The Status cause `reason` string for this error.
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }

    /// The message without the field prefix, as used for Status cause messages.
    pub fn body(&self) -> String {
        let mut s = self.kind.label().to_string();
        if self.kind.shows_value() {
            if let Some(v) = &self.value {
                s.push_str(": ");
                s.push_str(&render_value(v));
            }
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// The Status cause object `{"reason":…,"message":<body>,"field":…}`.
    pub fn to_cause(&self) -> Value {
        json!({
            "reason": self.reason(),
            "message": self.body(),
            "field": self.field,
        })
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Joins errors like a Kubernetes aggregate: duplicates dropped, one error bare, several as `[a, b]`.
pub fn aggregate_message(errors: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errors {
        let s = e.to_string();
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    match seen.len() {
        0 => String::new(),
        1 => seen.swap_remove(0),
        _ => format!("[{}]", seen.join(", ")),
    }
}

/// The 422 Status message: `<Kind.group> "<name>" is invalid: <aggregate>`.
pub fn invalid_message(qualified_kind: &str, name: &str, errors: &[FieldError]) -> String {
    format!(
        "{} {} is invalid: {}",
        qualified_kind,
        go_quote(name),
        aggregate_message(errors)
    )
}

/// Renders a value for a message: strings quoted Go-style, numbers and bools bare, `null` as `"null"`,
/// arrays and objects as compact JSON.
pub fn render_value(v: &Value) -> String {
    match v {
        Value::Null => go_quote("null"),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => render_number(n),
        Value::String(s) => go_quote(s),
        Value::Array(_) | Value::Object(_) => v.to_string(),
    }
}

/// Formats a JSON number like Go's `%v` would format the decoded value (int64 or float64).
pub fn render_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        go_float(n.as_f64().unwrap_or(0.0))
    }
}

/// Quotes a string like Go's `%q`: double quotes, backslash escapes for quotes, backslashes and
/// control characters; printable Unicode is kept.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() || c == '\u{feff}' => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Formats a float like Go's `%v` (shortest digits; exponent form below 1e-4 or from 1e6 on).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.2345e6" or "-5e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let mut out = format!("{sign}{first}");
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let esign = if exp < 0 { '-' } else { '+' };
        out.push_str(&format!("e{esign}{:02}", exp.unsigned_abs()));
        return out;
    }
    // Plain decimal notation.
    let point = exp + 1; // number of digits before the decimal point
    let mut out = String::from(sign);
    if point <= 0 {
        out.push_str("0.");
        for _ in 0..(-point) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let point = point as usize;
        if digits.len() <= point {
            out.push_str(&digits);
            for _ in digits.len()..point {
                out.push('0');
            }
        } else {
            let (int_part, frac) = digits.split_at(point);
            out.push_str(int_part);
            out.push('.');
            out.push_str(frac);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_render_labels_and_reasons() {
        let cases = [
            (
                FieldErrorKind::Required,
                "Required value",
                "FieldValueRequired",
            ),
            (
                FieldErrorKind::Invalid,
                "Invalid value",
                "FieldValueInvalid",
            ),
            (
                FieldErrorKind::NotSupported,
                "Unsupported value",
                "FieldValueNotSupported",
            ),
            (
                FieldErrorKind::Forbidden,
                "Forbidden",
                "FieldValueForbidden",
            ),
            (FieldErrorKind::TooLong, "Too long", "FieldValueTooLong"),
            (FieldErrorKind::TooMany, "Too many", "FieldValueTooMany"),
            (
                FieldErrorKind::Duplicate,
                "Duplicate value",
                "FieldValueDuplicate",
            ),
            (FieldErrorKind::NotFound, "Not found", "FieldValueNotFound"),
            (
                FieldErrorKind::TypeInvalid,
                "Invalid value",
                "FieldValueTypeInvalid",
            ),
            (FieldErrorKind::Internal, "Internal error", "InternalError"),
        ];
        for (k, label, reason) in cases {
            assert_eq!(k.label(), label);
            assert_eq!(k.reason(), reason);
        }
    }

    #[test]
    fn required_body_and_display() {
        let e = FieldError::required("spec.image", "");
        assert_eq!(e.body(), "Required value");
        assert_eq!(e.to_string(), "spec.image: Required value");
        let e = FieldError::required("metadata.name", "name or generateName is required");
        assert_eq!(
            e.to_string(),
            "metadata.name: Required value: name or generateName is required"
        );
    }

    #[test]
    fn invalid_value_rendering() {
        let e = FieldError::invalid("metadata.name", "Foo_Bar", "bad");
        assert_eq!(e.body(), "Invalid value: \"Foo_Bar\": bad");
        let e = FieldError::invalid("spec.replicas", 15, "too big");
        assert_eq!(e.body(), "Invalid value: 15: too big");
        let e = FieldError::invalid("spec.on", true, "");
        assert_eq!(e.body(), "Invalid value: true");
        let e = FieldError::invalid("spec.f", 1.5, "x");
        assert_eq!(e.body(), "Invalid value: 1.5: x");
        let e = FieldError::invalid("spec.x", Value::Null, "x");
        assert_eq!(e.body(), "Invalid value: \"null\": x");
        let e = FieldError::invalid("spec.l", json!(["a", 1]), "x");
        assert_eq!(e.body(), "Invalid value: [\"a\",1]: x");
        let e = FieldError::invalid("spec.m", json!({"a": {"b": 1}}), "x");
        assert_eq!(e.body(), "Invalid value: {\"a\":{\"b\":1}}: x");
    }

    #[test]
    fn not_supported_lists_values() {
        let e = FieldError::not_supported("spec.scheme", "ftp", &["http", "https"]);
        assert_eq!(
            e.body(),
            "Unsupported value: \"ftp\": supported values: \"http\", \"https\""
        );
        assert_eq!(e.reason(), "FieldValueNotSupported");
        let e = FieldError::not_supported("spec.scheme", "ftp", &[]);
        assert_eq!(e.body(), "Unsupported value: \"ftp\"");
    }

    #[test]
    fn kinds_that_hide_values() {
        let e = FieldError::new(
            "metadata.namespace",
            FieldErrorKind::Forbidden,
            Some(json!("x")),
            "not allowed on this type",
        );
        assert_eq!(e.body(), "Forbidden: not allowed on this type");
        let e = FieldError::too_long("metadata.annotations", 262144);
        assert_eq!(e.body(), "Too long: must have at most 262144 bytes");
        let e = FieldError::internal("spec", "boom");
        assert_eq!(e.body(), "Internal error: boom");
    }

    #[test]
    fn too_many_duplicate_not_found() {
        assert_eq!(
            FieldError::too_many("spec.list", Some(4), Some(3)).body(),
            "Too many: 4: must have at most 3 items"
        );
        assert_eq!(
            FieldError::too_many("spec.list", None, None).body(),
            "Too many: has too many items"
        );
        assert_eq!(
            FieldError::duplicate("spec.keys[1]", "a").body(),
            "Duplicate value: \"a\""
        );
        assert_eq!(
            FieldError::not_found("spec.ref", "x").body(),
            "Not found: \"x\""
        );
        let e = FieldError::type_invalid("spec.n", "s", "must be of type integer");
        assert_eq!(e.body(), "Invalid value: \"s\": must be of type integer");
        assert_eq!(e.reason(), "FieldValueTypeInvalid");
    }

    #[test]
    fn cause_shape() {
        let e = FieldError::invalid("spec.x", 5, "bad");
        assert_eq!(
            e.to_cause(),
            json!({"reason": "FieldValueInvalid", "message": "Invalid value: 5: bad", "field": "spec.x"})
        );
    }

    #[test]
    fn aggregate_and_invalid_message() {
        let a = FieldError::required("spec.a", "");
        let b = FieldError::invalid("spec.b", 5, "x");
        assert_eq!(aggregate_message(&[]), "");
        assert_eq!(
            aggregate_message(std::slice::from_ref(&a)),
            "spec.a: Required value"
        );
        assert_eq!(
            aggregate_message(&[a.clone(), b.clone(), a.clone()]),
            "[spec.a: Required value, spec.b: Invalid value: 5: x]"
        );
        assert_eq!(
            invalid_message("Widget.example.com", "foo", &[a]),
            "Widget.example.com \"foo\" is invalid: spec.a: Required value"
        );
    }

    #[test]
    fn go_quote_escapes() {
        assert_eq!(go_quote("abc"), "\"abc\"");
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("a\nb\tc"), "\"a\\nb\\tc\"");
        assert_eq!(go_quote("\u{1}"), "\"\\x01\"");
        assert_eq!(go_quote("\u{7f}"), "\"\\x7f\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
        assert_eq!(go_quote("héllo ☃"), "\"héllo ☃\"");
        assert_eq!(go_quote(""), "\"\"");
    }

    #[test]
    fn go_float_formats() {
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(3.0), "3");
        assert_eq!(go_float(-2.25), "-2.25");
        assert_eq!(go_float(0.0001), "0.0001");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(123456.0), "123456");
        assert_eq!(go_float(1234567.0), "1.234567e+06");
        assert_eq!(go_float(1e6), "1e+06");
        assert_eq!(go_float(1e20), "1e+20");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(1.25e300), "1.25e+300");
        assert_eq!(go_float(0.0), "0");
        assert_eq!(go_float(f64::NAN), "NaN");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
    }

    #[test]
    fn render_numbers() {
        assert_eq!(render_value(&json!(u64::MAX)), u64::MAX.to_string());
        assert_eq!(render_value(&json!(-7)), "-7");
        assert_eq!(render_value(&json!(2.5)), "2.5");
    }
}
