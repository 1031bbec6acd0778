//! Account (`core.platform-mesh.io`, cluster-scoped): the account operator's
//! admission webhooks.
//!
//! Validation (create and update alike, on the new object, first failure wins):
//! 1. `spec.type` must be in the allow-list (`org` plus the operator's
//!    additional types; Platform Mesh deployments add `account`);
//! 2. for `type: org` the name, trimmed, must have at least 3 characters;
//! 3. and must not be a reserved organization name (the deny list).
//!
//! Upstream has no immutability rule (its webhook tests change `account` to
//! `org`), so a type change on update is only a warning: kcp keeps the type
//! of the account's existing Workspace, so reconciling it will fail.
//!
//! Mutation: on create `spec.creator` is set to the requesting user
//! ([`set_creator`]).

use serde_json::{json, Value};

use super::checks::{object_name, str_of};
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::{go_quote, FieldError};

/// Organization names rejected by default (the account-operator Helm chart's `webhooks.denyList`).
pub const DEFAULT_ORG_DENY_LIST: &[&str] = &["admin", "root", "system", "www"];

/// The configurable part of the account webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountPolicy {
    /// Allowed `spec.type` values (exact, case-sensitive).
    pub allowed_types: Vec<String>,
    /// Reserved organization names (exact, case-sensitive).
    pub org_deny_list: Vec<String>,
}

impl Default for AccountPolicy {
    /// Types `account` and `org`; deny list [`DEFAULT_ORG_DENY_LIST`].
    fn default() -> Self {
        AccountPolicy {
            allowed_types: vec!["account".to_string(), "org".to_string()],
            org_deny_list: DEFAULT_ORG_DENY_LIST
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// Minimum length of an organization name (after trimming whitespace).
const MIN_ORG_NAME_LEN: usize = 3;

/// Validates an Account under `policy`.
pub(crate) fn validate(
    obj: &Value,
    old: Option<&Value>,
    policy: &AccountPolicy,
    report: &mut Report,
) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    let Some(ty) = str_of(spec, "type") else {
        return;
    };
    if !policy.allowed_types.iter().any(|t| t == ty) {
        let mut supported: Vec<&str> = policy.allowed_types.iter().map(String::as_str).collect();
        supported.sort_unstable();
        report.error(FieldError::not_supported("spec.type", ty, &supported));
        return;
    }
    if let Some(old_ty) = old
        .and_then(|o| o.get("spec"))
        .and_then(|s| str_of(s, "type"))
    {
        if old_ty != ty {
            report.warn(
                "spec.type",
                format!(
                    "changed from {} to {}; the account's existing workspace keeps its type, so the account operator cannot reconcile it",
                    go_quote(old_ty),
                    go_quote(ty)
                ),
            );
        }
    }
    if ty != "org" {
        return;
    }
    let Some(name) = object_name(obj) else {
        return;
    };
    if name.trim().len() < MIN_ORG_NAME_LEN {
        report.error(FieldError::invalid(
            "metadata.name",
            name,
            format!("organization names must have at least {MIN_ORG_NAME_LEN} characters"),
        ));
    } else if policy.org_deny_list.iter().any(|d| d == name) {
        report.error(FieldError::invalid(
            "metadata.name",
            name,
            "is reserved and cannot be used as an organization name",
        ));
    }
}

/// Sets `spec.creator` to `username`, overwriting any value.
pub(crate) fn set_creator(obj: &mut Value, username: &str) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let spec = map.entry("spec").or_insert_with(|| json!({}));
    if spec.is_null() {
        *spec = json!({});
    }
    if let Some(s) = spec.as_object_mut() {
        s.insert("creator".to_string(), json!(username));
    }
}

const KIND: (&str, &str, &str, bool) = (super::CORE_GROUP, "Account", "accounts", false);

fn case(
    name: &'static str,
    object_name: &str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, object_name, Some(spec), field, message)
}

/// Invalid Account objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    vec![
        case(
            "type not allowed",
            "acme",
            json!({"type": "folder", "displayName": "ACME"}),
            "spec.type",
            "Unsupported value: \"folder\": supported values: \"account\", \"org\"",
        ),
        case(
            "type empty",
            "acme",
            json!({"type": "", "displayName": "ACME"}),
            "spec.type",
            "Unsupported value: \"\": supported values: \"account\", \"org\"",
        ),
        case(
            "type wrong case",
            "acme",
            json!({"type": "Org", "displayName": "ACME"}),
            "spec.type",
            "Unsupported value: \"Org\": supported values: \"account\", \"org\"",
        ),
        case(
            "org name too short",
            "gk",
            json!({"type": "org", "displayName": "GK"}),
            "metadata.name",
            "Invalid value: \"gk\": organization names must have at least 3 characters",
        ),
        case(
            "org name reserved",
            "admin",
            json!({"type": "org", "displayName": "Admins"}),
            "metadata.name",
            "Invalid value: \"admin\": is reserved and cannot be used as an organization name",
        ),
        case(
            "org name reserved www",
            "www",
            json!({"type": "org", "displayName": "Web"}),
            "metadata.name",
            "Invalid value: \"www\": is reserved and cannot be used as an organization name",
        ),
        case(
            "display name missing",
            "acme",
            json!({"type": "org"}),
            "spec.displayName",
            "Required value",
        ),
        case(
            "type missing",
            "acme",
            json!({"displayName": "ACME"}),
            "spec.type",
            "Required value",
        ),
        case(
            "display name too long",
            "acme",
            json!({"type": "account", "displayName": "x".repeat(256)}),
            "spec.displayName",
            "Too long: may not be more than 255 bytes",
        ),
        case(
            "extension without template",
            "acme",
            json!({"type": "account", "displayName": "A",
                "extensions": [{"apiVersion": "v1", "kind": "ConfigMap"}]}),
            "spec.extensions[0].specGoTemplate",
            "Required value",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{
        default_account_creator, validate as run, validate_account, CORE_GROUP,
    };

    fn account(name: &str, ty: &str) -> Value {
        json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
               "metadata": {"name": name}, "spec": {"type": ty, "displayName": ""}})
    }

    fn errors(r: &Report) -> Vec<String> {
        r.errors.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn valid_accounts() {
        for (name, ty) in [
            ("acme", "org"),
            ("my-org", "org"),
            ("admin", "account"),
            ("ab", "account"),
            ("default", "org"),
        ] {
            assert_valid(CORE_GROUP, "Account", &account(name, ty));
        }
        let full = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
            "metadata": {"name": "acme"}, "spec": {"type": "org", "displayName": "ACME Inc.",
            "description": "optional text", "creator": "alice@example.com",
            "extensions": [{"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "AccountExtension",
                            "specGoTemplate": {"foo": "bar"}, "readyConditionType": "Ready"}],
            "data": {"any": {"nested": "value"}}}});
        assert_valid(CORE_GROUP, "Account", &full);
    }

    #[test]
    fn upstream_webhook_table() {
        // The deny list of upstream's webhook unit tests.
        let policy = AccountPolicy {
            allowed_types: vec!["account".into(), "org".into()],
            org_deny_list: vec!["admin".into(), "root".into(), "system".into()],
        };
        let empty = AccountPolicy {
            org_deny_list: vec![],
            ..policy.clone()
        };
        let cases: Vec<(Value, Option<Value>, &AccountPolicy, Vec<&str>)> = vec![
            (account("admin", "org"), None, &policy,
             vec!["metadata.name: Invalid value: \"admin\": is reserved and cannot be used as an organization name"]),
            (account("my-org", "org"), None, &policy, vec![]),
            (account("admin", "account"), None, &policy, vec![]),
            (account("admin", "org"), None, &empty, vec![]),
            (account("gk", "org"), None, &policy,
             vec!["metadata.name: Invalid value: \"gk\": organization names must have at least 3 characters"]),
            (account("my-account", "org"), Some(account("my-account", "account")), &policy, vec![]),
            (account("admin", "org"), Some(account("admin", "account")), &policy,
             vec!["metadata.name: Invalid value: \"admin\": is reserved and cannot be used as an organization name"]),
            (account("admin", "account"), Some(account("admin", "org")), &policy, vec![]),
            (account("admin", "account"), Some(account("admin", "account")), &policy, vec![]),
            (account("gk", "org"), Some(account("gk", "org")), &policy,
             vec!["metadata.name: Invalid value: \"gk\": organization names must have at least 3 characters"]),
            (account(" a ", "org"), None, &policy,
             vec!["metadata.name: Invalid value: \" a \": organization names must have at least 3 characters"]),
        ];
        for (obj, old, p, want) in cases {
            assert_eq!(
                errors(&validate_account(&obj, old.as_ref(), p)),
                want,
                "{obj} {old:?}"
            );
        }
        // Only org is allowed without additional types.
        let org_only = AccountPolicy {
            allowed_types: vec!["org".into()],
            org_deny_list: vec![],
        };
        assert_eq!(
            errors(&validate_account(
                &account("team", "account"),
                None,
                &org_only
            )),
            vec!["spec.type: Unsupported value: \"account\": supported values: \"org\""]
        );
        // Custom types can be allowed.
        let custom = AccountPolicy {
            allowed_types: vec!["trial".into(), "org".into()],
            org_deny_list: vec![],
        };
        assert!(validate_account(&account("team", "trial"), None, &custom).is_ok());
    }

    #[test]
    fn type_change_warns() {
        let r = run(
            CORE_GROUP,
            "Account",
            &account("acme", "org"),
            Some(&account("acme", "account")),
        );
        assert!(r.is_ok());
        assert_eq!(r.warnings, vec!["spec.type: changed from \"account\" to \"org\"; the account's existing workspace keeps its type, so the account operator cannot reconcile it"]);
        let r = run(
            CORE_GROUP,
            "Account",
            &account("acme", "org"),
            Some(&account("acme", "org")),
        );
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn creator_is_overwritten() {
        let mut obj = account("acme", "org");
        obj["spec"]["creator"] = json!("mallory");
        default_account_creator(&mut obj, "alice@example.com");
        assert_eq!(obj["spec"]["creator"], json!("alice@example.com"));
        let mut obj = json!({"metadata": {"name": "x"}});
        default_account_creator(&mut obj, "");
        assert_eq!(obj["spec"], json!({"creator": ""}));
        let mut obj = json!({"spec": null});
        default_account_creator(&mut obj, "bob");
        assert_eq!(obj["spec"], json!({"creator": "bob"}));
        let mut obj = json!("x");
        default_account_creator(&mut obj, "bob");
        assert_eq!(obj, json!("x"));
    }
}
