//! `DeploymentSubroutine`: the profile and templates of a PlatformMesh rendered and synced to the
//! infra and runtime clusters (see [`render`](super::render) and [`apply`](super::apply)).

use std::sync::Arc;

use api::core::PlatformMeshSpec;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::apply::{sync, Policy, Target as SyncTarget};
use super::controller::PlatformMeshError;
use super::gates;
use super::render::{render_deployment, template_kinds, Inputs, Target};
use super::vars::{profile_config_map, DeploymentTechnology, Profile, RemoteRuntime, Render};
use crate::runtime::mapping::CrossClusterKeys;
use crate::subroutines::{Step, Subroutine};

/// Prefix of the annotations on deployed objects that name their PlatformMesh (cluster,
/// namespace, name), for mapping changes back to it.
pub const OWNER_PREFIX: &str = "owner.platform-mesh.io";

/// The clusters a PlatformMesh is deployed to.
pub struct Clusters {
    /// Where Flux or Argo CD run (HelmReleases, Applications).
    pub infra: kube::Client,
    /// Where the PlatformMesh, its profile and the OCM Resources live.
    pub runtime: kube::Client,
    /// The runtime's kubeconfig Secret for the infra cluster's deployers, when they differ.
    pub remote: Option<RemoteRuntime>,
    /// The kcp side (KcpSetup, ProviderSecret, FeatureToggles); without it those steps skip.
    pub kcp: Option<crate::kcp::Kcp>,
    /// The image versions and unsuspensions the ResourceReconciler set, which the Deployment
    /// step keeps when it applies the releases again.
    pub images: super::ocm_resources::ImageVersions,
    /// What the Deployment step waits for and sets up beyond the releases.
    pub gates: super::gates::Gates,
}

impl Clusters {
    /// The cluster the releases install into, where cert-manager, kcp-operator and kcp run:
    /// the runtime cluster through the remote kubeconfig when there is one, else the infra
    /// cluster the deployers run in. (Upstream names it the runtime cluster; the two are one
    /// whenever infra and runtime are, the usual setup.)
    pub fn installed_into(&self) -> &kube::Client {
        match &self.remote {
            Some(_) => &self.runtime,
            None => &self.infra,
        }
    }
}

/// What every PlatformMesh step works on.
pub struct Context {
    /// The PlatformMesh.
    pub object: DynamicObject,
    /// Its spec, parsed.
    pub spec: PlatformMeshSpec,
    /// Where it is deployed.
    pub clusters: Arc<Clusters>,
    /// The runtime's cluster name in the controller's manager, when it has one.
    pub cluster: Option<String>,
}

impl Context {
    /// A context for `object`; a spec that does not parse is an error naming the object.
    pub fn new(object: DynamicObject, clusters: Arc<Clusters>) -> Result<Context, String> {
        let spec_value = object.data.get("spec").cloned().unwrap_or(Value::Null);
        let spec: PlatformMeshSpec = if spec_value.is_null() {
            PlatformMeshSpec::default()
        } else {
            serde_json::from_value(spec_value).map_err(|e| {
                format!(
                    "PlatformMesh {}: spec does not decode: {e}",
                    object.metadata.name.as_deref().unwrap_or("")
                )
            })?
        };
        Ok(Context {
            object,
            spec,
            clusters,
            cluster: None,
        })
    }

    /// The PlatformMesh's namespace.
    pub fn namespace(&self) -> &str {
        self.object
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
    }

    /// The PlatformMesh's name.
    pub fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or("")
    }

    /// The PlatformMesh's uid (owner of what it deploys).
    pub fn uid(&self) -> &str {
        self.object.metadata.uid.as_deref().unwrap_or("")
    }
}

/// Reads the instance's profile ConfigMap from the runtime cluster.
pub async fn load_profile(ctx: &Context) -> Result<Profile, String> {
    let (ns, name) = profile_config_map(ctx.name(), ctx.namespace(), &ctx.spec);
    let api: Api<ConfigMap> = Api::namespaced(ctx.clusters.runtime.clone(), &ns);
    let cm = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading the profile ConfigMap {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("the profile ConfigMap {ns}/{name} does not exist"))?;
    profile_of(cm).map_err(|e| format!("profile ConfigMap {ns}/{name}: {e}"))
}

/// The profile a profile ConfigMap holds.
pub fn profile_of(cm: ConfigMap) -> Result<Profile, String> {
    let data: serde_json::Map<String, Value> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    Profile::from_config_map_data(&data).map_err(|e| e.to_string())
}

/// The Deployment step.
pub struct Deployment {
    /// The template engine.
    pub engine: Arc<dyn Render + Send + Sync>,
}

/// The condition type of the Deployment step.
pub const DEPLOYMENT: &str = "DeploymentSubroutine";

fn kinds(prefixes: &[&str]) -> Vec<GroupVersionKind> {
    let mut out: Vec<GroupVersionKind> = Vec::new();
    for p in prefixes {
        for (api_version, kind) in template_kinds(p) {
            let (group, version) = api_version
                .split_once('/')
                .unwrap_or(("", api_version.as_str()));
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            if !out.contains(&gvk) {
                out.push(gvk);
            }
        }
    }
    out
}

/// Each cluster, its client and the kinds its templates produce.
fn targets(ctx: &Context) -> [(Target, &kube::Client, Vec<GroupVersionKind>); 2] {
    [
        (
            Target::Infra,
            &ctx.clusters.infra,
            kinds(&["infra/infra/", "components/infra/"]),
        ),
        (
            Target::Runtime,
            &ctx.clusters.runtime,
            kinds(&["infra/runtime/", "components/runtime/"]),
        ),
    ]
}

#[async_trait::async_trait]
impl Subroutine<Context, PlatformMeshError> for Deployment {
    fn name(&self) -> &'static str {
        DEPLOYMENT
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[super::kcp_setup::FINALIZER]
    }

    /// Removes everything this PlatformMesh deployed to both clusters.
    async fn finalize(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        for (target, client, scope) in targets(ctx) {
            sync(
                &SyncTarget {
                    client,
                    owner: ctx.uid(),
                    default_namespace: ctx.namespace(),
                    annotations: &[],
                    policy: Policy::DEPLOYMENT,
                },
                &[],
                &scope,
            )
            .await
            .map_err(|e| format!("{} cluster: {e}", target.as_str()))?;
        }
        Ok(Step::done())
    }

    async fn process(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let profile = load_profile(ctx).await?;
        let rendered = render_deployment(
            self.engine.as_ref(),
            Inputs {
                namespace: ctx.namespace(),
                spec: &ctx.spec,
                profile: &profile,
                remote: ctx.clusters.remote.as_ref(),
            },
        )
        .map_err(|e| e.to_string())?;
        let keys = CrossClusterKeys::with_prefix(OWNER_PREFIX);
        let mut owner = vec![
            (keys.namespace, ctx.namespace().to_string()),
            (keys.name, ctx.name().to_string()),
        ];
        if let Some(cluster) = &ctx.cluster {
            owner.push((keys.cluster, cluster.clone()));
        }
        let mut summary = Vec::new();
        for (target, client, scope) in targets(ctx) {
            let mut objects: Vec<Value> = rendered
                .iter()
                .filter(|r| r.target == target)
                .map(|r| r.object.clone())
                .collect();
            if target == Target::Infra {
                for obj in &mut objects {
                    keep_resource_fields(ctx, obj).await?;
                }
            }
            let outcome = sync(
                &SyncTarget {
                    client,
                    owner: ctx.uid(),
                    default_namespace: ctx.namespace(),
                    annotations: &owner,
                    policy: Policy::DEPLOYMENT,
                },
                &objects,
                &scope,
            )
            .await
            .map_err(|e| format!("{} cluster: {e}", target.as_str()))?;
            if !outcome.applied.is_empty() || !outcome.pruned.is_empty() {
                tracing::info!(
                    platformmesh = %ctx.name(),
                    cluster = target.as_str(),
                    applied = ?outcome.applied,
                    removed = ?outcome.pruned,
                    "deployment synced"
                );
            }
            // The message is the same while the render is, so an unchanged instance keeps an
            // unchanged status.
            summary.push(format!("{} objects in {}", objects.len(), target.as_str()));
        }
        // Upstream's gates: cert-manager's CRDs (when the profile deploys it), the webhook's
        // secrets, istio, kcp-operator's objects.
        let technology = DeploymentTechnology::parse(profile.infra.get("deploymentTechnology"));
        let cert_manager = profile.infra["certManager"]["enabled"] == true;
        if let Some(waiting) = gates::check(ctx, cert_manager, technology)
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(waiting);
        }
        Ok(Step::Done {
            message: summary.join("; "),
            requeue: None,
        })
    }
}

/// What the ResourceReconciler set stays when the Deployment step applies a release again
/// (upstream's infra post-processing): a HelmRelease gets the image versions recorded for it
/// and stays unsuspended once a Resource unsuspended it; an Application keeps the source the
/// ResourceReconciler filled in (the templates' placeholders never overwrite it, and a
/// placeholder revision is left out of the apply) and gets the recorded image versions in its
/// Helm values.
async fn keep_resource_fields(ctx: &Context, obj: &mut Value) -> Result<(), String> {
    use super::ocm_resources::{helm_values_with, set_path, PLACEHOLDER};
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let namespace = obj["metadata"]["namespace"]
        .as_str()
        .unwrap_or(ctx.namespace())
        .to_string();
    let images = &ctx.clusters.images;
    match (api_version.as_str(), kind.as_str()) {
        ("helm.toolkit.fluxcd.io/v2", "HelmRelease") => {
            for (path, version) in images.of(&namespace, &name) {
                if !obj["spec"]["values"].is_object() {
                    obj["spec"]["values"] = serde_json::json!({});
                }
                set_path(&mut obj["spec"]["values"], &path, Value::String(version));
            }
            if images.unsuspended(&namespace, &name) && obj["spec"]["suspend"] == true {
                obj["spec"]["suspend"] = Value::Bool(false);
            }
        }
        ("argoproj.io/v1alpha1", "Application") => {
            let apps: Api<DynamicObject> = Api::namespaced_with(
                ctx.clusters.infra.clone(),
                &namespace,
                &super::ocm_resources::applications(),
            );
            let existing = apps
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading Application {namespace}/{name}: {e}"))?;
            let current = existing
                .as_ref()
                .map(|a| a.data["spec"]["source"].clone())
                .unwrap_or(Value::Null);
            let real = |v: &Value| {
                v.as_str()
                    .filter(|s| !s.is_empty() && *s != PLACEHOLDER)
                    .map(str::to_string)
            };
            // The source below is taken from the Application as read now: apply it only to
            // that version, so that a source the ResourceReconciler writes in between is not
            // overwritten with the one read before (the apply fails with a conflict instead, and
            // the next reconcile reads the new source).
            if let Some(rv) = existing
                .as_ref()
                .and_then(|a| a.metadata.resource_version.clone())
            {
                obj["metadata"]["resourceVersion"] = Value::String(rv);
            }
            if let Some(source) = obj["spec"]["source"].as_object_mut() {
                let template_url = source.get("repoURL").cloned().unwrap_or(Value::Null);
                match (real(&template_url), real(&current["repoURL"])) {
                    (None, existing) => {
                        source.insert(
                            "repoURL".into(),
                            Value::String(existing.unwrap_or_default()),
                        );
                    }
                    (Some(t), Some(e)) if t != e => {
                        source.insert("repoURL".into(), Value::String(e));
                    }
                    _ => {}
                }
                let template_rev = source.get("targetRevision").cloned().unwrap_or(Value::Null);
                match (real(&template_rev), real(&current["targetRevision"])) {
                    (None, _) => {
                        source.remove("targetRevision");
                    }
                    (Some(t), Some(e)) if t != e => {
                        source.remove("targetRevision");
                    }
                    _ => {}
                }
                let recorded = images.of(&namespace, &name);
                if !recorded.is_empty() {
                    let mut text = source
                        .get("helm")
                        .and_then(|h| h.get("values"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    for (path, version) in recorded {
                        text = helm_values_with(&text, &path, &version)
                            .map_err(|e| {
                                format!("Application {namespace}/{name}: helm values: {e}")
                            })?
                            .0;
                    }
                    let helm = source
                        .entry("helm")
                        .or_insert_with(|| serde_json::json!({}));
                    helm["values"] = Value::String(text);
                }
            }
        }
        _ => {}
    }
    Ok(())
}
