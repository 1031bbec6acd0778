//! Staging workspaces: how the broker reaches providers on kcp without entering their
//! workspaces (as upstream's kcp variant since its staging-workspace rework).
//!
//! A provider publishes its API as an APIExport of its own workspace and names it on each
//! AcceptAPI (annotation [`APIEXPORT_ANNOTATION`]); it lets the broker `bind` that export.
//! For each consumer and provider the broker makes one workspace under its tree root (a
//! workspace it may create workspaces in, by default the platform workspace), named
//! `staging-<h(consumer)>-<h(provider)>-<h(export)>` with h the 12-hex [`cluster_hash`], binds the
//! provider's export there (APIBinding [`BINDING`], every permission claim of the export
//! accepted) and writes the provider copies into it. As creator the broker owns the workspace;
//! the provider sees the copies, and writes their related resources, through its export's
//! virtual workspace, as any kcp service provider does. The broker never enters a provider's
//! or a consumer's workspace.
//!
//! The binding references the export by the provider's logical cluster, so an AcceptAPI can
//! only make the broker bind an export of the provider's own workspace.
//!
//! A staging workspace goes once the last copy in it is gone, as upstream's does once nothing in
//! it is tracked: every write of a copy holds a [`StagingUse`] of its workspace, and a workspace
//! is only closed (then listed, and deleted when empty) while nothing uses it; a reconcile that
//! finds it closing waits and makes it again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use api::broker::GroupVersionResource;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{cluster_hash, BrokerError};
use crate::kcp::workspaces;
use crate::runtime::client::cluster_prefix;
use crate::runtime::{Cluster, ClusterName, ClusterProvider, ClusterSink, ProviderError};

/// AcceptAPI annotation: the provider's APIExport (in its own workspace) serving the API.
pub const APIEXPORT_ANNOTATION: &str = "broker.platform-mesh.io/kcp-apiexport-name";
/// Label on the broker's staging workspaces.
pub const STAGING_LABEL: &str = "broker.platform-mesh.io/staging";
/// Staging workspace annotation: the consumer's logical cluster.
pub const CONSUMER_ANNOTATION: &str = "broker.platform-mesh.io/consumer-cluster";
/// Staging workspace annotation: the provider's logical cluster.
pub const PROVIDER_ANNOTATION: &str = "broker.platform-mesh.io/provider-cluster";
/// Staging workspace annotation: the provider's APIExport.
pub const EXPORT_ANNOTATION: &str = "broker.platform-mesh.io/api-export";
/// The APIBinding of the provider's export in a staging workspace.
pub const BINDING: &str = "staging";

/// The staging workspace of a consumer, a provider (logical cluster names) and the provider's
/// export.
///
/// ```
/// use controllers::broker::staging::staging_name;
/// assert_eq!(staging_name("abc", "def", "certificates"), "staging-ba7816bf8f01-cb8379ac2098-f78c06aa55a0");
/// ```
pub fn staging_name(consumer: &str, provider: &str, export: &str) -> String {
    format!(
        "staging-{}-{}-{}",
        cluster_hash(consumer),
        cluster_hash(provider),
        cluster_hash(export)
    )
}

/// Whether `name` can name an APIExport (a DNS-1123 subdomain).
pub fn valid_export_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// What a staging workspace is for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    consumer: String,
    provider: String,
    export: String,
}

/// An AcceptAPI, by provider cluster, namespace and name.
type Origin = (ClusterName, String, String);

/// How long a staging workspace stays after it was last written to or made ready before the
/// sweep may delete it when empty (copies whose deletion the broker did not see to the end,
/// such as those a provider's finalizer held).
const SWEEP_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The first pause before a close that could not decide is tried again.
const CLOSE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest pause between such tries.
const CLOSE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Who uses a staging workspace right now.
#[derive(Default)]
struct Usage {
    /// Writes of copies in flight.
    writers: usize,
    /// Being checked for emptiness (and deleted when empty): no new writers.
    closing: bool,
}

/// A write of a copy into a staging workspace, in flight: the workspace is not deleted while
/// one exists.
pub struct StagingUse {
    staging: Arc<Staging>,
    name: String,
}

impl Drop for StagingUse {
    fn drop(&mut self) {
        let mut usage = lock(&self.staging.usage);
        if let Some(u) = usage.get_mut(&self.name) {
            u.writers = u.writers.saturating_sub(1);
            if u.writers == 0 && !u.closing {
                usage.remove(&self.name);
            }
        }
    }
}

/// The broker's staging workspaces: plans them, makes and binds them, and engages the ready ones
/// as the clusters provider copies are written to.
pub struct Staging {
    root: kube::Client,
    tree_root: String,
    exports: Mutex<BTreeMap<Origin, (GroupVersionResource, String)>>,
    plans: Mutex<BTreeMap<String, Plan>>,
    engaged: Mutex<BTreeMap<ClusterName, Arc<Cluster>>>,
    sink: Mutex<Option<ClusterSink>>,
    usage: Mutex<BTreeMap<String, Usage>>,
    /// When each engaged staging workspace was last made ready or written to.
    touched: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Closes that could not decide (a copy was being written, another close ran, a request
    /// failed): when to try again, and the pause after that.
    retries: Mutex<BTreeMap<String, (std::time::Instant, std::time::Duration)>>,
    /// The brokered kinds, whose copies a staging workspace holds.
    kinds: Vec<ApiResource>,
}

/// APIBindings as v1alpha2, whose claims carry verbs: an acceptance must name the verbs the
/// export asks for (kcp allows the intersection of both sides).
fn bindings() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("apis.kcp.io", "v1alpha2", "APIBinding"),
        "apibindings",
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The claims a binding accepts: every claim its export makes, with the verbs it asks for,
/// for all objects.
fn accepted_claims(binding: &Value) -> Value {
    let claims = binding["status"]["exportPermissionClaims"]
        .as_array()
        .map(|claims| {
            claims
                .iter()
                .map(|c| {
                    let verbs = match c["verbs"].as_array() {
                        Some(v) if !v.is_empty() => Value::Array(v.clone()),
                        _ => json!(["*"]),
                    };
                    let mut accepted = json!({
                        "group": c["group"].as_str().unwrap_or(""),
                        "resource": c["resource"],
                        "verbs": verbs,
                        "selector": {"matchAll": true},
                        "state": "Accepted",
                    });
                    if let Some(id) = c["identityHash"].as_str().filter(|id| !id.is_empty()) {
                        accepted["identityHash"] = json!(id);
                    }
                    accepted
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    Value::Array(claims)
}

/// Whether the binding's spec accepts exactly `wanted` (ignoring order and defaulted fields).
fn accepts_all(binding: &Value, wanted: &Value) -> bool {
    let key = |c: &Value| {
        let mut verbs: Vec<String> = c["verbs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        verbs.sort();
        (
            c["group"].as_str().unwrap_or("").to_string(),
            c["resource"].as_str().unwrap_or("").to_string(),
            c["identityHash"].as_str().unwrap_or("").to_string(),
            c["state"].as_str().unwrap_or("").to_string(),
            verbs,
        )
    };
    let set = |v: &Value| -> std::collections::BTreeSet<_> {
        v.as_array()
            .map(|a| a.iter().map(key).collect())
            .unwrap_or_default()
    };
    set(&binding["spec"]["permissionClaims"]) == set(wanted)
}

impl Staging {
    /// Staging workspaces under `tree_root` (a workspace path) of the kcp `root` points at,
    /// holding copies of `kinds` (namespaced).
    pub fn new(root: kube::Client, tree_root: &str, kinds: Vec<ApiResource>) -> Self {
        Staging {
            root,
            tree_root: tree_root.to_string(),
            exports: Mutex::default(),
            plans: Mutex::default(),
            engaged: Mutex::default(),
            sink: Mutex::default(),
            usage: Mutex::default(),
            touched: Mutex::default(),
            retries: Mutex::default(),
            kinds,
        }
    }

    fn touch(&self, name: &str) {
        lock(&self.touched).insert(name.to_string(), std::time::Instant::now());
    }

    /// Closes the engaged staging workspaces left untouched for [`SWEEP_AFTER`] that are empty.
    async fn sweep(&self) {
        let stale: Vec<String> = lock(&self.touched)
            .iter()
            .filter(|(_, at)| at.elapsed() >= SWEEP_AFTER)
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            match self.close_if_empty(&name).await {
                Ok(true) => {}
                Ok(false) => self.touch(&name),
                Err(e) => {
                    tracing::warn!(workspace = name, error = %e, "sweeping a staging workspace failed")
                }
            }
        }
    }

    /// A use of staging workspace `name` for writing a copy; `None` while it is being closed.
    pub fn enter(self: &Arc<Self>, name: &str) -> Option<StagingUse> {
        let mut usage = lock(&self.usage);
        let u = usage.entry(name.to_string()).or_default();
        if u.closing {
            return None;
        }
        u.writers += 1;
        drop(usage);
        self.touch(name);
        Some(StagingUse {
            staging: self.clone(),
            name: name.to_string(),
        })
    }

    /// Deletes staging workspace `name` when no copy is in it and none is being written; a copy
    /// was just deleted from it. Returns whether it went. When it cannot tell (a copy is being
    /// written into it, another close is under way, or a request failed), it tries again soon
    /// (see [`CLOSE_RETRY`]) rather than leaving the workspace to the sweep.
    pub async fn close_if_empty(&self, name: &str) -> Result<bool, BrokerError> {
        let busy = {
            let mut usage = lock(&self.usage);
            let u = usage.entry(name.to_string()).or_default();
            let busy = u.writers > 0 || u.closing;
            if !busy {
                u.closing = true;
            }
            busy
        };
        if busy {
            debug!(
                workspace = name,
                "staging workspace in use; closing it again soon"
            );
            self.retry_close(name);
            return Ok(false);
        }
        let result = self.delete_when_empty(name).await;
        lock(&self.usage).remove(name);
        match &result {
            Err(_) => self.retry_close(name),
            Ok(_) => {
                lock(&self.retries).remove(name);
            }
        }
        result
    }

    /// Asks for another close of `name`, after a pause that doubles up to [`CLOSE_RETRY_MAX`].
    fn retry_close(&self, name: &str) {
        let mut retries = lock(&self.retries);
        let pause = retries
            .get(name)
            .map_or(CLOSE_RETRY, |(_, p)| (*p * 2).min(CLOSE_RETRY_MAX));
        retries.insert(name.to_string(), (std::time::Instant::now() + pause, pause));
    }

    /// Tries again the closes that are due.
    async fn closes_due(&self) {
        let now = std::time::Instant::now();
        let due: Vec<String> = lock(&self.retries)
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            if let Err(e) = self.close_if_empty(&name).await {
                tracing::warn!(workspace = name, error = %e, "deleting an empty staging workspace failed; trying again");
            }
        }
    }

    async fn delete_when_empty(&self, name: &str) -> Result<bool, BrokerError> {
        let Some(cluster) = self.get(name) else {
            return Ok(false);
        };
        for kind in &self.kinds {
            let api: Api<DynamicObject> = Api::all_with(cluster.client(), kind);
            match api.list(&ListParams::default().limit(1)).await {
                Ok(list) if !list.items.is_empty() => return Ok(false),
                Ok(_) => {}
                // The export does not serve this kind: none of it can be there.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(BrokerError::kube(
                        format!("listing {} in staging workspace {name}", kind.plural),
                        e,
                    ))
                }
            }
        }
        let ws_api: Api<DynamicObject> =
            Api::all_with(self.client_at(&self.tree_root), &workspaces());
        match ws_api.delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(BrokerError::kube(
                    format!("deleting staging workspace {name}"),
                    e,
                ))
            }
        }
        lock(&self.engaged).remove(&ClusterName::from(name));
        lock(&self.touched).remove(name);
        let sink = lock(&self.sink).clone();
        if let Some(sink) = sink {
            sink.disengage(&ClusterName::from(name))
                .await
                .map_err(|e| BrokerError::NotConnected(format!("{name}: {e}")))?;
        }
        info!(workspace = name, "staging workspace empty; deleted");
        Ok(true)
    }

    fn client_at(&self, path: &str) -> kube::Client {
        crate::runtime::client::scoped_client(&self.root, &cluster_prefix(path))
    }

    /// Records the export an AcceptAPI of `provider` names for `gvr`.
    pub fn set_export(&self, origin: Origin, gvr: GroupVersionResource, export: String) {
        lock(&self.exports).insert(origin, (gvr, export));
    }

    /// Forgets the export of an AcceptAPI.
    pub fn remove_export(&self, origin: &Origin) {
        lock(&self.exports).remove(origin);
    }

    /// The export `provider` serves `gvr` with (of its first AcceptAPI naming one).
    fn export_of(&self, provider: &ClusterName, gvr: &GroupVersionResource) -> Option<String> {
        // Keys sort by provider first: only this provider's AcceptAPIs are looked at.
        let from = (provider.clone(), String::new(), String::new());
        lock(&self.exports)
            .range(from..)
            .take_while(|((p, _, _), _)| p == provider)
            .find(|(_, (g, _))| g == gvr)
            .map(|(_, (_, export))| export.clone())
    }

    /// The staging workspace copies of `consumer`'s objects of `gvr` go to on `provider`, if the
    /// provider named its export.
    pub fn plan(
        &self,
        consumer: &ClusterName,
        provider: &ClusterName,
        gvr: &GroupVersionResource,
    ) -> Option<ClusterName> {
        let export = self.export_of(provider, gvr)?;
        let name = staging_name(consumer.as_str(), provider.as_str(), &export);
        lock(&self.plans).entry(name.clone()).or_insert(Plan {
            consumer: consumer.to_string(),
            provider: provider.to_string(),
            export,
        });
        Some(ClusterName::from(name.as_str()))
    }

    /// The plan of staging workspace `name`: as planned, or as the workspace records it.
    fn plan_of(&self, name: &str, stored: Option<&DynamicObject>) -> Option<Plan> {
        if let Some(p) = lock(&self.plans).get(name) {
            return Some(p.clone());
        }
        let annotations = stored?.metadata.annotations.as_ref()?;
        let plan = Plan {
            consumer: annotations.get(CONSUMER_ANNOTATION)?.clone(),
            provider: annotations.get(PROVIDER_ANNOTATION)?.clone(),
            export: annotations.get(EXPORT_ANNOTATION)?.clone(),
        };
        (staging_name(&plan.consumer, &plan.provider, &plan.export) == name).then(|| {
            lock(&self.plans).insert(name.to_string(), plan.clone());
            plan
        })
    }

    /// Whether staging workspace `name` is one of `consumer`'s. The consumer object names its
    /// staging workspace in an annotation its owner can write, so a name is only followed when
    /// the broker planned it for that consumer (or the workspace, which only the broker writes,
    /// says so).
    pub async fn planned_for(
        &self,
        name: &str,
        consumer: &ClusterName,
    ) -> Result<bool, BrokerError> {
        if let Some(p) = lock(&self.plans).get(name) {
            return Ok(p.consumer == consumer.as_str());
        }
        if !name.starts_with("staging-") {
            return Ok(false);
        }
        let ws_api: Api<DynamicObject> =
            Api::all_with(self.client_at(&self.tree_root), &workspaces());
        let stored = ws_api
            .get_opt(name)
            .await
            .map_err(|e| BrokerError::kube(format!("reading staging workspace {name}"), e))?;
        Ok(self
            .plan_of(name, stored.as_ref())
            .is_some_and(|p| p.consumer == consumer.as_str()))
    }

    /// Makes staging workspace `name` ready: creates it, binds the provider's export with its
    /// claims accepted, and engages it once the binding is bound. Returns whether it is engaged
    /// (when not, the caller comes back later).
    pub async fn ensure(&self, name: &ClusterName) -> Result<bool, BrokerError> {
        if lock(&self.engaged).contains_key(name) {
            return Ok(true);
        }
        let ws_api: Api<DynamicObject> =
            Api::all_with(self.client_at(&self.tree_root), &workspaces());
        let stored = ws_api
            .get_opt(name.as_str())
            .await
            .map_err(|e| BrokerError::kube(format!("reading staging workspace {name}"), e))?;
        let Some(plan) = self.plan_of(name.as_str(), stored.as_ref()) else {
            return Err(BrokerError::NotConnected(name.to_string()));
        };
        let Some(ws) = stored else {
            let ws: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name.as_str(), "labels": {STAGING_LABEL: "true"},
                    "annotations": {CONSUMER_ANNOTATION: plan.consumer,
                        PROVIDER_ANNOTATION: plan.provider, EXPORT_ANNOTATION: plan.export}},
            }))
            .map_err(BrokerError::Build)?;
            match ws_api.create(&PostParams::default(), &ws).await {
                Ok(_) => {
                    info!(workspace = %name, provider = %plan.provider, "staging workspace created")
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    return Err(BrokerError::kube(
                        format!("creating staging workspace {name} in {}", self.tree_root),
                        e,
                    ))
                }
            }
            return Ok(false);
        };
        if ws.metadata.deletion_timestamp.is_some() || ws.data["status"]["phase"] != "Ready" {
            return Ok(false);
        }
        let path = format!("{}:{name}", self.tree_root);
        let bindings: Api<DynamicObject> = Api::all_with(self.client_at(&path), &bindings());
        let what = || format!("the binding of {} in staging workspace {name}", plan.export);
        let Some(binding) = bindings
            .get_opt(BINDING)
            .await
            .map_err(|e| BrokerError::kube(format!("reading {}", what()), e))?
        else {
            let binding: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
                "metadata": {"name": BINDING},
                "spec": {"reference": {"export": {"path": plan.provider, "name": plan.export}}},
            }))
            .map_err(BrokerError::Build)?;
            match bindings.create(&PostParams::default(), &binding).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(BrokerError::kube(format!("creating {}", what()), e)),
            }
            return Ok(false);
        };
        let binding = serde_json::to_value(&binding).map_err(BrokerError::Json)?;
        let wanted = accepted_claims(&binding);
        if !accepts_all(&binding, &wanted) {
            let patch = json!({"spec": {"permissionClaims": wanted}});
            bindings
                .patch(BINDING, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| BrokerError::kube(format!("accepting the claims of {}", what()), e))?;
            return Ok(false);
        }
        if binding["status"]["phase"] != "Bound" {
            debug!(workspace = %name, "waiting for the staging binding");
            return Ok(false);
        }
        self.engage(name.as_str(), &path).await
    }

    async fn engage(&self, name: &str, path: &str) -> Result<bool, BrokerError> {
        let Some(sink) = lock(&self.sink).clone() else {
            return Ok(false);
        };
        let cluster = Arc::new(Cluster::scoped(
            name,
            self.root.clone(),
            &cluster_prefix(path),
        ));
        lock(&self.engaged).insert(ClusterName::from(name), cluster.clone());
        self.touch(name);
        sink.engage(cluster)
            .await
            .map_err(|e| BrokerError::NotConnected(format!("{name}: {e}")))?;
        Ok(true)
    }

    /// The staging workspaces that exist, engaged when bound.
    async fn resume(&self) -> Result<(), BrokerError> {
        let ws_api: Api<DynamicObject> =
            Api::all_with(self.client_at(&self.tree_root), &workspaces());
        let list = ws_api
            .list(&ListParams::default().labels(&format!("{STAGING_LABEL}=true")))
            .await
            .map_err(|e| {
                BrokerError::kube(
                    format!("listing staging workspaces in {}", self.tree_root),
                    e,
                )
            })?;
        for ws in list.items {
            let name = ws.metadata.name.clone().unwrap_or_default();
            if self.plan_of(&name, Some(&ws)).is_some() {
                self.ensure(&ClusterName::from(name.as_str())).await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ClusterProvider for Staging {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        *lock(&self.sink) = Some(sink);
        let mut delay = std::time::Duration::from_millis(200);
        loop {
            match self.resume().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "resuming staging workspaces failed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(std::time::Duration::from_secs(30));
                }
            }
        }
        let mut last_sweep = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(CLOSE_RETRY) => {}
            }
            self.closes_due().await;
            if last_sweep.elapsed() >= SWEEP_AFTER / 2 {
                last_sweep = tokio::time::Instant::now();
                self.sweep().await;
            }
        }
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        lock(&self.engaged).get(&ClusterName::from(name)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staging() -> Arc<Staging> {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        Arc::new(Staging::new(client, "root:platform", Vec::new()))
    }

    #[tokio::test]
    async fn a_staging_workspace_is_not_closed_while_a_copy_is_written_into_it() {
        let staging = staging();
        let writing = staging.enter("staging-a").expect("not closing");
        // Closing gives up at once while the write is in flight (no request is made), and
        // asks to be tried again soon.
        assert!(!staging.close_if_empty("staging-a").await.expect("close"));
        let (_, pause) = lock(&staging.retries)["staging-a"];
        assert_eq!(pause, CLOSE_RETRY);
        assert!(!staging.close_if_empty("staging-a").await.expect("close"));
        let (_, pause) = lock(&staging.retries)["staging-a"];
        assert_eq!(pause, CLOSE_RETRY * 2, "the pause doubles");
        assert!(
            staging.enter("staging-a").is_some(),
            "more writers may come"
        );
        drop(writing);
        assert!(
            lock(&staging.usage).get("staging-a").is_none(),
            "no use left"
        );
        // The retry, now that the write is over, decides (not engaged here: nothing to delete)
        // and asks for no further try.
        lock(&staging.retries)
            .get_mut("staging-a")
            .expect("retry")
            .0 = std::time::Instant::now();
        staging.closes_due().await;
        assert!(lock(&staging.retries).get("staging-a").is_none());
        // While it is being closed, no writer gets in.
        lock(&staging.usage)
            .entry("staging-b".into())
            .or_default()
            .closing = true;
        assert!(staging.enter("staging-b").is_none());
        // Not engaged: nothing to close, and nothing is left marked.
        assert!(!staging.close_if_empty("staging-c").await.expect("close"));
        assert!(lock(&staging.usage).get("staging-c").is_none());
    }

    #[tokio::test]
    async fn a_consumer_follows_only_its_own_staging_workspaces() {
        let staging = staging();
        let gvr = GroupVersionResource {
            group: "example.io".into(),
            version: "v1".into(),
            resource: "things".into(),
        };
        let provider = ClusterName::from("p");
        staging.set_export(
            (provider.clone(), "default".into(), "things".into()),
            gvr.clone(),
            "things".into(),
        );
        let (mine, theirs) = (ClusterName::from("a"), ClusterName::from("b"));
        let name = staging.plan(&mine, &provider, &gvr).expect("planned");
        assert_eq!(name.as_str(), staging_name("a", "p", "things"));
        assert!(staging
            .planned_for(name.as_str(), &mine)
            .await
            .expect("mine"));
        assert!(!staging
            .planned_for(name.as_str(), &theirs)
            .await
            .expect("theirs"));
        // A name that is no staging workspace at all is not followed (and not looked up).
        assert!(!staging
            .planned_for("elsewhere", &mine)
            .await
            .expect("other"));
    }

    #[test]
    fn names_follow_upstream() {
        assert_eq!(
            staging_name("abc", "def", "certificates"),
            "staging-ba7816bf8f01-cb8379ac2098-f78c06aa55a0"
        );
    }

    #[test]
    fn export_names_are_dns_subdomains() {
        for ok in ["certificates", "certs.example.io", "a-b"] {
            assert!(valid_export_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a..b", "a/b", &"a".repeat(254)] {
            assert!(!valid_export_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_claim_of_the_export_is_accepted() {
        let binding = json!({"spec": {}, "status": {"exportPermissionClaims": [
            {"group": "", "resource": "secrets", "identityHash": "", "verbs": ["get", "create"]},
            {"group": "x.io", "resource": "things", "identityHash": "abc"}]}});
        let wanted = accepted_claims(&binding);
        assert_eq!(
            wanted,
            json!([{"group": "", "resource": "secrets", "verbs": ["get", "create"],
                    "selector": {"matchAll": true}, "state": "Accepted"},
                {"group": "x.io", "resource": "things", "identityHash": "abc", "verbs": ["*"],
                    "selector": {"matchAll": true}, "state": "Accepted"}])
        );
        let mut fewer = binding.clone();
        fewer["spec"]["permissionClaims"] = json!([
            {"group": "", "resource": "secrets", "verbs": ["get"], "state": "Accepted"},
            {"group": "x.io", "resource": "things", "identityHash": "abc", "verbs": ["*"], "state": "Accepted"}]);
        assert!(
            !accepts_all(&fewer, &wanted),
            "fewer verbs than asked are not enough"
        );
        assert!(!accepts_all(&binding, &wanted));
        let mut done = binding.clone();
        done["spec"]["permissionClaims"] = wanted.clone();
        assert!(accepts_all(&done, &wanted));
    }
}
