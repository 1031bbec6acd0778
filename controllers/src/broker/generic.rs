//! The brokering reconciler, one per brokered kind, run over consumer clusters.
//!
//! For a consumer object it:
//! 1. keeps the broker's finalizer and, in annotations, the provider holding the object
//!    (`provider-cluster`) and the one it is moving to (`new-provider-cluster`);
//! 2. picks a provider when it has none: the best-ranked accepting provider (see
//!    [`accept`](super::accept));
//! 3. copies the object to the provider as `<12 hex>-<name>` (see
//!    [`cluster_hash`](super::cluster_hash)), annotated with where it came from;
//! 4. brings the provider copy's status back (related-resource names without the prefix) and,
//!    once the provider is past `Provisioning`, copies the related resources the provider
//!    names into the consumer's namespace, owned by the consumer object, deleting earlier copies
//!    the provider no longer names;
//! 5. when its provider stops accepting it (its spec or an AcceptAPI changed), moves it: copies
//!    it to the new provider, waits until that copy is available (its `status.status` is past
//!    `Provisioning`; when providers of the kind report no `status.status`, there is nothing to
//!    wait for) or, when a MigrationConfiguration exists for the kind, until the Migration
//!    completes; then serves from the new provider and deletes the old copy;
//! 6. on deletion, deletes the provider copies and waits until they are gone, deletes the
//!    related-resource copies and the Migration, then releases the consumer object.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use api::broker::GroupVersionResource;
use api::common::GroupVersionKind;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tracing::{debug, info};

use super::accept::{gvr_text, Registry};
use super::copy::{self, Copied};
use super::migration::{self, Configurations};
use super::staging::Staging;
use super::{
    cluster_hash, provider_name, BrokerError, RelatedError, CONSUMER_CLUSTER, CONSUMER_NAME,
    CONSUMER_PREFIX, GENERIC_FINALIZER, NEW_PROVIDER_CLUSTER, PROVIDER_CLUSTER, PROVIDER_PREFIX,
    RELATED_RESOURCES,
};
use crate::runtime::{
    Action, Cluster, ClusterContext, ClusterName, Manager, Reconciler, Request, ResourceKind,
};

/// Migration annotation: the `Kind.version.group` of the consumer object.
pub const CONSUMER_KIND: &str = "broker.platform-mesh.io/consumer-kind";

/// Resolves kinds to their API resources, remembering the answers.
#[derive(Clone, Default)]
pub struct Discovery {
    known: Arc<Mutex<HashMap<GroupVersionKind, (ApiResource, bool)>>>,
}

impl Discovery {
    /// The API resource of `gvk` and whether it is namespaced, asking `client` the first time.
    pub async fn resolve(
        &self,
        client: &kube::Client,
        gvk: &GroupVersionKind,
    ) -> Result<(ApiResource, bool), BrokerError> {
        if let Some(found) = self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(gvk)
        {
            return Ok(found.clone());
        }
        let key = kube::core::GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        let (ar, caps) = kube::discovery::pinned_kind(client, &key)
            .await
            .map_err(|source| BrokerError::Discovery {
                kind: kind_text(gvk),
                source,
            })?;
        let found = (ar, caps.scope == kube::discovery::Scope::Namespaced);
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(gvk.clone(), found.clone());
        Ok(found)
    }
}

/// `Kind.version.group` (`core` for the core group), as `--watch-kind` takes it.
pub fn kind_text(gvk: &GroupVersionKind) -> String {
    let group = if gvk.group.is_empty() {
        "core"
    } else {
        &gvk.group
    };
    format!("{}.{}.{group}", gvk.kind, gvk.version)
}

/// One brokered kind.
#[derive(Clone, Debug)]
pub struct Brokered {
    /// Its group, version and kind.
    pub gvk: GroupVersionKind,
    /// Its group, version and resource, as AcceptAPIs name it.
    pub gvr: GroupVersionResource,
    /// As the runtime watches it.
    pub kind: ResourceKind,
}

impl Brokered {
    /// A namespaced kind; `plural` defaults to the usual lower-case plural of the kind.
    pub fn new(gvk: GroupVersionKind, plural: Option<&str>) -> Self {
        let key = kube::core::GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        let api = match plural {
            Some(p) => ApiResource::from_gvk_with_plural(&key, p),
            None => ApiResource::from_gvk(&key),
        };
        Brokered {
            gvr: GroupVersionResource {
                group: gvk.group.clone(),
                version: gvk.version.clone(),
                resource: api.plural.clone(),
            },
            kind: ResourceKind::dynamic(api, true),
            gvk,
        }
    }

    /// The name of its brokering controller.
    pub fn controller(&self) -> String {
        format!("broker-{}", kind_text(&self.gvk))
    }
}

/// What every brokering reconciler shares.
#[derive(Clone)]
pub struct Shared {
    /// What providers accept.
    pub registry: Registry,
    /// How objects migrate.
    pub configurations: Configurations,
    /// The provider clusters.
    pub providers: Manager,
    /// The coordination cluster's client, where Migrations live.
    pub coordination: Option<kube::Client>,
    /// Resolves related-resource kinds.
    pub discovery: Discovery,
    /// On kcp without entering provider workspaces: the staging workspaces copies go to (the
    /// provider clusters are then those workspaces, one per consumer and provider).
    pub staging: Option<Arc<Staging>>,
    /// Per consumer cluster, the other names it was engaged under by an earlier run (two
    /// contexts of a kubeconfig reaching it): copies made under those names are no copies of
    /// this broker's any more, and go.
    pub aliases: Arc<HashMap<String, Vec<String>>>,
    /// Provider names of an earlier run that reach an engaged provider: alias to its name.
    pub provider_aliases: Arc<HashMap<String, String>>,
}

/// Brokers one kind: see the module documentation.
pub struct GenericReconciler {
    /// The kind.
    pub brokered: Brokered,
    /// Registry, clusters and discovery.
    pub shared: Shared,
}

/// One consumer object being reconciled, and the names derived from it.
struct Item {
    obj: Value,
    api: Api<DynamicObject>,
    namespace: Option<String>,
    name: String,
    /// `consumer#<cluster>`.
    consumer: String,
    /// The provider-side name.
    remote: String,
    /// The provider-side prefix, `<hash>-`.
    prefix: String,
}

fn api_error(what: &str) -> impl Fn(kube::Error) -> BrokerError + '_ {
    move |e| BrokerError::kube(what, e)
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn to_dynamic(v: Value) -> Result<DynamicObject, BrokerError> {
    serde_json::from_value(v).map_err(BrokerError::Build)
}

fn to_value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

impl Reconciler for GenericReconciler {
    type Error = BrokerError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, BrokerError> {
        let kind = &self.brokered.kind;
        let cache = ctx.cache(kind).await?;
        let consumer = format!("{CONSUMER_PREFIX}{}", ctx.cluster_name());
        let remote = provider_name(&consumer, &req.name);
        let prefix = format!("{}-", cluster_hash(&consumer));
        for alias in self
            .shared
            .aliases
            .get(ctx.cluster_name().as_str())
            .into_iter()
            .flatten()
        {
            let alias = format!("{CONSUMER_PREFIX}{alias}");
            let remote = provider_name(&alias, &req.name);
            self.orphans(&alias, req.namespace.as_deref(), &remote)
                .await?;
        }
        let Some(obj) = cache.get(ctx.cluster_name(), req.namespace.as_deref(), &req.name) else {
            self.orphans(&consumer, req.namespace.as_deref(), &remote)
                .await?;
            return Ok(Action::await_change());
        };
        let item = Item {
            obj: to_value(&obj),
            api: ctx
                .cluster()
                .dynamic_api(&kind.api, req.namespace.as_deref()),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            consumer,
            remote,
            prefix,
        };
        let mut item = item;
        let mut live = false;
        let (current, moving, target, still) = loop {
            let named = |key: &str| {
                copy::annotation(&item.obj, key)
                    .map(strip_provider)
                    .map(|p| self.shared.provider_aliases.get(&p).cloned().unwrap_or(p))
            };
            let current = named(PROVIDER_CLUSTER);
            let moving = named(NEW_PROVIDER_CLUSTER);
            let current = self.own_staging(current, ctx.cluster_name()).await?;
            let moving = self.own_staging(moving, ctx.cluster_name()).await?;
            if item.obj["metadata"]["deletionTimestamp"].is_string() {
                return self.finalize(&item, [current, moving]).await;
            }
            let key = format!(
                "{}/{}/{}",
                item.consumer,
                item.namespace.as_deref().unwrap_or(""),
                item.name
            );
            let ranked = self
                .shared
                .registry
                .accepting(&self.brokered.gvr, &item.obj, &key)
                .into_iter();
            let accepting: Vec<ClusterName> = match &self.shared.staging {
                None => ranked
                    .filter(|p| self.shared.providers.engaged(p).is_some())
                    .collect(),
                Some(staging) => ranked
                    .filter_map(|p| staging.plan(ctx.cluster_name(), &p, &self.brokered.gvr))
                    .collect(),
            };
            let Some(current) = current else {
                let Some(first) = accepting.first() else {
                    return Err(self.nobody_accepts(&item));
                };
                if let Some(wait) = self.prepare(first).await? {
                    return Ok(wait);
                }
                info!(provider = %first, "placing {}", item.name);
                self.write_meta(&item, Some(first.as_str()), None).await?;
                return self.serve(&item, first.as_str()).await;
            };
            if self.provider(&current).is_none() {
                // A cache one step behind the broker's own writes can still name the provider
                // the object has just left, whose staging workspace is gone: the object as
                // stored decides before a staging workspace is made for it again.
                if !live {
                    live = true;
                    match item.api.get_opt(&item.name).await {
                        Ok(Some(o)) => {
                            item.obj = to_value(&o);
                            continue;
                        }
                        Ok(None) => return Ok(Action::await_change()),
                        Err(e) => return Err(BrokerError::kube("reading the consumer object", e)),
                    }
                }
                match self.prepare(&ClusterName::from(current.as_str())).await? {
                    Some(wait) => return Ok(wait),
                    None if self.provider(&current).is_none() => {
                        return Err(BrokerError::NotConnected(current))
                    }
                    None => {}
                }
            }
            let still = accepting.iter().any(|p| p.as_str() == current);
            let target = match &moving {
                Some(m) if *m != current && accepting.iter().any(|p| p.as_str() == m) => {
                    Some(m.clone())
                }
                _ if still => None,
                _ => accepting.first().map(|p| p.to_string()),
            };
            if live || (target.is_none() && moving.is_none()) {
                break (current, moving, target, still);
            }
            // Moves are decided on the object as stored, not as cached: a cache one step
            // behind the broker's own writes would start again a move (and a Migration) that
            // just finished.
            live = true;
            match item.api.get_opt(&item.name).await {
                Ok(Some(o)) => item.obj = to_value(&o),
                Ok(None) => return Ok(Action::await_change()),
                Err(e) => return Err(BrokerError::kube("reading the consumer object", e)),
            }
        };
        if let Some(abandoned) = moving.as_ref().filter(|m| Some(*m) != target.as_ref()) {
            // The move is off (the object fits its provider again, or the target stopped
            // accepting it): the copy made for it goes.
            if *abandoned != current {
                self.delete_copy(&item, abandoned).await?;
            }
        }
        self.write_meta(&item, Some(&current), target.as_deref())
            .await?;
        match target {
            Some(t) => {
                if let Some(wait) = self.prepare(&ClusterName::from(t.as_str())).await? {
                    self.serve(&item, &current).await?;
                    return Ok(wait);
                }
                self.move_to(&item, &current, &t).await
            }
            None => {
                if !still {
                    debug!(provider = %current, "no provider accepts {} any more; it stays", item.name);
                }
                self.serve(&item, &current).await
            }
        }
    }
}

fn strip_provider(s: &str) -> String {
    s.strip_prefix(PROVIDER_PREFIX).unwrap_or(s).to_string()
}

impl GenericReconciler {
    fn provider(&self, name: &str) -> Option<Arc<Cluster>> {
        self.shared.providers.engaged(&ClusterName::from(name))
    }

    /// `named` (a provider cluster a consumer object's annotation names) unless, through staging
    /// workspaces, it is no staging workspace of `consumer`'s: then the object counts as not
    /// placed there (the annotation is the consumer's to write).
    async fn own_staging(
        &self,
        named: Option<String>,
        consumer: &ClusterName,
    ) -> Result<Option<String>, BrokerError> {
        match (&self.shared.staging, named) {
            (Some(staging), Some(name)) => {
                Ok(staging.planned_for(&name, consumer).await?.then_some(name))
            }
            (_, named) => Ok(named),
        }
    }

    /// Makes the staging workspace `provider` ready when the broker works through staging
    /// workspaces; `Some` with when to look again while it is not.
    async fn prepare(&self, provider: &ClusterName) -> Result<Option<Action>, BrokerError> {
        let Some(staging) = &self.shared.staging else {
            return Ok(None);
        };
        let ready = staging.ensure(provider).await? && self.provider(provider.as_str()).is_some();
        Ok((!ready).then(|| Action::requeue_after(std::time::Duration::from_millis(500))))
    }

    /// The consumer cluster's client, which related resources are written with: for kcp
    /// consumers the export's virtual workspace, where they need the export's permission claim
    /// that the consumer's binding accepted.
    fn consumer_client(&self, item: &Item) -> kube::Client {
        item.api.clone().into_client()
    }

    fn copy_api(&self, cluster: &Cluster, item: &Item) -> Api<DynamicObject> {
        cluster.dynamic_api(&self.brokered.kind.api, item.namespace.as_deref())
    }

    /// Why no provider takes the object, for the reconcile error.
    fn nobody_accepts(&self, item: &Item) -> BrokerError {
        let gvr = &self.brokered.gvr;
        let providers = match &self.shared.staging {
            None => self.shared.providers.engaged_clusters(),
            Some(_) => self.shared.registry.providers(gvr),
        };
        let reasons: Vec<String> = providers
            .iter()
            .filter_map(|p| {
                self.shared
                    .registry
                    .accepts(p, gvr, &item.obj)
                    .err()
                    .map(|d| {
                        let why: Vec<_> = d.iter().map(|d| d.reason.clone()).collect();
                        format!("{p}: {}", why.join("; "))
                    })
            })
            .collect();
        BrokerError::NobodyAccepts {
            gvr: gvr_text(gvr),
            name: item.name.clone(),
            reasons: if reasons.is_empty() {
                "no provider clusters".to_string()
            } else {
                reasons.join(" | ")
            },
        }
    }

    /// Writes the finalizer and the provider annotations of the consumer object when they differ.
    async fn write_meta(
        &self,
        item: &Item,
        provider: Option<&str>,
        moving: Option<&str>,
    ) -> Result<(), BrokerError> {
        let want = |p: Option<&str>| p.map(|p| format!("{PROVIDER_PREFIX}{p}"));
        let (provider, moving) = (want(provider), want(moving));
        let same = copy::has_finalizer(&item.obj, GENERIC_FINALIZER)
            && copy::annotation(&item.obj, PROVIDER_CLUSTER) == provider.as_deref()
            && copy::annotation(&item.obj, NEW_PROVIDER_CLUSTER) == moving.as_deref();
        if same {
            return Ok(());
        }
        let patch = json!({"metadata": {
            "resourceVersion": item.obj["metadata"]["resourceVersion"],
            "finalizers": copy::finalizers_with(&item.obj, GENERIC_FINALIZER, true),
            "annotations": {PROVIDER_CLUSTER: provider, NEW_PROVIDER_CLUSTER: moving},
        }});
        item.api
            .patch(&item.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error("writing the consumer object"))
    }

    /// Creates or updates the copy on `provider`; returns it as stored.
    async fn ensure_copy(&self, item: &Item, provider: &str) -> Result<Value, BrokerError> {
        // A staging workspace is not deleted while a copy is written into it.
        let _writing = match &self.shared.staging {
            Some(staging) => Some(
                staging
                    .enter(provider)
                    .ok_or_else(|| BrokerError::NotConnected(provider.to_string()))?,
            ),
            None => None,
        };
        let cluster = self
            .provider(provider)
            .ok_or_else(|| BrokerError::NotConnected(provider.to_string()))?;
        let api = self.copy_api(&cluster, item);
        let wanted = copy::provider_copy(
            &item.obj,
            &item.remote,
            item.namespace.as_deref(),
            &item.consumer,
            &item.name,
        );
        let what = || format!("the copy {} on {provider}", item.remote);
        match api
            .get_opt(&item.remote)
            .await
            .map_err(|e| BrokerError::kube(format!("reading {}", what()), e))?
        {
            Some(stored) => {
                let stored = to_value(&stored);
                match copy::updated_copy(&stored, &wanted) {
                    None => Ok(stored),
                    Some(updated) => api
                        .replace(&item.remote, &PostParams::default(), &to_dynamic(updated)?)
                        .await
                        .map(|o| to_value(&o))
                        .map_err(|e| BrokerError::kube(format!("updating {}", what()), e)),
                }
            }
            None => {
                let obj = to_dynamic(wanted)?;
                let created = match api.create(&PostParams::default(), &obj).await {
                    Err(e) if is_status(&e, 404) && item.namespace.is_some() => {
                        // The namespace is missing on the provider: make it, then try again.
                        let ns = item.namespace.clone().unwrap_or_default();
                        let namespaces: Api<Namespace> = Api::all(cluster.client());
                        let made = serde_json::from_value(json!({"metadata": {"name": ns}}))
                            .map_err(BrokerError::Json)?;
                        match namespaces.create(&PostParams::default(), &made).await {
                            Ok(_) => {}
                            Err(e) if is_status(&e, 409) => {}
                            Err(e) => {
                                return Err(BrokerError::kube(
                                    format!("creating namespace {ns} on {provider}"),
                                    e,
                                ))
                            }
                        }
                        api.create(&PostParams::default(), &obj).await
                    }
                    other => other,
                };
                created
                    .map(|o| to_value(&o))
                    .map_err(|e| BrokerError::kube(format!("creating {}", what()), e))
            }
        }
    }

    async fn get_copy(&self, item: &Item, provider: &str) -> Result<Option<Value>, BrokerError> {
        let Some(cluster) = self.provider(provider) else {
            return Ok(None);
        };
        self.copy_api(&cluster, item)
            .get_opt(&item.remote)
            .await
            .map(|o| o.as_ref().map(to_value))
            .map_err(|e| {
                BrokerError::kube(format!("reading the copy {} on {provider}", item.remote), e)
            })
    }

    /// Releases and deletes the copy on `provider`; returns whether it is gone.
    async fn delete_copy(&self, item: &Item, provider: &str) -> Result<bool, BrokerError> {
        let Some(cluster) = self.provider(provider) else {
            return Ok(true);
        };
        let gone = delete_released(&self.copy_api(&cluster, item), &item.remote).await?;
        if gone {
            self.staging_emptied(provider).await?;
        }
        Ok(gone)
    }

    /// A copy left staging workspace `provider`: it goes when nothing else is in it. Failing
    /// that is no failure of the object's brokering; the staging sweep tries again.
    async fn staging_emptied(&self, provider: &str) -> Result<(), BrokerError> {
        if let Some(staging) = &self.shared.staging {
            if let Err(e) = staging.close_if_empty(provider).await {
                tracing::warn!(workspace = provider, error = %e, "deleting an empty staging workspace failed");
            }
        }
        Ok(())
    }

    /// Serves the object from `provider`: copy, status back, related resources.
    async fn serve(&self, item: &Item, provider: &str) -> Result<Action, BrokerError> {
        let remote = self.ensure_copy(item, provider).await?;
        self.bring_back(item, provider, &remote).await?;
        Ok(Action::await_change())
    }

    /// Status and (once the provider is past provisioning) related resources from a copy.
    async fn bring_back(
        &self,
        item: &Item,
        provider: &str,
        remote: &Value,
    ) -> Result<(), BrokerError> {
        self.sync_status(item, remote).await?;
        if copy::provider_state(remote).is_some_and(copy::still_provisioning) {
            return Ok(());
        }
        self.sync_related(item, provider, remote).await
    }

    async fn sync_status(&self, item: &Item, remote: &Value) -> Result<(), BrokerError> {
        let Some(status) = remote.get("status").filter(|s| !s.is_null()) else {
            return Ok(());
        };
        let shown = copy::consumer_status(status, &item.prefix);
        if item.obj.get("status") == Some(&shown) {
            return Ok(());
        }
        let mut obj = item.obj.clone();
        obj["status"] = shown;
        item.api
            .replace_status(&item.name, &PostParams::default(), &to_dynamic(obj)?)
            .await
            .map(|_| ())
            .map_err(api_error("writing the consumer object's status"))
    }

    /// Copies the related resources `remote` names on `provider` to the consumer and deletes
    /// the copies of those it no longer names.
    async fn sync_related(
        &self,
        item: &Item,
        provider: &str,
        remote: &Value,
    ) -> Result<(), BrokerError> {
        let cluster = self
            .provider(provider)
            .ok_or_else(|| BrokerError::NotConnected(provider.to_string()))?;
        let consumer = self.consumer_client(item);
        let mut copied: BTreeSet<Copied> = BTreeSet::new();
        let mut errors = Vec::new();
        for r in copy::related(remote)? {
            let gvk = GroupVersionKind {
                group: r.group.clone(),
                version: r.version.clone(),
                kind: r.kind.clone(),
            };
            let (ar, namespaced) = self
                .shared
                .discovery
                .resolve(&cluster.client(), &gvk)
                .await?;
            let source_ns = r
                .namespace
                .clone()
                .or_else(|| item.namespace.clone())
                .filter(|_| namespaced);
            let source = match cluster
                .dynamic_api(&ar, source_ns.as_deref())
                .get_opt(&r.name)
                .await
            {
                Ok(Some(o)) => to_value(&o),
                Ok(None) => {
                    errors.push(RelatedError::Missing {
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        provider: provider.to_string(),
                    });
                    continue;
                }
                Err(source) => {
                    errors.push(RelatedError::Read {
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        provider: provider.to_string(),
                        source,
                    });
                    continue;
                }
            };
            let name = copy::strip_prefix(&r.name, &item.prefix).to_string();
            let ns = item.namespace.clone().filter(|_| namespaced);
            let api: Api<DynamicObject> = match &ns {
                Some(ns) => Api::namespaced_with(consumer.clone(), ns, &ar),
                None => Api::all_with(consumer.clone(), &ar),
            };
            let wanted = copy::related_copy(&source, &name, ns.as_deref(), &item.obj);
            let written = match api.get_opt(&name).await {
                Ok(Some(stored)) => match copy::updated_related(&to_value(&stored), &wanted) {
                    None => Ok(()),
                    Some(updated) => match to_dynamic(updated) {
                        Ok(o) => api
                            .replace(&name, &PostParams::default(), &o)
                            .await
                            .map(|_| ())
                            .map_err(BrokerError::Read),
                        Err(e) => Err(e),
                    },
                },
                Ok(None) => match to_dynamic(wanted) {
                    Ok(o) => api
                        .create(&PostParams::default(), &o)
                        .await
                        .map(|_| ())
                        .map_err(BrokerError::Read),
                    Err(e) => Err(e),
                },
                Err(e) => Err(BrokerError::Read(e)),
            };
            match written {
                Ok(()) => {
                    copied.insert(Copied {
                        api_version: ar.api_version.clone(),
                        kind: ar.kind.clone(),
                        name,
                    });
                }
                Err(e) => errors.push(RelatedError::Copy {
                    kind: r.kind.clone(),
                    name,
                    source: Box::new(e),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(BrokerError::Related(errors));
        }
        let before = recorded(&item.obj);
        for stale in before.difference(&copied) {
            self.delete_related(item, stale).await?;
        }
        if before != copied {
            let text = serde_json::to_string(&copied).map_err(BrokerError::Json)?;
            let patch = json!({"metadata": {"annotations": {RELATED_RESOURCES: text}}});
            item.api
                .patch(&item.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_error("recording related resources"))?;
        }
        Ok(())
    }

    /// Deletes one related-resource copy of the consumer when the consumer object owns it.
    async fn delete_related(&self, item: &Item, c: &Copied) -> Result<(), BrokerError> {
        let consumer = self.consumer_client(item);
        let (group, version) = c
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", &c.api_version));
        let gvk = GroupVersionKind {
            group: group.into(),
            version: version.into(),
            kind: c.kind.clone(),
        };
        let (ar, namespaced) = self.shared.discovery.resolve(&consumer, &gvk).await?;
        let api: Api<DynamicObject> = match item.namespace.as_deref().filter(|_| namespaced) {
            Some(ns) => Api::namespaced_with(consumer, ns, &ar),
            None => Api::all_with(consumer, &ar),
        };
        let uid = item.obj["metadata"]["uid"].as_str().unwrap_or_default();
        match api.get_opt(&c.name).await {
            Ok(Some(o)) if copy::owned_by(&to_value(&o), uid) => {
                match api.delete(&c.name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_status(&e, 404) => Ok(()),
                    Err(e) => Err(BrokerError::kube(
                        format!("deleting {} {}", c.kind, c.name),
                        e,
                    )),
                }
            }
            Ok(_) => Ok(()),
            Err(e) => Err(BrokerError::kube(
                format!("reading {} {}", c.kind, c.name),
                e,
            )),
        }
    }

    /// Moves the object from `old` to `new`.
    async fn move_to(&self, item: &Item, old: &str, new: &str) -> Result<Action, BrokerError> {
        let new_copy = self.ensure_copy(item, new).await?;
        let old_copy = self.get_copy(item, old).await?;
        let config = self
            .shared
            .configurations
            .get(&self.brokered.gvk, &self.brokered.gvk);
        if let (Some(_), Some(coordination)) = (config, &self.shared.coordination) {
            let state = self.ensure_migration(coordination, item, old, new).await?;
            match &old_copy {
                Some(o) if !migration::serves_from_new(&state) => {
                    self.bring_back(item, old, o).await?
                }
                _ => self.bring_back(item, new, &new_copy).await?,
            }
            if state != migration::state::CUTOVER_COMPLETED {
                if state == migration::state::FAILED {
                    info!("the migration of {} failed; it stays on {old}", item.name);
                }
                return Ok(Action::await_change());
            }
        } else {
            let ready = match copy::provider_state(&new_copy) {
                Some(s) => !copy::still_provisioning(s),
                None => old_copy
                    .as_ref()
                    .is_none_or(|o| copy::provider_state(o).is_none()),
            };
            if !ready {
                if let Some(o) = &old_copy {
                    self.bring_back(item, old, o).await?;
                }
                return Ok(Action::await_change());
            }
        }
        // Cut over: serve from the new provider, then let go of the old copy.
        self.bring_back(item, new, &new_copy).await?;
        if !self.delete_copy(item, old).await? {
            debug!("the old copy of {} on {old} is still finalizing", item.name);
        }
        if let Some(coordination) = &self.shared.coordination {
            self.delete_migration(coordination, item).await?;
        }
        info!(from = old, to = new, "moved {}", item.name);
        self.write_meta(item, Some(new), None).await?;
        Ok(Action::await_change())
    }

    fn migration_name(&self, item: &Item) -> String {
        let scope = format!("{}/{}", item.consumer, kind_text(&self.brokered.gvk));
        format!("{}-{}", cluster_hash(&scope), item.name)
    }

    fn migration_api(
        &self,
        coordination: &kube::Client,
        item: &Item,
    ) -> Api<api::broker::Migration> {
        Api::namespaced(
            coordination.clone(),
            item.namespace.as_deref().unwrap_or("default"),
        )
    }

    /// Creates the Migration from `old` to `new` (replacing one for another move) and returns
    /// its state.
    async fn ensure_migration(
        &self,
        coordination: &kube::Client,
        item: &Item,
        old: &str,
        new: &str,
    ) -> Result<String, BrokerError> {
        let api = self.migration_api(coordination, item);
        let name = self.migration_name(item);
        let (from, to) = (
            format!("{PROVIDER_PREFIX}{old}"),
            format!("{PROVIDER_PREFIX}{new}"),
        );
        if let Some(m) = api
            .get_opt(&name)
            .await
            .map_err(api_error("reading the Migration"))?
        {
            if m.spec.from.cluster_name == from && m.spec.to.cluster_name == to {
                return Ok(m.status.and_then(|s| s.state).unwrap_or_default());
            }
            // A Migration of an earlier move: replaced once it is gone.
            self.delete_migration(coordination, item).await?;
            return Ok(String::new());
        }
        let namespace = item.namespace.clone().unwrap_or_else(|| "default".into());
        let side = |cluster: &str| json!({"gvk": self.brokered.gvk, "name": item.remote, "namespace": item.namespace, "clusterName": cluster});
        let m: api::broker::Migration = serde_json::from_value(json!({
            "apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "Migration",
            "metadata": {"name": name, "namespace": namespace, "annotations": {
                CONSUMER_CLUSTER: item.consumer, CONSUMER_NAME: item.name,
                CONSUMER_KIND: kind_text(&self.brokered.gvk)}},
            "spec": {"from": side(&from), "to": side(&to)},
        }))
        .map_err(BrokerError::Json)?;
        match api.create(&PostParams::default(), &m).await {
            Ok(_) => Ok(String::new()),
            Err(e) if is_status(&e, 409) => Ok(String::new()),
            Err(e) if is_status(&e, 404) => {
                let namespaces: Api<Namespace> = Api::all(coordination.clone());
                let made = serde_json::from_value(json!({"metadata": {"name": namespace}}))
                    .map_err(BrokerError::Json)?;
                match namespaces.create(&PostParams::default(), &made).await {
                    Ok(_) => Ok(String::new()),
                    Err(e) if is_status(&e, 409) => Ok(String::new()),
                    Err(e) => Err(BrokerError::kube(
                        format!("creating namespace {namespace} for the Migration"),
                        e,
                    )),
                }
            }
            Err(e) => Err(BrokerError::kube(
                format!("creating the Migration {name}"),
                e,
            )),
        }
    }

    async fn delete_migration(
        &self,
        coordination: &kube::Client,
        item: &Item,
    ) -> Result<(), BrokerError> {
        match self
            .migration_api(coordination, item)
            .delete(&self.migration_name(item), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(BrokerError::kube("deleting the Migration", e)),
        }
    }

    /// The consumer object is being deleted: provider copies, related copies and the Migration
    /// go first, then the object is released.
    async fn finalize(
        &self,
        item: &Item,
        providers: [Option<String>; 2],
    ) -> Result<Action, BrokerError> {
        if !copy::has_finalizer(&item.obj, GENERIC_FINALIZER) {
            return Ok(Action::await_change());
        }
        let mut gone = true;
        for p in providers.iter().flatten() {
            gone &= self.delete_copy(item, p).await?;
        }
        if !gone {
            // Provider-side finalizers are running; the copy's deletion wakes us.
            return Ok(Action::await_change());
        }
        for c in recorded(&item.obj) {
            self.delete_related(item, &c).await?;
        }
        if let Some(coordination) = &self.shared.coordination {
            self.delete_migration(coordination, item).await?;
        }
        let patch = json!({"metadata": {
            "resourceVersion": item.obj["metadata"]["resourceVersion"],
            "finalizers": copy::finalizers_with(&item.obj, GENERIC_FINALIZER, false),
        }});
        match item
            .api
            .patch(&item.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Action::await_change()),
            Err(e) if is_status(&e, 404) => Ok(Action::await_change()),
            Err(e) => Err(BrokerError::kube("releasing the consumer object", e)),
        }
    }

    /// The consumer object is gone: copies of it left on providers go too.
    async fn orphans(
        &self,
        consumer: &str,
        namespace: Option<&str>,
        remote: &str,
    ) -> Result<(), BrokerError> {
        for name in self.shared.providers.engaged_clusters() {
            let Some(cluster) = self.shared.providers.engaged(&name) else {
                continue;
            };
            let api = cluster.dynamic_api(&self.brokered.kind.api, namespace);
            let Some(o) = api.get_opt(remote).await.map_err(BrokerError::Read)? else {
                continue;
            };
            if copy::annotation(&to_value(&o), CONSUMER_CLUSTER) == Some(consumer)
                && delete_released(&api, remote).await?
            {
                self.staging_emptied(name.as_str()).await?;
            }
        }
        Ok(())
    }
}

/// The related-resource copies recorded on a consumer object.
fn recorded(obj: &Value) -> BTreeSet<Copied> {
    copy::annotation(obj, RELATED_RESOURCES)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// Removes the broker's finalizer from `name` and deletes it; returns whether it is gone.
async fn delete_released(api: &Api<DynamicObject>, name: &str) -> Result<bool, BrokerError> {
    let Some(o) = api.get_opt(name).await.map_err(BrokerError::Read)? else {
        return Ok(true);
    };
    let v = to_value(&o);
    if copy::has_finalizer(&v, GENERIC_FINALIZER) {
        let patch = json!({"metadata": {
            "resourceVersion": v["metadata"]["resourceVersion"],
            "finalizers": copy::finalizers_with(&v, GENERIC_FINALIZER, false),
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(true),
            Err(e) => return Err(BrokerError::kube(format!("releasing {name}"), e)),
        }
    }
    if v["metadata"]["deletionTimestamp"].is_null() {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(either) if either.is_right() => return Ok(true),
            // The object as deleted: gone unless finalizers hold it.
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(true),
            Err(e) => return Err(BrokerError::kube(format!("deleting {name}"), e)),
        }
    }
    Ok(api
        .get_opt(name)
        .await
        .map_err(BrokerError::Read)?
        .is_none())
}

/// Forwards events on provider copies (and Migrations) to the consumer object they belong to.
pub fn consumer_request(obj: &DynamicObject) -> Option<(String, Request)> {
    let annotations = obj.metadata.annotations.as_ref()?;
    let cluster = annotations.get(CONSUMER_CLUSTER)?;
    let name = annotations.get(CONSUMER_NAME)?;
    let cluster = cluster.strip_prefix(CONSUMER_PREFIX)?;
    Some((
        cluster.to_string(),
        Request {
            cluster: ClusterName::from(cluster),
            namespace: obj.metadata.namespace.clone().filter(|n| !n.is_empty()),
            name: name.clone(),
        },
    ))
}
