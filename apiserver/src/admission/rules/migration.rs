//! Migration (`broker.platform-mesh.io`, namespaced): moves one brokered
//! resource from a source to a target cluster. The schema requires the
//! references, their names and cluster names; beyond it, the `gvk` of each
//! side needs a non-empty `kind` and `version` (the group may be empty for
//! the core API group), shared with MigrationConfiguration.

use serde_json::{json, Value};

use super::checks::non_blank;
use super::{make_case, InvalidCase, Report};

/// Checks that a `{group, version, kind}` object at `field` names a kind.
pub(crate) fn gvk(report: &mut Report, gvk: Option<&Value>, field: &str) {
    if let Some(g) = gvk.filter(|g| g.is_object()) {
        non_blank(report, g, "version", &format!("{field}.version"), "");
        non_blank(report, g, "kind", &format!("{field}.kind"), "");
    }
}

/// Validates a Migration.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    for side in ["from", "to"] {
        let r = spec.get(side);
        gvk(
            report,
            r.and_then(|r| r.get("gvk")),
            &format!("spec.{side}.gvk"),
        );
    }
}

const KIND: (&str, &str, &str, bool) = (super::BROKER_GROUP, "Migration", "migrations", true);

/// A valid reference to the VM `test-vm` in `cluster`.
fn vm_ref(cluster: &str) -> Value {
    json!({"gvk": {"group": "example.platform-mesh.io", "version": "v1alpha1", "kind": "VM"},
           "name": "a8b70b353e97-test-vm", "namespace": "default", "clusterName": cluster})
}

fn case(
    name: &'static str,
    spec: Option<Value>,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "test-vm", spec, field, message)
}

fn spec_with(side: &str, key: &str, value: Option<Value>) -> Value {
    let mut s = json!({"from": vm_ref("provider#x86"), "to": vm_ref("provider#arm64")});
    if let Some(m) = s[side].as_object_mut() {
        match value {
            Some(v) => m.insert(key.to_string(), v),
            None => m.remove(key),
        };
    }
    s
}

/// Invalid Migration objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    let gvk = |g: &str, v: &str, k: &str| Some(json!({"group": g, "version": v, "kind": k}));
    vec![
        case("spec missing", None, "spec", "Required value"),
        case(
            "to missing",
            Some(json!({"from": vm_ref("provider#x86")})),
            "spec.to",
            "Required value",
        ),
        case(
            "from cluster name empty",
            Some(spec_with("from", "clusterName", Some(json!("")))),
            "spec.from.clusterName",
            "Invalid value: \"\": spec.from.clusterName in body should be at least 1 chars long",
        ),
        case(
            "to name missing",
            Some(spec_with("to", "name", None)),
            "spec.to.name",
            "Required value",
        ),
        case(
            "from gvk kind missing",
            Some(spec_with(
                "from",
                "gvk",
                Some(json!({"group": "", "version": "v1"})),
            )),
            "spec.from.gvk.kind",
            "Required value",
        ),
        case(
            "to gvk kind empty",
            Some(spec_with(
                "to",
                "gvk",
                gvk("example.platform-mesh.io", "v1alpha1", ""),
            )),
            "spec.to.gvk.kind",
            "Required value",
        ),
        case(
            "from gvk version empty",
            Some(spec_with("from", "gvk", gvk("", "", "ConfigMap"))),
            "spec.from.gvk.version",
            "Required value",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::BROKER_GROUP;

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn broker_created_migration_is_valid() {
        let mut core = spec_with(
            "to",
            "gvk",
            Some(json!({"group": "", "version": "v1", "kind": "ConfigMap"})),
        );
        core["from"]["gvk"] = core["to"]["gvk"].clone();
        for spec in [spec_with("from", "namespace", None), core] {
            let obj = json!({"apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "Migration",
                             "metadata": {"name": "test-vm"}, "spec": spec});
            assert_valid(BROKER_GROUP, "Migration", &obj);
        }
    }
}
