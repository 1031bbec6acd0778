//! The Kubernetes structural-schema engine: pure functions over
//! `serde_json::Value` that give every type served here the semantics
//! kube-apiserver gives custom resources (reference E2–E7).
//!
//! A schema is an OpenAPI v3 `openAPIV3Schema` object exactly as it appears
//! in a CustomResourceDefinition, held as a `serde_json::Value`. The engine
//! assumes it is structural (E1); it never panics on any schema or object,
//! treating malformed keywords as absent.
//!
//! * [`prune`] removes fields the schema does not specify and reports them
//!   for `fieldValidation` (E3, B12);
//! * [`default()`] applies `default`s and drops non-nullable `null`s (E4);
//! * [`validate`] checks OpenAPI value validations and list types with
//!   kube's error texts (E5, E7);
//! * [`validate_cel`] evaluates `x-kubernetes-validations` rules (E6);
//! * [`admit`] runs the whole write pipeline in kube's order.
//!
//! Errors are [`FieldError`]s rendering as `<field>: <Type>[: <value>][: <detail>]`.

mod cel;
mod cel_budget;
mod cel_cost;
mod cel_value;
mod defaults;
mod formats;
mod node;
mod path;
mod prune;
mod validate;

#[cfg(test)]
mod tests {
    mod cel;
    mod cel_cost;
    mod prune_default;
    mod validate;
}

pub use self::cel::{
    cel_value, check_expression, evaluate, evaluate_values, validate_cel, CelError,
};
pub use self::cel_budget::{PER_CALL_LIMIT, RUNTIME_CEL_COST_BUDGET};
pub use self::cel_cost::{
    check_rule_costs, STATIC_ESTIMATED_COST_LIMIT, STATIC_ESTIMATED_CRD_COST_LIMIT,
};
pub use defaults::default;
pub use prune::prune;
pub use validate::validate;

use serde_json::Value;

use crate::meta::field_error::FieldError;

/// The `fieldValidation` query parameter of create/update/patch (B12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and warn about each (the server default).
    #[default]
    Warn,
    /// Reject the request when it has unknown fields (kubectl's default).
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter; absent or empty means [`FieldValidation::Warn`],
    /// an unrecognised value gives `None` (kube answers 422 for it).
    pub fn parse(param: Option<&str>) -> Option<Self> {
        match param.unwrap_or("") {
            "" | "Warn" => Some(FieldValidation::Warn),
            "Ignore" => Some(FieldValidation::Ignore),
            "Strict" => Some(FieldValidation::Strict),
            _ => None,
        }
    }
}

/// The outcome of [`admit`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Admission {
    /// Paths of the pruned unknown fields (`spec.foo`), in document order;
    /// always empty with [`FieldValidation::Ignore`].
    pub unknown_fields: Vec<String>,
    /// Schema and CEL violations; non-empty means 422 Invalid.
    pub errors: Vec<FieldError>,
}

impl Admission {
    /// The `Warning` header texts for [`FieldValidation::Warn`]:
    /// `unknown field "spec.foo"`.
    pub fn warnings(&self) -> Vec<String> {
        self.unknown_fields
            .iter()
            .map(|f| format!("unknown field {}", crate::meta::field_error::go_quote(f)))
            .collect()
    }

    /// The 400 BadRequest detail for [`FieldValidation::Strict`], when there
    /// are unknown fields: `strict decoding error: unknown field "spec.foo",
    /// unknown field "spec.bar"`.
    pub fn strict_error(&self) -> Option<String> {
        if self.unknown_fields.is_empty() {
            None
        } else {
            Some(format!(
                "strict decoding error: {}",
                self.warnings().join(", ")
            ))
        }
    }
}

/// Whether any part of `schema` has `x-kubernetes-validations` (whose evaluation may be heavy).
pub fn has_rules(schema: &Value) -> bool {
    has_cel_rules(schema, 0)
}

/// Whether any part of `schema` has `x-kubernetes-validations`.
fn has_cel_rules(schema: &Value, depth: usize) -> bool {
    if depth > 64 {
        return false;
    }
    match schema {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (k == "x-kubernetes-validations" && v.as_array().is_some_and(|a| !a.is_empty()))
                || has_cel_rules(v, depth + 1)
        }),
        Value::Array(items) => items.iter().any(|v| has_cel_rules(v, depth + 1)),
        _ => false,
    }
}

/// The write pipeline for one object: prune (recording unknown fields unless
/// `mode` is [`FieldValidation::Ignore`]), default, validate, then evaluate
/// CEL rules (transition rules against `old`, the stored object on update).
///
/// `obj` is left pruned and defaulted. Whether unknown fields are warnings or
/// a rejection is the caller's decision, via [`Admission::warnings`] /
/// [`Admission::strict_error`].
pub fn admit(
    obj: &mut Value,
    old: Option<&Value>,
    schema: &Value,
    mode: FieldValidation,
) -> Admission {
    let unknown = prune(obj, schema);
    default(obj, schema);
    let mut errors = validate(obj, schema);
    // As kube-apiserver: CEL rules are not evaluated over an object whose shape is already
    // wrong (a wrong type, a missing required field, a value outside an enum, too long or too
    // many); the client hears that some rules were not checked.
    let blocking = errors.iter().any(|e| {
        use crate::meta::field_error::FieldErrorKind as K;
        matches!(
            e.kind,
            K::NotSupported | K::Required | K::TooLong | K::TooMany | K::TypeInvalid
        )
    });
    if blocking {
        if has_cel_rules(schema, 0) {
            // kube-apiserver's error has no field and a nil value, printed `<nil>` and `null`.
            errors.push(crate::meta::field_error::FieldError::new(
                "<nil>",
                crate::meta::field_error::FieldErrorKind::Invalid,
                None,
                "null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ));
        }
    } else {
        errors.extend(validate_cel(obj, old, schema));
    }
    Admission {
        unknown_fields: if mode == FieldValidation::Ignore {
            Vec::new()
        } else {
            unknown
        },
        errors,
    }
}
