//! Tests that hold the generated CRDs and Rust types against the upstream CRDs and samples.
//! Upstream files are read at test time from the shared reference directory beside the repo.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::{AcceptAPI, Migration, MigrationConfiguration};
use crate::core::{Account, AccountInfo, PlatformMesh};
use crate::providers::{ManagedProvider, Provider, ProviderPermissions};

/// The shared reference directory.
fn reference_dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference"
    ))
    .to_path_buf()
}

/// Upstream CRD file per generated CRD name, and the printer columns we add on top of upstream.
const UPSTREAM: &[(&str, &str, &[&str])] = &[
    (
        "platformmeshes.core.platform-mesh.io",
        "platform-mesh-operator/config-crd/core.platform-mesh.io_platformmeshes.yaml",
        &["Age"],
    ),
    (
        "accounts.core.platform-mesh.io",
        "account-operator/core.platform-mesh.io_accounts.yaml",
        &["Age"],
    ),
    (
        "accountinfos.core.platform-mesh.io",
        "account-operator/core.platform-mesh.io_accountinfos.yaml",
        &["Age"],
    ),
    (
        "providers.providers.platform-mesh.io",
        "platform-mesh-operator/config-crd/providers.platform-mesh.io_providers.yaml",
        &["Age"],
    ),
    (
        "managedproviders.providers.platform-mesh.io",
        "platform-mesh-operator/config-crd/providers.platform-mesh.io_managedproviders.yaml",
        &["Age"],
    ),
    (
        "acceptapis.broker.platform-mesh.io",
        "resource-broker/config/broker/crd/broker.platform-mesh.io_acceptapis.yaml",
        &["Group", "Version", "Resource", "Age"],
    ),
    (
        "migrations.broker.platform-mesh.io",
        "resource-broker/config/broker/crd/broker.platform-mesh.io_migrations.yaml",
        &["State", "Age"],
    ),
    (
        "migrationconfigurations.broker.platform-mesh.io",
        "resource-broker/config/broker/crd/broker.platform-mesh.io_migrationconfigurations.yaml",
        &["Age"],
    ),
];

fn load_yaml(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn upstream_crd(name: &str) -> Value {
    let (_, file, _) = UPSTREAM
        .iter()
        .find(|(n, _, _)| *n == name)
        .expect("known CRD");
    load_yaml(&reference_dir().join(file))
}

fn generated(name: &str) -> Value {
    let crd = crate::crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no generated CRD {name}"));
    serde_json::to_value(crd).unwrap()
}

/// Recursively compares two schema trees, ignoring `description`, treating `required` as a set
/// and numbers by value. Pushes one line per difference, naming its path.
fn diff(path: &str, upstream: &Value, ours: &Value, out: &mut Vec<String>) {
    match (upstream, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                if key == "description" {
                    continue;
                }
                let sub = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) if key == "required" => {
                        let set = |v: &Value| -> BTreeSet<String> {
                            v.as_array()
                                .into_iter()
                                .flatten()
                                .map(|s| s.to_string())
                                .collect()
                        };
                        if set(x) != set(y) {
                            out.push(format!("{sub}: upstream {x} != ours {y}"));
                        }
                    }
                    (Some(x), Some(y)) => diff(&sub, x, y, out),
                    (Some(x), None) => out.push(format!("{sub}: missing in ours (upstream {x})")),
                    (None, Some(y)) => out.push(format!("{sub}: extra in ours ({y})")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                out.push(format!(
                    "{path}: length upstream {} != ours {}",
                    a.len(),
                    b.len()
                ));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: upstream {a} != ours {b}")),
    }
}

#[test]
fn diff_reports_paths_of_differences() {
    let up = json!({"description": "x", "properties": {"a": {"type": "string", "minimum": 0}},
        "required": ["a", "b"]});
    let same =
        json!({"properties": {"a": {"type": "string", "minimum": 0.0}}, "required": ["b", "a"]});
    let mut out = Vec::new();
    diff("root", &up, &same, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let changed = json!({"properties": {"a": {"type": "integer"}, "c": {}}, "required": ["a"]});
    diff("root", &up, &changed, &mut out);
    assert_eq!(out.len(), 4, "{out:#?}");
    assert!(out.iter().any(|l| l.starts_with("root.properties.a.type:")));
    assert!(out
        .iter()
        .any(|l| l.starts_with("root.properties.a.minimum: missing")));
    assert!(out
        .iter()
        .any(|l| l.starts_with("root.properties.c: extra")));
    assert!(out.iter().any(|l| l.starts_with("root.required:")));
}

#[test]
fn every_upstream_crd_has_a_generated_twin() {
    let ours: BTreeSet<String> = crate::crds()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let upstream: BTreeSet<String> = UPSTREAM.iter().map(|(n, _, _)| n.to_string()).collect();
    assert_eq!(ours, upstream);
}

#[test]
fn names_scope_and_versions_match_upstream() {
    for (name, _, _) in UPSTREAM {
        let (up, ours) = (upstream_crd(name), generated(name));
        let mut out = Vec::new();
        assert_eq!(up["metadata"]["name"], ours["metadata"]["name"]);
        for key in ["group", "names", "scope"] {
            diff(key, &up["spec"][key], &ours["spec"][key], &mut out);
        }
        let (uv, ov) = (&up["spec"]["versions"], &ours["spec"]["versions"]);
        assert_eq!(ov.as_array().unwrap().len(), 1, "{name}: one version");
        for key in ["name", "served", "storage", "subresources", "deprecated"] {
            diff(key, &uv[0][key], &ov[0][key], &mut out);
        }
        assert!(out.is_empty(), "{name}:\n{}", out.join("\n"));
    }
}

#[test]
fn schemas_match_upstream() {
    for (name, _, _) in UPSTREAM {
        let (up, ours) = (upstream_crd(name), generated(name));
        let mut out = Vec::new();
        let up_props = &up["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert!(
            up_props["spec"].is_object(),
            "{name}: upstream schema not found"
        );
        diff(
            "openAPIV3Schema",
            &up["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            &ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            &mut out,
        );
        assert!(out.is_empty(), "{name}:\n{}", out.join("\n"));
    }
}

#[test]
fn printer_columns_keep_upstream_and_only_add_known_ones() {
    for (name, _, added) in UPSTREAM {
        let (up, ours) = (upstream_crd(name), generated(name));
        let strip = |v: &Value| -> Vec<Value> {
            v["spec"]["versions"][0]["additionalPrinterColumns"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|mut c| {
                    c.as_object_mut().unwrap().remove("description");
                    c
                })
                .collect()
        };
        let (up_cols, our_cols) = (strip(&up), strip(&ours));
        let kept: Vec<Value> = our_cols
            .iter()
            .filter(|c| !added.contains(&c["name"].as_str().unwrap()))
            .cloned()
            .collect();
        assert_eq!(kept, up_cols, "{name}: upstream columns changed");
        let extra: Vec<&str> = our_cols
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .filter(|n| added.contains(n))
            .collect();
        assert_eq!(&extra, added, "{name}: added columns");
        let age = our_cols.iter().find(|c| c["name"] == "Age").unwrap();
        assert_eq!(
            age,
            &json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
        );
    }
}

/// Builds an object that sets every property the upstream schema declares.
fn maximal(schema: &Value) -> Value {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && schema.get("properties").is_none()
    {
        return json!({"any": {"nested": [1, "two", true]}});
    }
    if let Some(values) = schema.get("enum") {
        return values[0].clone();
    }
    if let Some(default) = schema.get("default") {
        return default.clone();
    }
    match schema["type"].as_str() {
        Some("string") if schema["format"] == "date-time" => json!("2024-05-06T07:08:09Z"),
        Some("string") => json!("value"),
        Some("integer") => json!(7),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("array") => json!([maximal(&schema["items"])]),
        Some("object") => {
            let mut obj = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, sub) in props {
                    obj.insert(key.clone(), maximal(sub));
                }
            }
            if let Some(extra) = schema.get("additionalProperties") {
                obj.insert("some-key".into(), maximal(extra));
            }
            Value::Object(obj)
        }
        other => panic!("unexpected schema type {other:?} in {schema}"),
    }
}

/// Deserializes into `T`, serializes back, and requires the same JSON.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| format!("decode: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("encode: {e}"))?;
    let mut out = Vec::new();
    diff("", value, &back, &mut out);
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n"))
    }
}

/// Round-trips a value through the Rust type of its kind.
fn round_trip_kind(kind: &str, value: &Value) -> Result<(), String> {
    match kind {
        "PlatformMesh" => round_trip::<PlatformMesh>(value),
        "Account" => round_trip::<Account>(value),
        "AccountInfo" => round_trip::<AccountInfo>(value),
        "Provider" => round_trip::<Provider>(value),
        "ManagedProvider" => round_trip::<ManagedProvider>(value),
        "AcceptAPI" => round_trip::<AcceptAPI>(value),
        "Migration" => round_trip::<Migration>(value),
        "MigrationConfiguration" => round_trip::<MigrationConfiguration>(value),
        "ProviderPermissions" => round_trip::<ProviderPermissions>(value),
        other => Err(format!("unknown kind {other}")),
    }
}

#[test]
fn fully_populated_objects_round_trip() {
    for (name, _, _) in UPSTREAM {
        let up = upstream_crd(name);
        let mut object = maximal(&up["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
        let kind = up["spec"]["names"]["kind"].as_str().unwrap();
        object["apiVersion"] = json!(format!(
            "{}/v1alpha1",
            up["spec"]["group"].as_str().unwrap()
        ));
        object["kind"] = json!(kind);
        object["metadata"] = json!({"name": "sample", "labels": {"a": "b"}});
        round_trip_kind(kind, &object).unwrap_or_else(|e| panic!("{kind}: {e}\n{object:#}"));
    }
}

/// Every YAML document under the sample directories whose kind is one of ours.
fn upstream_samples() -> Vec<(PathBuf, Value)> {
    let kinds: BTreeSet<&str> = [
        "PlatformMesh",
        "Account",
        "AccountInfo",
        "Provider",
        "ManagedProvider",
        "AcceptAPI",
        "Migration",
        "MigrationConfiguration",
    ]
    .into();
    let mut files = Vec::new();
    for dir in [
        "platform-mesh-operator/config-samples",
        "platform-mesh-operator/e2e-samples",
        "resource-broker/examples",
        "account-operator",
    ] {
        collect_yaml_files(&reference_dir().join(dir), &mut files);
    }
    let mut samples = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        if !kinds.iter().any(|k| text.contains(&format!("kind: {k}\n"))) {
            continue;
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for doc in docs {
            let is_ours = doc["apiVersion"]
                .as_str()
                .is_some_and(|v| v.contains("platform-mesh.io/"))
                && doc["kind"].as_str().is_some_and(|k| kinds.contains(k));
            if is_ours {
                samples.push((file.clone(), doc));
            }
        }
    }
    samples
}

fn collect_yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

#[test]
fn upstream_samples_round_trip() {
    let samples = upstream_samples();
    let kinds: BTreeSet<&str> = samples
        .iter()
        .map(|(_, d)| d["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains("PlatformMesh") && kinds.contains("AcceptAPI"),
        "{kinds:?}"
    );
    assert!(samples.len() >= 6, "found only {} samples", samples.len());
    println!("{} upstream samples of kinds {kinds:?}", samples.len());
    for (file, doc) in &samples {
        let kind = doc["kind"].as_str().unwrap();
        round_trip_kind(kind, doc).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}

#[test]
fn generated_crds_parse_as_typed_crds() {
    for (name, file, _) in UPSTREAM {
        let text = fs::read_to_string(reference_dir().join(file)).unwrap();
        let up: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(up.metadata.name.as_deref(), Some(*name));
    }
}

#[test]
fn provider_matches_the_kcp_api_resource_schema_too() {
    let ars = load_yaml(&reference_dir().join(
        "platform-mesh-operator/kcp-generated/apiresourceschema-providers.providers.platform-mesh.io.yaml",
    ));
    let ours = generated("providers.providers.platform-mesh.io");
    let mut out = Vec::new();
    diff(
        "names",
        &ars["spec"]["names"],
        &ours["spec"]["names"],
        &mut out,
    );
    diff(
        "schema",
        &ars["spec"]["versions"][0]["schema"],
        &ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
        &mut out,
    );
    assert!(ars["spec"]["versions"][0]["schema"]["properties"]["spec"].is_object());
    assert!(out.is_empty(), "{}", out.join("\n"));
}

/// The generated APIResourceSchema of `plural.group` next to upstream's kcp-generated one.
fn generated_and_upstream_schema(plural_group: &str) -> (Value, Value) {
    let crd = crate::schemas::exported_crds()
        .into_iter()
        .find(|c| format!("{}.{}", c.spec.names.plural, c.spec.group) == plural_group)
        .unwrap_or_else(|| panic!("no exported CRD {plural_group}"));
    let ours: Value =
        serde_saphyr::from_str(&crate::schemas::render_schema(&crd, "260101")).unwrap();
    let upstream = load_yaml(&reference_dir().join(format!(
        "platform-mesh-operator/kcp-generated/apiresourceschema-{plural_group}.yaml"
    )));
    (ours, upstream)
}

#[test]
fn generated_api_resource_schemas_match_kcp_generated_ones() {
    for plural_group in [
        "providers.providers.platform-mesh.io",
        "providerpermissions.providers.platform-mesh.io",
    ] {
        let (ours, upstream) = generated_and_upstream_schema(plural_group);
        let mut out = Vec::new();
        for key in ["group", "names", "scope"] {
            diff(key, &upstream["spec"][key], &ours["spec"][key], &mut out);
        }
        let (uv, ov) = (
            &upstream["spec"]["versions"][0],
            &ours["spec"]["versions"][0],
        );
        for key in ["name", "served", "storage", "subresources", "schema"] {
            diff(key, &uv[key], &ov[key], &mut out);
        }
        assert!(out.is_empty(), "{plural_group}:\n{}", out.join("\n"));
        // Same shape of name as kcp's: v<yymmdd>-<hash>.<plural>.<group>.
        let name = |v: &Value| v["metadata"]["name"].as_str().unwrap().to_string();
        let suffix = |n: &str| n.split_once('.').unwrap().1.to_string();
        assert_eq!(suffix(&name(&ours)), suffix(&name(&upstream)));
        assert!(name(&ours).starts_with("v260101-"));
    }
}

#[test]
fn fully_populated_provider_permissions_round_trip() {
    let (_, upstream) =
        generated_and_upstream_schema("providerpermissions.providers.platform-mesh.io");
    let mut object = maximal(&upstream["spec"]["versions"][0]["schema"]);
    object["apiVersion"] = json!("providers.platform-mesh.io/v1alpha1");
    object["kind"] = json!("ProviderPermissions");
    object["metadata"] = json!({"name": "sample"});
    round_trip_kind("ProviderPermissions", &object).unwrap_or_else(|e| panic!("{e}\n{object:#}"));
}
