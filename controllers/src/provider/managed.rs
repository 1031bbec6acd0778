//! The ManagedProvider controller: how the platform team onboards a platform-owned service. A
//! ManagedProvider (namespaced, next to its PlatformMesh in the runtime cluster) waits for the
//! PlatformMesh, creates or adopts a Provider in kcp (`spec.provider`, default
//! `root:providers:system`/`<name>`), waits for it, copies the Provider's kubeconfig Secret into
//! the runtime cluster and deploys the service's runtime components with Flux (an OCIRepository
//! or HelmRepository plus a HelmRelease each, or OCM Repository/Component/Resource first).
//!
//! Differences from upstream, on purpose: the copied Secret is removed from the cluster it was
//! copied to (upstream deletes it from the local cluster even when it went to a remote runtime);
//! HelmReleases, OCIRepositories and OCM Resources it deploys wake it up when they change
//! (owner references), so it does not wait for a timed requeue.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use api::providers::{
    ChartSourceType, FluxComponent, ManagedProviderSpec, OcmComponent, ProviderComponentSpec,
};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{json, Value};

use super::{
    ensure, ensure_written, providers, secret_text, stop, ProviderReconcileError, OWNED_STATUS,
};
use crate::kcp::Kcp;
use crate::objects::platform_meshes;
use crate::objects::{api_resource, condition_true};
use crate::oci::oci_url;
use crate::runtime::mapping::owner_requests;
use crate::runtime::{
    Action, ClusterContext, ClusterName, Controller, Reconciler, Request, ResourceKind,
};
use crate::subroutines::{drive_with_status, Lifecycle, StatusFields, Step, Subroutine};

/// The controller's name.
pub const CONTROLLER: &str = "ManagedProviderReconciler";
/// Held (only with `cleanupOnDelete`) until the kcp Provider is deleted.
pub const PROVIDER_FINALIZER: &str = "providers.platform-mesh.io/provider-resource";
/// Held until the copied kubeconfig Secret is deleted.
pub const KUBECONFIG_FINALIZER: &str = "providers.platform-mesh.io/kubeconfig-secret";
/// Held until the runtime deployments are deleted.
pub const DEPLOY_FINALIZER: &str = "providers.platform-mesh.io/runtime-deployments";
/// The default workspace of the Provider.
pub const DEFAULT_PROVIDER_PATH: &str = "root:providers:system";

/// ManagedProvider phases.
pub mod phase {
    /// Nothing done yet.
    pub const PENDING: &str = "Pending";
    /// The PlatformMesh is not Ready.
    pub const WAITING_FOR_PLATFORM_MESH: &str = "WaitingForPlatformMesh";
    /// The Provider is not Ready.
    pub const WAITING_FOR_PROVIDER: &str = "WaitingForProvider";
    /// The kubeconfig is not there yet.
    pub const COPYING_KUBECONFIG: &str = "CopyingKubeconfig";
    /// The Provider writes its kubeconfig elsewhere than this ManagedProvider asks.
    pub const COPYING_KUBECONFIG_FAILED: &str = "CopyingKubeconfigFailed";
    /// Runtime components are not Ready yet.
    pub const DEPLOYING: &str = "Deploying";
    /// Everything is Ready.
    pub const READY: &str = "Ready";
    /// Being deleted.
    pub const DELETING: &str = "Deleting";
}

/// `providers.platform-mesh.io/v1alpha1` ManagedProvider (namespaced).
pub fn managed_providers() -> ApiResource {
    api_resource(
        "providers.platform-mesh.io",
        "v1alpha1",
        "ManagedProvider",
        "managedproviders",
    )
}

fn flux_source(kind: &str, plural: &str) -> ApiResource {
    api_resource("source.toolkit.fluxcd.io", "v1", kind, plural)
}

/// `helm.toolkit.fluxcd.io/v2` HelmRelease.
pub fn helm_releases() -> ApiResource {
    api_resource(
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    )
}

/// `source.toolkit.fluxcd.io/v1` OCIRepository.
pub fn oci_repositories() -> ApiResource {
    flux_source("OCIRepository", "ocirepositories")
}

/// `source.toolkit.fluxcd.io/v1` HelmRepository.
pub fn helm_repositories() -> ApiResource {
    flux_source("HelmRepository", "helmrepositories")
}

/// `delivery.ocm.software/v1alpha1` kinds: Repository, Component, Resource.
pub fn ocm(kind: &str) -> ApiResource {
    let plural = match kind {
        "Repository" => "repositories".to_string(),
        other => format!("{}s", other.to_lowercase()),
    };
    api_resource("delivery.ocm.software", "v1alpha1", kind, &plural)
}

/// What a step of a ManagedProvider sees and reports.
pub struct ManagedContext {
    /// The ManagedProvider as read at the start of the reconcile.
    pub object: DynamicObject,
    /// Its decoded spec.
    pub spec: ManagedProviderSpec,
    /// A client of the cluster holding it (where its deployments go).
    pub client: kube::Client,
    /// kcp access.
    pub kcp: Arc<Kcp>,
    /// `status.phase` and `status.providerKubeconfigSecretRef` as the steps leave them.
    pub status: StatusFields,
}

impl ManagedContext {
    fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.object
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
    }

    /// The Provider's workspace path and name.
    pub fn provider_ref(&self) -> (String, String) {
        match &self.spec.provider {
            Some(p) => (p.path.clone(), p.name.clone()),
            None => (DEFAULT_PROVIDER_PATH.to_string(), self.name().to_string()),
        }
    }

    /// The Provider's `spec.providerKubeconfigSecret` this ManagedProvider asks for.
    pub fn kubeconfig_secret(&self) -> Value {
        let s = self.spec.provider_kubeconfig_secret.as_ref();
        let name = s
            .map(|s| s.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("{}-provider-kubeconfig", self.name()));
        let key = s
            .map(|s| s.key.clone())
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "kubeconfig".into());
        json!({"name": name, "namespace": self.namespace(), "key": key})
    }

    fn provider_api(&self) -> Api<DynamicObject> {
        let (path, _) = self.provider_ref();
        Api::all_with(self.kcp.workspace(&path), &providers())
    }

    fn local(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), self.namespace(), ar)
    }

    fn cleanup_on_delete(&self) -> bool {
        self.spec.cleanup_on_delete.unwrap_or(false)
    }

    /// The owner reference deployed objects carry.
    fn owner(&self) -> Value {
        json!({"apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "ManagedProvider",
               "name": self.name(), "uid": self.object.metadata.uid.clone().unwrap_or_default(),
               "controller": true})
    }

    /// A client of the cluster receiving the kubeconfig copy: the remote runtime named by
    /// `runtimeKubeconfigSecretName`, or this cluster.
    async fn runtime_target(&self) -> Result<kube::Client, ProviderReconcileError> {
        let Some(secret) = self
            .spec
            .runtime_kubeconfig_secret_name
            .as_deref()
            .filter(|s| !s.is_empty())
        else {
            return Ok(self.client.clone());
        };
        let s = self
            .local(&api_resource("", "v1", "Secret", "secrets"))
            .get(secret)
            .await
            .map_err(|source| ProviderReconcileError::RuntimeSecret {
                secret: secret.to_string(),
                source,
            })?;
        let text = secret_text(&s.data["data"], "kubeconfig").ok_or_else(|| {
            ProviderReconcileError::RuntimeSecretKey {
                secret: secret.to_string(),
            }
        })?;
        let invalid = |source| ProviderReconcileError::RuntimeKubeconfig {
            secret: secret.to_string(),
            source,
        };
        let kc = Kubeconfig::from_yaml(&text).map_err(invalid)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(invalid)?;
        kube::Client::try_from(config).map_err(ProviderReconcileError::RuntimeClient)
    }
}

/// `WaitPlatformMeshSubroutine`: the PlatformMesh named in `spec.platformMeshRef` is Ready.
pub struct WaitPlatformMesh;

#[async_trait::async_trait]
impl Subroutine<ManagedContext, ProviderReconcileError> for WaitPlatformMesh {
    fn name(&self) -> &'static str {
        "WaitPlatformMeshSubroutine"
    }

    async fn process(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.start_phase(phase::PENDING);
        let name = &ctx.spec.platform_mesh_ref.name;
        let pm = ctx
            .local(&platform_meshes())
            .get_opt(name)
            .await
            .map_err(|e| ProviderReconcileError::kube(format!("getting PlatformMesh {name}"), e))?;
        if !pm.is_some_and(|p| condition_true(&p.data, "Ready")) {
            ctx.status.set_phase(phase::WAITING_FOR_PLATFORM_MESH);
            return Ok(stop(format!("Waiting for PlatformMesh {name} to be Ready")));
        }
        Ok(Step::done())
    }
}

/// `ProviderResourceSubroutine`: the kcp Provider, created or adopted.
pub struct ProviderResource;

#[async_trait::async_trait]
impl Subroutine<ManagedContext, ProviderReconcileError> for ProviderResource {
    fn name(&self) -> &'static str {
        "ProviderResourceSubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[PROVIDER_FINALIZER]
    }

    fn finalizers_for(&self, ctx: &ManagedContext) -> &'static [&'static str] {
        if ctx.cleanup_on_delete() {
            &[PROVIDER_FINALIZER]
        } else {
            &[]
        }
    }

    async fn process(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        let (_, name) = ctx.provider_ref();
        let mut spec = json!({"providerKubeconfigSecret": ctx.kubeconfig_secret()});
        if let Some(h) = ctx
            .spec
            .provider_host_override
            .as_deref()
            .filter(|h| !h.is_empty())
        {
            spec["hostOverride"] = json!(h);
        }
        ensure(
            &ctx.provider_api(),
            json!({"apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "Provider",
                   "metadata": {"name": name}, "spec": spec}),
            |stored| {
                let mut want = stored.data["spec"].clone();
                if !want.is_object() {
                    want = json!({});
                }
                want["providerKubeconfigSecret"] = spec["providerKubeconfigSecret"].clone();
                match spec.get("hostOverride") {
                    Some(h) => want["hostOverride"] = h.clone(),
                    None => {
                        if let Some(m) = want.as_object_mut() {
                            m.remove("hostOverride");
                        }
                    }
                }
                (want != stored.data["spec"]).then(|| {
                    let mut s = stored.clone();
                    s.data["spec"] = want;
                    s
                })
            },
        )
        .await?;
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        if !ctx.cleanup_on_delete() {
            return Ok(Step::done());
        }
        ctx.status.set_phase(phase::DELETING);
        let (path, name) = ctx.provider_ref();
        match ctx
            .provider_api()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(stop("Waiting for the Provider to be deleted")),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Step::done()),
            Err(e) => Err(ProviderReconcileError::kube(
                format!("deleting Provider {path}:{name}"),
                e,
            )),
        }
    }
}

/// `WaitProviderSubroutine`: the Provider's phase is Ready.
pub struct WaitProvider;

#[async_trait::async_trait]
impl Subroutine<ManagedContext, ProviderReconcileError> for WaitProvider {
    fn name(&self) -> &'static str {
        "WaitProviderSubroutine"
    }

    async fn process(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        let (path, name) = ctx.provider_ref();
        let p = ctx.provider_api().get_opt(&name).await.map_err(|e| {
            ProviderReconcileError::kube(format!("getting Provider {path}:{name}"), e)
        })?;
        if !p.is_some_and(|p| p.data["status"]["phase"] == "Ready") {
            ctx.status.set_phase(phase::WAITING_FOR_PROVIDER);
            return Ok(stop(format!(
                "Waiting for Provider {path}:{name} to be Ready"
            )));
        }
        Ok(Step::done())
    }
}

/// `KubeconfigCopySubroutine`: the Provider's kubeconfig Secret, copied from kcp into the
/// runtime cluster (same name, this namespace).
pub struct KubeconfigCopy;

#[async_trait::async_trait]
impl Subroutine<ManagedContext, ProviderReconcileError> for KubeconfigCopy {
    fn name(&self) -> &'static str {
        "KubeconfigCopySubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[KUBECONFIG_FINALIZER]
    }

    async fn process(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        let (path, name) = ctx.provider_ref();
        let p = ctx.provider_api().get(&name).await.map_err(|e| {
            ProviderReconcileError::kube(format!("getting Provider {path}:{name}"), e)
        })?;
        let reference = &p.data["status"]["providerKubeconfigSecretRef"];
        let (Some(secret), Some(ns)) =
            (reference["name"].as_str(), reference["namespace"].as_str())
        else {
            ctx.status.set_phase(phase::COPYING_KUBECONFIG);
            return Ok(stop("Waiting for the Provider's kubeconfig Secret"));
        };
        let wanted = ctx.kubeconfig_secret();
        if p.data["spec"]["providerKubeconfigSecret"] != wanted {
            ctx.status.set_phase(phase::COPYING_KUBECONFIG_FAILED);
            return Ok(stop(format!(
                "the Provider's providerKubeconfigSecret {} differs from the expected {wanted}",
                p.data["spec"]["providerKubeconfigSecret"]
            )));
        }
        let key = wanted["key"].as_str().unwrap_or("kubeconfig");
        let source = Api::<DynamicObject>::namespaced_with(
            ctx.kcp.workspace(&path),
            ns,
            &api_resource("", "v1", "Secret", "secrets"),
        )
        .get_opt(secret)
        .await
        .map_err(|e| {
            ProviderReconcileError::kube(format!("getting Secret {path}:{ns}/{secret}"), e)
        })?;
        let Some(value) = source.and_then(|s| s.data["data"][key].as_str().map(str::to_string))
        else {
            ctx.status.set_phase(phase::COPYING_KUBECONFIG);
            return Ok(stop(format!(
                "Secret {path}:{ns}/{secret} has no {key} yet"
            )));
        };
        let target = ctx.runtime_target().await?;
        ensure(
            &Api::all_with(
                target.clone(),
                &api_resource("", "v1", "Namespace", "namespaces"),
            ),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ctx.namespace()}}),
            |_| None,
        )
        .await?;
        let data = json!({ key: value });
        ensure(
            &Api::namespaced_with(
                target,
                ctx.namespace(),
                &api_resource("", "v1", "Secret", "secrets"),
            ),
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": secret, "namespace": ctx.namespace()}, "data": data}),
            |stored| {
                (stored.data["data"] != data).then(|| {
                    let mut s = stored.clone();
                    s.data["data"] = data.clone();
                    s
                })
            },
        )
        .await?;
        ctx.status.set(
            "providerKubeconfigSecretRef",
            json!({"name": secret, "namespace": ctx.namespace()}),
        );
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        let reference = ctx.status.get("providerKubeconfigSecretRef");
        let Some(name) = reference["name"].as_str() else {
            return Ok(Step::done());
        };
        ctx.status.set_phase(phase::DELETING);
        let target = match ctx.runtime_target().await {
            Ok(t) => t,
            // The remote runtime is unreachable for good (its kubeconfig is gone): nothing
            // left to delete it with.
            Err(e) => {
                tracing::warn!(managedprovider = ctx.name(), error = %e, "the copied kubeconfig Secret is left behind");
                return Ok(Step::done());
            }
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            target,
            ctx.namespace(),
            &api_resource("", "v1", "Secret", "secrets"),
        );
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(Step::done()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Step::done()),
            Err(e) => Err(ProviderReconcileError::kube(
                format!("deleting Secret {name}"),
                e,
            )),
        }
    }
}

/// The objects one runtime deployment is made of, by kind, in deletion order.
fn component_objects(c: &ProviderComponentSpec) -> Option<(String, Vec<ApiResource>)> {
    if let Some(f) = &c.flux {
        let (name, source) = flux_name(f);
        return Some((name, vec![helm_releases(), source]));
    }
    let o = c.ocm.as_ref()?;
    Some((
        ocm_name(o),
        vec![
            helm_releases(),
            oci_repositories(),
            ocm("Resource"),
            ocm("Component"),
            ocm("Repository"),
        ],
    ))
}

/// A Flux component's name and source kind: the last path segment of the chart (OCI), or the
/// chart name (Helm repository).
fn flux_name(f: &FluxComponent) -> (String, ApiResource) {
    match f.type_.unwrap_or_default() {
        ChartSourceType::Oci => (
            f.chart.rsplit('/').next().unwrap_or(&f.chart).to_string(),
            oci_repositories(),
        ),
        ChartSourceType::Helm => (f.chart.clone(), helm_repositories()),
    }
}

/// An OCM component's deployment name: `name`, else the resource name unless it is `chart`,
/// else the last reference path element, else the last segment of the component.
pub fn ocm_name(o: &OcmComponent) -> String {
    if let Some(n) = o.name.as_deref().filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    if let Some(r) = o
        .resource_name
        .as_deref()
        .filter(|r| !r.is_empty() && *r != "chart")
    {
        return r.to_string();
    }
    if let Some(last) = o.reference_path.as_ref().and_then(|p| p.last()) {
        return last.name.clone();
    }
    o.component
        .rsplit('/')
        .next()
        .unwrap_or(&o.component)
        .to_string()
}

/// Writes one object of a deployment, owned by the ManagedProvider; the spec (and labels) are
/// updated when they differ. Returns the stored object and whether it was written.
async fn put(
    ctx: &ManagedContext,
    ar: &ApiResource,
    name: &str,
    labels: Value,
    spec: Value,
) -> Result<(DynamicObject, bool), ProviderReconcileError> {
    let mut meta =
        json!({"name": name, "namespace": ctx.namespace(), "ownerReferences": [ctx.owner()]});
    if labels.is_object() {
        meta["labels"] = labels.clone();
    }
    ensure_written(
        &ctx.local(ar),
        json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": meta, "spec": spec}),
        |stored| {
            let mut s = stored.clone();
            let mut changed = stored.data["spec"] != spec;
            s.data["spec"] = spec.clone();
            if let Some(l) = labels.as_object() {
                let have = s.metadata.labels.get_or_insert_with(Default::default);
                for (k, v) in l {
                    let v = v.as_str().unwrap_or_default().to_string();
                    if have.get(k) != Some(&v) {
                        have.insert(k.clone(), v);
                        changed = true;
                    }
                }
            }
            changed.then_some(s)
        },
    )
    .await
    .map_err(Into::into)
}

/// The HelmRelease's `kubeConfig` when the components go to a remote runtime.
fn kube_config(ctx: &ManagedContext) -> Option<Value> {
    ctx.spec
        .runtime_kubeconfig_secret_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| json!({"secretRef": {"name": s, "key": "kubeconfig"}}))
}

fn release_spec(ctx: &ManagedContext, chart: Value, values: &Option<Value>) -> Value {
    let mut spec = json!({"interval": "5m"});
    for (k, v) in chart.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    if let Some(kc) = kube_config(ctx) {
        spec["kubeConfig"] = kc;
    }
    if let Some(v) = values.as_ref().filter(|v| !v.is_null()) {
        spec["values"] = v.clone();
    }
    spec
}

/// An OCIRepository and a HelmRelease for the chart at `url`; whether both are in place and
/// Ready.
async fn deploy_oci(
    ctx: &ManagedContext,
    name: &str,
    url: String,
    version: &str,
    insecure: bool,
    values: &Option<Value>,
) -> Result<bool, ProviderReconcileError> {
    let mut source = json!({"url": url, "ref": {"tag": version}, "provider": "generic",
        "interval": "1m0s",
        "layerSelector": {"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "operation": "copy"}});
    if insecure {
        source["insecure"] = json!(true);
    }
    let (repo, wrote_repo) = put(ctx, &oci_repositories(), name, Value::Null, source).await?;
    let chart =
        json!({"chartRef": {"kind": "OCIRepository", "name": name, "namespace": ctx.namespace()}});
    let (release, wrote_release) = put(
        ctx,
        &helm_releases(),
        name,
        Value::Null,
        release_spec(ctx, chart, values),
    )
    .await?;
    let observed = repo.data["status"]["observedGeneration"].as_i64();
    Ok(!wrote_repo
        && !wrote_release
        && observed == repo.metadata.generation
        && condition_true(&release.data, "Ready"))
}

/// Deploys one component; whether it is Ready.
async fn deploy_component(
    ctx: &ManagedContext,
    c: &ProviderComponentSpec,
) -> Result<bool, ProviderReconcileError> {
    if let Some(f) = &c.flux {
        let (name, _) = flux_name(f);
        let insecure = f.insecure.unwrap_or(false);
        return match f.type_.unwrap_or_default() {
            ChartSourceType::Oci => {
                let url = format!("oci://{}/{}", f.registry.trim_end_matches('/'), f.chart);
                deploy_oci(ctx, &name, url, &f.version, insecure, &f.values).await
            }
            ChartSourceType::Helm => {
                let mut source = json!({"url": f.registry, "interval": "5m"});
                if insecure {
                    source["insecure"] = json!(true);
                }
                let (_, wrote_repo) =
                    put(ctx, &helm_repositories(), &name, Value::Null, source).await?;
                let chart = json!({"chart": {"spec": {"chart": f.chart, "version": f.version,
                    "sourceRef": {"kind": "HelmRepository", "name": name, "namespace": ctx.namespace()}}}});
                let (release, wrote_release) = put(
                    ctx,
                    &helm_releases(),
                    &name,
                    Value::Null,
                    release_spec(ctx, chart, &f.values),
                )
                .await?;
                Ok(!wrote_repo && !wrote_release && condition_true(&release.data, "Ready"))
            }
        };
    }
    let Some(o) = &c.ocm else {
        return Ok(true);
    };
    let name = ocm_name(o);
    let (base, sub) = match o.registry.split_once('/') {
        Some((b, s)) => (b.to_string(), s.to_string()),
        None => (o.registry.clone(), String::new()),
    };
    let ocm_config = json!([{"apiVersion": "delivery.ocm.software/v1alpha1", "kind": "Repository",
        "name": name, "namespace": ctx.namespace(), "policy": "Propagate"}]);
    let mut repo_spec = json!({"type": "OCIRegistry", "baseUrl": base});
    if !sub.is_empty() {
        repo_spec["subPath"] = json!(sub);
    }
    let (_, a) = put(
        ctx,
        &ocm("Repository"),
        &name,
        Value::Null,
        json!({"interval": "1m0s", "repositorySpec": repo_spec}),
    )
    .await?;
    let (_, b) = put(ctx, &ocm("Component"), &name, Value::Null,
        json!({"component": o.component, "semver": o.version, "interval": "1m0s",
               "downgradePolicy": "Deny", "repositoryRef": {"name": name}, "ocmConfig": ocm_config})).await?;
    let mut by_reference = json!({"resource": {"name": o.resource_name.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| "chart".into())}});
    if let Some(path) = o.reference_path.as_ref().filter(|p| !p.is_empty()) {
        by_reference["referencePath"] = json!(path
            .iter()
            .map(|p| json!({"name": p.name}))
            .collect::<Vec<_>>());
    }
    let (resource, c) = put(ctx, &ocm("Resource"), &name, json!({"artifact": "chart", "repo": "oci"}),
        json!({"componentRef": {"name": name}, "resource": {"byReference": by_reference}, "ocmConfig": ocm_config})).await?;
    if a || b || c {
        return Ok(false);
    }
    let r = &resource.data["status"]["resource"];
    let image = r["access"]["imageReference"]
        .as_str()
        .or(r["imageReference"].as_str());
    let (Some(image), Some(version)) = (image, r["version"].as_str()) else {
        return Ok(false);
    };
    deploy_oci(
        ctx,
        &name,
        oci_url(image),
        version,
        o.insecure.unwrap_or(false),
        &o.values,
    )
    .await
}

/// `DeploySubroutine`: the runtime components, with Flux (through OCM when asked), Ready when
/// every HelmRelease is.
pub struct Deploy;

#[async_trait::async_trait]
impl Subroutine<ManagedContext, ProviderReconcileError> for Deploy {
    fn name(&self) -> &'static str {
        "DeploySubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[DEPLOY_FINALIZER]
    }

    async fn process(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        let mut waiting = Vec::new();
        for c in &ctx.spec.runtime_deployments {
            if !deploy_component(ctx, c).await? {
                waiting.push(component_objects(c).map(|(n, _)| n).unwrap_or_default());
            }
        }
        if !waiting.is_empty() {
            ctx.status.set_phase(phase::DEPLOYING);
            return Ok(stop(format!(
                "Waiting for {} to be Ready",
                waiting.join(", ")
            )));
        }
        ctx.status.set_phase(phase::READY);
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &ManagedContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.set_phase(phase::DELETING);
        let mut present = false;
        for c in &ctx.spec.runtime_deployments {
            let Some((name, kinds)) = component_objects(c) else {
                continue;
            };
            for ar in kinds {
                match ctx.local(&ar).delete(&name, &DeleteParams::default()).await {
                    Ok(_) => present = true,
                    // Gone, or the kind is not served at all.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(ProviderReconcileError::kube(
                            format!("deleting {} {name}", ar.kind),
                            e,
                        ))
                    }
                }
            }
        }
        if present {
            return Ok(stop("Waiting for the runtime deployments to be deleted"));
        }
        Ok(Step::done())
    }
}

/// The steps of a ManagedProvider, in order (reversed on deletion).
pub fn lifecycle() -> Lifecycle<ManagedContext, ProviderReconcileError> {
    Lifecycle::new()
        .step(WaitPlatformMesh)
        .step(ProviderResource)
        .step(WaitProvider)
        .step(KubeconfigCopy)
        .step(Deploy)
}

/// Which ManagedProviders wait for which PlatformMesh, learnt at each reconcile.
#[derive(Clone, Default)]
struct WaitIndex(Arc<RwLock<HashMap<PlatformMeshKey, BTreeSet<Request>>>>);

/// A PlatformMesh by cluster, namespace and name.
type PlatformMeshKey = (ClusterName, String, String);

impl WaitIndex {
    fn record(&self, cluster: &ClusterName, ns: &str, pm: &str, req: &Request) {
        let mut m = self.0.write().unwrap_or_else(|p| p.into_inner());
        for reqs in m.values_mut() {
            reqs.remove(req);
        }
        m.retain(|_, r| !r.is_empty());
        m.entry((cluster.clone(), ns.to_string(), pm.to_string()))
            .or_default()
            .insert(req.clone());
    }

    fn requests(&self, cluster: &ClusterName, obj: &DynamicObject) -> Vec<Request> {
        let key = (
            cluster.clone(),
            obj.metadata.namespace.clone().unwrap_or_default(),
            obj.metadata.name.clone().unwrap_or_default(),
        );
        let m = self.0.read().unwrap_or_else(|p| p.into_inner());
        m.get(&key)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Reconciles ManagedProviders.
pub struct ManagedProviderReconciler {
    lifecycle: Lifecycle<ManagedContext, ProviderReconcileError>,
    kcp: Arc<Kcp>,
    waits: WaitIndex,
}

impl Reconciler for ManagedProviderReconciler {
    type Error = ProviderReconcileError;

    async fn reconcile(
        &self,
        req: Request,
        ctx: ClusterContext,
    ) -> Result<Action, ProviderReconcileError> {
        let api = ctx
            .cluster()
            .dynamic_api(&managed_providers(), req.namespace.as_deref());
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(obj) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        let spec: ManagedProviderSpec = match serde_json::from_value(obj.data["spec"].clone()) {
            Ok(s) => s,
            // A spec that does not decode cannot get better by retrying; it waits for an edit.
            Err(e) => {
                tracing::warn!(managedprovider = %req, error = %e, "not reconciled");
                return Ok(Action::await_change());
            }
        };
        self.waits.record(
            ctx.cluster_name(),
            req.namespace.as_deref().unwrap_or_default(),
            &spec.platform_mesh_ref.name,
            &req,
        );
        let context = ManagedContext {
            status: StatusFields::stored(&obj, OWNED_STATUS),
            object: obj.clone(),
            spec,
            client: ctx.client(),
            kcp: self.kcp.clone(),
        };
        let result = drive_with_status(&self.lifecycle, &api, &obj, &context, |c| {
            c.status.snapshot()
        })
        .await;
        match result {
            Ok(Some(after)) => Ok(Action::requeue_after(after)),
            Ok(None) => Ok(Action::await_change()),
            Err(e) => Err(e.flatten()),
        }
    }
}

/// The ManagedProvider controller: ManagedProviders of the engaged (runtime) clusters, woken
/// also by their PlatformMesh and the Flux and OCM objects they own.
pub fn controller(kcp: Arc<Kcp>, workers: usize) -> Controller<ManagedProviderReconciler> {
    let waits = WaitIndex::default();
    let index = waits.clone();
    let owner = ResourceKind::dynamic(managed_providers(), true);
    let mut c = Controller::new(
        CONTROLLER,
        ManagedProviderReconciler {
            lifecycle: lifecycle(),
            kcp,
            waits,
        },
    )
    .for_kind(owner.clone())
    .watches_kind(
        ResourceKind::dynamic(platform_meshes(), true),
        Arc::new(move |cluster, obj| index.requests(cluster, obj)),
    );
    for ar in [helm_releases(), oci_repositories(), ocm("Resource")] {
        let owner = owner.clone();
        c = c.watches_kind(
            ResourceKind::dynamic(ar, true),
            Arc::new(move |cluster, obj| owner_requests(cluster, obj, &owner)),
        );
    }
    c.workers(workers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::providers::OcmReferencePathElement;

    fn ocm_component(name: Option<&str>, resource: Option<&str>, path: &[&str]) -> OcmComponent {
        OcmComponent {
            component: "github.com/platform-mesh/provider-quickstart".into(),
            insecure: None,
            name: name.map(str::to_string),
            reference_path: (!path.is_empty()).then(|| {
                path.iter()
                    .map(|p| OcmReferencePathElement {
                        name: p.to_string(),
                    })
                    .collect()
            }),
            registry: "ghcr.io/platform-mesh".into(),
            resource_name: resource.map(str::to_string),
            values: None,
            version: "0.1.0".into(),
        }
    }

    #[test]
    fn ocm_deployment_names_follow_upstreams_order() {
        assert_eq!(
            ocm_name(&ocm_component(Some("mine"), Some("x"), &["p"])),
            "mine"
        );
        assert_eq!(
            ocm_name(&ocm_component(None, Some("operator"), &["p"])),
            "operator"
        );
        assert_eq!(
            ocm_name(&ocm_component(None, Some("chart"), &["a", "b"])),
            "b"
        );
        assert_eq!(
            ocm_name(&ocm_component(None, None, &[])),
            "provider-quickstart"
        );
    }
}
