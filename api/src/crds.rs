//! CustomResourceDefinitions of every Platform Mesh kind, derived from the Rust types.
//! Adds what kube-derive cannot express, and writes/checks the YAML files in `manifests/crds/`.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::crd::CustomResourceExt;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::{AcceptAPI, Migration, MigrationConfiguration};
use crate::core::{Account, AccountInfo, PlatformMesh};
use crate::providers::{ManagedProvider, Provider};

/// First line of every generated CRD file.
pub const GENERATED_HEADER: &str =
    "# Generated from the Rust types in the `api` crate by `platform-mesh crds`. Do not edit.\n";

/// All Platform Mesh CRDs, in a fixed order, with the post-processing applied.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        finish(PlatformMesh::crd(), spec_optional),
        finish(Account::crd(), spec_optional),
        finish(AccountInfo::crd(), spec_optional),
        finish(Provider::crd(), keep),
        finish(ManagedProvider::crd(), keep),
        finish(AcceptAPI::crd(), spec_optional),
        finish(Migration::crd(), keep),
        finish(MigrationConfiguration::crd(), keep),
    ]
}

/// File name of a CRD manifest: `<group>_<plural>.yaml`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Renders one CRD as YAML, deterministically, with the generated-file header.
pub fn render_crd(crd: &CustomResourceDefinition) -> String {
    let mut value = serde_json::to_value(crd).expect("a CRD serializes to JSON");
    integral_floats_to_integers(&mut value);
    let yaml =
        serde_saphyr::to_string(&SortedKeys(&value)).expect("a JSON value serializes to YAML");
    format!("{GENERATED_HEADER}{yaml}")
}

/// Serializes a JSON value with object keys in sorted order, whether or not serde_json's
/// `preserve_order` feature is enabled somewhere in the build.
pub(crate) struct SortedKeys<'a>(pub(crate) &'a Value);

impl Serialize for SortedKeys<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut out = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    out.serialize_entry(key, &SortedKeys(value))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&SortedKeys(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// Writes one `<group>_<plural>.yaml` per CRD into `dir` (created if missing) and returns the paths.
pub fn write_crds(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for crd in crds() {
        let path = dir.join(crd_file_name(&crd));
        fs::write(&path, render_crd(&crd))?;
        written.push(path);
    }
    Ok(written)
}

/// Checks that `dir` holds exactly the files [`write_crds`] would write, byte for byte.
///
/// The error lists every missing, stale (different content) and unexpected `.yaml` file.
pub fn check_crds(dir: &Path) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut expected = BTreeSet::new();
    for crd in crds() {
        let name = crd_file_name(&crd);
        let path = dir.join(&name);
        match fs::read_to_string(&path) {
            Ok(on_disk) if on_disk == render_crd(&crd) => {}
            Ok(_) => problems.push(format!("stale: {}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                problems.push(format!("missing: {}", path.display()))
            }
            Err(e) => problems.push(format!("unreadable: {}: {e}", path.display())),
        }
        expected.insert(name);
    }
    if let Ok(entries) = fs::read_dir(dir) {
        let mut extra: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml") && !expected.contains(n))
            .collect();
        extra.sort();
        problems.extend(
            extra
                .into_iter()
                .map(|n| format!("unexpected: {}", dir.join(n).display())),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "CRD manifests in {} are out of date:\n  {}",
            dir.display(),
            problems.join("\n  ")
        ))
    }
}

/// Applies the common post-processing plus a per-kind fixup to the root schema.
pub(crate) fn finish(
    crd: CustomResourceDefinition,
    fixup: fn(&mut Value),
) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes to JSON");
    // kube-derive leaves `listKind` unset; upstream manifests spell it out.
    let list_kind = format!("{}List", crd.spec.names.kind);
    value["spec"]["names"]["listKind"] = Value::String(list_kind);
    for version in value["spec"]["versions"]
        .as_array_mut()
        .expect("CRD versions")
    {
        let root = &mut version["schema"]["openAPIV3Schema"];
        common_fixups(root);
        fixup(root);
    }
    serde_json::from_value(value).expect("post-processed CRD is still a CRD")
}

/// Fixups every kind needs.
///
/// * kube-derive leaves `apiVersion`, `kind` and `metadata` out of the schema; upstream lists them.
/// * schemars adds a `title` at the root and `nullable: true` on every `Option`; upstream has
///   neither (and without `nullable`, the server drops explicit nulls instead of storing them).
fn common_fixups(root: &mut Value) {
    remove_key_recursively(root, "nullable");
    let obj = root.as_object_mut().expect("root schema is an object");
    obj.remove("title");
    let props = obj
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("root properties");
    props.insert(
        "apiVersion".into(),
        json!({"type": "string", "description": "Versioned schema of this object, `<group>/<version>`."}),
    );
    props.insert(
        "kind".into(),
        json!({"type": "string", "description": "REST resource kind of this object, in CamelCase."}),
    );
    props.insert("metadata".into(), json!({"type": "object"}));
}

/// Per-kind fixup: upstream does not require `spec` for this kind (kube-derive always does).
pub(crate) fn spec_optional(root: &mut Value) {
    let obj = root.as_object_mut().expect("root schema is an object");
    if let Some(Value::Array(required)) = obj.get_mut("required") {
        required.retain(|r| r != "spec");
        if required.is_empty() {
            obj.remove("required");
        }
    }
}

/// Per-kind fixup for kinds that need nothing beyond the common fixups.
fn keep(_: &mut Value) {}

/// Removes `key` from every object in the tree.
pub(crate) fn remove_key_recursively(value: &mut Value, key: &str) {
    match value {
        Value::Object(map) => {
            map.remove(key);
            map.values_mut()
                .for_each(|v| remove_key_recursively(v, key));
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| remove_key_recursively(v, key)),
        _ => {}
    }
}

/// Turns floats with an integral value (`0.0`, e.g. from `minimum`) into integers, so YAML
/// output reads `minimum: 0` like upstream manifests.
pub(crate) fn integral_floats_to_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                *value = Value::from(f as i64);
            }
        }
        Value::Object(map) => map.values_mut().for_each(integral_floats_to_integers),
        Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifests_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds")
    }

    #[test]
    fn crds_are_fresh() {
        if let Err(e) = check_crds(&manifests_dir()) {
            panic!("{e}\nrun `cargo run -- crds` to regenerate them");
        }
    }

    #[test]
    fn file_names_are_unique_and_follow_group_plural() {
        let names: BTreeSet<String> = crds().iter().map(crd_file_name).collect();
        assert_eq!(names.len(), crds().len());
        assert!(names.contains("core.platform-mesh.io_platformmeshes.yaml"));
        assert!(names.contains("broker.platform-mesh.io_acceptapis.yaml"));
    }

    #[test]
    fn rendering_is_deterministic_and_parses_back() {
        for crd in crds() {
            let yaml = render_crd(&crd);
            assert_eq!(yaml, render_crd(&crd));
            let back: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
            assert_eq!(back, crd, "{}", crd_file_name(&crd));
        }
    }

    #[test]
    fn write_then_check_round_trips_and_detects_drift() {
        let dir = std::env::temp_dir().join(format!("pm-crds-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let written = write_crds(&dir).unwrap();
        assert_eq!(written.len(), crds().len());
        check_crds(&dir).unwrap();

        fs::write(&written[0], "stale").unwrap();
        fs::remove_file(&written[1]).unwrap();
        fs::write(dir.join("zz_extra.yaml"), "x").unwrap();
        let err = check_crds(&dir).unwrap_err();
        assert!(err.contains("stale:"), "{err}");
        assert!(err.contains("missing:"), "{err}");
        assert!(err.contains("unexpected:"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_nullable_or_title_left() {
        for crd in crds() {
            let text = serde_json::to_string(&crd).unwrap();
            assert!(
                !text.contains("\"nullable\""),
                "{}",
                crd.metadata.name.unwrap()
            );
            assert!(
                !text.contains("\"title\""),
                "{}",
                crd.metadata.name.unwrap()
            );
        }
    }
}
