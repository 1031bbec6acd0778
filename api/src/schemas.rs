//! kcp APIResourceSchemas of the Platform Mesh kinds that kcp offers through APIExports
//! (`core.platform-mesh.io`: Account, AccountInfo; `providers.platform-mesh.io`: Provider,
//! ProviderPermissions), derived from the same CRDs as `manifests/crds/`, and the files of
//! `manifests/kcp/01-platform-mesh-system/` that hold them.
//!
//! An APIResourceSchema is a CRD's group, names, scope and versions, with each version's
//! structural schema directly under `schema` (no `openAPIV3Schema` level). Its name follows
//! kcp's `v<yymmdd>-<hash>.<plural>.<group>`: `<hash>` is the first eight hex digits of the
//! SHA-256 of the rendered spec, so every schema change gives a new name (kcp never updates a
//! schema in place); `<yymmdd>` is the UTC date that hash was first written, kept from the file
//! on disk while the hash stays the same.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::crd::CustomResourceExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::crds::{finish, integral_floats_to_integers, spec_optional, SortedKeys};
use crate::providers::ProviderPermissions;

/// First line of every generated APIResourceSchema file.
pub const SCHEMA_HEADER: &str =
    "# Generated from the Rust types in the `api` crate by `platform-mesh crds`. Do not edit.\n";

/// Where the generated files live, relative to the repository root.
pub const SCHEMA_DIR: &str = "manifests/kcp/01-platform-mesh-system";

/// Why generated APIResourceSchemas could not be written or are not up to date.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The files on disk differ from what the Rust types give.
    #[error("APIResourceSchemas in {dir} are out of date:\n  {}", problems.join("\n  "))]
    OutOfDate {
        /// The directory checked.
        dir: PathBuf,
        /// One line per missing or stale file.
        problems: Vec<String>,
    },
}

/// The CRDs whose kinds kcp serves through Platform Mesh's APIExports, in a fixed order.
pub fn exported_crds() -> Vec<CustomResourceDefinition> {
    let all = crate::crds();
    let pick = |name: &str| {
        all.iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("no CRD {name}"))
    };
    vec![
        pick("accounts.core.platform-mesh.io"),
        pick("accountinfos.core.platform-mesh.io"),
        pick("providers.providers.platform-mesh.io"),
        // Not a CRD of its own upstream (only an APIResourceSchema), so not in `crds()`.
        finish(ProviderPermissions::crd(), spec_optional),
    ]
}

/// The file of a CRD's schema: `10-apiresourceschema-<plural>.<group>.yaml`.
pub fn schema_file_name(crd: &CustomResourceDefinition) -> String {
    format!(
        "10-apiresourceschema-{}.{}.yaml",
        crd.spec.names.plural, crd.spec.group
    )
}

/// The APIResourceSchema spec of a CRD: group, names, scope, and each version with its schema
/// lifted out of `openAPIV3Schema`.
pub fn schema_spec(crd: &CustomResourceDefinition) -> Value {
    let mut value = serde_json::to_value(crd).expect("a CRD serializes to JSON");
    integral_floats_to_integers(&mut value);
    let spec = &value["spec"];
    let versions: Vec<Value> = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let mut v = v.clone();
            let schema = v["schema"]["openAPIV3Schema"].take();
            v["schema"] = schema;
            v
        })
        .collect();
    json!({
        "group": spec["group"],
        "names": spec["names"],
        "scope": spec["scope"],
        "versions": versions,
    })
}

fn yaml(value: &Value) -> String {
    serde_saphyr::to_string(&SortedKeys(value)).expect("a JSON value serializes to YAML")
}

/// The first eight hex digits of the SHA-256 of the rendered spec.
pub fn schema_hash(spec: &Value) -> String {
    let digest = Sha256::digest(yaml(spec).as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// `v<date>-<hash>.<plural>.<group>`.
pub fn schema_name(crd: &CustomResourceDefinition, date: &str) -> String {
    format!(
        "v{date}-{}.{}.{}",
        schema_hash(&schema_spec(crd)),
        crd.spec.names.plural,
        crd.spec.group
    )
}

/// The APIResourceSchema of a CRD, named with `date` (`yymmdd`), as YAML with the header.
pub fn render_schema(crd: &CustomResourceDefinition, date: &str) -> String {
    let object = json!({
        "apiVersion": "apis.kcp.io/v1alpha1",
        "kind": "APIResourceSchema",
        "metadata": {"name": schema_name(crd, date)},
        "spec": schema_spec(crd),
    });
    format!("{SCHEMA_HEADER}{}", yaml(&object))
}

/// Today's UTC date as `yymmdd`.
pub fn today_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    yymmdd(secs / 86_400)
}

/// `yymmdd` of a day counted from 1970-01-01 (the proleptic Gregorian calendar).
fn yymmdd(days: u64) -> String {
    // Shift to a calendar whose years start in March, so leap days end a year.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{:02}{month:02}{day:02}", year.rem_euclid(100))
}

/// `metadata.name` of the object in a schema file, if the file exists and has one.
fn name_on_disk(path: &Path) -> Result<Option<String>, SchemaError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SchemaError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let value: Value = serde_saphyr::from_str(&text).unwrap_or(Value::Null);
    Ok(value["metadata"]["name"].as_str().map(str::to_string))
}

/// The date of `existing` (`v<date>-<hash>.…`) when its hash is `hash`.
fn kept_date(existing: Option<&str>, hash: &str) -> Option<String> {
    let prefix = existing?.split('.').next()?;
    let (date, h) = prefix.strip_prefix('v')?.split_once('-')?;
    (h == hash && date.len() == 6 && date.bytes().all(|b| b.is_ascii_digit()))
        .then(|| date.to_string())
}

/// One written schema file, and the name it replaced when the schema changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The file.
    pub path: PathBuf,
    /// The object's name.
    pub name: String,
    /// The previous name, when the file held a different one.
    pub replaced: Option<String>,
}

/// Writes one file per [`exported_crds`] into `dir` (created if missing). A schema whose hash is
/// unchanged keeps its name; a changed one is named with `today` (`yymmdd`), and its old name is
/// replaced by the new one in the other `.yaml` files of `dir` (the APIExports that list it).
pub fn write_schemas(dir: &Path, today: &str) -> Result<Vec<Written>, SchemaError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SchemaError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut written = Vec::new();
    for crd in exported_crds() {
        let path = dir.join(schema_file_name(&crd));
        let old = name_on_disk(&path)?;
        let hash = schema_hash(&schema_spec(&crd));
        let date = kept_date(old.as_deref(), &hash).unwrap_or_else(|| today.to_string());
        fs::write(&path, render_schema(&crd, &date)).map_err(io_err(&path))?;
        let name = schema_name(&crd, &date);
        let replaced = old.filter(|o| *o != name);
        if let Some(old) = &replaced {
            replace_in_dir(dir, &path, old, &name)?;
        }
        written.push(Written {
            path,
            name,
            replaced,
        });
    }
    Ok(written)
}

/// Replaces `old` by `new` in every `.yaml` file of `dir` except `skip`.
fn replace_in_dir(dir: &Path, skip: &Path, old: &str, new: &str) -> Result<(), SchemaError> {
    let entries = fs::read_dir(dir).map_err(|source| SchemaError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path == skip || path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let io_err = |source| SchemaError::Io {
            path: path.clone(),
            source,
        };
        let text = fs::read_to_string(&path).map_err(io_err)?;
        if text.contains(old) {
            fs::write(&path, text.replace(old, new)).map_err(io_err)?;
        }
    }
    Ok(())
}

/// Checks that `dir` holds the files [`write_schemas`] would write, byte for byte, with the
/// dates they carry. The error lists every missing and stale file.
pub fn check_schemas(dir: &Path) -> Result<(), SchemaError> {
    let mut problems = Vec::new();
    for crd in exported_crds() {
        let path = dir.join(schema_file_name(&crd));
        let Some(old) = name_on_disk(&path)? else {
            problems.push(format!("missing: {}", path.display()));
            continue;
        };
        let hash = schema_hash(&schema_spec(&crd));
        let Some(date) = kept_date(Some(&old), &hash) else {
            problems.push(format!(
                "stale: {} ({old} is not {})",
                path.display(),
                schema_name(&crd, "<date>")
            ));
            continue;
        };
        let on_disk = fs::read_to_string(&path).map_err(|source| SchemaError::Io {
            path: path.clone(),
            source,
        })?;
        if on_disk != render_schema(&crd, &date) {
            problems.push(format!("stale: {}", path.display()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SchemaError::OutOfDate {
            dir: dir.to_path_buf(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifests_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(SCHEMA_DIR)
    }

    #[test]
    fn schemas_are_fresh() {
        if let Err(e) = check_schemas(&manifests_dir()) {
            panic!(
                "{e}\nrun `cargo run -- crds` to regenerate them (it also renames them in the \
                 APIExports of that directory)"
            );
        }
    }

    #[test]
    fn the_exported_kinds() {
        let names: Vec<String> = exported_crds()
            .iter()
            .map(|c| format!("{}.{}", c.spec.names.plural, c.spec.group))
            .collect();
        assert_eq!(
            names,
            [
                "accounts.core.platform-mesh.io",
                "accountinfos.core.platform-mesh.io",
                "providers.providers.platform-mesh.io",
                "providerpermissions.providers.platform-mesh.io",
            ]
        );
    }

    #[test]
    fn a_schema_is_its_crd_without_the_openapi_level() {
        let crd = &exported_crds()[2];
        let text = render_schema(crd, "260101");
        assert!(text.starts_with(SCHEMA_HEADER));
        let object: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(object["apiVersion"], "apis.kcp.io/v1alpha1");
        assert_eq!(object["kind"], "APIResourceSchema");
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("v260101-") && name.ends_with(".providers.providers.platform-mesh.io"),
            "{name}"
        );
        let crd_json = serde_json::to_value(crd).unwrap();
        let version = &object["spec"]["versions"][0];
        assert_eq!(
            version["schema"]["properties"]["spec"],
            crd_json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        );
        assert!(version["schema"].get("openAPIV3Schema").is_none());
        assert_eq!(version["subresources"], json!({"status": {}}));
        assert_eq!(object["spec"]["scope"], "Cluster");
        assert_eq!(object["spec"]["names"]["listKind"], "ProviderList");
    }

    #[test]
    fn the_hash_follows_the_schema() {
        let crd = exported_crds().remove(0);
        let spec = schema_spec(&crd);
        let hash = schema_hash(&spec);
        assert_eq!(hash.len(), 8);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(hash, schema_hash(&schema_spec(&crd)));
        let mut changed = spec.clone();
        changed["versions"][0]["schema"]["properties"]["extra"] = json!({"type": "string"});
        assert_ne!(hash, schema_hash(&changed));
    }

    #[test]
    fn dates() {
        assert_eq!(yymmdd(0), "700101");
        assert_eq!(yymmdd(11_016), "000229");
        assert_eq!(yymmdd(20_635), "260701");
        assert_eq!(yymmdd(20_454), "260101");
        assert_eq!(today_utc().len(), 6);
        assert_eq!(
            kept_date(Some("v260101-0123abcd.accounts.x"), "0123abcd"),
            Some("260101".into())
        );
        assert_eq!(
            kept_date(Some("v260101-0123abcd.accounts.x"), "ffffffff"),
            None
        );
        assert_eq!(kept_date(Some("v1alpha1.accounts.x"), "0123abcd"), None);
        assert_eq!(kept_date(None, "0123abcd"), None);
    }

    #[test]
    fn write_keeps_dates_renames_references_and_check_detects_drift() {
        let dir = std::env::temp_dir().join(format!("pm-schemas-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = write_schemas(&dir, "250101").unwrap();
        assert_eq!(first.len(), exported_crds().len());
        assert!(first.iter().all(|w| w.replaced.is_none()));
        check_schemas(&dir).unwrap();

        // Unchanged schemas keep their date.
        let again = write_schemas(&dir, "260202").unwrap();
        assert_eq!(
            again.iter().map(|w| &w.name).collect::<Vec<_>>(),
            first.iter().map(|w| &w.name).collect::<Vec<_>>()
        );

        // A schema whose hash no longer matches is stale; rewriting renames it, and the export
        // that lists it follows.
        let accounts = &first[0];
        let rest = accounts.name.split_once('.').unwrap().1;
        let outdated = format!("v250101-00000000.{rest}");
        let text = fs::read_to_string(&accounts.path).unwrap();
        fs::write(&accounts.path, text.replace(&accounts.name, &outdated)).unwrap();
        let export = dir.join("20-apiexport-core.yaml");
        fs::write(&export, format!("latestResourceSchemas:\n- {outdated}\n")).unwrap();
        fs::remove_file(&first[1].path).unwrap();
        fs::write(
            &first[2].path,
            render_schema(&exported_crds()[2], "250101") + "#\n",
        )
        .unwrap();
        let err = check_schemas(&dir).unwrap_err().to_string();
        assert!(err.contains("stale:") && err.contains(&outdated), "{err}");
        assert!(err.contains("missing:"), "{err}");
        assert_eq!(err.matches("stale:").count(), 2, "{err}");

        let fixed = write_schemas(&dir, "260202").unwrap();
        assert_eq!(fixed[0].replaced.as_deref(), Some(outdated.as_str()));
        assert!(fixed[0].name.starts_with("v260202-"), "{}", fixed[0].name);
        assert_eq!(
            fs::read_to_string(&export).unwrap(),
            format!("latestResourceSchemas:\n- {}\n", fixed[0].name)
        );
        assert!(fixed[1].name.starts_with("v260202-"));
        assert_eq!(fixed[2].name, first[2].name);
        check_schemas(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
