//! What the Deployment step applies: every template under `gotemplates/` rendered with the data
//! of its group, split into objects, each bound for the infra or the runtime cluster.
//!
//! | templates | data | cluster |
//! |---|---|---|
//! | `infra/infra/**` | [`infra_vars`] | infra |
//! | `infra/runtime/**` | [`runtime_vars`] | runtime |
//! | `components/infra/*` | [`component_vars`] | infra |
//! | `components/runtime/*` | [`component_vars`] | runtime |
//!
//! Files are chosen by the deployment technology of their group, as upstream: with `argocd`,
//! files named `helmrelease*` and `kustomization*` are skipped; with `fluxcd`, `application*`.
//! The templates are compiled into the binary, so `platform-mesh` needs no files beside it.

use serde_json::Value;

use super::vars::{
    component_vars, infra_vars, kind_of, parse_yaml, runtime_vars, DeploymentTechnology, Profile,
    ProfileError, RemoteRuntime, Render,
};
use api::core::PlatformMeshSpec;

/// A file compiled into the binary: its path below its directory (`gotemplates/` or
/// `manifests/`) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// Path below the directory, e.g. `infra/infra/traefik/helmrelease.yaml`.
    pub path: &'static str,
    /// The template text.
    pub text: &'static str,
}

macro_rules! template {
    ($path:literal) => {
        Template {
            path: $path,
            text: include_str!(concat!("../../../gotemplates/", $path)),
        }
    };
}

/// Every file of `gotemplates/`, sorted by path (a test keeps this list equal to the directory).
pub static TEMPLATES: &[Template] = &[
    template!("components/infra/applications.yaml"),
    template!("components/infra/helmreleases.yaml"),
    template!("components/runtime/ocm-chart-resources.yaml"),
    template!("components/runtime/ocm-image-resources.yaml"),
    template!("infra/infra/appproject.yaml"),
    template!("infra/infra/cert-manager/application.yaml"),
    template!("infra/infra/cert-manager/helmrelease.yaml"),
    template!("infra/infra/etcd-druid/application.yaml"),
    template!("infra/infra/etcd-druid/helmrelease.yaml"),
    template!("infra/infra/gateway-api/application.yaml"),
    template!("infra/infra/gateway-api/kustomization.yaml"),
    template!("infra/infra/opentelemetry-operator/application.yaml"),
    template!("infra/infra/opentelemetry-operator/helmrelease.yaml"),
    template!("infra/infra/prometheus-operator-crds/application.yaml"),
    template!("infra/infra/prometheus-operator-crds/helmrelease.yaml"),
    template!("infra/infra/traefik/application-crds.yaml"),
    template!("infra/infra/traefik/application.yaml"),
    template!("infra/infra/traefik/helmrelease-crds.yaml"),
    template!("infra/infra/traefik/helmrelease.yaml"),
    template!("infra/runtime/cert-manager/resource-cainjector.yaml"),
    template!("infra/runtime/cert-manager/resource-controller.yaml"),
    template!("infra/runtime/cert-manager/resource-webhook.yaml"),
    template!("infra/runtime/cert-manager/resource.yaml"),
    template!("infra/runtime/etcd-druid/resource-image.yaml"),
    template!("infra/runtime/etcd-druid/resource.yaml"),
    template!("infra/runtime/gateway-api/resource.yaml"),
    template!("infra/runtime/opentelemetry-operator/resource.yaml"),
    template!("infra/runtime/prometheus-operator-crds/resource.yaml"),
    template!("infra/runtime/traefik/resource-crds.yaml"),
    template!("infra/runtime/traefik/resource.yaml"),
];

/// The cluster a rendered object goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// Where the deployers (Flux or Argo CD) run.
    Infra,
    /// Where the components run (OCM Resources are resolved there).
    Runtime,
}

impl Target {
    /// `infra` or `runtime`.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Infra => "infra",
            Target::Runtime => "runtime",
        }
    }
}

/// One rendered object.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Where it is applied.
    pub target: Target,
    /// The template it came from.
    pub template: &'static str,
    /// The object.
    pub object: Value,
}

/// Why the objects could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The template data could not be built (the profile's components did not render).
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A template failed to execute.
    #[error("template {template}: {message}")]
    Template {
        /// Path of the template.
        template: &'static str,
        /// What the engine said.
        message: String,
    },
    /// A template's output is not a list of Kubernetes objects.
    #[error("template {template}, document {document}: {message}")]
    Output {
        /// Path of the template.
        template: &'static str,
        /// 1-based index of the YAML document in the output.
        document: usize,
        /// What is wrong with it.
        message: String,
    },
}

/// What a PlatformMesh renders from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The instance's namespace.
    pub namespace: &'a str,
    /// The instance's spec.
    pub spec: &'a PlatformMeshSpec,
    /// Its profile.
    pub profile: &'a Profile,
    /// The remote runtime's kubeconfig Secret, when the runtime is not the infra cluster.
    pub remote: Option<&'a RemoteRuntime>,
}

/// The `(apiVersion, kind)` pairs the templates under `prefix` can produce, read from their
/// literal `apiVersion:` and `kind:` lines: the kinds the Deployment step prunes, so a kind that
/// a profile change stops rendering altogether is still cleaned up, with nothing remembered
/// between reconciles.
pub fn template_kinds(prefix: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for t in TEMPLATES.iter().filter(|t| t.path.starts_with(prefix)) {
        let mut api_version: Option<&str> = None;
        for line in t.text.lines() {
            if let Some(v) = line.strip_prefix("apiVersion:") {
                api_version = Some(v.trim());
            } else if let (Some(k), Some(v)) = (line.strip_prefix("kind:"), api_version) {
                let pair = (v.to_string(), k.trim().to_string());
                if !out.contains(&pair) {
                    out.push(pair);
                }
                api_version = None;
            }
        }
    }
    out.sort();
    out
}

/// Whether a template file is used with a deployment technology.
pub fn selected(path: &str, tech: DeploymentTechnology) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    match tech {
        DeploymentTechnology::ArgoCd => {
            !(file.starts_with("helmrelease") || file.starts_with("kustomization"))
        }
        DeploymentTechnology::FluxCd => !file.starts_with("application"),
    }
}

/// Every object the Deployment step applies, in template order (infra, runtime, components).
pub fn render_deployment(
    engine: &dyn Render,
    inputs: Inputs<'_>,
) -> Result<Vec<Rendered>, RenderError> {
    let Inputs {
        namespace,
        spec,
        profile,
        remote,
    } = inputs;
    let infra = infra_vars(profile, namespace, spec, remote);
    let runtime = runtime_vars(engine, profile, namespace, spec, remote)?;
    let components = component_vars(engine, profile, namespace, spec, remote)?;
    let groups: [(&str, &Value, Target); 4] = [
        ("infra/infra/", &infra, Target::Infra),
        ("infra/runtime/", &runtime, Target::Runtime),
        ("components/infra/", &components, Target::Infra),
        ("components/runtime/", &components, Target::Runtime),
    ];
    let mut out = Vec::new();
    for (prefix, data, target) in groups {
        let tech = DeploymentTechnology::parse(data.get("deploymentTechnology"));
        for t in TEMPLATES
            .iter()
            .filter(|t| t.path.starts_with(prefix) && selected(t.path, tech))
        {
            let text =
                engine
                    .render(t.path, t.text, data)
                    .map_err(|message| RenderError::Template {
                        template: t.path,
                        message,
                    })?;
            for object in objects(t.path, &text)? {
                out.push(Rendered {
                    target,
                    template: t.path,
                    object,
                });
            }
        }
    }
    Ok(out)
}

/// The objects of a multi-document YAML text; empty documents are skipped.
pub fn objects(template: &'static str, text: &str) -> Result<Vec<Value>, RenderError> {
    let mut out = Vec::new();
    for (i, doc) in split_documents(text).into_iter().enumerate() {
        let err = |message: String| RenderError::Output {
            template,
            document: i + 1,
            message,
        };
        let v = parse_yaml(doc).map_err(err)?;
        match &v {
            Value::Null => continue,
            Value::Object(m) => {
                for field in ["apiVersion", "kind"] {
                    if m.get(field)
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        return Err(err(format!("the object has no {field}")));
                    }
                }
                if v.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(err("the object has no metadata.name".into()));
                }
            }
            other => {
                return Err(err(format!(
                    "a document is a {}, not an object",
                    kind_of(other)
                )))
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// Splits at lines that are exactly `---` (optionally followed by spaces or a comment).
fn split_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---"
            || bare.strip_prefix("---").is_some_and(|rest| {
                rest.starts_with([' ', '\t']) && rest.trim_start().is_empty()
                    || rest.trim_start().starts_with('#')
            });
        if is_marker {
            docs.push(&text[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    docs.push(&text[start..]);
    docs
}

/// The files below `<repository>/<root>/<dir>` for each of `dirs`, as sorted paths relative
/// to `root` (for the tests that keep the compiled lists equal to the directories).
#[cfg(test)]
pub(crate) fn files_below(root: &str, dirs: &[&str]) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(root);
    let mut out = Vec::new();
    let mut pending: Vec<std::path::PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                out.push(
                    p.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/"),
                );
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_list_is_the_directory() {
        let on_disk = files_below("gotemplates", &[""]);
        let compiled: Vec<String> = TEMPLATES.iter().map(|t| t.path.to_string()).collect();
        assert_eq!(
            compiled, on_disk,
            "TEMPLATES must list every file of gotemplates/"
        );
    }

    #[test]
    fn files_are_chosen_by_deployment_technology() {
        use DeploymentTechnology::*;
        let chosen = |tech| -> Vec<&str> {
            TEMPLATES
                .iter()
                .filter(|t| t.path.starts_with("infra/infra/traefik/") && selected(t.path, tech))
                .map(|t| t.path.rsplit('/').next().unwrap())
                .collect()
        };
        assert_eq!(
            chosen(FluxCd),
            vec!["helmrelease-crds.yaml", "helmrelease.yaml"]
        );
        assert_eq!(
            chosen(ArgoCd),
            vec!["application-crds.yaml", "application.yaml"]
        );
        assert!(selected(
            "infra/infra/gateway-api/kustomization.yaml",
            FluxCd
        ));
        assert!(!selected(
            "infra/infra/gateway-api/kustomization.yaml",
            ArgoCd
        ));
        assert!(selected("infra/runtime/traefik/resource.yaml", ArgoCd));
        assert!(selected("infra/runtime/traefik/resource.yaml", FluxCd));
    }

    #[test]
    fn the_kinds_templates_produce_are_read_from_their_text() {
        let kinds = template_kinds("");
        let has = |v: &str, k: &str| kinds.contains(&(v.to_string(), k.to_string()));
        assert!(has("helm.toolkit.fluxcd.io/v2", "HelmRelease"));
        assert!(has("argoproj.io/v1alpha1", "Application"));
        assert!(has("argoproj.io/v1alpha1", "AppProject"));
        assert!(has("kustomize.toolkit.fluxcd.io/v1", "Kustomization"));
        assert!(has("delivery.ocm.software/v1alpha1", "Resource"));
        assert_eq!(kinds.len(), 5, "{kinds:?}");
        assert_eq!(
            template_kinds("infra/runtime/"),
            vec![("delivery.ocm.software/v1alpha1".into(), "Resource".into())]
        );
    }

    #[test]
    fn documents_split_on_markers_and_empty_ones_are_skipped() {
        let text = "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n--- # two\n\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: b\ndata:\n  x: \"---\"\n";
        let objs = objects("t", text).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0]["metadata"]["name"], "a");
        assert_eq!(objs[1]["data"]["x"], "---");
    }

    #[test]
    fn output_that_is_not_objects_is_an_error_naming_template_and_document() {
        let e = objects(
            "x.yaml",
            "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\n- 1\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "template x.yaml, document 2: a document is a list, not an object"
        );
        let e = objects("x.yaml", "apiVersion: v1\nkind: A\nmetadata: {}\n").unwrap_err();
        assert!(e.to_string().contains("no metadata.name"), "{e}");
        let e = objects("x.yaml", "kind: A\nmetadata: {name: a}\n").unwrap_err();
        assert!(e.to_string().contains("no apiVersion"), "{e}");
        let e = objects("x.yaml", "a: [\n").unwrap_err();
        assert!(
            e.to_string().starts_with("template x.yaml, document 1:"),
            "{e}"
        );
    }
}
