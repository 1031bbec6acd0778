//! `platform-mesh render` and `platform-mesh template`: what the PlatformMesh controller would
//! apply, computed from files without a cluster, for review and diffing.

use serde_json::{Map, Value};

use super::features::feature_plan;
use super::manifests::{kcp_data, plan, IdpSettings};
use super::render::{render_deployment, Inputs, Rendered, Target};
use super::vars::{parse_yaml, template_vars, Profile, RemoteRuntime, Render};
use api::core::PlatformMeshSpec;

/// The PlatformMesh of a YAML file: its namespace (default `default`) and spec.
pub fn read_platform_mesh(text: &str) -> Result<(String, PlatformMeshSpec), String> {
    let doc = parse_yaml(text).map_err(|e| format!("not YAML: {e}"))?;
    if doc["kind"] != "PlatformMesh" {
        return Err(format!(
            "expected kind PlatformMesh, found {}",
            doc.get("kind")
                .map(Value::to_string)
                .unwrap_or("none".into())
        ));
    }
    let namespace = doc["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let spec: PlatformMeshSpec =
        serde_json::from_value(doc["spec"].clone()).map_err(|e| format!("spec: {e}"))?;
    Ok((namespace, spec))
}

/// A profile from a file: either the ConfigMap holding `profile.yaml`, or `profile.yaml` itself.
pub fn read_profile(text: &str) -> Result<Profile, String> {
    let doc = parse_yaml(text).map_err(|e| format!("not YAML: {e}"))?;
    if doc["kind"] == "ConfigMap" {
        let data = doc["data"].as_object().cloned().unwrap_or_else(Map::new);
        return Profile::from_config_map_data(&data).map_err(|e| e.to_string());
    }
    Profile::parse(text).map_err(|e| e.to_string())
}

/// Every object the Deployment, KcpSetup and FeatureToggles steps would apply, as one
/// multi-document YAML text: each document preceded by a comment naming its cluster (or kcp
/// workspace) and source file, in apply order.
pub fn render_yaml(
    engine: &dyn Render,
    platform_mesh: &str,
    profile: &str,
    remote: Option<&RemoteRuntime>,
) -> Result<String, String> {
    let (namespace, spec) = read_platform_mesh(platform_mesh)?;
    let profile = read_profile(profile)?;
    let objects = render_deployment(
        engine,
        Inputs {
            namespace: &namespace,
            spec: &spec,
            profile: &profile,
            remote,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut out = to_yaml(&objects)?;
    out.push_str(&kcp_yaml(engine, &namespace, &spec)?);
    Ok(out)
}

/// What KcpSetup and FeatureToggles would apply, workspace by workspace (the identity hashes of
/// root's kcp APIExports are left empty: they come from the kcp at hand).
fn kcp_yaml(
    engine: &dyn Render,
    namespace: &str,
    spec: &PlatformMeshSpec,
) -> Result<String, String> {
    let data = kcp_data(namespace, spec, &IdpSettings::default(), &[]);
    let mut stages = plan(engine, "kcp", &data, spec).map_err(|e| e.to_string())?;
    let on: Vec<String> = spec
        .feature_toggles
        .iter()
        .flatten()
        .filter_map(|t| t.name.clone())
        .collect();
    let (features, _) = feature_plan(engine, &template_vars(namespace, spec), spec, &on)?;
    stages.extend(features);
    let mut out = String::new();
    for stage in &stages {
        for p in &stage.objects {
            out.push_str(&format!(
                "---\n# kcp workspace {}, from manifests/{}\n",
                stage.workspace, p.source
            ));
            push_yaml(&mut out, &p.object)?;
        }
    }
    for ws in spec
        .kcp
        .as_ref()
        .and_then(|k| k.extra_workspaces.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some((parent, name)) = ws.path.rsplit_once(':') {
            out.push_str(&format!(
                "---\n# kcp workspace {parent}, from spec.kcp.extraWorkspaces\n"
            ));
            push_yaml(
                &mut out,
                &serde_json::json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                    "metadata": {"name": name},
                    "spec": {"type": {"name": ws.type_.name, "path": ws.type_.path}}}),
            )?;
        }
    }
    Ok(out)
}

fn push_yaml(out: &mut String, object: &Value) -> Result<(), String> {
    let yaml = serde_saphyr::to_string(object).map_err(|e| e.to_string())?;
    out.push_str(&yaml);
    if !yaml.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

fn to_yaml(objects: &[Rendered]) -> Result<String, String> {
    let mut out = String::new();
    for r in objects {
        let cluster = match r.target {
            Target::Infra => "infra",
            Target::Runtime => "runtime",
        };
        out.push_str(&format!(
            "---\n# {cluster} cluster, from gotemplates/{}\n",
            r.template
        ));
        push_yaml(&mut out, &r.object)?;
    }
    Ok(out)
}

/// Renders one template file with data from a YAML (or JSON) file, as the controller's engine does.
pub fn template(
    engine: &dyn Render,
    name: &str,
    text: &str,
    values: &str,
) -> Result<String, String> {
    let data = parse_yaml(values).map_err(|e| format!("values: not YAML: {e}"))?;
    engine.render(name, text, &data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gotemplate::Engine;

    fn reference(file: &str) -> String {
        let path = format!(
            "{}/../../shared/reference/platform-mesh-operator/e2e-samples/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Compares with a golden file; `UPDATE_GOLDEN=1` rewrites it.
    fn golden(name: &str, actual: &str) {
        let path = format!(
            "{}/src/platformmesh/testdata/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
            std::fs::write(&path, actual).expect("write golden");
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (run with UPDATE_GOLDEN=1 to create it)"));
        if expected != actual {
            let line = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .map(|i| i + 1)
                .unwrap_or(expected.lines().count().min(actual.lines().count()) + 1);
            panic!(
                "{name} differs from the golden file at line {line}; if the change is intended, \
                 run `UPDATE_GOLDEN=1 cargo nextest run -p controllers golden` and review the diff"
            );
        }
    }

    /// The reference e2e profile with both sections switched to Argo CD.
    fn argocd_profile() -> String {
        reference("default-profile.yaml").replace(
            "deploymentTechnology: fluxcd",
            "deploymentTechnology: argocd",
        )
    }

    #[test]
    fn golden_render_of_the_reference_e2e_profile() {
        let out = render_yaml(
            &Engine::default(),
            &reference("platform-mesh.yaml"),
            &reference("default-profile.yaml"),
            None,
        )
        .expect("render");
        golden("e2e-fluxcd.yaml", &out);
    }

    fn remote() -> RemoteRuntime {
        RemoteRuntime {
            secret_name: "runtime-kubeconfig".into(),
            secret_key: "kubeconfig".into(),
        }
    }

    #[test]
    fn golden_render_with_argocd() {
        let profile = argocd_profile();
        assert!(profile.contains("deploymentTechnology: argocd"));
        let out = render_yaml(
            &Engine::default(),
            &reference("platform-mesh.yaml"),
            &profile,
            None,
        )
        .expect("render");
        golden("e2e-argocd.yaml", &out);
    }

    #[test]
    fn golden_render_with_a_remote_runtime() {
        let out = render_yaml(
            &Engine::default(),
            &reference("platform-mesh.yaml"),
            &reference("default-profile.yaml"),
            Some(&remote()),
        )
        .expect("render");
        assert!(out.contains("name: runtime-kubeconfig"));
        golden("e2e-fluxcd-remote.yaml", &out);
    }

    #[test]
    fn every_template_file_is_covered_by_a_golden_render() {
        let mut covered = std::collections::BTreeSet::new();
        for (profile, remote) in [
            (reference("default-profile.yaml"), None),
            (argocd_profile(), None),
            (reference("default-profile.yaml"), Some(remote())),
        ] {
            let (ns, spec) = read_platform_mesh(&reference("platform-mesh.yaml")).expect("pm");
            let profile = read_profile(&profile).expect("profile");
            for r in render_deployment(
                &Engine::default(),
                Inputs {
                    namespace: &ns,
                    spec: &spec,
                    profile: &profile,
                    remote: remote.as_ref(),
                },
            )
            .expect("render")
            {
                covered.insert(r.template);
            }
        }
        let missing: Vec<&str> = super::super::render::TEMPLATES
            .iter()
            .map(|t| t.path)
            .filter(|p| !covered.contains(p))
            .collect();
        assert!(
            missing.is_empty(),
            "templates rendering no object in any golden: {missing:?}"
        );
    }

    #[test]
    fn bad_files_are_named_errors() {
        let e = read_platform_mesh("kind: ConfigMap\n").expect_err("kind");
        assert!(e.contains("expected kind PlatformMesh"), "{e}");
        let e = read_profile("- a list\n").expect_err("profile");
        assert!(e.contains("not a mapping"), "{e}");
        let e = template(&Engine::default(), "t.yaml", "x: {{ .a.b }}", "a: {}\n")
            .expect_err("missing");
        assert!(e.contains("template: t.yaml:1:"), "{e}");
        assert_eq!(
            template(
                &Engine::default(),
                "t.yaml",
                "x: {{ .a | default 3 }}",
                "{}"
            )
            .as_deref(),
            Ok("x: 3")
        );
    }
}
