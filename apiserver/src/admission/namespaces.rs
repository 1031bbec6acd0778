//! Namespace lifecycle: the `default` namespace of every logical cluster, refusing content in
//! missing or terminating namespaces, and emptying a namespace before it goes. And what
//! kube-controller-manager puts in every namespace (kcp runs the same controllers per
//! workspace): the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap with the CA
//! that signs the server's certificate, both put back when deleted or changed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::admission::{Admission, Attributes, Operation, WriteValidation};
use crate::meta::names::NameRule;
use crate::meta::status::{ApiError, GroupResource};
use crate::registry::catalog::Catalog;
use crate::registry::objects::{self, meta_mut};
use crate::registry::{Change, GenericStore, Place, Resource, StrategiesBuilder, Strategy};
use crate::storage::{list_all, StorageError, Store};

/// The name the namespace machinery's writes record in `managedFields`: kube's controllers
/// that do the same work run in kube-controller-manager.
const MANAGER: &str = "kube-controller-manager";

/// The namespace every logical cluster has.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Namespace bookkeeping shared by the handlers.
pub struct NamespaceLifecycle {
    inner: Arc<Inner>,
    /// Wakes terminating namespaces when something was removed.
    removed: Arc<Notify>,
}

/// What the lifecycle reads and writes: the store and the types each cluster serves. Sweeps of
/// terminating namespaces hold it weakly, so they end with the server.
struct Inner {
    store: Arc<dyn Store>,
    /// The generic store the writes go through (it holds this lifecycle's strategies).
    objects: Weak<GenericStore>,
    catalog: Arc<Catalog>,
    /// Clusters whose `default` namespace is known to have been created.
    initialized: Mutex<HashSet<String>>,
    /// The CA published in every namespace's `kube-root-ca.crt`; none publishes nothing.
    root_ca: Option<String>,
}

/// The ConfigMap with the server's CA in every namespace (kube's root-ca-cert-publisher).
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The ServiceAccount every namespace has (kube's serviceaccounts controller).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

fn namespaces_gr() -> GroupResource {
    GroupResource::new("", "namespaces")
}

fn namespace_key(cluster: &str, name: &str) -> String {
    format!("/core/namespaces/{cluster}/{name}")
}

impl NamespaceLifecycle {
    /// The lifecycle of the namespaces in `store`, whose types `catalog` describes.
    /// `root_ca` is published in every namespace as `kube-root-ca.crt`.
    pub fn new(
        store: Arc<dyn Store>,
        objects: Weak<GenericStore>,
        catalog: Arc<Catalog>,
        root_ca: Option<String>,
    ) -> Self {
        NamespaceLifecycle {
            inner: Arc::new(Inner {
                store,
                objects,
                catalog,
                initialized: Mutex::new(HashSet::new()),
                root_ca,
            }),
            removed: Arc::new(Notify::new()),
        }
    }

    fn namespaces(state: &Inner) -> Option<Arc<Resource>> {
        state
            .catalog
            .builtin_view()
            .registry
            .lookup("", "v1", "namespaces")
            .cloned()
    }

    /// Makes sure the cluster has its `default` namespace (created on first use).
    pub async fn ensure_cluster(&self, cluster: &str) -> Result<(), ApiError> {
        let state = &self.inner;
        if state
            .initialized
            .lock()
            .map(|s| s.contains(cluster))
            .unwrap_or(false)
        {
            return Ok(());
        }
        let Some(ns) = Self::namespaces(state) else {
            return Ok(());
        };
        let key = namespace_key(cluster, DEFAULT_NAMESPACE);
        let exists = state
            .store
            .get(&key)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .is_some();
        if !exists {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEFAULT_NAMESPACE}, "spec": {}});
            // The namespace's strategy fills it once created.
            let objects = state.objects()?;
            objects
                .own(MANAGER)
                .create_missing(Place::cluster(&ns, cluster), obj)
                .await?;
        }
        if let Ok(mut s) = state.initialized.lock() {
            s.insert(cluster.to_string());
        }
        Ok(())
    }

    /// Forgets a cluster that was deleted (its `default` namespace is gone with it).
    pub fn forget_cluster(&self, cluster: &str) {
        if let Ok(mut s) = self.inner.initialized.lock() {
            s.remove(cluster);
        }
    }

    /// Refuses creating content in a namespace that does not exist (404) or is terminating (403).
    pub async fn check_for_create(
        &self,
        cluster: &str,
        namespace: &str,
        gr: &GroupResource,
        name: &str,
    ) -> Result<(), ApiError> {
        let kv = self
            .inner
            .store
            .get_cached(&namespace_key(cluster, namespace))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .ok_or_else(|| ApiError::not_found(&namespaces_gr(), namespace))?;
        if objects::stored_is_deleting(&kv.value)? {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!("{gr} {name:?} is forbidden: unable to create new content in namespace {namespace} because it is being terminated"),
            )
            .with_details(crate::meta::status::Details {
                name: name.to_string(),
                group: gr.group.clone(),
                kind: gr.resource.clone(),
                causes: vec![crate::meta::status::Cause {
                    reason: "NamespaceTerminating".into(),
                    message: format!("namespace {namespace} is being terminated"),
                    field: "metadata.namespace".into(),
                }],
                ..Default::default()
            }));
        }
        Ok(())
    }

    /// Starts emptying a namespace marked for deletion; it is removed once empty.
    pub fn terminate(&self, cluster: &str, name: &str) {
        let (cluster, name) = (cluster.to_string(), name.to_string());
        let state = Arc::downgrade(&self.inner);
        let removed = self.removed.clone();
        tokio::spawn(async move {
            loop {
                let wait = removed.notified();
                tokio::pin!(wait);
                wait.as_mut().enable();
                {
                    let Some(s) = state.upgrade() else { return };
                    match sweep(&s, &cluster, &name).await {
                        Ok(true) => return,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(cluster, namespace = name, error = %e, "namespace cleanup")
                        }
                    }
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), wait).await;
            }
        });
    }

    /// Resumes the cleanup of namespaces that were terminating when the server stopped.
    pub async fn resume(&self) -> Result<(), StorageError> {
        let (items, _) = list_all(self.inner.store.as_ref(), "/core/namespaces/").await?;
        for kv in items {
            let Ok(obj) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&obj) {
                let Some(cluster) = crate::storage::key_cluster(&kv.key).map(str::to_string) else {
                    continue;
                };
                self.terminate(&cluster, objects::name(&obj));
            }
        }
        Ok(())
    }
}

/// One pass over a terminating namespace: deletes what it can; true once the namespace is gone.
async fn sweep(state: &Inner, cluster: &str, namespace: &str) -> Result<bool, ApiError> {
    let objects = state.objects()?;
    let own = objects.own(MANAGER);
    let mut remaining = 0usize;
    let view = state.catalog.view(cluster);
    let listed = |r: &Resource| r.prefix(Some(cluster), Some(namespace));
    let list = |prefix: String| async move {
        list_all(state.store.as_ref(), &prefix)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))
    };
    for r in view.registry.resources().iter().filter(|r| r.ty.namespaced) {
        let (items, _) = list(listed(r)).await?;
        for kv in items {
            remaining += 1;
            let Ok(obj) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&obj) {
                continue;
            }
            // Deleted as a client would: an object with finalizers is marked and waits.
            let place = Place::namespaced(r, cluster, namespace);
            match own.delete(place, objects::name(&obj)).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if remaining > 0 {
        // Check again: what had no finalizers is gone now.
        let mut left = 0;
        for r in view.registry.resources().iter().filter(|r| r.ty.namespaced) {
            left += list(listed(r)).await?.0.len();
        }
        if left > 0 {
            return Ok(false);
        }
    }
    let Some(ns) = NamespaceLifecycle::namespaces(state) else {
        return Ok(true);
    };
    let Some(kv) = state
        .store
        .get(&namespace_key(cluster, namespace))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
    else {
        return Ok(true);
    };
    let Ok(obj) = objects::decode_stored(&kv.value) else {
        return Ok(false);
    };
    if !objects::finalizers(&obj).is_empty() {
        return Ok(false);
    }
    // Empty: the namespace itself goes now (it is marked already; removing is the last step).
    own.remove(Place::cluster(&ns, cluster), namespace).await?;
    if namespace == DEFAULT_NAMESPACE {
        if let Ok(mut s) = state.initialized.lock() {
            s.remove(cluster);
        }
    }
    Ok(true)
}

impl Inner {
    /// The generic store, while the server runs.
    fn objects(&self) -> Result<Arc<GenericStore>, ApiError> {
        self.objects
            .upgrade()
            .ok_or_else(|| ApiError::internal("the server is shutting down"))
    }
}

impl NamespaceLifecycle {
    /// Adds the namespace type's strategy, and the one that tells terminating namespaces when
    /// any object went away.
    pub fn add_strategies(self: &Arc<Self>, strategies: &mut StrategiesBuilder) {
        strategies.add("", "namespaces", Arc::new(NamespaceStrategy(self.clone())));
        strategies.add("", "serviceaccounts", Arc::new(Refill(self.clone())));
        strategies.add("", "configmaps", Arc::new(Refill(self.clone())));
        strategies.add_to_every_type(Arc::new(ContentRemoved(self.removed.clone())));
    }
}

/// Admission's namespace lifecycle: content is created only in a namespace that exists and is
/// not terminating.
#[async_trait::async_trait]
impl Admission for NamespaceLifecycle {
    async fn admit(&self, attrs: &Attributes<'_>, _obj: &mut Value) -> Result<(), ApiError> {
        if attrs.operation != Operation::Create || !attrs.resource.ty.namespaced {
            return Ok(());
        }
        self.check_for_create(
            attrs.cluster,
            attrs.namespace.unwrap_or_default(),
            &attrs.resource.gr,
            attrs.name,
        )
        .await
    }
}

impl WriteValidation for NamespaceLifecycle {}

/// The Namespace type: named as a DNS label, and deleted in two steps: marked Terminating,
/// emptied, then removed.
struct NamespaceStrategy(Arc<NamespaceLifecycle>);

#[async_trait::async_trait]
impl Strategy for NamespaceStrategy {
    fn name_rule(&self) -> Option<NameRule> {
        Some(NameRule::DnsLabel)
    }

    fn marks_on_delete(&self) -> bool {
        true
    }

    /// As kube-apiserver: the `kubernetes` finalizer of the namespace's content in
    /// `spec.finalizers`, set by the server after the writer's fields are recorded.
    async fn prepare_for_store(
        &self,
        _attrs: &crate::registry::WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if old.is_some() {
            return Ok(());
        }
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let finalizers = &mut obj["spec"]["finalizers"];
        if !finalizers.is_array() {
            *finalizers = json!([]);
        }
        if let Some(list) = finalizers.as_array_mut() {
            if !list.iter().any(|f| f == "kubernetes") {
                list.push(json!("kubernetes"));
            }
        }
        Ok(())
    }

    /// As kube-apiserver: the label `kubernetes.io/metadata.name` always carries the name.
    fn set_defaults(&self, obj: &mut Value) {
        let name = objects::name(obj).to_string();
        if name.is_empty() {
            return;
        }
        let meta = meta_mut(obj);
        if !meta.get("labels").is_some_and(Value::is_object) {
            meta.insert("labels".into(), json!({}));
        }
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }

    fn begin_delete(&self, obj: &mut Value) {
        // A namespace has no grace period (kube-apiserver's namespace storage sets none).
        meta_mut(obj).remove("deletionGracePeriodSeconds");
        obj["status"] = json!({"phase": "Terminating"});
    }

    async fn after_write(&self, _: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        let Ok(obj) = objects::decode_stored(stored) else {
            return;
        };
        match change {
            Change::DeleteBegun => self.0.terminate(cluster, objects::name(&obj)),
            Change::Created => self.0.fill(cluster, objects::name(&obj)).await,
            _ => {}
        }
    }
}

/// Puts the `default` ServiceAccount and `kube-root-ca.crt` back when they are deleted, and
/// the ConfigMap's content back when it is changed, as kube's controllers do.
struct Refill(Arc<NamespaceLifecycle>);

#[async_trait::async_trait]
impl Strategy for Refill {
    async fn after_write(&self, r: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        let Ok(obj) = objects::decode_stored(stored) else {
            return;
        };
        let ours = match r.ty.plural.as_str() {
            "serviceaccounts" => objects::name(&obj) == DEFAULT_SERVICE_ACCOUNT,
            _ => {
                objects::name(&obj) == ROOT_CA_CONFIGMAP
                    && (change == Change::Deleted
                        || obj["data"]["ca.crt"].as_str() != self.0.inner.root_ca.as_deref())
            }
        };
        if !ours || !matches!(change, Change::Deleted | Change::Updated) {
            return;
        }
        let namespace = obj["metadata"]["namespace"].as_str().unwrap_or("");
        self.0.fill(cluster, namespace).await;
    }
}

impl NamespaceLifecycle {
    /// Gives namespace `namespace` of `cluster` its `default` ServiceAccount and its
    /// `kube-root-ca.crt`, unless the namespace is gone or terminating. Best effort: a write
    /// that fails is said in the log, and made again on the next change.
    async fn fill(&self, cluster: &str, namespace: &str) {
        let state = &self.inner;
        match state.store.get(&namespace_key(cluster, namespace)).await {
            Ok(Some(kv)) => match objects::decode_stored(&kv.value) {
                Ok(ns) if !objects::is_deleting(&ns) => {}
                _ => return,
            },
            _ => return,
        }
        let registry = &state.catalog.builtin_view().registry;
        if let Some(r) = registry.lookup("", "v1", "serviceaccounts") {
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}});
            self.put(r, cluster, namespace, sa, |_| true).await;
        }
        if let (Some(r), Some(ca)) = (
            registry.lookup("", "v1", "configmaps"),
            state.root_ca.as_deref(),
        ) {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": namespace,
                    "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                "data": {"ca.crt": ca}});
            self.put(r, cluster, namespace, cm, |old| {
                old["data"]["ca.crt"].as_str() == Some(ca)
            })
            .await;
        }
    }

    /// Creates `obj`, or, when it exists and `current` says it is not as it should be,
    /// replaces its data.
    async fn put(
        &self,
        r: &Arc<Resource>,
        cluster: &str,
        namespace: &str,
        obj: Value,
        current: impl Fn(&Value) -> bool + Send + Sync,
    ) {
        let name = objects::name(&obj).to_string();
        let data = obj["data"].clone();
        let written = async {
            let objects = self.inner.objects()?;
            let own = objects.own(MANAGER);
            let place = Place::namespaced(r, cluster, namespace);
            if own.create_missing(place, obj).await? {
                return Ok(());
            }
            own.update(place, &name, |old| {
                if objects::is_deleting(old) || current(old) {
                    return false;
                }
                old["data"] = data.clone();
                true
            })
            .await
            .map(drop)
        };
        if let Err(e) = written.await {
            let e: ApiError = e;
            tracing::warn!(cluster, namespace, name, error = %e, "writing a namespace's default object");
        }
    }
}

/// Wakes the sweeps of terminating namespaces whenever an object is removed.
struct ContentRemoved(Arc<Notify>);

#[async_trait::async_trait]
impl Strategy for ContentRemoved {
    async fn after_write(&self, _: &Resource, _: &str, _: &Bytes, change: Change) {
        if change == Change::Deleted {
            self.0.notify_waiters();
        }
    }
}
