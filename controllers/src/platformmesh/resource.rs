//! Upstream's ResourceReconciler: the OCM `delivery.ocm.software/v1alpha1` Resources of the
//! runtime cluster, once the OCM controller resolved them (their `status.resource`), become the
//! sources and versions the deployers read in the infra cluster:
//!
//! - Flux: a chart in an OCI registry becomes the OCIRepository the HelmRelease's `chartRef`
//!   names (upstream's layer selector for Helm chart layers); a chart in git a GitRepository; a
//!   chart in a Helm repository a HelmRepository plus the HelmRelease's chart version; an image
//!   its tag in the HelmRelease's values (at the Resource's `path`, default `image.tag`).
//! - Argo CD: a chart fills the Application's `spec.source.repoURL` and `targetRevision` (the
//!   placeholders the templates leave); an image its tag in `spec.source.helm.values`.
//!
//! Which one is read from the Resource's annotations first, then its labels: `repo` (oci, git,
//! helm), `artifact` (chart, image), `for` (`name` or `ns/name` of the release an image is for),
//! `path`, `version-path` (where in the Resource the version is, default
//! `status.resource.version`) and `unsuspend`. A chart Resource names its target by its own name
//! without the `-chart` or `-image` suffix. The Resource itself is never written (upstream's
//! read-only lifecycle). Image versions and unsuspensions are remembered (in memory, as
//! upstream's ImageVersionStore: a restart forgets them until the Resources are reconciled
//! again) so that the Deployment step's next apply keeps them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use super::api_resource as resource;
use super::deployment::profile_of;
use super::deployment::Clusters;
use super::vars::{parse_yaml, profile_config_map, DeploymentTechnology};
use crate::runtime::{
    kube_error_is_transient, Action, ClusterContext, Controller, ReconcileError, Reconciler,
    Request, ResourceKind,
};

/// The controller's name.
pub const CONTROLLER: &str = "ResourceReconciler";
/// Field manager of the sources this controller applies.
pub const FIELD_MANAGER: &str = "platform-mesh-resource";
/// What the Flux templates leave where this controller fills in a value.
pub const PLACEHOLDER: &str = "PLACEHOLDER_TO_BE_SET_BY_RESOURCE_SUBROUTINE";
/// The OCI layer of a Helm chart, which Flux's OCIRepository copies.
const HELM_CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// `delivery.ocm.software/v1alpha1` Resource.
pub fn ocm_resources() -> ApiResource {
    resource("delivery.ocm.software", "v1alpha1", "Resource", "resources")
}

fn flux(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    resource(group, version, kind, plural)
}

/// Flux's OCIRepository.
pub fn oci_repositories() -> ApiResource {
    flux(
        "source.toolkit.fluxcd.io",
        "v1",
        "OCIRepository",
        "ocirepositories",
    )
}

/// Flux's GitRepository.
pub fn git_repositories() -> ApiResource {
    flux(
        "source.toolkit.fluxcd.io",
        "v1",
        "GitRepository",
        "gitrepositories",
    )
}

/// Flux's HelmRepository.
pub fn helm_repositories() -> ApiResource {
    flux(
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmRepository",
        "helmrepositories",
    )
}

/// Flux's HelmRelease.
pub fn helm_releases() -> ApiResource {
    flux(
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    )
}

/// Argo CD's Application.
pub fn applications() -> ApiResource {
    resource("argoproj.io", "v1alpha1", "Application", "applications")
}

/// `namespace/name` of a deployed release.
type ReleaseKey = (String, String);

#[derive(Default)]
struct Versions {
    /// Image versions set into a release's values, by dot path.
    images: HashMap<ReleaseKey, Vec<(String, String)>>,
    /// Releases unsuspended by a Resource.
    unsuspended: BTreeSet<ReleaseKey>,
}

/// The image versions and unsuspensions this controller set, for the Deployment step to keep.
#[derive(Clone, Default)]
pub struct ImageVersions(Arc<RwLock<Versions>>);

impl ImageVersions {
    fn record(&self, key: &ReleaseKey, path: &str, version: &str) {
        let mut v = self.0.write().unwrap_or_else(|p| p.into_inner());
        let entries = v.images.entry(key.clone()).or_default();
        match entries.iter_mut().find(|(p, _)| p == path) {
            Some(e) => e.1 = version.to_string(),
            None => entries.push((path.to_string(), version.to_string())),
        }
    }

    fn unsuspend(&self, key: &ReleaseKey) {
        let mut v = self.0.write().unwrap_or_else(|p| p.into_inner());
        v.unsuspended.insert(key.clone());
    }

    /// The image versions recorded for release `namespace/name`, as (dot path, version).
    pub fn of(&self, namespace: &str, name: &str) -> Vec<(String, String)> {
        let v = self.0.read().unwrap_or_else(|p| p.into_inner());
        v.images
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether a Resource unsuspended release `namespace/name`.
    pub fn unsuspended(&self, namespace: &str, name: &str) -> bool {
        let v = self.0.read().unwrap_or_else(|p| p.into_inner());
        v.unsuspended
            .contains(&(namespace.to_string(), name.to_string()))
    }
}

/// Why a Resource could not be carried over.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A call to an API server failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The Resource's status lacks what its kind of source needs (the OCM controller has not
    /// resolved it, or resolved something else).
    #[error("Resource {resource}: {missing}")]
    Incomplete {
        /// `namespace/name` of the Resource.
        resource: String,
        /// What is missing.
        missing: String,
    },
    /// The release or Application the Resource is for does not exist (yet).
    #[error("Resource {resource}: {target} does not exist yet")]
    NoTarget {
        /// `namespace/name` of the Resource.
        resource: String,
        /// What it is for.
        target: String,
    },
    /// Helm values of an Application are not YAML.
    #[error("Application {application}: spec.source.helm.values is not YAML: {reason}")]
    Values {
        /// `namespace/name`.
        application: String,
        /// The parser's message.
        reason: String,
    },
}

impl ReconcileError for ResourceError {
    fn is_transient(&self) -> bool {
        match self {
            ResourceError::Kube { source, .. } => kube_error_is_transient(source),
            // The OCM controller fills the status, the Deployment step creates the targets.
            ResourceError::Incomplete { .. } | ResourceError::NoTarget { .. } => true,
            ResourceError::Values { .. } => false,
        }
    }
}

fn kube_err(context: impl Into<String>) -> impl FnOnce(kube::Error) -> ResourceError {
    let context = context.into();
    move |source| ResourceError::Kube { context, source }
}

/// A Resource's setting `key`: its annotation, else its label.
fn setting(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .or_else(|| obj.metadata.labels.as_ref().and_then(|l| l.get(key)))
        .cloned()
}

/// The name of what a Resource is for: its own, without upstream's `-image`/`-chart` suffix.
pub fn trimmed_name(name: &str) -> &str {
    name.strip_suffix("-image")
        .or_else(|| name.strip_suffix("-chart"))
        .unwrap_or(name)
}

/// `for` as (namespace, name); a bare name is in `default_namespace`.
fn target_of(value: &str, default_namespace: &str) -> ReleaseKey {
    match value.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (default_namespace.to_string(), value.to_string()),
    }
}

/// The string at a dot path (`status.resource.version`) of `value`.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a str> {
    path.split('.')
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Sets `value` at dot path `path` of `target`, making the maps on the way.
pub fn set_path(target: &mut Value, path: &str, value: Value) {
    let mut at = target;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, key) in keys.iter().enumerate() {
        if !at.is_object() {
            *at = json!({});
        }
        let map = at.as_object_mut().expect("made an object above");
        if i + 1 == keys.len() {
            map.insert((*key).to_string(), value);
            return;
        }
        at = map.entry((*key).to_string()).or_insert_with(|| json!({}));
    }
}

/// `oci://host/repository` of an image or chart reference (tag and digest dropped).
pub fn oci_url(reference: &str) -> String {
    crate::provider::managed::oci_url(reference)
}

/// Where an Argo CD Application's chart comes from, resolved as upstream resolves it.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgoSource {
    /// `spec.source.repoURL`.
    pub repo_url: String,
    /// `spec.source.targetRevision`.
    pub target_revision: String,
}

/// A chart Resource's status as an Argo CD source: a Helm repository (with the resource's
/// version), a git repository (ref, component version, resource version or commit), or an
/// OCI reference (the repository without `oci://`, tag and chart name).
pub fn argo_source(status: &Value) -> Option<ArgoSource> {
    let access = &status["resource"]["access"];
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let resource_version = text(&status["resource"]["version"]);
    if let Some(url) = text(&access["helmRepository"]) {
        return Some(ArgoSource {
            repo_url: url,
            target_revision: resource_version.unwrap_or_default(),
        });
    }
    if let Some(url) = text(&access["repoUrl"]) {
        let revision = text(&access["ref"])
            .or_else(|| text(&status["component"]["version"]))
            .or(resource_version)
            .or_else(|| text(&access["commit"]))
            .unwrap_or_default();
        return Some(ArgoSource {
            repo_url: url,
            target_revision: revision,
        });
    }
    let image =
        text(&access["imageReference"]).or_else(|| text(&status["resource"]["imageReference"]))?;
    let repository = oci_url(&image);
    let repository = repository.trim_start_matches("oci://");
    let repository = repository
        .rsplit_once('/')
        .map_or(repository, |(parent, _chart)| parent);
    Some(ArgoSource {
        repo_url: repository.to_string(),
        target_revision: resource_version.unwrap_or_default(),
    })
}

/// Reconciles OCM Resources of the runtime cluster into the infra cluster's sources.
pub struct ResourceReconciler {
    clusters: Arc<Clusters>,
}

impl ResourceReconciler {
    /// The deployment technology of the PlatformMesh in `namespace` (its profile's `infra`,
    /// else `components` setting; Flux without one).
    async fn technology(&self, namespace: &str) -> DeploymentTechnology {
        let pms: Api<DynamicObject> = Api::namespaced_with(
            self.clusters.runtime.clone(),
            namespace,
            &super::controller::platform_meshes(),
        );
        let Ok(list) = pms.list(&Default::default()).await else {
            return DeploymentTechnology::FluxCd;
        };
        let Some(pm) = list.items.first() else {
            return DeploymentTechnology::FluxCd;
        };
        let spec = pm
            .data
            .get("spec")
            .cloned()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let (ns, name) =
            profile_config_map(pm.metadata.name.as_deref().unwrap_or(""), namespace, &spec);
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.clusters.runtime.clone(), &ns);
        let Ok(Some(cm)) = cms.get_opt(&name).await else {
            return DeploymentTechnology::FluxCd;
        };
        let Ok(profile) = profile_of(cm) else {
            return DeploymentTechnology::FluxCd;
        };
        let components = parse_yaml(&profile.components_text).unwrap_or_default();
        DeploymentTechnology::parse(
            profile
                .infra
                .get("deploymentTechnology")
                .or(components.get("deploymentTechnology")),
        )
    }

    /// Applies `object` (server-side, forced) in the infra cluster unless it already says so.
    async fn apply(
        &self,
        ar: &ApiResource,
        namespace: &str,
        name: &str,
        manager: &str,
        object: Value,
    ) -> Result<(), ResourceError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.clusters.infra.clone(), namespace, ar);
        let current = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading {} {namespace}/{name}", ar.kind)))?;
        if current.is_some_and(|c| contains(&serde_json::to_value(&c).unwrap_or_default(), &object))
        {
            return Ok(());
        }
        api.patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(kube_err(format!("applying {} {namespace}/{name}", ar.kind)))?;
        Ok(())
    }

    /// HelmRelease `key` in the infra cluster, and its API; a missing one is waited for.
    async fn release(
        &self,
        key: &ReleaseKey,
        resource: &str,
    ) -> Result<(Api<DynamicObject>, DynamicObject), ResourceError> {
        self.target(&helm_releases(), key, resource).await
    }

    /// The release or Application `key` (of `ar`) a Resource is for, in the infra cluster, and
    /// its API; a missing one is waited for.
    async fn target(
        &self,
        ar: &ApiResource,
        key: &ReleaseKey,
        resource: &str,
    ) -> Result<(Api<DynamicObject>, DynamicObject), ResourceError> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.clusters.infra.clone(), &key.0, ar);
        let what = format!("{} {}/{}", ar.kind, key.0, key.1);
        let object = api
            .get_opt(&key.1)
            .await
            .map_err(kube_err(format!("reading {what}")))?
            .ok_or_else(|| ResourceError::NoTarget {
                resource: resource.to_string(),
                target: what,
            })?;
        Ok((api, object))
    }

    /// Sets `value` at `spec.values.<path>` of HelmRelease `key` (and unsuspends it when asked).
    async fn release_values(
        &self,
        key: &ReleaseKey,
        path: &str,
        version: &str,
        unsuspend: bool,
        resource: &str,
    ) -> Result<(), ResourceError> {
        let (api, release) = self.release(key, resource).await?;
        self.clusters.images.record(key, path, version);
        if unsuspend {
            self.clusters.images.unsuspend(key);
        }
        let current = at_path(&release.data["spec"]["values"], path);
        let suspended = release.data["spec"]["suspend"] == true;
        if current == Some(version) && !(unsuspend && suspended) {
            return Ok(());
        }
        let mut patch = json!({"spec": {"values": {}}});
        set_path(&mut patch["spec"]["values"], path, json!(version));
        if unsuspend {
            patch["spec"]["suspend"] = json!(false);
        }
        api.patch(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "updating HelmRelease {}/{}",
                key.0, key.1
            )))?;
        Ok(())
    }

    /// Sets HelmRelease `key`'s `spec.chart.spec.version` (and unsuspends it when asked).
    async fn release_chart_version(
        &self,
        key: &ReleaseKey,
        version: &str,
        unsuspend: bool,
        resource: &str,
    ) -> Result<(), ResourceError> {
        let (api, release) = self.release(key, resource).await?;
        if unsuspend {
            self.clusters.images.unsuspend(key);
        }
        let suspended = release.data["spec"]["suspend"] == true;
        if release.data["spec"]["chart"]["spec"]["version"] == version && !(unsuspend && suspended)
        {
            return Ok(());
        }
        let mut patch = json!({"spec": {"chart": {"spec": {"version": version}}}});
        if unsuspend {
            patch["spec"]["suspend"] = json!(false);
        }
        api.patch(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "updating HelmRelease {}/{}",
                key.0, key.1
            )))?;
        Ok(())
    }

    async fn flux(
        &self,
        obj: &DynamicObject,
        name: &str,
        ns: &str,
    ) -> Result<Action, ResourceError> {
        let here = format!("{ns}/{name}");
        let status = &obj.data["status"];
        let repo = setting(obj, "repo").unwrap_or_default();
        let artifact = setting(obj, "artifact").unwrap_or_default();
        let target = trimmed_name(name);
        let version_path =
            setting(obj, "version-path").unwrap_or_else(|| "status.resource.version".into());
        let version = at_path(&obj.data, &version_path);
        let incomplete = |missing: &str| ResourceError::Incomplete {
            resource: here.clone(),
            missing: missing.to_string(),
        };
        match (repo.as_str(), artifact.as_str()) {
            ("oci", "chart") => {
                let version = version.ok_or_else(|| incomplete("no status.resource.version"))?;
                let image = at_path(status, "resource.access.imageReference")
                    .ok_or_else(|| incomplete("no status.resource.access.imageReference"))?;
                let object = json!({
                    "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
                    "metadata": {"name": target, "namespace": ns},
                    "spec": {"ref": {"tag": version}, "url": oci_url(image), "provider": "generic",
                        "interval": "1m0s",
                        "layerSelector": {"mediaType": HELM_CHART_LAYER, "operation": "copy"}}});
                self.apply(&oci_repositories(), ns, target, FIELD_MANAGER, object)
                    .await?;
            }
            ("git", "chart") => {
                let commit = at_path(status, "resource.access.commit")
                    .ok_or_else(|| incomplete("no status.resource.access.commit"))?;
                let url = at_path(status, "resource.access.repoUrl")
                    .ok_or_else(|| incomplete("no status.resource.access.repoUrl"))?;
                let object = json!({
                    "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                    "metadata": {"name": target, "namespace": ns},
                    "spec": {"ref": {"commit": commit}, "url": url, "interval": "1m0s", "timeout": "5m"}});
                self.apply(&git_repositories(), ns, target, FIELD_MANAGER, object)
                    .await?;
            }
            ("helm", "chart") => {
                let Some(url) = at_path(status, "resource.access.helmRepository") else {
                    // Upstream waits for the OCM controller to name the repository.
                    return Ok(Action::requeue_after(Duration::from_secs(5)));
                };
                let version = version.ok_or_else(|| incomplete("no status.resource.version"))?;
                let object = json!({
                    "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
                    "metadata": {"name": target, "namespace": ns},
                    "spec": {"url": url, "provider": "generic", "interval": "5m"}});
                self.apply(&helm_repositories(), ns, target, FIELD_MANAGER, object)
                    .await?;
                self.release_chart_version(
                    &(ns.to_string(), target.to_string()),
                    version,
                    setting(obj, "unsuspend").as_deref() == Some("true"),
                    &here,
                )
                .await?;
            }
            ("helm" | "oci", "image") => {
                let version = version.ok_or_else(|| incomplete(&format!("no {version_path}")))?;
                let key = target_of(
                    &setting(obj, "for").unwrap_or_else(|| target.to_string()),
                    ns,
                );
                let path = setting(obj, "path").unwrap_or_else(|| "image.tag".into());
                self.release_values(
                    &key,
                    &path,
                    version,
                    setting(obj, "unsuspend").as_deref() == Some("true"),
                    &here,
                )
                .await?;
            }
            // Resources of other kinds are not the deployers'.
            _ => {}
        }
        Ok(Action::await_change())
    }

    async fn argo(
        &self,
        obj: &DynamicObject,
        name: &str,
        ns: &str,
    ) -> Result<Action, ResourceError> {
        let here = format!("{ns}/{name}");
        let status = &obj.data["status"];
        let artifact = setting(obj, "artifact").unwrap_or_default();
        match artifact.as_str() {
            "chart" => {
                let Some(source) = argo_source(status) else {
                    return Err(ResourceError::Incomplete {
                        resource: here,
                        missing: "no helmRepository, repoUrl or imageReference in status.resource"
                            .into(),
                    });
                };
                let target = trimmed_name(name);
                let (apps, app) = self
                    .target(
                        &applications(),
                        &(ns.to_string(), target.to_string()),
                        &here,
                    )
                    .await?;
                let src = &app.data["spec"]["source"];
                if src["repoURL"] == source.repo_url.as_str()
                    && src["targetRevision"] == source.target_revision.as_str()
                {
                    return Ok(Action::await_change());
                }
                let patch = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": target, "namespace": ns},
                    "spec": {"source": {"repoURL": source.repo_url, "targetRevision": source.target_revision}}});
                apps.patch(
                    target,
                    &PatchParams::apply(&format!("{FIELD_MANAGER}-{name}")).force(),
                    &Patch::Apply(&patch),
                )
                .await
                .map_err(kube_err(format!(
                    "setting the source of Application {ns}/{target}"
                )))?;
            }
            "image" => {
                let Some(version) = at_path(status, "resource.version") else {
                    return Err(ResourceError::Incomplete {
                        resource: here,
                        missing: "no status.resource.version".into(),
                    });
                };
                let key = target_of(
                    &setting(obj, "for").unwrap_or_else(|| trimmed_name(name).to_string()),
                    ns,
                );
                let path = setting(obj, "path").unwrap_or_else(|| "image.tag".into());
                let (apps, app) = self.target(&applications(), &key, &here).await?;
                self.clusters.images.record(&key, &path, version);
                let text = app.data["spec"]["source"]["helm"]["values"]
                    .as_str()
                    .unwrap_or_default();
                let (values, changed) =
                    helm_values_with(text, &path, version).map_err(|reason| {
                        ResourceError::Values {
                            application: format!("{}/{}", key.0, key.1),
                            reason,
                        }
                    })?;
                if !changed {
                    return Ok(Action::await_change());
                }
                let patch = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": key.1, "namespace": key.0},
                    "spec": {"source": {"helm": {"values": values}}}});
                apps.patch(
                    &key.1,
                    &PatchParams::apply(&format!("{FIELD_MANAGER}-{name}")).force(),
                    &Patch::Apply(&patch),
                )
                .await
                .map_err(kube_err(format!(
                    "setting an image version of Application {}/{}",
                    key.0, key.1
                )))?;
            }
            _ => {}
        }
        Ok(Action::await_change())
    }
}

/// `text` (Helm values as YAML) with `version` at dot path `path`, and whether that changed it.
pub fn helm_values_with(text: &str, path: &str, version: &str) -> Result<(String, bool), String> {
    let mut values = if text.trim().is_empty() {
        json!({})
    } else {
        parse_yaml(text)?
    };
    if at_path(&values, path) == Some(version) {
        return Ok((text.to_string(), false));
    }
    set_path(&mut values, path, json!(version));
    let out = serde_saphyr::to_string(&values).map_err(|e| e.to_string())?;
    Ok((out, true))
}

/// Whether `have` holds every field of `want` with the same value (objects compared by key,
/// everything else exactly).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        _ => have == want,
    }
}

impl Reconciler for ResourceReconciler {
    type Error = ResourceError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, ResourceError> {
        let api: Api<DynamicObject> = ctx
            .cluster()
            .dynamic_api(&ocm_resources(), req.namespace.as_deref());
        let Some(obj) = api
            .get_opt(&req.name)
            .await
            .map_err(kube_err(format!("reading Resource {req}")))?
        else {
            return Ok(Action::await_change());
        };
        if obj.metadata.deletion_timestamp.is_some() || obj.data["status"].is_null() {
            // Not resolved yet: the OCM controller's status write brings it back.
            return Ok(Action::await_change());
        }
        let ns = req.namespace.as_deref().unwrap_or("default");
        match self.technology(ns).await {
            DeploymentTechnology::FluxCd => self.flux(&obj, &req.name, ns).await,
            DeploymentTechnology::ArgoCd => self.argo(&obj, &req.name, ns).await,
        }
    }
}

/// The ResourceReconciler over the runtime cluster's OCM Resources, writing to `clusters`'
/// infra cluster (engage the runtime cluster with the manager).
pub fn controller(clusters: Arc<Clusters>) -> Controller<ResourceReconciler> {
    Controller::new(CONTROLLER, ResourceReconciler { clusters })
        .for_kind(ResourceKind::dynamic(ocm_resources(), true))
        .workers(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_paths_and_sources_follow_upstream() {
        assert_eq!(trimmed_name("cert-manager-chart"), "cert-manager");
        assert_eq!(
            trimmed_name("cert-manager-controller-image"),
            "cert-manager-controller"
        );
        assert_eq!(trimmed_name("plain"), "plain");
        assert_eq!(
            target_of("ns/rel", "d"),
            ("ns".to_string(), "rel".to_string())
        );
        assert_eq!(target_of("rel", "d"), ("d".to_string(), "rel".to_string()));
        let mut v = json!({"image": {"repository": "x"}});
        set_path(&mut v, "image.tag", json!("1.2"));
        set_path(&mut v, "a.b.c", json!("d"));
        assert_eq!(
            v,
            json!({"image": {"repository": "x", "tag": "1.2"}, "a": {"b": {"c": "d"}}})
        );
        assert_eq!(
            oci_url("ghcr.io/platform-mesh/charts/iam:0.1.0"),
            "oci://ghcr.io/platform-mesh/charts/iam"
        );
        let oci = json!({"resource": {"version": "0.1.0",
            "access": {"imageReference": "ghcr.io/pm/charts/iam:0.1.0"}}});
        assert_eq!(
            argo_source(&oci),
            Some(ArgoSource {
                repo_url: "ghcr.io/pm/charts".into(),
                target_revision: "0.1.0".into()
            })
        );
        let git = json!({"resource": {"version": "9", "access": {"repoUrl": "https://g/x", "commit": "abc"}},
            "component": {"version": "1.0.0"}});
        assert_eq!(
            argo_source(&git),
            Some(ArgoSource {
                repo_url: "https://g/x".into(),
                target_revision: "1.0.0".into()
            })
        );
        let helm = json!({"resource": {"version": "2.0.0", "access": {"helmRepository": "https://charts"}}});
        assert_eq!(
            argo_source(&helm),
            Some(ArgoSource {
                repo_url: "https://charts".into(),
                target_revision: "2.0.0".into()
            })
        );
        assert_eq!(argo_source(&json!({})), None);
        let (text, changed) = helm_values_with("image:\n  tag: old\n", "image.tag", "new").unwrap();
        assert!(changed && text.contains("new"), "{text}");
        let (_, changed) = helm_values_with("image:\n  tag: new\n", "image.tag", "new").unwrap();
        assert!(!changed);
    }
}
