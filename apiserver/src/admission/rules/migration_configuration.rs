//! MigrationConfiguration (`broker.platform-mesh.io`, namespaced): ordered
//! stages the broker's migration controller runs. For each stage it creates
//! every `templates[<key>]` object (named `<migration id>-<key>`, in the
//! template's namespace or else the Migration's) and then evaluates
//! `successConditions`, CEL expressions whose variables are the stage's
//! template keys and `from` and `to`, the two provider copies (standard CEL
//! library).
//!
//! Errors:
//! * `from`/`to` name a kind and version;
//! * stage names are unique (the broker finds the current stage by name);
//! * template keys can become part of an object name and a CEL variable
//!   (lower-case alphanumerics and `-`), templates carry `apiVersion` and `kind`;
//! * template keys are not `from` or `to`, which name the provider copies;
//! * each success condition compiles as CEL and references no variables
//!   other than the stage's template keys, `from` and `to` (the broker binds
//!   nothing else, so such an expression could never hold).
//!
//! Warnings: a template's `metadata.name`, which the broker replaces.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::checks::{at, compile_cel, free_variables, items, set_str, str_of};
use super::migration::gvk;
use super::{make_case, InvalidCase, Report};
use crate::meta::field_error::FieldError;

/// Longest template key that still fits an object name `<26-character id>-<key>`.
const MAX_TEMPLATE_KEY_LEN: usize = 253 - 27;

/// Validates a MigrationConfiguration.
pub(crate) fn validate(obj: &Value, report: &mut Report) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    gvk(report, spec.get("from"), "spec.from");
    gvk(report, spec.get("to"), "spec.to");
    let mut seen = BTreeSet::new();
    for (i, stage) in items(spec, "stages").iter().enumerate() {
        if !stage.is_object() {
            continue;
        }
        let field = format!("spec.stages[{i}]");
        if let Some(name) = str_of(stage, "name").filter(|n| !n.is_empty()) {
            if !seen.insert(name) {
                report.error(FieldError::duplicate(format!("{field}.name"), name));
            }
        }
        let empty = serde_json::Map::new();
        let templates = stage
            .get("templates")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let tf = format!("{field}.templates");
        for (key, t) in templates {
            validate_template(key, t, &format!("{tf}[{key}]"), report);
        }
        let keys: BTreeSet<&str> = templates.keys().map(String::as_str).collect();
        for (j, cond) in items(stage, "successConditions").iter().enumerate() {
            if let Some(src) = cond.as_str() {
                validate_condition(
                    src,
                    &keys,
                    &format!("{field}.successConditions[{j}]"),
                    report,
                );
            }
        }
    }
}

fn is_template_key(key: &str) -> bool {
    let b = key.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            key.len() <= MAX_TEMPLATE_KEY_LEN
                && alnum(f)
                && alnum(l)
                && b.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn validate_template(key: &str, t: &Value, field: &str, report: &mut Report) {
    if key == "from" || key == "to" {
        report.error(FieldError::invalid(
            field,
            key,
            "from and to name the provider copies in success conditions; choose another key",
        ));
    } else if !is_template_key(key) {
        report.error(FieldError::invalid(
            field,
            key,
            "a template key names the stage object '<migration id>-<key>': it must consist of lower case alphanumeric characters or '-', and start and end with an alphanumeric character",
        ));
    }
    if !t.is_object() {
        return;
    }
    for k in ["apiVersion", "kind"] {
        if set_str(t, k).is_none() {
            report.error(FieldError::required(format!("{field}.{k}"), ""));
        }
    }
    if at(t, &["metadata", "name"]).is_some() {
        report.warn(
            &format!("{field}.metadata.name"),
            "ignored: stage objects are named '<migration id>-<key>'",
        );
    }
}

fn validate_condition(src: &str, keys: &BTreeSet<&str>, field: &str, report: &mut Report) {
    let program = match compile_cel(src) {
        Ok(p) => p,
        Err(e) => {
            report.error(FieldError::invalid(
                field,
                src,
                format!("compilation failed: {e}"),
            ));
            return;
        }
    };
    let known = if keys.is_empty() {
        "the variables are from and to; this stage has no templates".to_string()
    } else {
        let list: Vec<&str> = keys.iter().copied().collect();
        format!(
            "the variables are from, to and the stage's template keys: {}",
            list.join(", ")
        )
    };
    let vars = free_variables(&program);
    let bound = |v: &str| keys.contains(v) || v == "from" || v == "to";
    for var in vars.iter().filter(|v| !bound(v.as_str())) {
        report.error(FieldError::invalid(
            field,
            src,
            format!("undeclared reference to '{var}' ({known})"),
        ));
    }
}

const KIND: (&str, &str, &str, bool) = (
    super::BROKER_GROUP,
    "MigrationConfiguration",
    "migrationconfigurations",
    true,
);

fn vm() -> Value {
    json!({"group": "example.platform-mesh.io", "version": "v1alpha1", "kind": "VM"})
}

fn with_stages(stages: Value) -> Value {
    json!({"from": vm(), "to": vm(), "stages": stages})
}

fn case(
    name: &'static str,
    spec: Value,
    field: &'static str,
    message: &'static str,
) -> InvalidCase {
    make_case(KIND, name, "migrate-vm", Some(spec), field, message)
}

fn dummy() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"key": "value"}})
}

/// Invalid MigrationConfiguration objects and their errors.
pub(crate) fn cases() -> Vec<InvalidCase> {
    vec![
        case("duplicate stage names", with_stages(json!([{"name": "copy"}, {"name": "copy"}])),
            "spec.stages[1].name", "Duplicate value: \"copy\""),
        case("success condition does not compile", with_stages(json!([{"name": "copy", "templates": {"dummy": dummy()}, "successConditions": ["dummy.data.key =="]}])),
            "spec.stages[0].successConditions[0]",
            "Invalid value: \"dummy.data.key ==\": compilation failed: ERROR: <input>:1:18: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}"),
        case("success condition empty", with_stages(json!([{"name": "copy", "successConditions": [""]}])),
            "spec.stages[0].successConditions[0]",
            "Invalid value: \"\": compilation failed: ERROR: <input>:1:1: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}"),
        case("success condition references unknown variable", with_stages(json!([{"name": "copy", "templates": {"dummy": dummy()}, "successConditions": ["other.status.ready == true"]}])),
            "spec.stages[0].successConditions[0]",
            "Invalid value: \"other.status.ready == true\": undeclared reference to 'other' (the variables are from, to and the stage's template keys: dummy)"),
        case("success condition without templates", with_stages(json!([{"name": "copy", "successConditions": ["self.ready"]}])),
            "spec.stages[0].successConditions[0]",
            "Invalid value: \"self.ready\": undeclared reference to 'self' (the variables are from and to; this stage has no templates)"),
        case("template key from", with_stages(json!([{"name": "copy", "templates": {"from": dummy()}}])),
            "spec.stages[0].templates[from]",
            "Invalid value: \"from\": from and to name the provider copies in success conditions; choose another key"),
        case("template without apiVersion", with_stages(json!([{"name": "copy", "templates": {"dummy": {"kind": "ConfigMap"}}}])),
            "spec.stages[0].templates[dummy].apiVersion", "Required value"),
        case("template without kind", with_stages(json!([{"name": "copy", "templates": {"dummy": {"apiVersion": "v1", "kind": ""}}}])),
            "spec.stages[0].templates[dummy].kind", "Required value"),
        case("template key not a name", with_stages(json!([{"name": "copy", "templates": {"Dummy_Config": dummy()}}])),
            "spec.stages[0].templates[Dummy_Config]",
            "Invalid value: \"Dummy_Config\": a template key names the stage object '<migration id>-<key>': it must consist of lower case alphanumeric characters or '-', and start and end with an alphanumeric character"),
        case("template not an object", with_stages(json!([{"name": "copy", "templates": {"dummy": "x"}}])),
            "spec.stages[0].templates.dummy",
            "Invalid value: \"string\": spec.stages[0].templates.dummy in body must be of type object: \"string\""),
        case("stage name empty", with_stages(json!([{"name": ""}])),
            "spec.stages[0].name", "Invalid value: \"\": spec.stages[0].name in body should be at least 1 chars long"),
        case("from kind empty", json!({"from": {"group": "", "version": "v1", "kind": ""}, "to": vm()}),
            "spec.from.kind", "Required value"),
        case("to missing", json!({"from": vm()}), "spec.to", "Required value"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::rules::test_support::{assert_valid, check_cases};
    use crate::admission::rules::{validate as run, BROKER_GROUP};

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "MigrationConfiguration",
               "metadata": {"name": "migrate-vm"}, "spec": spec})
    }

    #[test]
    fn invalid_cases_yield_their_errors() {
        check_cases(&cases());
    }

    #[test]
    fn e2e_configurations_are_valid() {
        for spec in [
            with_stages(json!([])),
            json!({"from": vm(), "to": vm()}),
            with_stages(
                json!([{"name": "dummy-configmap", "templates": {"dummy": dummy()}, "successConditions": []}]),
            ),
            with_stages(json!([
                {"name": "initial", "progress": true, "templates": {"dummy": dummy(), "vm2": {"apiVersion": "example.platform-mesh.io/v1alpha1", "kind": "VM"}},
                 "successConditions": ["dummy.data.key == 'value' && has(vm2.status)", "true", "[1, 2].all(x, x > 0)", "size(dummy.data) >= 1"]},
                {"name": "cutover", "successConditions": ["1 + 1 == 2"]}])),
        ] {
            let o = obj(spec);
            assert_valid(BROKER_GROUP, "MigrationConfiguration", &o);
            assert!(run(BROKER_GROUP, "MigrationConfiguration", &o, None)
                .warnings
                .is_empty());
        }
    }

    #[test]
    fn several_undeclared_variables_and_warnings() {
        let spec = with_stages(
            json!([{"name": "s", "templates": {"cm": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "y"}}}, "successConditions": ["b.x && a.y && cm.z"]}]),
        );
        let r = run(BROKER_GROUP, "MigrationConfiguration", &obj(spec), None);
        let got: Vec<String> = r.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(got, vec![
            "spec.stages[0].successConditions[0]: Invalid value: \"b.x && a.y && cm.z\": undeclared reference to 'a' (the variables are from, to and the stage's template keys: cm)",
            "spec.stages[0].successConditions[0]: Invalid value: \"b.x && a.y && cm.z\": undeclared reference to 'b' (the variables are from, to and the stage's template keys: cm)",
        ]);
        assert_eq!(r.warnings, vec![
            "spec.stages[0].templates[cm].metadata.name: ignored: stage objects are named '<migration id>-<key>'",
        ]);
    }
}
