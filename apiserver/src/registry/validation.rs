//! Validation of one object, the same for every type: the metadata rules, the type's defaults,
//! the structural schema (prune, default, validate, CEL) and the type's own rules. In
//! kube-apiserver this is the strategy's `Validate` (a custom resource's schema and CEL rules run
//! there, not in admission); the API server's writes and the admission webhook both use it.

use serde_json::Value;

use super::strategy::{Report, Strategy};
use super::Resource;
use crate::field_error::FieldError;
use crate::names::NameRule;
use crate::schema::FieldValidation;
use crate::status::{ApiError, Cause};

/// What validation found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Fields the schema does not declare (already pruned from the object).
    pub unknown_fields: Vec<String>,
    /// Problems that refuse the object.
    pub errors: Vec<FieldError>,
    /// Problems worth telling the client that do not refuse it.
    pub warnings: Vec<String>,
}

/// Defaults, prunes and validates `obj` (the new state; `old` on update).
pub fn validate_object(
    r: &Resource,
    strategy: &dyn Strategy,
    obj: &mut Value,
    old: Option<&Value>,
    mode: FieldValidation,
) -> Outcome {
    let mut errors = crate::names::validate_object_meta(
        obj.get("metadata").unwrap_or(&Value::Null),
        r.ty.namespaced,
        strategy.name_rule().unwrap_or(NameRule::DnsSubdomain),
    );
    strategy.set_defaults(obj);
    let schema = crate::schema::admit(obj, old, &r.ty.schema, mode);
    errors.extend(schema.errors);
    let mut rules = Report::default();
    strategy.validate(obj, old, &mut rules);
    errors.extend(rules.errors);
    Outcome {
        unknown_fields: schema.unknown_fields,
        errors,
        warnings: rules.warnings,
    }
}

/// The 422 of an object that failed validation: `<Kind>.<group> "<name>" is invalid: ...`.
pub fn invalid(r: &Resource, name: &str, errors: &[FieldError]) -> ApiError {
    let mut seen = std::collections::HashSet::new();
    let causes = errors
        .iter()
        .filter(|e| seen.insert(e.to_string()))
        .map(|e| Cause {
            reason: e.reason().to_string(),
            message: e.body(),
            field: if e.field == "<nil>" {
                String::new()
            } else {
                e.field.clone()
            },
        })
        .collect();
    ApiError::invalid(r.kind(), &r.ty.group, name, causes)
}

/// The 400 of a strict write with unknown fields.
pub fn strict_error(r: &Resource, unknown: &[String]) -> ApiError {
    let list: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    ApiError::bad_request(format!(
        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
        r.kind(),
        r.ty.version,
        r.kind(),
        list.join(", ")
    ))
}
