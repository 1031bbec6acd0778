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
//!
//! What is written for one Resource is decided by [`writes`], which does no I/O: the reconciler
//! reads the release or Application ([`target_of_resource`]) and makes the writes, and
//! `platform-mesh render --resources` applies the same writes to a render.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use super::deployment::profile_of;
use super::deployment::Clusters;
use super::vars::{parse_yaml, profile_config_map, DeploymentTechnology, Profile};
use crate::objects::api_resource as resource;
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

/// `(namespace, name)` of a deployed release or Application.
pub type ReleaseKey = (String, String);

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
    /// The controller's watch cache could not be read (it did not sync in time).
    #[error("reading the watch cache: {0}")]
    Cache(#[from] crate::runtime::CacheError),
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
            ResourceError::Cache(e) => e.is_transient(),
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
    crate::oci::oci_url(reference)
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

/// The deployment technology the ResourceReconciler follows for a profile: its `infra` setting,
/// else its `components` setting, else Flux.
pub fn technology_of(profile: &Profile) -> DeploymentTechnology {
    let components = parse_yaml(&profile.components_text).unwrap_or_default();
    DeploymentTechnology::parse(
        profile
            .infra
            .get("deploymentTechnology")
            .or(components.get("deploymentTechnology")),
    )
}

/// How soon a Helm-repository chart whose repository the OCM controller has not named yet is
/// looked at again (upstream's 5 s).
const HELM_REPOSITORY_RECHECK: Duration = Duration::from_secs(5);

/// The HelmRelease or Application a Resource writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    /// Its kind: [`helm_releases`] or [`applications`].
    pub api: ApiResource,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl TargetRef {
    fn new(api: ApiResource, (namespace, name): ReleaseKey) -> Self {
        TargetRef {
            api,
            namespace,
            name,
        }
    }

    fn key(&self) -> ReleaseKey {
        (self.namespace.clone(), self.name.clone())
    }
}

impl std::fmt::Display for TargetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.api.kind, self.namespace, self.name)
    }
}

/// A Flux source the reconciler applies (server-side, forced, as [`FIELD_MANAGER`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// Its kind: [`oci_repositories`], [`git_repositories`] or [`helm_repositories`].
    pub api: ApiResource,
    /// Its namespace (the Resource's).
    pub namespace: String,
    /// Its name (the Resource's, without the `-chart` or `-image` suffix).
    pub name: String,
    /// The whole object.
    pub object: Value,
}

/// How the reconciler writes a change to a HelmRelease or Application.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetPatch {
    /// A JSON merge patch (HelmReleases, which upstream updates in place).
    Merge(Value),
    /// A forced server-side apply of these fields by field manager `manager` (Applications,
    /// one manager per Resource so that each keeps its own fields).
    Apply {
        /// The field manager.
        manager: String,
        /// The applied fields.
        object: Value,
    },
}

/// A change to the HelmRelease or Application a Resource is for.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// What is changed.
    pub target: TargetRef,
    /// The change as the reconciler sends it.
    pub patch: TargetPatch,
    /// The object as it is after the change (the current one with the patch merged in).
    pub object: Value,
}

impl Update {
    fn new(target: TargetRef, current: &Value, patch: TargetPatch) -> Self {
        let mut object = current.clone();
        match &patch {
            TargetPatch::Merge(fields) | TargetPatch::Apply { object: fields, .. } => {
                merge_into(&mut object, fields)
            }
        }
        Update {
            target,
            patch,
            object,
        }
    }
}

/// An image version set into a release, which the Deployment step keeps (see [`ImageVersions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageVersion {
    /// `(namespace, name)` of the HelmRelease or Application.
    pub release: ReleaseKey,
    /// Dot path in its Helm values.
    pub path: String,
    /// The version.
    pub version: String,
}

/// How handling a Resource ends, after its writes.
#[derive(Debug)]
pub enum Outcome {
    /// Everything is written.
    Done,
    /// The Resource is looked at again after `after`: the OCM controller has not filled in
    /// what is needed yet.
    Requeue {
        /// When to look again.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// The Resource cannot be carried over (yet); the writes listed before still happen.
    Failed(ResourceError),
}

impl From<ResourceError> for Outcome {
    fn from(e: ResourceError) -> Self {
        Outcome::Failed(e)
    }
}

/// What the ResourceReconciler writes for one Resource, in the order it writes: the source,
/// the recorded image version and unsuspension, the change to the release or Application, and
/// then how it ends.
#[derive(Debug)]
pub struct Writes {
    /// The Flux source to apply.
    pub source: Option<Source>,
    /// The image version to record for the Deployment step.
    pub image: Option<ImageVersion>,
    /// The release to remember as unsuspended, for the Deployment step.
    pub unsuspend: Option<ReleaseKey>,
    /// The change to the HelmRelease or Application, when it does not say so already.
    pub update: Option<Update>,
    /// How it ends.
    pub outcome: Outcome,
}

impl Default for Writes {
    fn default() -> Self {
        Writes {
            source: None,
            image: None,
            unsuspend: None,
            update: None,
            outcome: Outcome::Done,
        }
    }
}

/// What kind of write a Resource asks for, from its settings and the deployment technology.
enum Plan {
    /// Flux: an OCIRepository.
    OciChart,
    /// Flux: a GitRepository.
    GitChart,
    /// Flux: a HelmRepository and the chart version of the release.
    HelmChart(TargetRef),
    /// Flux: an image version in the release's values.
    FluxImage(TargetRef),
    /// Argo CD: the Application's source.
    ArgoChart(TargetRef),
    /// Argo CD: an image version in the Application's Helm values.
    ArgoImage(TargetRef),
    /// Not the deployers'.
    Nothing,
}

fn plan(resource: &DynamicObject, namespace: &str, technology: DeploymentTechnology) -> Plan {
    let name = resource.metadata.name.as_deref().unwrap_or_default();
    let repo = setting(resource, "repo").unwrap_or_default();
    let artifact = setting(resource, "artifact").unwrap_or_default();
    let own = (namespace.to_string(), trimmed_name(name).to_string());
    let for_ = || {
        target_of(
            &setting(resource, "for").unwrap_or_else(|| trimmed_name(name).to_string()),
            namespace,
        )
    };
    match technology {
        DeploymentTechnology::FluxCd => match (repo.as_str(), artifact.as_str()) {
            ("oci", "chart") => Plan::OciChart,
            ("git", "chart") => Plan::GitChart,
            ("helm", "chart") => Plan::HelmChart(TargetRef::new(helm_releases(), own)),
            ("helm" | "oci", "image") => Plan::FluxImage(TargetRef::new(helm_releases(), for_())),
            _ => Plan::Nothing,
        },
        DeploymentTechnology::ArgoCd => match artifact.as_str() {
            "chart" => Plan::ArgoChart(TargetRef::new(applications(), own)),
            "image" => Plan::ArgoImage(TargetRef::new(applications(), for_())),
            _ => Plan::Nothing,
        },
    }
}

/// The HelmRelease or Application that Resource `resource` of namespace `namespace` writes to
/// under `technology`, for the caller to read before [`writes`]; `None` for a Resource that
/// only makes a source or that the deployers do not use.
pub fn target_of_resource(
    resource: &DynamicObject,
    namespace: &str,
    technology: DeploymentTechnology,
) -> Option<TargetRef> {
    match plan(resource, namespace, technology) {
        Plan::HelmChart(t) | Plan::FluxImage(t) | Plan::ArgoChart(t) | Plan::ArgoImage(t) => {
            Some(t)
        }
        Plan::OciChart | Plan::GitChart | Plan::Nothing => None,
    }
}

/// What the ResourceReconciler writes for `resource` (a resolved OCM Resource, with its
/// status) of namespace `namespace` under `technology`, given the current state of the
/// HelmRelease or Application it is for ([`target_of_resource`]; `None` when that does not
/// exist). Reads and writes nothing: the reconciler makes these writes in the infra cluster,
/// `platform-mesh render --resources` shows them.
pub fn writes(
    resource: &DynamicObject,
    namespace: &str,
    technology: DeploymentTechnology,
    current: Option<&Value>,
) -> Writes {
    let mut out = Writes::default();
    if let Err(outcome) = plan_writes(resource, namespace, technology, current, &mut out) {
        out.outcome = outcome;
    }
    out
}

fn plan_writes(
    obj: &DynamicObject,
    ns: &str,
    technology: DeploymentTechnology,
    current: Option<&Value>,
    out: &mut Writes,
) -> Result<(), Outcome> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let here = format!("{ns}/{name}");
    let status = &obj.data["status"];
    let target = trimmed_name(name);
    let version_path =
        setting(obj, "version-path").unwrap_or_else(|| "status.resource.version".into());
    let version = at_path(&obj.data, &version_path);
    let unsuspend = setting(obj, "unsuspend").as_deref() == Some("true");
    let path = || setting(obj, "path").unwrap_or_else(|| "image.tag".into());
    let incomplete = |missing: &str| ResourceError::Incomplete {
        resource: here.clone(),
        missing: missing.to_string(),
    };
    let existing = |to: &TargetRef| {
        current.ok_or_else(|| ResourceError::NoTarget {
            resource: here.clone(),
            target: to.to_string(),
        })
    };
    let source = |api: ApiResource, object: Value| Source {
        api,
        namespace: ns.to_string(),
        name: target.to_string(),
        object,
    };
    match plan(obj, ns, technology) {
        Plan::OciChart => {
            let version = version.ok_or_else(|| incomplete("no status.resource.version"))?;
            let image = at_path(status, "resource.access.imageReference")
                .ok_or_else(|| incomplete("no status.resource.access.imageReference"))?;
            let object = json!({
                "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
                "metadata": {"name": target, "namespace": ns},
                "spec": {"ref": {"tag": version}, "url": oci_url(image), "provider": "generic",
                    "interval": "1m0s",
                    "layerSelector": {"mediaType": HELM_CHART_LAYER, "operation": "copy"}}});
            out.source = Some(source(oci_repositories(), object));
        }
        Plan::GitChart => {
            let commit = at_path(status, "resource.access.commit")
                .ok_or_else(|| incomplete("no status.resource.access.commit"))?;
            let url = at_path(status, "resource.access.repoUrl")
                .ok_or_else(|| incomplete("no status.resource.access.repoUrl"))?;
            let object = json!({
                "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                "metadata": {"name": target, "namespace": ns},
                "spec": {"ref": {"commit": commit}, "url": url, "interval": "1m0s", "timeout": "5m"}});
            out.source = Some(source(git_repositories(), object));
        }
        Plan::HelmChart(to) => {
            let Some(url) = at_path(status, "resource.access.helmRepository") else {
                // Upstream waits for the OCM controller to name the repository.
                return Err(Outcome::Requeue {
                    after: HELM_REPOSITORY_RECHECK,
                    reason: format!(
                        "Resource {here}: no status.resource.access.helmRepository yet"
                    ),
                });
            };
            let version = version.ok_or_else(|| incomplete("no status.resource.version"))?;
            let object = json!({
                "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
                "metadata": {"name": target, "namespace": ns},
                "spec": {"url": url, "provider": "generic", "interval": "5m"}});
            out.source = Some(source(helm_repositories(), object));
            let release = existing(&to)?;
            if unsuspend {
                out.unsuspend = Some(to.key());
            }
            let suspended = release["spec"]["suspend"] == true;
            if release["spec"]["chart"]["spec"]["version"] != version || (unsuspend && suspended) {
                let mut patch = json!({"spec": {"chart": {"spec": {"version": version}}}});
                if unsuspend {
                    patch["spec"]["suspend"] = json!(false);
                }
                out.update = Some(Update::new(to, release, TargetPatch::Merge(patch)));
            }
        }
        Plan::FluxImage(to) => {
            let version = version.ok_or_else(|| incomplete(&format!("no {version_path}")))?;
            let path = path();
            let release = existing(&to)?;
            out.image = Some(ImageVersion {
                release: to.key(),
                path: path.clone(),
                version: version.to_string(),
            });
            if unsuspend {
                out.unsuspend = Some(to.key());
            }
            let suspended = release["spec"]["suspend"] == true;
            if at_path(&release["spec"]["values"], &path) != Some(version)
                || (unsuspend && suspended)
            {
                let mut patch = json!({"spec": {"values": {}}});
                set_path(&mut patch["spec"]["values"], &path, json!(version));
                if unsuspend {
                    patch["spec"]["suspend"] = json!(false);
                }
                out.update = Some(Update::new(to, release, TargetPatch::Merge(patch)));
            }
        }
        Plan::ArgoChart(to) => {
            let source = argo_source(status).ok_or_else(|| {
                incomplete("no helmRepository, repoUrl or imageReference in status.resource")
            })?;
            let app = existing(&to)?;
            let src = &app["spec"]["source"];
            if src["repoURL"] != source.repo_url.as_str()
                || src["targetRevision"] != source.target_revision.as_str()
            {
                let fields = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": to.name, "namespace": to.namespace},
                    "spec": {"source": {"repoURL": source.repo_url,
                        "targetRevision": source.target_revision}}});
                let patch = TargetPatch::Apply {
                    manager: format!("{FIELD_MANAGER}-{name}"),
                    object: fields,
                };
                out.update = Some(Update::new(to, app, patch));
            }
        }
        Plan::ArgoImage(to) => {
            let version = at_path(status, "resource.version")
                .ok_or_else(|| incomplete("no status.resource.version"))?;
            let path = path();
            let app = existing(&to)?;
            out.image = Some(ImageVersion {
                release: to.key(),
                path: path.clone(),
                version: version.to_string(),
            });
            let text = app["spec"]["source"]["helm"]["values"]
                .as_str()
                .unwrap_or_default();
            let (values, changed) =
                helm_values_with(text, &path, version).map_err(|reason| ResourceError::Values {
                    application: format!("{}/{}", to.namespace, to.name),
                    reason,
                })?;
            if changed {
                let fields = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": to.name, "namespace": to.namespace},
                    "spec": {"source": {"helm": {"values": values}}}});
                let patch = TargetPatch::Apply {
                    manager: format!("{FIELD_MANAGER}-{name}"),
                    object: fields,
                };
                out.update = Some(Update::new(to, app, patch));
            }
        }
        // Resources of other kinds are not the deployers'.
        Plan::Nothing => {}
    }
    Ok(())
}

/// Merges `patch` into `target` as a JSON merge patch does: objects key by key (a null removes
/// the key), anything else replaced.
fn merge_into(target: &mut Value, patch: &Value) {
    if let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_into(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        return;
    }
    *target = patch.clone();
}

/// Reconciles OCM Resources of the runtime cluster into the infra cluster's sources.
pub struct ResourceReconciler {
    clusters: Arc<Clusters>,
}

impl ResourceReconciler {
    /// The deployment technology of the PlatformMesh in `namespace` ([`technology_of`] its
    /// profile; Flux without one).
    async fn technology(&self, namespace: &str) -> DeploymentTechnology {
        let pms: Api<DynamicObject> = Api::namespaced_with(
            self.clusters.runtime.clone(),
            namespace,
            &crate::objects::platform_meshes(),
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
        technology_of(&profile)
    }

    /// Applies `object` (server-side, forced) in the infra cluster unless it already says so.
    async fn apply(
        &self,
        ar: &ApiResource,
        namespace: &str,
        name: &str,
        manager: &str,
        object: &Value,
    ) -> Result<(), ResourceError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.clusters.infra.clone(), namespace, ar);
        let current = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading {} {namespace}/{name}", ar.kind)))?;
        if current.is_some_and(|c| contains(&serde_json::to_value(&c).unwrap_or_default(), object))
        {
            return Ok(());
        }
        api.patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(kube_err(format!("applying {} {namespace}/{name}", ar.kind)))?;
        Ok(())
    }

    /// The release or Application `target` as it is in the infra cluster; `None` when it does
    /// not exist (yet).
    async fn current(&self, target: &TargetRef) -> Result<Option<Value>, ResourceError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.clusters.infra.clone(), &target.namespace, &target.api);
        let object = api
            .get_opt(&target.name)
            .await
            .map_err(kube_err(format!("reading {target}")))?;
        Ok(object.map(|o| serde_json::to_value(o).unwrap_or_default()))
    }

    /// Makes `writes` in the infra cluster (and the image-version store), in their order.
    async fn write(&self, writes: Writes) -> Result<Action, ResourceError> {
        if let Some(s) = &writes.source {
            self.apply(&s.api, &s.namespace, &s.name, FIELD_MANAGER, &s.object)
                .await?;
        }
        if let Some(image) = &writes.image {
            self.clusters
                .images
                .record(&image.release, &image.path, &image.version);
        }
        if let Some(key) = &writes.unsuspend {
            self.clusters.images.unsuspend(key);
        }
        if let Some(update) = &writes.update {
            let target = &update.target;
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.clusters.infra.clone(), &target.namespace, &target.api);
            let (params, patch) = match &update.patch {
                TargetPatch::Merge(fields) => (PatchParams::default(), Patch::Merge(fields)),
                TargetPatch::Apply { manager, object } => {
                    (PatchParams::apply(manager).force(), Patch::Apply(object))
                }
            };
            api.patch(&target.name, &params, &patch)
                .await
                .map_err(kube_err(format!("updating {target}")))?;
        }
        match writes.outcome {
            Outcome::Done => Ok(Action::await_change()),
            Outcome::Requeue { after, .. } => Ok(Action::requeue_after(after)),
            Outcome::Failed(e) => Err(e),
        }
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
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(obj) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        if obj.metadata.deletion_timestamp.is_some() || obj.data["status"].is_null() {
            // Not resolved yet: the OCM controller's status write brings it back.
            return Ok(Action::await_change());
        }
        let ns = req.namespace.as_deref().unwrap_or("default");
        let technology = self.technology(ns).await;
        let current = match target_of_resource(&obj, ns, technology) {
            Some(target) => self.current(&target).await?,
            None => None,
        };
        self.write(writes(&obj, ns, technology, current.as_ref()))
            .await
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
    use DeploymentTechnology::{ArgoCd, FluxCd};

    /// A Resource `name` of namespace `ns` with labels `labels` and status `status`.
    fn ocm(name: &str, labels: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "delivery.ocm.software/v1alpha1",
            "kind": "Resource", "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "status": status}))
        .expect("resource")
    }

    fn oci_chart_status() -> Value {
        json!({"resource": {"version": "1.0.0",
            "access": {"imageReference": "ghcr.io/pm/charts/iam:1.0.0"}},
            "component": {"version": "0.1.0"}})
    }

    #[test]
    fn chart_resources_become_flux_sources_without_touching_releases() {
        let r = ocm(
            "iam-chart",
            json!({"repo": "oci", "artifact": "chart"}),
            oci_chart_status(),
        );
        assert_eq!(target_of_resource(&r, "ns", FluxCd), None);
        let w = writes(&r, "ns", FluxCd, None);
        assert!(matches!(w.outcome, Outcome::Done), "{:?}", w.outcome);
        let source = w.source.expect("source");
        assert_eq!(
            (source.api, source.namespace.as_str(), source.name.as_str()),
            (oci_repositories(), "ns", "iam")
        );
        assert_eq!(source.object["spec"]["url"], "oci://ghcr.io/pm/charts/iam");
        assert_eq!(source.object["spec"]["ref"]["tag"], "1.0.0");
        assert!(w.update.is_none() && w.image.is_none() && w.unsuspend.is_none());

        let git = ocm(
            "gw",
            json!({"repo": "git", "artifact": "chart"}),
            json!({"resource": {"access": {"repoUrl": "https://g/x", "commit": "abc"}}}),
        );
        let source = writes(&git, "ns", FluxCd, None).source.expect("git");
        assert_eq!(source.api, git_repositories());
        assert_eq!(source.object["spec"]["ref"]["commit"], "abc");

        let unresolved = ocm(
            "iam-chart",
            json!({"repo": "oci", "artifact": "chart"}),
            json!({"resource": {"version": "1.0.0"}}),
        );
        let w = writes(&unresolved, "ns", FluxCd, None);
        assert!(w.source.is_none());
        assert!(
            matches!(&w.outcome, Outcome::Failed(ResourceError::Incomplete { resource, missing })
                if resource == "ns/iam-chart" && missing.contains("imageReference")),
            "{:?}",
            w.outcome
        );
        let other = ocm("x", json!({"artifact": "blob"}), json!({}));
        let w = writes(&other, "ns", FluxCd, None);
        assert!(w.source.is_none() && w.update.is_none() && matches!(w.outcome, Outcome::Done));
    }

    #[test]
    fn helm_repository_charts_wait_for_their_repository_and_set_the_release_version() {
        let labels = json!({"repo": "helm", "artifact": "chart", "unsuspend": "true"});
        let r = ocm(
            "iam-chart",
            labels.clone(),
            json!({"resource": {"version": "2.0.0"}}),
        );
        let w = writes(&r, "ns", FluxCd, None);
        assert!(
            matches!(w.outcome, Outcome::Requeue { after, .. } if after == HELM_REPOSITORY_RECHECK)
        );
        assert!(w.source.is_none());

        let r = ocm(
            "iam-chart",
            labels,
            json!({"resource": {"version": "2.0.0", "access": {"helmRepository": "https://c"}}}),
        );
        let target = target_of_resource(&r, "ns", FluxCd).expect("target");
        assert_eq!(target.to_string(), "HelmRelease ns/iam");
        // No release yet: the repository is still applied, then the reconciler waits.
        let w = writes(&r, "ns", FluxCd, None);
        assert_eq!(w.source.expect("repository").api, helm_repositories());
        assert!(
            matches!(&w.outcome, Outcome::Failed(ResourceError::NoTarget { target, .. })
            if target == "HelmRelease ns/iam")
        );
        let release = json!({"metadata": {"name": "iam"}, "spec": {"suspend": true,
            "chart": {"spec": {"chart": "iam"}}}});
        let w = writes(&r, "ns", FluxCd, Some(&release));
        assert_eq!(w.unsuspend, Some(("ns".into(), "iam".into())));
        let update = w.update.expect("update");
        assert_eq!(
            update.patch,
            TargetPatch::Merge(
                json!({"spec": {"chart": {"spec": {"version": "2.0.0"}}, "suspend": false}})
            )
        );
        assert_eq!(
            update.object,
            json!({"metadata": {"name": "iam"}, "spec": {"suspend": false,
                "chart": {"spec": {"chart": "iam", "version": "2.0.0"}}}})
        );
        // Once the release says so, nothing is written to it.
        let w = writes(&r, "ns", FluxCd, Some(&update.object));
        assert!(w.update.is_none());
    }

    #[test]
    fn image_resources_set_release_values_once() {
        let r = ocm(
            "pg-image",
            json!({"repo": "oci", "artifact": "image", "for": "db", "path": "postgresql.image.tag",
                "unsuspend": "true"}),
            json!({"resource": {"version": "v2"}}),
        );
        let w = writes(&r, "ns", FluxCd, None);
        assert!(
            w.image.is_none(),
            "nothing is recorded for a release that is not there"
        );
        assert!(matches!(
            w.outcome,
            Outcome::Failed(ResourceError::NoTarget { .. })
        ));
        let release = json!({"spec": {"suspend": true, "values": {"postgresql": {"auth": "x"}}}});
        let w = writes(&r, "ns", FluxCd, Some(&release));
        assert_eq!(
            w.image,
            Some(ImageVersion {
                release: ("ns".into(), "db".into()),
                path: "postgresql.image.tag".into(),
                version: "v2".into()
            })
        );
        let update = w.update.expect("update");
        assert_eq!(
            update.object,
            json!({"spec": {"suspend": false,
                "values": {"postgresql": {"auth": "x", "image": {"tag": "v2"}}}}})
        );
        let w = writes(&r, "ns", FluxCd, Some(&update.object));
        assert!(w.update.is_none() && w.image.is_some());
    }

    #[test]
    fn argo_applications_get_their_source_and_image_versions() {
        let chart = ocm(
            "iam-chart",
            json!({"repo": "oci", "artifact": "chart"}),
            oci_chart_status(),
        );
        assert_eq!(
            target_of_resource(&chart, "ns", ArgoCd).map(|t| t.to_string()),
            Some("Application ns/iam".to_string())
        );
        let app = json!({"metadata": {"name": "iam", "namespace": "ns"}, "spec": {"source": {
            "chart": "iam", "repoURL": PLACEHOLDER, "targetRevision": PLACEHOLDER,
            "helm": {"values": "a: 1\n"}}}});
        let w = writes(&chart, "ns", ArgoCd, Some(&app));
        assert!(w.source.is_none());
        let update = w.update.expect("update");
        assert!(matches!(&update.patch, TargetPatch::Apply { manager, .. }
                if manager == "platform-mesh-resource-iam-chart"));
        assert_eq!(
            update.object["spec"]["source"]["repoURL"],
            "ghcr.io/pm/charts"
        );
        assert_eq!(update.object["spec"]["source"]["targetRevision"], "1.0.0");
        assert_eq!(update.object["spec"]["source"]["chart"], "iam");
        assert!(writes(&chart, "ns", ArgoCd, Some(&update.object))
            .update
            .is_none());

        let image = ocm(
            "iam-image",
            json!({"repo": "oci", "artifact": "image"}),
            json!({"resource": {"version": "v3"}}),
        );
        let w = writes(&image, "ns", ArgoCd, Some(&update.object));
        let values = w.update.expect("values").object["spec"]["source"]["helm"]["values"]
            .as_str()
            .expect("text")
            .to_string();
        assert_eq!(
            parse_yaml(&values).expect("yaml"),
            json!({"a": 1, "image": {"tag": "v3"}})
        );
        let bad = json!({"spec": {"source": {"helm": {"values": "a: [\n"}}}});
        let w = writes(&image, "ns", ArgoCd, Some(&bad));
        assert!(matches!(
            w.outcome,
            Outcome::Failed(ResourceError::Values { .. })
        ));
        let unresolved = ocm("iam-chart", json!({"artifact": "chart"}), json!({}));
        assert!(matches!(
            writes(&unresolved, "ns", ArgoCd, Some(&app)).outcome,
            Outcome::Failed(ResourceError::Incomplete { .. })
        ));
    }

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
