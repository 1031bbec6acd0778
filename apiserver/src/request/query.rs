//! The request's query string, decoded, and the typed options kube-apiserver reads from it.

use std::collections::HashMap;

use percent_encoding::percent_decode_str;

use crate::meta::status::ApiError;

/// Decoded query parameters (the last of repeated keys wins; `dryRun` keeps all values).
#[derive(Clone, Debug, Default)]
pub struct Query {
    values: HashMap<String, String>,
    dry_run: Vec<String>,
}

fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    percent_decode_str(&s).decode_utf8_lossy().into_owned()
}

impl Query {
    /// Decodes a raw query string (`+` is a space, `%xx` escapes); `None` is no query.
    pub fn parse(raw: Option<&str>) -> Self {
        let mut q = Query::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k), decode(v));
            if k == "dryRun" {
                q.dry_run.push(v.clone());
            }
            q.values.insert(k, v);
        }
        q
    }

    /// The value of a parameter, the last one when it is repeated.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// A boolean flag (`true`, `1`; `false`, `0`, empty).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True" | "TRUE"))
    }

    /// The `dryRun` values as sent.
    pub fn dry_run_values(&self) -> &[String] {
        &self.dry_run
    }

    /// `dryRun=All`; any other value is refused as kube-apiserver refuses it: 422, the options
    /// of the request (`options`: `CreateOptions`, `PatchOptions`, …) being invalid.
    pub fn dry_run(&self, options: &str) -> Result<bool, ApiError> {
        let mut dry = false;
        for v in &self.dry_run {
            match v.as_str() {
                "All" => dry = true,
                "" => {}
                _ => {
                    let values: Vec<String> =
                        self.dry_run.iter().map(|v| format!("{v:?}")).collect();
                    return Err(ApiError::options_invalid(
                        options,
                        "dryRun",
                        "FieldValueNotSupported",
                        format!(
                            "Unsupported value: [{}]: supported values: \"All\"",
                            values.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(dry)
    }

    /// `fieldValidation` (default Warn); anything else is refused as [`Query::dry_run`] says.
    pub fn field_validation(&self, options: &str) -> Result<FieldValidation, ApiError> {
        match self.get("fieldValidation").unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Strict" => Ok(FieldValidation::Strict),
            "Ignore" => Ok(FieldValidation::Ignore),
            other => Err(ApiError::options_invalid(
                options,
                "fieldValidation",
                "FieldValueNotSupported",
                format!(
                    "Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                ),
            )),
        }
    }

    /// An unsigned integer parameter; garbage is a 400.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(|n| Some(n.max(0) as u64))
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "invalid value for {key}: {v:?} is not an integer"
                    ))
                }),
        }
    }
}

/// How unknown fields in a write are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and warn about each (the default).
    Warn,
    /// Reject the request when it has unknown fields.
    Strict,
}

/// Parses a Go duration, as kube-apiserver puts in `?timeout=` and kube takes in flags (`10s`,
/// `1m30s`, `500ms`).
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let mut total = std::time::Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let (num, tail) = rest.split_at(digits);
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let secs = match unit {
            "h" => value * 3600.0,
            "m" => value * 60.0,
            "s" => value,
            "ms" => value / 1000.0,
            "us" | "µs" => value / 1e6,
            "ns" => value / 1e9,
            _ => return None,
        };
        total += std::time::Duration::from_secs_f64(secs.max(0.0));
        rest = next;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("x"), None);
        assert_eq!(parse_go_duration("10"), None);
    }
    #[test]
    fn decodes_and_flags() {
        let q = Query::parse(Some(
            "labelSelector=app%3Dx%2Cenv+in+(a)&watch=1&&limit=5&dryRun=All",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=x,env in (a)"));
        assert!(q.flag("watch"));
        assert_eq!(q.u64("limit").ok().flatten(), Some(5));
        assert_eq!(q.dry_run("CreateOptions").ok(), Some(true));
        let e = Query::parse(Some("dryRun=Some"))
            .dry_run("CreateOptions")
            .expect_err("refused");
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: [\"Some\"]: supported values: \"All\""
        );
        assert!(Query::parse(Some("limit=x")).u64("limit").is_err());
        assert_eq!(
            Query::parse(Some("fieldValidation=Strict"))
                .field_validation("CreateOptions")
                .ok(),
            Some(FieldValidation::Strict)
        );
    }
}
