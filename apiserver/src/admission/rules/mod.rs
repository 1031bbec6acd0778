//! Type-specific admission rules for the Platform Mesh kinds: the checks and
//! defaults that upstream operators and webhooks apply beyond the structural
//! schema (which [`crate::meta::schema`] already enforces: types, enums, patterns,
//! bounds, required keys and CEL `x-kubernetes-validations`).
//!
//! * [`validate`] checks a whole object after schema validation and returns
//!   field errors (the request is rejected with 422) and warnings (sent as
//!   `Warning` headers).
//! * [`default()`] fills in values upstream documents as defaults but the schema
//!   does not declare (e.g. a PlatformMesh's profile ConfigMap `<name>-profile`).
//! * [`default_account_creator`] is the counterpart of the account
//!   operator's mutating webhook and needs the requesting user.
//! * [`invalid_cases`] lists invalid objects with the exact error they
//!   produce, for integration tests.
//!
//! One module per kind; every function is total (no panics on any input).

mod checks;

mod data_limits;

mod accept_api;
mod account;
mod account_info;
mod managed_provider;
mod migration;
mod migration_configuration;
mod platform_mesh;
mod provider;

use std::sync::Arc;

use serde_json::Value;

use crate::registry::{StrategiesBuilder, Strategy};
use crate::request::identity::Identity;

pub use account::{AccountPolicy, DEFAULT_ORG_DENY_LIST};
pub use data_limits::MAX_DATA_BYTES;

/// The group of PlatformMesh, Account and AccountInfo.
pub const CORE_GROUP: &str = "core.platform-mesh.io";
/// The group of Provider and ManagedProvider.
pub const PROVIDERS_GROUP: &str = "providers.platform-mesh.io";
/// The group of AcceptAPI, Migration and MigrationConfiguration.
pub const BROKER_GROUP: &str = "broker.platform-mesh.io";

pub use crate::registry::Report;

/// The rules of one kind as its strategy: defaults and validation, plain functions of the object.
struct TypeRules {
    default: fn(&mut Value),
    validate: fn(&Value, Option<&Value>, &mut Report),
}

impl Strategy for TypeRules {
    fn set_defaults(&self, obj: &mut Value) {
        (self.default)(obj)
    }

    fn validate(&self, obj: &Value, old: Option<&Value>, report: &mut Report) {
        (self.validate)(obj, old, report)
    }
}

/// The Account kind: the creator is set from the request, as upstream's mutating webhook does on
/// CREATE, and the account operator's default policy validates it.
struct AccountRules;

impl Strategy for AccountRules {
    fn prepare_for_create(&self, obj: &mut Value, user: Option<&Identity>) {
        if let Some(user) = user {
            account::set_creator(obj, &user.user);
        }
    }

    fn validate(&self, obj: &Value, old: Option<&Value>, report: &mut Report) {
        account::validate(obj, old, &AccountPolicy::default(), report)
    }
}

fn no_defaults(_: &mut Value) {}

/// Every kind with rules: group, kind, plural and its strategy.
fn kinds() -> Vec<(&'static str, &'static str, &'static str, Arc<dyn Strategy>)> {
    let rules = |default: fn(&mut Value), validate: fn(&Value, Option<&Value>, &mut Report)| {
        Arc::new(TypeRules { default, validate }) as Arc<dyn Strategy>
    };
    vec![
        (
            CORE_GROUP,
            "PlatformMesh",
            "platformmeshes",
            rules(platform_mesh::default, |o, _, r| {
                platform_mesh::validate(o, r)
            }),
        ),
        (CORE_GROUP, "Account", "accounts", Arc::new(AccountRules)),
        (
            CORE_GROUP,
            "AccountInfo",
            "accountinfos",
            rules(no_defaults, |o, _, r| account_info::validate(o, r)),
        ),
        (
            PROVIDERS_GROUP,
            "Provider",
            "providers",
            rules(provider::default, |o, _, r| provider::validate(o, r)),
        ),
        (
            PROVIDERS_GROUP,
            "ManagedProvider",
            "managedproviders",
            rules(managed_provider::default, |o, _, r| {
                managed_provider::validate(o, r)
            }),
        ),
        (
            BROKER_GROUP,
            "AcceptAPI",
            "acceptapis",
            rules(no_defaults, |o, _, r| accept_api::validate(o, r)),
        ),
        (
            BROKER_GROUP,
            "Migration",
            "migrations",
            rules(no_defaults, |o, _, r| migration::validate(o, r)),
        ),
        (
            BROKER_GROUP,
            "MigrationConfiguration",
            "migrationconfigurations",
            rules(no_defaults, |o, _, r| {
                migration_configuration::validate(o, r)
            }),
        ),
        (
            "",
            "ConfigMap",
            "configmaps",
            rules(no_defaults, data_limits::validate_config_map),
        ),
        (
            "",
            "Secret",
            "secrets",
            rules(data_limits::default_secret, data_limits::validate_secret),
        ),
    ]
}

/// Adds the strategy of every kind with rules.
pub fn register(strategies: &mut StrategiesBuilder) {
    for (group, _, plural, strategy) in kinds() {
        strategies.add(group, plural, strategy);
    }
}

/// The rules of `group`/`kind`, if it has any.
fn rules_of(group: &str, kind: &str) -> Option<Arc<dyn Strategy>> {
    kinds()
        .into_iter()
        .find(|(g, k, _, _)| *g == group && *k == kind)
        .map(|(_, _, _, s)| s)
}

/// Type-specific validation of a whole object (after schema validation).
/// `old` is the stored object on update and `None` on create. Kinds without
/// rules (and unknown group/kind pairs) give an empty report.
pub fn validate(group: &str, kind: &str, obj: &Value, old: Option<&Value>) -> Report {
    let mut report = Report::default();
    if let Some(rules) = rules_of(group, kind) {
        rules.validate(obj, old, &mut report);
    }
    report
}

/// Validates an Account with an explicit [`AccountPolicy`] (allowed types and
/// reserved organization names), like the account operator configured with
/// `--webhooks-additional-account-types` and `--webhooks-deny-list`.
pub fn validate_account(obj: &Value, old: Option<&Value>, policy: &AccountPolicy) -> Report {
    let mut report = Report::default();
    account::validate(obj, old, policy, &mut report);
    report
}

/// Defaults beyond the schema's `default`s, as upstream documents them. Only
/// absent fields are filled (plus a ManagedProvider's empty kubeconfig Secret
/// name/key, which upstream treats as unset), and every value written is valid. Defaults that
/// derive from `metadata.name` are skipped while the name is unknown, so call
/// this after `generateName` has been resolved.
pub fn default(group: &str, kind: &str, obj: &mut Value) {
    if let Some(rules) = rules_of(group, kind) {
        rules.set_defaults(obj);
    }
}

/// Sets an Account's `spec.creator` to the requesting user, overwriting any
/// client-supplied value, as upstream's mutating webhook does on CREATE. Does
/// nothing when the object or its `spec` is not a JSON object.
pub fn default_account_creator(obj: &mut Value, username: &str) {
    account::set_creator(obj, username);
}

/// One invalid object and the single error it must produce.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidCase {
    /// Short unique description of the problem.
    pub name: &'static str,
    /// API group of the object.
    pub group: &'static str,
    /// Kind of the object.
    pub kind: &'static str,
    /// Resource (plural) the object is created under.
    pub plural: &'static str,
    /// Whether the object is created inside a namespace.
    pub namespaced: bool,
    /// The full object (`apiVersion`, `kind`, `metadata.name`, no namespace).
    pub object: Value,
    /// The expected cause field, e.g. `spec.exposure.port`.
    pub field: &'static str,
    /// The expected cause message (the error body without the field), e.g.
    /// `Invalid value: 0: must be between 1 and 65535, inclusive`.
    pub message: &'static str,
}

/// Invalid objects across all eight kinds. Each has exactly one problem: the
/// structural schema (plus CEL rules) and [`validate`] together report exactly
/// `field: message` for it, and nothing else.
pub fn invalid_cases() -> Vec<InvalidCase> {
    let mut out = platform_mesh::cases();
    out.extend(provider::cases());
    out.extend(managed_provider::cases());
    out.extend(account::cases());
    out.extend(account_info::cases());
    out.extend(accept_api::cases());
    out.extend(migration::cases());
    out.extend(migration_configuration::cases());
    out
}

/// Builds an [`InvalidCase`] for a kind: the object gets `apiVersion`, `kind`
/// and `metadata.name` (`name`), plus `spec` when given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_case(
    kind: (&'static str, &'static str, &'static str, bool),
    name: &'static str,
    object_name: &str,
    spec: Option<Value>,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    let (group, kind, plural, namespaced) = kind;
    let mut object = serde_json::json!({
        "apiVersion": format!("{group}/v1alpha1"),
        "kind": kind,
        "metadata": {"name": object_name},
    });
    if let (Some(spec), Some(map)) = (spec, object.as_object_mut()) {
        map.insert("spec".to_string(), spec);
    }
    InvalidCase {
        name,
        group,
        kind,
        plural,
        namespaced,
        object,
        field,
        message,
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Runs objects through the schema pipeline plus the rules.
    use serde_json::Value;

    use super::{default, validate, InvalidCase};
    use crate::meta::schema::{admit, FieldValidation};

    /// The served schema of a kind.
    pub fn schema_of(group: &str, kind: &str) -> Value {
        api::serving::served_types()
            .into_iter()
            .find(|t| t.group == group && t.kind == kind)
            .map(|t| t.schema)
            .unwrap_or_else(|| panic!("{group}/{kind} is not served"))
    }

    /// Every error (schema, CEL and rules) for an object, as Display strings;
    /// rules defaults are applied first when `with_defaults`. Unknown fields fail the test.
    pub fn all_errors(group: &str, kind: &str, obj: &Value, with_defaults: bool) -> Vec<String> {
        let mut obj = obj.clone();
        if with_defaults {
            default(group, kind, &mut obj);
        }
        let adm = admit(
            &mut obj,
            None,
            &schema_of(group, kind),
            FieldValidation::Strict,
        );
        assert!(
            adm.unknown_fields.is_empty(),
            "unknown fields {:?}",
            adm.unknown_fields
        );
        let mut out: Vec<String> = adm.errors.iter().map(|e| e.to_string()).collect();
        out.extend(
            validate(group, kind, &obj, None)
                .errors
                .iter()
                .map(|e| e.to_string()),
        );
        out
    }

    /// Asserts each case yields exactly its one expected error, with and without defaults
    /// (besides kube-apiserver's note that CEL rules were skipped over a malformed object).
    pub fn check_cases(cases: &[InvalidCase]) {
        for c in cases {
            let want = vec![format!("{}: {}", c.field, c.message)];
            for with_defaults in [false, true] {
                let mut got = all_errors(c.group, c.kind, &c.object, with_defaults);
                got.retain(|e| {
                    !e.starts_with(
                        "<nil>: Invalid value: null: some validation rules were not checked",
                    )
                });
                assert_eq!(got, want, "case {:?} (defaults: {with_defaults})", c.name);
            }
        }
    }

    /// Asserts an object is accepted by schema and rules (with and without defaults).
    pub fn assert_valid(group: &str, kind: &str, obj: &Value) {
        for with_defaults in [false, true] {
            let got = all_errors(group, kind, obj, with_defaults);
            assert!(got.is_empty(), "{obj}: {got:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::json;

    use crate::meta::field_error::FieldError;

    use super::*;

    #[test]
    fn cases_cover_every_kind_and_match_served_types() {
        let cases = invalid_cases();
        assert!(cases.len() >= 60, "only {} cases", cases.len());
        let mut per_kind: BTreeMap<&str, usize> = BTreeMap::new();
        let mut names = BTreeSet::new();
        let served = api::serving::served_types();
        for c in &cases {
            *per_kind.entry(c.kind).or_default() += 1;
            assert!(
                names.insert((c.kind, c.name)),
                "duplicate case name {}",
                c.name
            );
            let t = served
                .iter()
                .find(|t| t.group == c.group && t.kind == c.kind)
                .expect("served kind");
            assert_eq!(t.plural, c.plural, "{}", c.name);
            assert_eq!(t.namespaced, c.namespaced, "{}", c.name);
            assert_eq!(c.object["apiVersion"], json!(t.api_version()));
            assert_eq!(c.object["kind"], json!(c.kind));
            assert!(c.object["metadata"]["name"].is_string());
            assert!(c.object["metadata"].get("namespace").is_none());
        }
        for kind in [
            "PlatformMesh",
            "Provider",
            "ManagedProvider",
            "Account",
            "AccountInfo",
            "AcceptAPI",
            "Migration",
            "MigrationConfiguration",
        ] {
            assert!(
                per_kind.get(kind).copied().unwrap_or(0) >= 4,
                "{kind}: {per_kind:?}"
            );
        }
    }

    #[test]
    fn every_case_yields_exactly_its_error() {
        test_support::check_cases(&invalid_cases());
    }

    #[test]
    fn unknown_kinds_and_garbage_are_harmless() {
        let garbage = [
            json!(null),
            json!(1),
            json!("x"),
            json!([1, 2]),
            json!({}),
            json!({"spec": 5}),
            json!({"spec": {"kcp": [], "stages": {}, "filters": "x"}}),
        ];
        let kinds = [
            (CORE_GROUP, "PlatformMesh"),
            (CORE_GROUP, "Account"),
            (CORE_GROUP, "AccountInfo"),
            (PROVIDERS_GROUP, "Provider"),
            (PROVIDERS_GROUP, "ManagedProvider"),
            (BROKER_GROUP, "AcceptAPI"),
            (BROKER_GROUP, "Migration"),
            (BROKER_GROUP, "MigrationConfiguration"),
            ("", "ConfigMap"),
        ];
        for (g, k) in kinds {
            for v in &garbage {
                let _ = validate(g, k, v, Some(v));
                let mut m = v.clone();
                default(g, k, &mut m);
            }
        }
        assert_eq!(
            validate("", "ConfigMap", &json!({}), None),
            Report::default()
        );
    }

    #[test]
    fn report_helpers() {
        let mut r = Report::default();
        assert!(r.is_ok());
        r.warn("spec.x", "careful");
        assert!(r.is_ok());
        assert_eq!(r.warnings, vec!["spec.x: careful"]);
        r.error(FieldError::required("spec.y", ""));
        assert!(!r.is_ok());
    }
}
