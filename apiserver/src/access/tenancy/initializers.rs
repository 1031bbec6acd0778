//! kcp's workspace initializers: a WorkspaceType with `spec.initializer: true` names an
//! initializer (`<logical cluster of the type>:<type name>`) that every workspace of that type,
//! or of a type extending it, waits for. The workspace's LogicalCluster lists them in
//! `status.initializers` and stays `Initializing` until each initializer removed its own name
//! (through the `initializingworkspaces` virtual workspace); then it and its Workspace are
//! `Ready`. The server itself is the `system:apibindings` initializer of types with default
//! bindings. The LogicalCluster carries labels for its phase and each initializer so a virtual
//! workspace can select the ones waiting for it; the server alone writes them.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha224};

use super::{Tenancy, TenancyError, TypeRef, MANAGER, PATH_ANNOTATION};
use crate::meta::status::ApiError;
use crate::registry::objects::{self, meta_mut};
use crate::registry::Place;
use crate::request::request_info::{ClusterTarget, ROOT_CLUSTER};

/// The initializer the server itself is, for workspaces whose types bind APIs by default.
pub const APIBINDINGS_INITIALIZER: &str = "system:apibindings";
/// Label with a LogicalCluster's phase.
pub const PHASE_LABEL: &str = "tenancy.kcp.io/phase";
const INITIALIZER_PREFIX: &str = "initializer.internal.kcp.io/";
const TERMINATOR_PREFIX: &str = "terminator.internal.kcp.io/";
/// Keeps a deleting LogicalCluster while terminators are left.
pub const TERMINATORS_FINALIZER: &str = "kcp.io/has-terminators";
/// The key of a LogicalCluster's own object.
pub(super) fn logical_cluster_key(cluster: &str) -> String {
    format!("/core.kcp.io/logicalclusters/{cluster}/cluster")
}

pub use crate::request::request_info::Lifecycle;

impl Lifecycle {
    /// The list in a LogicalCluster's spec and status.
    pub fn field(self) -> &'static str {
        match self {
            Lifecycle::Initializing => "initializers",
            Lifecycle::Terminating => "terminators",
        }
    }

    /// The verb on `workspacetypes` an initializer or terminator needs.
    pub fn verb(self) -> &'static str {
        match self {
            Lifecycle::Initializing => "initialize",
            Lifecycle::Terminating => "terminate",
        }
    }

    /// The WorkspaceType field that makes a type one.
    fn type_flag(self) -> &'static str {
        match self {
            Lifecycle::Initializing => "initializer",
            Lifecycle::Terminating => "terminator",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Lifecycle::Initializing => INITIALIZER_PREFIX,
            Lifecycle::Terminating => TERMINATOR_PREFIX,
        }
    }

    /// The label a LogicalCluster waiting for `id` carries (kcp's: a SHA-224 prefix as the key,
    /// the whole hash as the value, so it cannot be forged from the key).
    pub fn label(self, id: &str) -> (String, String) {
        let hash: String = Sha224::digest(id.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let prefix = self.prefix();
        let key_len = 63 - prefix.len();
        (format!("{prefix}{}", &hash[..key_len]), hash)
    }
}

/// The workspace type an initializer id names: `(logical cluster, type name)`.
pub fn type_of(id: &str) -> Option<(&str, &str)> {
    let (cluster, name) = id.rsplit_once(':')?;
    (!cluster.is_empty() && !name.is_empty()).then_some((cluster, name))
}

/// The URLs of a WorkspaceType's two virtual workspaces, as kcp publishes them in its status.
pub fn type_status(advertise_address: &str, cluster: &str, name: &str, now: &str) -> Value {
    let id = format!("{cluster}:{name}");
    let url = |l: Lifecycle| format!("https://{advertise_address}/services/{}/{id}", l.service());
    json!({
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "VirtualWorkspaceURLsReady", "status": "True", "lastTransitionTime": now},
        ],
        "virtualWorkspaces": [
            {"url": url(Lifecycle::Initializing), "type": "initializing"},
            {"url": url(Lifecycle::Terminating), "type": "terminating"},
        ],
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// A LogicalCluster's waiting list (`status.initializers` or `status.terminators`).
pub fn waiting(lc: &Value, l: Lifecycle) -> Vec<String> {
    strings(&lc["status"][l.field()])
}

/// Sets the labels the server keeps on a LogicalCluster: its phase, and one per initializer it
/// waits for (per terminator once it is deleting); any other label under those prefixes goes.
pub fn set_labels(lc: &mut Value) {
    let phase = lc["status"]["phase"].as_str().unwrap_or("").to_string();
    let mut wanted: Vec<(String, String)> = Vec::new();
    if !phase.is_empty() {
        wanted.push((PHASE_LABEL.to_string(), phase));
    }
    for id in waiting(lc, Lifecycle::Initializing) {
        wanted.push(Lifecycle::Initializing.label(&id));
    }
    if objects::is_deleting(lc) {
        for id in waiting(lc, Lifecycle::Terminating) {
            wanted.push(Lifecycle::Terminating.label(&id));
        }
    }
    let meta = meta_mut(lc);
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta.insert("labels".into(), Value::Object(Map::new()));
    }
    if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
        labels.retain(|k, _| {
            k != PHASE_LABEL
                && !k.starts_with(INITIALIZER_PREFIX)
                && !k.starts_with(TERMINATOR_PREFIX)
        });
        for (k, v) in wanted {
            labels.insert(k, json!(v));
        }
    }
}

/// The rules a client's update of a LogicalCluster's status follows (kcp's LogicalCluster
/// admission for unprivileged writers): the phase is the server's; while Initializing the
/// initializers may only shrink; afterwards they are fixed; terminators only shrink.
pub fn check_status_update(old: &Value, new: &mut Value) -> Result<(), String> {
    new["status"]["phase"] = old["status"]["phase"].clone();
    for (l, open) in [
        (
            Lifecycle::Initializing,
            old["status"]["phase"] == "Initializing",
        ),
        (Lifecycle::Terminating, objects::is_deleting(old)),
    ] {
        let before = waiting(old, l);
        let after = waiting(new, l);
        if before == after {
            continue;
        }
        if !open {
            return Err(format!("status.{} is immutable now", l.field()));
        }
        if !after.iter().all(|a| before.contains(a)) {
            return Err(format!("status.{} may only shrink", l.field()));
        }
    }
    Ok(())
}

impl Tenancy {
    /// Lets `change` edit the LogicalCluster of `cluster` (returning `false` leaves it as it
    /// is), written through the generic store; the object afterwards, `None` when there is
    /// none.
    pub(super) async fn update_logical_cluster(
        &self,
        cluster: &str,
        change: impl FnMut(&mut Value) -> bool + Send,
    ) -> Result<Option<Value>, TenancyError> {
        let res = self.builtin("core.kcp.io/v1alpha1/logicalclusters")?;
        let generic = self.objects()?;
        Ok(generic
            .own(MANAGER)
            .update(Place::cluster(&res, cluster), "cluster", change)
            .await?)
    }

    /// Keeps the set of logical clusters that are not Ready (initializing or terminating), from
    /// the LogicalCluster `lc` of `cluster` as written.
    pub(crate) fn note_phase(&self, cluster: &str, lc: Option<&Value>) {
        let ready =
            lc.is_none_or(|lc| lc["status"]["phase"] == "Ready" && !objects::is_deleting(lc));
        if let Ok(mut set) = self.not_ready.write() {
            match ready {
                true => set.remove(cluster),
                false => set.insert(cluster.to_string()),
            };
        }
        let inactive = lc.is_some_and(|lc| {
            lc["metadata"]["annotations"][super::INACTIVE_ANNOTATION].as_str() == Some("true")
        });
        if let Ok(mut set) = self.inactive.write() {
            match inactive {
                true => set.insert(cluster.to_string()),
                false => set.remove(cluster),
            };
        }
    }

    /// Whether logical cluster `cluster` is marked inactive (kcp's `internal.kcp.io/inactive`):
    /// then no one reaches it but through its LogicalCluster, to mark it active again.
    pub fn is_inactive(&self, cluster: &str) -> bool {
        self.inactive
            .read()
            .map(|set| set.contains(cluster))
            .unwrap_or(false)
    }

    /// Whether logical cluster `cluster` is Ready: only then do its users reach it (as kcp
    /// lets no one but its administrators, initializers and terminators into a workspace that is
    /// initializing or terminating).
    pub fn is_ready(&self, cluster: &str) -> bool {
        self.not_ready
            .read()
            .map(|set| !set.contains(cluster))
            .unwrap_or(false)
    }

    /// The initializers and terminators of a workspace of type `t`: every type it extends
    /// (itself included) that is one, plus the server's own when the types bind APIs.
    pub(crate) async fn lifecycle_ids(&self, t: &TypeRef) -> (Vec<String>, Vec<String>) {
        let (mut inits, mut terms) = (Vec::new(), Vec::new());
        let Some(state) = self.state() else {
            return (inits, terms);
        };
        let Some(wt) = self.workspace_type_at(&state, t).await else {
            return (inits, terms);
        };
        let mut binds = false;
        for (r, v) in self.extended(&state, t, &wt).await {
            let cluster = match r.path.as_str() {
                "" | ROOT_CLUSTER => ROOT_CLUSTER.to_string(),
                path => match self.resolve(ClusterTarget::Name(path.to_string())) {
                    Ok(ClusterTarget::Name(c)) => c,
                    _ => continue,
                },
            };
            let id = format!("{cluster}:{}", r.name);
            for (l, list) in [
                (Lifecycle::Initializing, &mut inits),
                (Lifecycle::Terminating, &mut terms),
            ] {
                if v["spec"][l.type_flag()] == true && !list.contains(&id) {
                    list.push(id.clone());
                }
            }
            binds |= v["spec"]["defaultAPIBindings"]
                .as_array()
                .is_some_and(|d| !d.is_empty());
        }
        if binds {
            inits.push(APIBINDINGS_INITIALIZER.to_string());
        }
        (inits, terms)
    }

    /// Removes `id` from the waiting list of logical cluster `cluster` (the server's own
    /// initializer, done binding), then moves the workspace on.
    pub(crate) async fn remove_initializer(
        &self,
        cluster: &str,
        id: &str,
    ) -> Result<(), TenancyError> {
        self.update_logical_cluster(cluster, |lc| {
            let mut list = waiting(lc, Lifecycle::Initializing);
            if !list.iter().any(|i| i == id) {
                return false;
            }
            list.retain(|i| i != id);
            lc["status"]["initializers"] = json!(list);
            set_labels(lc);
            true
        })
        .await?;
        self.advance(cluster).await
    }

    /// Moves logical cluster `cluster` (and its Workspace) on: Ready once no initializer is
    /// left; the Workspace mirrors the phase and the initializers still waited for.
    pub(crate) async fn advance(&self, cluster: &str) -> Result<(), TenancyError> {
        let now = objects::now_rfc3339();
        let Some(lc) = self.update_logical_cluster(cluster, |lc| {
            let left = waiting(lc, Lifecycle::Initializing);
            let initializing = lc["status"]["phase"] == "Initializing";
            let condition = if left.is_empty() {
                json!({"type": "WorkspaceInitialized", "status": "True", "lastTransitionTime": now})
            } else {
                json!({"type": "WorkspaceInitialized", "status": "False", "severity": "Info",
                    "reason": "InitializerExists", "lastTransitionTime": now,
                    "message": format!("Initializers still exist: [{}]", left.join(" "))})
            };
            let same_condition = lc["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "WorkspaceInitialized"))
                .is_some_and(|h| {
                    h["status"] == condition["status"] && h["message"] == condition["message"]
                });
            if (!initializing || !left.is_empty()) && same_condition {
                return false;
            }
            if initializing && left.is_empty() {
                lc["status"]["phase"] = json!("Ready");
            }
            let mut conditions: Vec<Value> = lc["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c["type"] != "WorkspaceInitialized")
                .collect();
            conditions.push(condition);
            lc["status"]["conditions"] = Value::Array(conditions);
            set_labels(lc);
            true
        })
        .await?
        else {
            return Ok(());
        };
        self.note_phase(cluster, Some(&lc));
        if objects::is_deleting(&lc) {
            self.resume_deletion(&lc).await;
            return Ok(());
        }
        self.mirror_to_workspace(&lc).await
    }

    /// Whether logical cluster `cluster` may go: no terminator is left. The first call marks it
    /// deleting (a deletion timestamp, a finalizer so status writes keep it, phase
    /// `Terminating`), which opens it to its terminators.
    pub(crate) async fn await_terminators(&self, cluster: &str) -> Result<bool, TenancyError> {
        let mut free = true;
        let lc = self
            .update_logical_cluster(cluster, |lc| {
                free = waiting(lc, Lifecycle::Terminating).is_empty();
                if free || objects::is_deleting(lc) {
                    return false;
                }
                meta_mut(lc).insert("finalizers".into(), json!([TERMINATORS_FINALIZER]));
                lc["status"]["phase"] = json!("Terminating");
                set_labels(lc);
                true
            })
            .await?;
        let lc = match lc {
            // Deleted as a client would: the finalizer keeps it, marked, for the status
            // writes of its terminators.
            Some(lc) if !free && !objects::is_deleting(&lc) => {
                let res = self.builtin("core.kcp.io/v1alpha1/logicalclusters")?;
                let generic = self.objects()?;
                let place = Place::cluster(&res, cluster);
                generic.own(MANAGER).delete(place, "cluster").await?;
                self.store
                    .get(&logical_cluster_key(cluster))
                    .await?
                    .and_then(|kv| objects::decode_stored(&kv.value).ok())
            }
            lc => lc,
        };
        self.note_phase(cluster, lc.as_ref());
        Ok(free)
    }

    /// Once the last terminator of a deleting logical cluster removed itself, its Workspace's
    /// deletion goes on.
    async fn resume_deletion(&self, lc: &Value) {
        if !objects::is_deleting(lc) || !waiting(lc, Lifecycle::Terminating).is_empty() {
            return;
        }
        let Some(child) = lc["metadata"]["annotations"]["kcp.io/cluster"]
            .as_str()
            .map(str::to_string)
        else {
            return;
        };
        let Some((parent, name)) = self.placement(lc) else {
            return;
        };
        let Some(state) = self.state() else { return };
        tokio::spawn(async move {
            super::lifecycle::finish_workspace_deletion(&state, &parent, &name, &child).await;
        });
    }

    /// The parent logical cluster and name of the Workspace that placed a LogicalCluster.
    fn placement(&self, lc: &Value) -> Option<(String, String)> {
        let path = lc["metadata"]["annotations"][PATH_ANNOTATION].as_str()?;
        let (parent_path, name) = path.rsplit_once(':')?;
        match self.resolve(ClusterTarget::Name(parent_path.to_string())) {
            Ok(ClusterTarget::Name(parent)) => Some((parent, name.to_string())),
            _ => None,
        }
    }

    /// Copies a LogicalCluster's phase and waiting initializers to the Workspace that placed it.
    async fn mirror_to_workspace(&self, lc: &Value) -> Result<(), TenancyError> {
        let Some((parent, name)) = self.placement(lc) else {
            return Ok(());
        };
        let phase = lc["status"]["phase"].clone();
        let left = waiting(lc, Lifecycle::Initializing);
        let workspaces = self.builtin("tenancy.kcp.io/v1alpha1/workspaces")?;
        let generic = self.objects()?;
        let place = Place::cluster(&workspaces, &parent);
        generic
            .own(MANAGER)
            .update(place, &name, |ws| {
                let want_inits = match left.is_empty() {
                    true => Value::Null,
                    false => json!(left),
                };
                if objects::is_deleting(ws)
                    || (ws["status"]["phase"] == phase
                        && ws["status"]
                            .get("initializers")
                            .cloned()
                            .unwrap_or(Value::Null)
                            == want_inits)
                {
                    return false;
                }
                ws["status"]["phase"] = phase.clone();
                if let Some(s) = ws["status"].as_object_mut() {
                    match want_inits {
                        Value::Null => s.remove("initializers"),
                        v => s.insert("initializers".into(), v),
                    };
                }
                true
            })
            .await?;
        Ok(())
    }
}

/// A 422 for a status update of a LogicalCluster that breaks [`check_status_update`].
pub fn invalid_status(r: &crate::registry::Resource, message: String) -> ApiError {
    super::invalid(r, "cluster", "status", message)
}

/// The status rule of the initializing (terminating) virtual workspace: an update leaves the
/// waiting list as it is or removes exactly one name, the virtual workspace's own.
pub struct OnlyOwnName {
    lifecycle: Lifecycle,
    id: String,
    inner: std::sync::Arc<dyn crate::admission::Admission>,
}

impl OnlyOwnName {
    /// `inner`, behind the rule for `id`.
    pub fn wrap(
        lifecycle: Lifecycle,
        id: &str,
        inner: std::sync::Arc<dyn crate::admission::Admission>,
    ) -> std::sync::Arc<dyn crate::admission::Admission> {
        std::sync::Arc::new(OnlyOwnName {
            lifecycle,
            id: id.to_string(),
            inner,
        })
    }
}

#[async_trait::async_trait]
impl crate::admission::WriteValidation for OnlyOwnName {
    async fn mutate(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.inner.mutate(attrs, obj, old).await
    }

    async fn validate(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if let Some(old) = old {
            let before = waiting(old, self.lifecycle);
            let after = waiting(obj, self.lifecycle);
            let mut expected = before.clone();
            expected.retain(|i| *i != self.id);
            if after != before && !(after == expected && before.len() == after.len() + 1) {
                let what = match self.lifecycle {
                    Lifecycle::Initializing => "initializer",
                    Lifecycle::Terminating => "terminator",
                };
                return Err(invalid_status(
                    attrs.resource,
                    format!("only removing the {:?} {what} is supported", self.id),
                ));
            }
        }
        self.inner.validate(attrs, obj, old).await
    }
}

#[async_trait::async_trait]
impl crate::admission::Admission for OnlyOwnName {
    async fn admit(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &mut Value,
    ) -> Result<(), ApiError> {
        self.inner.admit(attrs, obj).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_keyed_by_hash() {
        let (k, v) = Lifecycle::Initializing.label("root:security");
        assert_eq!(k.len(), 63);
        assert!(k.starts_with(INITIALIZER_PREFIX));
        assert_eq!(v.len(), 56);
        assert!(v.starts_with(&k[INITIALIZER_PREFIX.len()..]));
        assert_eq!(Lifecycle::Terminating.label("root:security").0.len(), 63);
        assert_eq!(type_of("root:security"), Some(("root", "security")));
        assert_eq!(type_of("abc:def:t"), Some(("abc:def", "t")));
        assert_eq!(type_of("nocolon"), None);
    }

    #[test]
    fn initializers_only_shrink_while_initializing() {
        let old =
            json!({"status": {"phase": "Initializing", "initializers": ["root:a", "root:b"]}});
        let mut fewer = json!({"status": {"phase": "Ready", "initializers": ["root:b"]}});
        assert!(check_status_update(&old, &mut fewer).is_ok());
        assert_eq!(
            fewer["status"]["phase"], "Initializing",
            "the phase is the server's"
        );
        let mut more = json!({"status": {"initializers": ["root:a", "root:b", "root:c"]}});
        assert!(check_status_update(&old, &mut more).is_err());
        let ready = json!({"status": {"phase": "Ready", "initializers": ["root:a"]}});
        let mut cleared = json!({"status": {"initializers": []}});
        assert!(check_status_update(&ready, &mut cleared).is_err());
    }
}
