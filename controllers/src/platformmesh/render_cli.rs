//! `platform-mesh render` and `platform-mesh template`: what the PlatformMesh controller would
//! apply, computed from files without a cluster, for review and diffing. With resolved OCM
//! Resources, `render` also shows what the ResourceReconciler writes for them: the Flux sources
//! the HelmReleases name, and the releases and Applications with their sources and image
//! versions filled in.

use std::collections::HashMap;

use kube::api::DynamicObject;
use serde_json::{json, Map, Value};

use super::features::feature_plan;
use super::manifests::{kcp_data, plan};
use super::ocm_resources::{
    ocm_resources, target_of_resource, technology_of, writes, Outcome, ResourceError,
};
use super::render::{render_deployment, Inputs, Rendered, Target};
use super::vars::{
    parse_yaml, template_vars, DeploymentTechnology, Profile, RemoteRuntime, Render,
};
use crate::kcp::IdpSettings;
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
    render_reviewed(engine, platform_mesh, profile, remote, None).map_err(|e| e.to_string())
}

/// [`render_yaml`] with the ResourceReconciler's writes for `resources` (the rendered OCM
/// Resources with their resolved status, as [`read_resources`] reads them): the Flux sources it
/// applies follow the Deployment step's objects, and the HelmReleases and Applications it
/// changes are shown as changed (their comment says so).
pub fn render_resolved_yaml(
    engine: &dyn Render,
    platform_mesh: &str,
    profile: &str,
    remote: Option<&RemoteRuntime>,
    resources: &str,
) -> Result<String, ResolveError> {
    render_reviewed(engine, platform_mesh, profile, remote, Some(resources))
}

fn render_reviewed(
    engine: &dyn Render,
    platform_mesh: &str,
    profile: &str,
    remote: Option<&RemoteRuntime>,
    resources: Option<&str>,
) -> Result<String, ResolveError> {
    let (namespace, spec) = read_platform_mesh(platform_mesh).map_err(ResolveError::Render)?;
    let profile = read_profile(profile).map_err(ResolveError::Render)?;
    let objects = render_deployment(
        engine,
        Inputs {
            namespace: &namespace,
            spec: &spec,
            profile: &profile,
            remote,
        },
    )
    .map_err(|e| ResolveError::Render(e.to_string()))?;
    let reviewed = match resources {
        None => objects.iter().map(Reviewed::rendered).collect(),
        Some(text) => with_resource_writes(
            &objects,
            &namespace,
            technology_of(&profile),
            &read_resources(text)?,
        )?,
    };
    let mut out = to_yaml(&reviewed).map_err(ResolveError::Render)?;
    out.push_str(&kcp_yaml(engine, &namespace, &spec).map_err(ResolveError::Render)?);
    Ok(out)
}

/// Why the ResourceReconciler's writes could not be added to a render.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The PlatformMesh, the profile or the templates did not render.
    #[error("{0}")]
    Render(String),
    /// The Resources file is not YAML, or holds something else than Resources.
    #[error("{0}")]
    Input(String),
    /// A rendered Resource is not in the Resources file.
    #[error("Resource {0} is not in the file: the output would not be resolved")]
    Missing(String),
    /// A rendered Resource is in the file without a status.
    #[error("Resource {0} has no status: the OCM controller has not resolved it")]
    Unresolved(String),
    /// The release or Application a Resource is for is not rendered.
    #[error("Resource {resource} is for {target}, which is not rendered")]
    NoTarget {
        /// `namespace/name` of the Resource.
        resource: String,
        /// What it is for.
        target: String,
    },
    /// The ResourceReconciler would wait for more of the Resource's status.
    #[error("the ResourceReconciler would wait: {0}")]
    Waiting(String),
    /// The ResourceReconciler would fail on the Resource.
    #[error(transparent)]
    Reconciler(ResourceError),
}

/// One object of a review: the cluster it is applied to, what writes it, and the object.
#[derive(Debug, Clone, PartialEq)]
pub struct Reviewed {
    /// Where it is applied.
    pub target: Target,
    /// What writes it: `gotemplates/<template>`, with `, as the ResourceReconciler updates it`
    /// when that changes it, or `the ResourceReconciler, for Resource <namespace>/<name>`.
    pub from: String,
    /// The object.
    pub object: Value,
}

impl Reviewed {
    fn rendered(r: &Rendered) -> Self {
        Reviewed {
            target: r.target,
            from: format!("gotemplates/{}", r.template),
            object: r.object.clone(),
        }
    }
}

/// The Resource objects of a file as `kubectl get resources.delivery.ocm.software -A -o yaml`
/// prints them: YAML (or JSON) documents, each a `delivery.ocm.software/v1alpha1` Resource or
/// a List of them.
pub fn read_resources(text: &str) -> Result<Vec<Value>, ResolveError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ResolveError::Input(format!("not YAML: {e}")))?;
    let resource = ocm_resources();
    let is_resource =
        |v: &Value| v["apiVersion"] == resource.api_version.as_str() && v["kind"] == "Resource";
    let what = |v: &Value| match v.get("kind").and_then(Value::as_str) {
        Some(kind) => format!("a {kind}"),
        None => "not an object with a kind".to_string(),
    };
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if is_resource(&doc) {
            out.push(doc);
            continue;
        }
        let Some(items) = doc["items"]
            .as_array()
            .filter(|_| doc["kind"].as_str().is_some_and(|k| k.ends_with("List")))
        else {
            return Err(ResolveError::Input(format!(
                "document {} is {}, not a {} Resource or a List of them",
                i + 1,
                what(&doc),
                resource.api_version
            )));
        };
        for (j, item) in items.iter().enumerate() {
            if !is_resource(item) {
                return Err(ResolveError::Input(format!(
                    "document {}, item {} is {}, not a {} Resource",
                    i + 1,
                    j + 1,
                    what(item),
                    resource.api_version
                )));
            }
            out.push(item.clone());
        }
    }
    Ok(out)
}

/// `namespace/name` of an object; `default_namespace` when it names none.
fn key_of(object: &Value, default_namespace: &str) -> (String, String) {
    (
        object["metadata"]["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace)
            .to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The rendered objects of a PlatformMesh in namespace `namespace` with what the
/// ResourceReconciler writes under `technology` once every rendered Resource is resolved as in
/// `resolved` (Resources with their status, matched to the rendered ones by namespace and name;
/// other Resources are not this PlatformMesh's and are left out). The releases and Applications
/// are changed in place; the Flux sources follow the rendered objects, in the order of their
/// Resources. The rendered Resources' own annotations and labels decide what is written, the
/// file's only their status. Every rendered Resource must be resolved.
pub fn with_resource_writes(
    rendered: &[Rendered],
    namespace: &str,
    technology: DeploymentTechnology,
    resolved: &[Value],
) -> Result<Vec<Reviewed>, ResolveError> {
    let ocm = ocm_resources();
    let is_resource =
        |v: &Value| v["apiVersion"] == ocm.api_version.as_str() && v["kind"] == "Resource";
    let mut statuses: HashMap<(String, String), &Value> = HashMap::new();
    for r in resolved {
        statuses.entry(key_of(r, namespace)).or_insert(&r["status"]);
    }
    let mut out: Vec<Reviewed> = rendered.iter().map(Reviewed::rendered).collect();
    let mut sources: Vec<Reviewed> = Vec::new();
    for r in rendered {
        if !is_resource(&r.object) {
            continue;
        }
        let (ns, name) = key_of(&r.object, namespace);
        let here = format!("{ns}/{name}");
        let status = statuses
            .get(&(ns.clone(), name.clone()))
            .ok_or_else(|| ResolveError::Missing(here.clone()))?;
        if status.is_null() {
            return Err(ResolveError::Unresolved(here));
        }
        let mut object = r.object.clone();
        object["metadata"]["namespace"] = Value::String(ns.clone());
        object["status"] = (*status).clone();
        let resource: DynamicObject = serde_json::from_value(object)
            .map_err(|e| ResolveError::Input(format!("Resource {here}: {e}")))?;
        let target = target_of_resource(&resource, &ns, technology);
        let at = target.as_ref().and_then(|t| {
            out.iter().position(|o| {
                o.target == Target::Infra
                    && o.object["apiVersion"] == t.api.api_version.as_str()
                    && o.object["kind"] == t.api.kind.as_str()
                    && key_of(&o.object, namespace) == (t.namespace.clone(), t.name.clone())
            })
        });
        let w = writes(&resource, &ns, technology, at.map(|j| &out[j].object));
        if let Some(source) = w.source {
            let from = format!("the ResourceReconciler, for Resource {here}");
            let same = |o: &Reviewed| {
                o.object["kind"] == source.api.kind.as_str()
                    && key_of(&o.object, namespace)
                        == (source.namespace.clone(), source.name.clone())
            };
            // A later Resource of the same name applies over an earlier one's.
            sources.retain(|o| !same(o));
            sources.push(Reviewed {
                target: Target::Infra,
                from,
                object: source.object,
            });
        }
        if let (Some(update), Some(j)) = (w.update, at) {
            out[j].object = update.object;
            let note = ", as the ResourceReconciler updates it";
            if !out[j].from.ends_with(note) {
                out[j].from.push_str(note);
            }
        }
        match w.outcome {
            Outcome::Done => {}
            Outcome::Requeue { reason, .. } => return Err(ResolveError::Waiting(reason)),
            Outcome::Failed(ResourceError::NoTarget { resource, target }) => {
                return Err(ResolveError::NoTarget { resource, target })
            }
            Outcome::Failed(e) => return Err(ResolveError::Reconciler(e)),
        }
    }
    out.extend(sources);
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

fn to_yaml(objects: &[Reviewed]) -> Result<String, String> {
    let mut out = String::new();
    for r in objects {
        out.push_str(&format!(
            "---\n# {} cluster, from {}\n",
            r.target.as_str(),
            r.from
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

/// The status the OCM controller gives a Resource in this repository's tests and generated
/// `--resources` files (the e2e OCM stand-in writes it, the golden files are made with it): a
/// chart is resolved by its `repo` label (`git` to a repository and commit, `helm` to a Helm
/// repository, anything else to an image reference in `ghcr.io/platform-mesh/charts`), an
/// image to tag `v1.2.3`. Made-up repositories, for tests and examples only.
pub fn example_resolved_status(resource: &Value) -> Value {
    let name = resource["metadata"]["name"].as_str().unwrap_or_default();
    let base = super::ocm_resources::trimmed_name(name);
    let label = |k: &str| {
        resource["metadata"]["labels"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let resolved = match (label("artifact").as_str(), label("repo").as_str()) {
        ("chart", "git") => json!({"name": "chart", "version": "1.0.0",
            "access": {"type": "gitHub", "repoUrl": format!("https://github.com/platform-mesh/{base}"),
                "commit": "0123456789abcdef0123456789abcdef01234567"}}),
        ("chart", "helm") => json!({"name": "chart", "version": "1.0.0",
            "access": {"type": "helm", "helmRepository": "https://charts.platform-mesh.io"}}),
        ("chart", _) => json!({"name": "chart", "version": "1.0.0",
            "access": {"type": "ociArtifact",
                "imageReference": format!("ghcr.io/platform-mesh/charts/{base}:1.0.0")}}),
        _ => json!({"name": "image", "version": "v1.2.3",
            "access": {"type": "ociArtifact",
                "imageReference": format!("ghcr.io/platform-mesh/{base}:v1.2.3")}}),
    };
    json!({"resource": resolved,
        "component": {"name": "github.com/platform-mesh/platform-mesh", "version": "0.1.0"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
            "message": "stand-in", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
}

#[cfg(test)]
mod tests {
    use super::*;
    use gotemplate::Engine;
    use serde_json::json;

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

    /// The OCM Resources the reference e2e PlatformMesh renders with `profile`, as `(namespace,
    /// name)` and object (its namespace filled in as the Deployment step applies it).
    fn rendered_resources(profile: &str) -> Vec<Value> {
        let (ns, spec) = read_platform_mesh(&reference("platform-mesh.yaml")).expect("pm");
        let profile = read_profile(profile).expect("profile");
        let inputs = Inputs {
            namespace: &ns,
            spec: &spec,
            profile: &profile,
            remote: None,
        };
        render_deployment(&Engine::default(), inputs)
            .expect("render")
            .into_iter()
            .filter(|r| r.object["kind"] == "Resource")
            .map(|r| {
                let mut o = r.object;
                let (namespace, _) = key_of(&o, &ns);
                o["metadata"]["namespace"] = json!(namespace);
                o
            })
            .collect()
    }

    /// The file `resolved-resources.yaml`: every Resource of the reference e2e render, resolved
    /// as the e2e OCM stand-in resolves it, as `kubectl get resources.delivery.ocm.software -A
    /// -o yaml` prints them (a v1 List).
    fn resolved_resources() -> String {
        let items: Vec<Value> = rendered_resources(&reference("default-profile.yaml"))
            .into_iter()
            .map(|mut o| {
                o["status"] = example_resolved_status(&o);
                o
            })
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}});
        let mut out = String::from(
            "# The OCM Resources of the reference e2e PlatformMesh and profile, resolved as the e2e\n\
             # OCM stand-in resolves them. Generated by the test golden_resolved_resources in\n\
             # controllers/src/platformmesh/review.rs (UPDATE_GOLDEN=1 rewrites it): do not edit.\n",
        );
        push_yaml(&mut out, &list).expect("yaml");
        out
    }

    #[test]
    fn golden_resolved_resources() {
        let fluxcd = rendered_resources(&reference("default-profile.yaml"));
        assert!(!fluxcd.is_empty());
        // One file serves both technologies: they render the same Resources.
        assert_eq!(
            fluxcd,
            rendered_resources(&argocd_profile()),
            "the argocd profile renders other Resources than the fluxcd one: give it its own file"
        );
        golden("resolved-resources.yaml", &resolved_resources());
    }

    /// The reference e2e render with `profile` and the ResourceReconciler's writes for
    /// [`resolved_resources`].
    fn render_resolved(profile: &str) -> String {
        render_resolved_yaml(
            &Engine::default(),
            &reference("platform-mesh.yaml"),
            profile,
            None,
            &resolved_resources(),
        )
        .expect("render --resources")
    }

    #[test]
    fn golden_render_with_resolved_resources() {
        let out = render_resolved(&reference("default-profile.yaml"));
        assert!(out.contains("kind: OCIRepository") && out.contains("kind: GitRepository"));
        golden("e2e-fluxcd-resolved.yaml", &out);
    }

    #[test]
    fn golden_render_with_argocd_and_resolved_resources() {
        let out = render_resolved(&argocd_profile());
        assert!(!out.contains(super::super::ocm_resources::PLACEHOLDER));
        golden("e2e-argocd-resolved.yaml", &out);
    }

    #[test]
    fn resolved_resources_only_add_the_reconcilers_writes() {
        let plain = render_yaml(
            &Engine::default(),
            &reference("platform-mesh.yaml"),
            &reference("default-profile.yaml"),
            None,
        )
        .expect("render");
        let resolved = render_resolved(&reference("default-profile.yaml"));
        let docs = |text: &str| -> Vec<Value> { serde_saphyr::from_multiple(text).expect("yaml") };
        let (plain, resolved) = (docs(&plain), docs(&resolved));
        // One source per chart Resource is added; every rendered object is still there, in its
        // place, and only releases changed.
        let (sources, rest): (Vec<Value>, Vec<Value>) = resolved.iter().cloned().partition(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("Repository"))
        });
        assert_eq!(sources.len(), 24, "one source per chart Resource");
        assert_eq!(rest.len(), plain.len());
        let mut changed = 0;
        for (p, r) in plain.iter().zip(&rest) {
            if p != r {
                assert_eq!(r["kind"], "HelmRelease", "{r}");
                changed += 1;
            }
        }
        assert!(changed > 0);
        // The image of openfga's PostgreSQL unsuspends it.
        let openfga = resolved
            .iter()
            .find(|d| d["kind"] == "HelmRelease" && d["metadata"]["name"] == "openfga")
            .expect("openfga");
        assert_eq!(openfga["spec"]["suspend"], false);
        assert_eq!(
            openfga["spec"]["values"]["postgresql"]["image"]["tag"],
            "v1.2.3"
        );
    }

    #[test]
    fn resources_files_are_lists_or_streams_and_must_resolve_every_rendered_resource() {
        let file = resolved_resources();
        let list = read_resources(&file).expect("list");
        let mut stream = String::new();
        for item in &list {
            stream.push_str("---\n");
            push_yaml(&mut stream, item).expect("yaml");
        }
        assert_eq!(read_resources(&stream).expect("stream"), list);
        let e = read_resources("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
            .expect_err("not a Resource");
        assert!(e.to_string().contains("document 1 is a ConfigMap"), "{e}");
        let e = read_resources("a: [\n").expect_err("not YAML");
        assert!(e.to_string().starts_with("not YAML"), "{e}");

        let resolve = |resources: &str| {
            render_resolved_yaml(
                &Engine::default(),
                &reference("platform-mesh.yaml"),
                &reference("default-profile.yaml"),
                None,
                resources,
            )
        };
        let without = |name: &str| {
            let mut items = list.clone();
            items.retain(|i| i["metadata"]["name"] != name);
            let mut out = String::new();
            push_yaml(
                &mut out,
                &json!({"apiVersion": "v1", "kind": "List", "items": items}),
            )
            .expect("yaml");
            out
        };
        let e = resolve(&without("iam-ui-chart")).expect_err("missing");
        assert_eq!(
            e.to_string(),
            "Resource platform-mesh-system/iam-ui-chart is not in the file: the output would not \
             be resolved"
        );
        let mut unresolved = list.clone();
        unresolved[0]
            .as_object_mut()
            .expect("object")
            .remove("status");
        let mut text = String::new();
        push_yaml(
            &mut text,
            &json!({"apiVersion": "v1", "kind": "List", "items": unresolved}),
        )
        .expect("yaml");
        let e = resolve(&text).expect_err("unresolved");
        assert!(
            matches!(&e, ResolveError::Unresolved(r) if r == "platform-mesh-system/cert-manager-cainjector-image"),
            "{e}"
        );
        // A chart resolved to something the reconciler cannot use names the Resource and what
        // it lacks.
        let mut broken = list.clone();
        let chart = broken
            .iter_mut()
            .find(|i| i["metadata"]["name"] == "traefik")
            .expect("traefik");
        chart["status"]["resource"]["access"] = json!({});
        let mut text = String::new();
        push_yaml(
            &mut text,
            &json!({"apiVersion": "v1", "kind": "List", "items": broken}),
        )
        .expect("yaml");
        let e = resolve(&text).expect_err("incomplete");
        assert_eq!(
            e.to_string(),
            "Resource platform-mesh-system/traefik: no status.resource.access.imageReference"
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
