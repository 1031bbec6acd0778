//! AcceptAPI (`broker.platform-mesh.io`, namespaced): declares that a provider
//! accepts resources of one GVR, narrowed by filters on `spec.<key>`. The
//! schema already requires the GVR fields and rejects filter keys starting
//! with `spec.`.
//!
//! Errors, from the broker's matching semantics:
//! * `gvr.version` and `gvr.resource` are non-empty, and `group`/`resource`
//!   are lower case (the broker compares them exactly with the consumer's
//!   RESTMapper, which only yields lower-case names);
//! * a filter `key` is a dot path of non-empty field names (there is no
//!   escaping or indexing; an empty segment can never match, and the broker
//!   lets objects without the field pass);
//! * each filter needs at least one criterion: a non-empty `valueIn`, a
//!   `boundary` bound, or a non-empty `suffix`;
//! * boundaries are non-negative (the broker ignores negative ones) and
//!   `min <= max`.

use serde_json::{json, Value};

use super::checks::{items, non_blank, str_of};
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::FieldError;

/// Validates an AcceptAPI.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    if let Some(gvr) = spec.get("gvr").filter(|g| g.is_object()) {
        non_blank(report, gvr, "version", "spec.gvr.version", "");
        let resource = non_blank(report, gvr, "resource", "spec.gvr.resource", "");
        for (key, value) in [("group", str_of(gvr, "group")), ("resource", resource)] {
            if let Some(v) = value.filter(|v| v.chars().any(|c| c.is_ascii_uppercase())) {
                report.error(FieldError::invalid(
                    format!("spec.gvr.{key}"),
                    v,
                    "must be lower case, as API discovery reports it",
                ));
            }
        }
    }
    for (i, f) in items(spec, "filters").iter().enumerate() {
        validate_filter(f, &format!("spec.filters[{i}]"), report);
    }
}

fn validate_filter(f: &Value, field: &str, report: &mut Report) {
    if !f.is_object() {
        return;
    }
    if let Some(key) = str_of(f, "key").filter(|k| !k.is_empty()) {
        if key.split('.').any(str::is_empty) {
            report.error(FieldError::invalid(
                format!("{field}.key"),
                key,
                "must be a '.'-separated path of non-empty field names below spec (e.g. 'fqdn' or 'network.cidr')",
            ));
        }
    }
    let value_in = !items(f, "valueIn").is_empty();
    let suffix = str_of(f, "suffix").is_some_and(|s| !s.is_empty());
    let boundary = f.get("boundary").filter(|b| b.is_object());
    let bound = |k: &str| boundary.and_then(|b| b.get(k)).and_then(Value::as_i64);
    let (min, max) = (bound("min"), bound("max"));
    let has_bound = boundary.is_some_and(|b| {
        ["min", "max"]
            .iter()
            .any(|k| b.get(*k).is_some_and(|v| !v.is_null()))
    });
    if !value_in && !suffix && !has_bound {
        report.error(FieldError::required(
            field,
            "at least one of valueIn, boundary (min or max) or suffix is required",
        ));
    }
    for (k, v) in [("min", min), ("max", max)] {
        if let Some(n) = v.filter(|n| *n < 0) {
            report.error(FieldError::invalid(
                format!("{field}.boundary.{k}"),
                n,
                "must be greater than or equal to 0",
            ));
        }
    }
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo >= 0 && hi >= 0 && lo > hi {
            report.error(FieldError::invalid(
                format!("{field}.boundary.min"),
                lo,
                format!("must be less than or equal to max ({hi})"),
            ));
        }
    }
}

const KIND: (&str, &str, &str, bool) = (super::BROKER_GROUP, "AcceptAPI", "acceptapis", true);

fn case(
    name: &'static str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "accept-invalid", Some(spec), field, message)
}

fn certs(filters: Value) -> Value {
    json!({"gvr": {"group": "example.platform-mesh.io", "version": "v1alpha1", "resource": "certificates"},
           "filters": filters})
}

/// Invalid AcceptAPI objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    vec![
        case("filter key starts with spec", certs(json!([{"key": "spec.fqdn", "suffix": "corp"}])),
            "spec.filters[0].key", "Invalid value: \"string\": Key must not start with 'spec.' as it is implied"),
        case("filter key empty", certs(json!([{"key": "", "suffix": "corp"}])),
            "spec.filters[0].key", "Invalid value: \"\": spec.filters[0].key in body should be at least 1 chars long"),
        case("filter key with empty segment", certs(json!([{"key": "network..cidr", "suffix": "/16"}])),
            "spec.filters[0].key",
            "Invalid value: \"network..cidr\": must be a '.'-separated path of non-empty field names below spec (e.g. 'fqdn' or 'network.cidr')"),
        case("filter without criteria", certs(json!([{"key": "fqdn"}])),
            "spec.filters[0]", "Required value: at least one of valueIn, boundary (min or max) or suffix is required"),
        case("filter with only empty criteria", certs(json!([{"key": "arch", "valueIn": [], "suffix": "", "boundary": {}}])),
            "spec.filters[0]", "Required value: at least one of valueIn, boundary (min or max) or suffix is required"),
        case("boundary min above max", certs(json!([{"key": "memory", "boundary": {"min": 512, "max": 128}}])),
            "spec.filters[0].boundary.min", "Invalid value: 512: must be less than or equal to max (128)"),
        case("boundary negative", certs(json!([{"key": "memory", "boundary": {"min": -1}}])),
            "spec.filters[0].boundary.min", "Invalid value: -1: must be greater than or equal to 0"),
        case("boundary not an integer", certs(json!([{"key": "memory", "boundary": {"max": 1.5}}])),
            "spec.filters[0].boundary.max",
            "Invalid value: \"number\": spec.filters[0].boundary.max in body must be of type integer: \"number\""),
        case("filter key missing", certs(json!([{"suffix": "corp"}])), "spec.filters[0].key", "Required value"),
        case("gvr missing", json!({"filters": []}), "spec.gvr", "Required value"),
        case("gvr resource empty", json!({"gvr": {"group": "", "version": "v1", "resource": ""}}),
            "spec.gvr.resource", "Required value"),
        case("gvr resource upper case", json!({"gvr": {"group": "", "version": "v1", "resource": "ConfigMaps"}}),
            "spec.gvr.resource", "Invalid value: \"ConfigMaps\": must be lower case, as API discovery reports it"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{validate as run, BROKER_GROUP};

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn upstream_examples_are_valid() {
        let objs = [
            // examples/certs/internalca and externalca.
            (
                "certificates.example.platform-mesh.io",
                certs(json!([{"key": "fqdn", "suffix": "internal.corp"}])),
            ),
            (
                "certificates.example.platform-mesh.io",
                certs(json!([{"key": "fqdn", "suffix": "corp.com"}])),
            ),
            // examples/platform-mesh provider AcceptAPI.
            (
                "v1alpha1.certificates.identity.generic.platform-mesh.io",
                json!({"gvr": {"group": "identity.generic.platform-mesh.io", "version": "v1alpha1", "resource": "certificates"},
                    "filters": [{"key": "fqdn", "suffix": "internal.corp"}]}),
            ),
            // e2e: core group, no filters; value sets; boundaries.
            (
                "accept-configmaps",
                json!({"gvr": {"group": "", "version": "v1", "resource": "configmaps"}}),
            ),
            (
                "accept-x86",
                json!({"gvr": {"group": "example.platform-mesh.io", "version": "v1alpha1", "resource": "vms"},
                                  "filters": [{"key": "arch", "valueIn": ["x86_64"]},
                                              {"key": "memory", "boundary": {"min": 128, "max": 128}},
                                              {"key": "a.b", "boundary": {"max": 0}}]}),
            ),
        ];
        for (name, spec) in objs {
            let obj = json!({"apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "AcceptAPI",
                             "metadata": {"name": name}, "spec": spec});
            assert_valid(BROKER_GROUP, "AcceptAPI", &obj);
            assert!(run(BROKER_GROUP, "AcceptAPI", &obj, None)
                .warnings
                .is_empty());
        }
    }

    #[test]
    fn several_problems_in_one_filter() {
        let obj =
            json!({"spec": certs(json!([{"key": ".x", "boundary": {"min": -5, "max": -1}}]))});
        let got: Vec<String> = run(BROKER_GROUP, "AcceptAPI", &obj, None)
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(got, vec![
            "spec.filters[0].key: Invalid value: \".x\": must be a '.'-separated path of non-empty field names below spec (e.g. 'fqdn' or 'network.cidr')",
            "spec.filters[0].boundary.min: Invalid value: -5: must be greater than or equal to 0",
            "spec.filters[0].boundary.max: Invalid value: -1: must be greater than or equal to 0",
        ]);
    }
}
