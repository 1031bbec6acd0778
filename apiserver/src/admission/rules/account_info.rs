//! AccountInfo (`core.platform-mesh.io`, cluster-scoped): written by the
//! account operator, one per account workspace, always named `account`.
//! Upstream registers no webhook for it, so there are no rules beyond the
//! schema; a differently named AccountInfo only draws a warning, since
//! nothing upstream reads it.

use serde_json::{json, Value};

use super::checks::object_name;
use super::{make_case, InvalidCase, Report};

/// The name every AccountInfo has upstream.
const SINGLETON_NAME: &str = "account";

/// Validates an AccountInfo (warnings only).
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    if let Some(name) = object_name(obj) {
        if name != SINGLETON_NAME {
            report.warn(
                "metadata.name",
                format!(
                    "the account operator only reads and writes the AccountInfo named {SINGLETON_NAME:?}; this one is ignored"
                ),
            );
        }
    }
}

const KIND: (&str, &str, &str, bool) = (super::CORE_GROUP, "AccountInfo", "accountinfos", false);

/// A complete, valid `AccountLocation`.
fn location(name: &str, path: &str, ty: &str) -> Value {
    json!({"name": name, "generatedClusterId": "2x7abc", "originClusterId": "1abdef", "path": path,
           "url": format!("https://kcp.example.com/clusters/{path}"), "type": ty})
}

/// A complete, valid spec for the org `acme`.
fn spec() -> Value {
    let org = location("acme", "root:orgs:acme", "org");
    json!({"fga": {"store": {"id": "01J0000000000000000000000"}}, "account": org.clone(),
           "organization": org, "clusterInfo": {"ca": "-----BEGIN CERTIFICATE-----\n"}})
}

fn without(mut v: Value, path: &[&str]) -> Value {
    if let Some((last, parents)) = path.split_last() {
        let mut cur = Some(&mut v);
        for p in parents {
            cur = cur.and_then(|c| c.get_mut(*p));
        }
        if let Some(m) = cur.and_then(Value::as_object_mut) {
            m.remove(*last);
        }
    }
    v
}

fn case(
    name: &'static str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, SINGLETON_NAME, Some(spec), field, message)
}

/// Invalid AccountInfo objects (all schema-level) and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    let mut with_oidc = spec();
    with_oidc["oidc"] =
        json!({"issuerUrl": "https://idp.example/realms/acme", "clients": {"acme": {}}});
    let mut bad_parent = spec();
    bad_parent["parentAccount"] = without(location("acme", "root:orgs:acme", "org"), &["url"]);
    let mut typed = spec();
    typed["fga"]["store"]["id"] = json!(42);
    vec![
        case("account missing", without(spec(), &["account"]), "spec.account", "Required value"),
        case("fga store id missing", without(spec(), &["fga", "store", "id"]), "spec.fga.store.id", "Required value"),
        case("cluster info ca missing", without(spec(), &["clusterInfo", "ca"]), "spec.clusterInfo.ca", "Required value"),
        case("organization path missing", without(spec(), &["organization", "path"]), "spec.organization.path", "Required value"),
        case("parent account url missing", bad_parent, "spec.parentAccount.url", "Required value"),
        case("oidc client without id", with_oidc, "spec.oidc.clients.acme.clientId", "Required value"),
        case("fga store id not a string", typed, "spec.fga.store.id",
            "Invalid value: \"integer\": spec.fga.store.id in body must be of type string: \"integer\""),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{validate as run, CORE_GROUP};

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn valid_account_infos() {
        let mut child = spec();
        child["account"] = location("team", "root:orgs:acme:team", "account");
        child["parentAccount"] = location("acme", "root:orgs:acme", "org");
        child["oidc"] = json!({"issuerUrl": "https://idp.example/realms/acme", "clients": {"acme": {"clientId": "acme"}}});
        for s in [spec(), child] {
            let obj = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "AccountInfo",
                             "metadata": {"name": "account"}, "spec": s});
            assert_valid(CORE_GROUP, "AccountInfo", &obj);
            assert!(run(CORE_GROUP, "AccountInfo", &obj, None)
                .warnings
                .is_empty());
        }
    }

    #[test]
    fn other_names_warn() {
        let obj = json!({"metadata": {"name": "info"}, "spec": spec()});
        let r = run(CORE_GROUP, "AccountInfo", &obj, None);
        assert!(r.is_ok());
        assert_eq!(r.warnings, vec!["metadata.name: the account operator only reads and writes the AccountInfo named \"account\"; this one is ignored"]);
    }
}
