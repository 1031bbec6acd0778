//! `platform-mesh render` and `platform-mesh template`: the reference e2e PlatformMesh and profile
//! render to the golden file checked in beside the controller, and template errors name the file,
//! line and key.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `platform-mesh render` of the reference e2e PlatformMesh and profile with `extra` flags
/// prints exactly the golden file `golden` of the controller's tests.
fn renders_as(extra: &[&str], golden: &str) {
    let samples = repo().join("../shared/reference/platform-mesh-operator/e2e-samples");
    let out = bin()
        .args(["render", "-f"])
        .arg(samples.join("platform-mesh.yaml"))
        .arg("--profile")
        .arg(samples.join("default-profile.yaml"))
        .args(extra)
        .output()
        .expect("render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read_to_string(
        repo()
            .join("controllers/src/platformmesh/testdata")
            .join(golden),
    )
    .expect("golden");
    assert!(
        String::from_utf8_lossy(&out.stdout) == want,
        "platform-mesh render {extra:?} differs from controllers/src/platformmesh/testdata/{golden}"
    );
}

#[test]
fn render_of_the_reference_e2e_profile_matches_the_golden_file() {
    renders_as(&[], "e2e-fluxcd.yaml");
}

#[test]
fn render_with_a_remote_runtime_secret_matches_its_golden_file() {
    renders_as(
        &[
            "--remote-runtime-secret",
            "runtime-kubeconfig",
            "--remote-runtime-secret-key",
            "kubeconfig",
        ],
        "e2e-fluxcd-remote.yaml",
    );
}

#[test]
fn crds_writes_the_committed_crds_and_schemas_where_it_is_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (crds, schemas) = (dir.path().join("crds"), dir.path().join("schemas"));
    let out = bin()
        .arg("crds")
        .arg("--dir")
        .arg(&crds)
        .arg("--schemas-dir")
        .arg(&schemas)
        .output()
        .expect("crds");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = repo().join("manifests/crds");
    let mut names: Vec<_> = std::fs::read_dir(&committed)
        .expect("manifests/crds")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for name in &names {
        let want = std::fs::read(committed.join(name)).expect("committed");
        let got = std::fs::read(crds.join(name))
            .unwrap_or_else(|e| panic!("{} not written: {e}", name.to_string_lossy()));
        assert!(want == got, "{} differs", name.to_string_lossy());
    }
    assert!(
        std::fs::read_dir(&schemas).expect("schemas dir").count() > 0,
        "no APIResourceSchemas written to --schemas-dir"
    );
    // And `--check` agrees that what it wrote is fresh.
    let check = bin()
        .arg("crds")
        .arg("--dir")
        .arg(&crds)
        .arg("--schemas-dir")
        .arg(&schemas)
        .arg("--check")
        .output()
        .expect("crds --check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `platform-mesh template FILE --values VALUES`.
fn template(file: &std::path::Path, values: &std::path::Path) -> std::process::Output {
    bin()
        .arg("template")
        .arg(file)
        .arg("--values")
        .arg(values)
        .output()
        .expect("run")
}

#[test]
fn template_renders_one_file_and_names_missing_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tpl = dir.path().join("svc.yaml");
    std::fs::write(
        &tpl,
        "{{- range $name, $svc := .services }}\n{{- if $svc.enabled }}\n- name: {{ $name }}\n  replicas: {{ $svc.replicas | default 1 }}\n{{- end }}\n{{- end }}\n",
    )
    .expect("write");
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "services:\n  portal: {enabled: true, replicas: 3}\n  iam: {enabled: true}\n  off: {enabled: false}\n",
    )
    .expect("write");
    let out = template(&tpl, &values);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "\n- name: iam\n  replicas: 1\n- name: portal\n  replicas: 3\n"
    );

    std::fs::write(&tpl, "a: 1\nb: {{ .services.portal.image }}\n").expect("write");
    let out = template(&tpl, &values);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("template: {}:2:", tpl.display()))
            && err.contains(".services.portal.image"),
        "{err}"
    );

    let out = template(&dir.path().join("nope.yaml"), &values);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.yaml"));
}
