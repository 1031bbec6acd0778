//! The Deployment step's writes to one cluster: server-side apply of the rendered objects, no
//! write for an object that is already as rendered, and removal of objects an earlier render
//! applied that this one no longer renders.
//!
//! Every applied object carries the label [`DEPLOYED_BY_LABEL`] (the PlatformMesh's uid) and the
//! annotation [`RENDER_HASH_ANNOTATION`] (a hash of what was rendered). An object is left alone
//! when its live state has the same hash and holds every rendered field with the rendered value;
//! a changed render, a field changed by someone else, or a missing object is applied again
//! (field manager [`FIELD_MANAGER`], forced, as upstream). Pruning lists each kind this render or
//! the previous one produced, by the label, and deletes what is not rendered any more.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, Scope};
use serde_json::Value;

use crate::runtime::sharding::stable_hash;

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "platform-mesh-deployment";
/// Label naming the PlatformMesh (by uid) that deployed an object.
pub const DEPLOYED_BY_LABEL: &str = "platform-mesh.io/deployed-by";
/// Annotation holding the hash of the rendered object last applied.
pub const RENDER_HASH_ANNOTATION: &str = "platform-mesh.io/render-hash";

/// What one sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Objects written (`Kind namespace/name`).
    pub applied: Vec<String>,
    /// Objects already as rendered.
    pub unchanged: usize,
    /// Objects removed because they are no longer rendered.
    pub pruned: Vec<String>,
    /// The kinds rendered this time; pass them as `previous_kinds` next time so that a kind no
    /// longer rendered at all is still pruned.
    pub kinds: Vec<GroupVersionKind>,
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The object has no usable apiVersion, kind or name.
    #[error("rendered object {0} lacks apiVersion, kind or metadata.name")]
    Malformed(String),
    /// The cluster does not serve the object's kind (its CRD is not installed yet).
    #[error("{what}: the cluster does not serve {api_version} {kind}: {source}")]
    UnknownKind {
        /// The object.
        what: String,
        /// Its apiVersion.
        api_version: String,
        /// Its kind.
        kind: String,
        /// The discovery error.
        source: Box<kube::Error>,
    },
    /// A request failed.
    #[error("{action} {what}: {source}")]
    Request {
        /// `applying`, `reading`, `listing` or `deleting`.
        action: &'static str,
        /// The object or kind.
        what: String,
        /// The client error.
        source: Box<kube::Error>,
    },
}

struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

/// Where objects go and whose they are.
pub struct Target<'a> {
    /// A client of the cluster.
    pub client: &'a kube::Client,
    /// The uid of the PlatformMesh the objects belong to.
    pub owner: &'a str,
    /// The namespace of namespaced objects that name none.
    pub default_namespace: &'a str,
    /// Annotations added to every object, e.g. the owner's cluster, namespace and name (see
    /// [`annotated_target`](crate::runtime::mapping::annotated_target)), so a change to a deployed
    /// object leads back to its PlatformMesh.
    pub annotations: &'a [(String, String)],
    /// How the objects are applied and pruned.
    pub policy: Policy,
}

/// How a sync writes: the field manager, whether objects no longer rendered are removed, and
/// which kinds are only created (their spec is immutable once they exist, e.g. Workspaces).
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Field manager of the server-side applies.
    pub field_manager: &'static str,
    /// Remove labelled objects no longer rendered.
    pub prune: bool,
    /// `group/Kind` of kinds left alone once they exist.
    pub create_only: &'static [&'static str],
}

impl Policy {
    /// The Deployment step's policy: its field manager, pruning, everything applied.
    pub const DEPLOYMENT: Policy = Policy {
        field_manager: FIELD_MANAGER,
        prune: true,
        create_only: &[],
    };
}

/// Applies `objects` and prunes what `previous_kinds` and this render's kinds hold beyond them.
pub async fn sync(
    target: &Target<'_>,
    objects: &[Value],
    previous_kinds: &[GroupVersionKind],
) -> Result<Outcome, DeployError> {
    let mut kinds: BTreeMap<(String, String, String), Option<Kind>> = BTreeMap::new();
    let mut outcome = Outcome::default();
    let mut rendered: HashSet<(String, String, Option<String>, String)> = HashSet::new();
    for obj in objects {
        let (gvk, name) = identity(obj)?;
        let what = describe(
            &gvk.kind,
            obj.pointer("/metadata/namespace").and_then(Value::as_str),
            &name,
        );
        let kind = match resolve(target.client, &mut kinds, &gvk).await {
            Ok(k) => k,
            Err(source) => {
                return Err(DeployError::UnknownKind {
                    what,
                    api_version: api_version(&gvk),
                    kind: gvk.kind.clone(),
                    source: Box::new(source),
                })
            }
        };
        let namespace = kind.namespaced.then(|| {
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(target.default_namespace)
                .to_string()
        });
        let desired = desired(obj, target.owner, target.annotations, namespace.as_deref());
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(target.client.clone(), ns, &kind.resource),
            None => Api::all_with(target.client.clone(), &kind.resource),
        };
        let what = describe(&gvk.kind, namespace.as_deref(), &name);
        rendered.insert((
            gvk.group.clone(),
            gvk.kind.clone(),
            namespace.clone(),
            name.clone(),
        ));
        let live = api
            .get_opt(&name)
            .await
            .map_err(|source| DeployError::Request {
                action: "reading",
                what: what.clone(),
                source: Box::new(source),
            })?;
        let create_only = live.is_some()
            && target
                .policy
                .create_only
                .iter()
                .any(|k| k.split_once('/') == Some((gvk.group.as_str(), gvk.kind.as_str())));
        let current = create_only
            || live
                .map(|l| serde_json::to_value(l).unwrap_or(Value::Null))
                .is_some_and(|l| contains(&l, &desired));
        if current {
            outcome.unchanged += 1;
            continue;
        }
        api.patch(
            &name,
            &PatchParams::apply(target.policy.field_manager).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(|source| DeployError::Request {
            action: "applying",
            what: what.clone(),
            source: Box::new(source),
        })?;
        outcome.applied.push(what);
    }
    // Prune, kind by kind: this render's kinds and the previous render's.
    let mut scope: BTreeSet<(String, String, String)> = BTreeSet::new();
    if target.policy.prune {
        scope.extend(kinds.keys().cloned());
        scope.extend(previous_kinds.iter().map(gvk_key));
    }
    let selector = format!("{DEPLOYED_BY_LABEL}={}", target.owner);
    for key in scope {
        let gvk = GroupVersionKind::gvk(&key.0, &key.1, &key.2);
        let Ok(kind) = resolve(target.client, &mut kinds, &gvk).await else {
            // No longer served: nothing of it can be left.
            continue;
        };
        let all: Api<DynamicObject> = Api::all_with(target.client.clone(), &kind.resource);
        let listed = all
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| DeployError::Request {
                action: "listing",
                what: format!("{} {}", api_version(&gvk), gvk.kind),
                source: Box::new(source),
            })?;
        for item in listed.items {
            let name = item.metadata.name.clone().unwrap_or_default();
            let namespace = item.metadata.namespace.clone();
            if rendered.contains(&(
                gvk.group.clone(),
                gvk.kind.clone(),
                namespace.clone(),
                name.clone(),
            )) {
                continue;
            }
            let api: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(target.client.clone(), ns, &kind.resource),
                None => Api::all_with(target.client.clone(), &kind.resource),
            };
            let what = describe(&gvk.kind, namespace.as_deref(), &name);
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => outcome.pruned.push(what),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(DeployError::Request {
                        action: "deleting",
                        what,
                        source: Box::new(source),
                    })
                }
            }
        }
    }
    outcome.kinds = kinds
        .iter()
        .filter(|(_, k)| k.is_some())
        .filter(|(key, _)| {
            objects
                .iter()
                .filter_map(|o| identity(o).ok())
                .any(|(g, _)| gvk_key(&g) == **key)
        })
        .map(|(k, _)| GroupVersionKind::gvk(&k.0, &k.1, &k.2))
        .collect();
    Ok(outcome)
}

/// Every object of a sync must name its kind and itself.
fn identity(obj: &Value) -> Result<(GroupVersionKind, String), DeployError> {
    let malformed = || {
        DeployError::Malformed(
            obj.pointer("/metadata/name")
                .map(|n| n.to_string())
                .unwrap_or_default(),
        )
    };
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(malformed)?;
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(malformed)?;
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(malformed)?;
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    Ok((
        GroupVersionKind::gvk(group, version, kind),
        name.to_string(),
    ))
}

fn gvk_key(g: &GroupVersionKind) -> (String, String, String) {
    (g.group.clone(), g.version.clone(), g.kind.clone())
}

fn api_version(g: &GroupVersionKind) -> String {
    if g.group.is_empty() {
        g.version.clone()
    } else {
        format!("{}/{}", g.group, g.version)
    }
}

fn describe(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

async fn resolve<'k>(
    client: &kube::Client,
    cache: &'k mut BTreeMap<(String, String, String), Option<Kind>>,
    gvk: &GroupVersionKind,
) -> Result<&'k Kind, kube::Error> {
    let key = gvk_key(gvk);
    if !matches!(cache.get(&key), Some(Some(_))) {
        let found = kube::discovery::pinned_kind(client, gvk).await;
        let entry = match found {
            Ok((resource, caps)) => Some(kind_of(resource, &caps)),
            Err(e) => {
                cache.insert(key, None);
                return Err(e);
            }
        };
        cache.insert(key.clone(), entry);
    }
    match cache.get(&key) {
        Some(Some(k)) => Ok(k),
        _ => Err(kube::Error::Discovery(
            kube::error::DiscoveryError::MissingKind(gvk.kind.clone()),
        )),
    }
}

fn kind_of(resource: ApiResource, caps: &ApiCapabilities) -> Kind {
    Kind {
        resource,
        namespaced: caps.scope == Scope::Namespaced,
    }
}

/// The object as applied: the rendered fields, the owner label, the render hash, the namespace.
fn desired(obj: &Value, owner: &str, extra: &[(String, String)], namespace: Option<&str>) -> Value {
    // A resourceVersion in a rendered object is a precondition of its apply (the object was
    // rendered from that version), not part of what was rendered.
    let mut rendered = obj.clone();
    if let Some(meta) = rendered.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    let hash = format!("{:016x}", stable_hash(&[&rendered.to_string()]));
    let mut out = obj.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        match namespace {
            Some(ns) => {
                meta.insert("namespace".into(), Value::String(ns.to_string()));
            }
            None => {
                meta.remove("namespace");
            }
        }
        let labels = meta
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(l) = labels.as_object_mut() {
            l.insert(DEPLOYED_BY_LABEL.into(), Value::String(owner.to_string()));
        }
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(RENDER_HASH_ANNOTATION.into(), Value::String(hash));
            for (k, v) in extra {
                a.insert(k.clone(), Value::String(v.clone()));
            }
        }
    }
    out
}

/// Whether `live` holds every field of `want` with the same value (lists: same length, each
/// element contained). Numbers compare by value, so `1` and `1.0` are the same.
pub fn contains(live: &Value, want: &Value) -> bool {
    match (live, want) {
        (Value::Object(l), Value::Object(w)) => w.iter().all(|(k, v)| {
            l.get(k).is_some_and(|lv| contains(lv, v)) || (v.is_null() && !l.contains_key(k))
        }),
        (Value::Array(l), Value::Array(w)) => {
            l.len() == w.len() && l.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containment_is_by_field_and_value() {
        let live = json!({"a": 1, "b": {"c": [1, {"d": "x", "e": 2}]}, "z": true});
        assert!(contains(
            &live,
            &json!({"a": 1.0, "b": {"c": [1, {"d": "x"}]}})
        ));
        assert!(!contains(&live, &json!({"a": 2})));
        assert!(
            !contains(&live, &json!({"b": {"c": [1]}})),
            "list length differs"
        );
        assert!(!contains(&live, &json!({"q": 1})));
        assert!(
            contains(&live, &json!({"q": null})),
            "a null field is an absent field"
        );
    }

    fn desired_for(obj: &Value, owner: &str, namespace: Option<&str>) -> Value {
        let extra = [("owner.platform-mesh.io/name".to_string(), "pm".to_string())];
        desired(obj, owner, &extra, namespace)
    }

    #[test]
    fn desired_objects_carry_owner_hash_and_namespace() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        let d = desired_for(&obj, "uid-1", Some("ns"));
        assert_eq!(d["metadata"]["namespace"], "ns");
        assert_eq!(d["metadata"]["labels"][DEPLOYED_BY_LABEL], "uid-1");
        let h = d["metadata"]["annotations"][RENDER_HASH_ANNOTATION].clone();
        let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "w"}});
        assert_ne!(
            desired_for(&changed, "uid-1", Some("ns"))["metadata"]["annotations"]
                [RENDER_HASH_ANNOTATION],
            h
        );
        assert_eq!(desired_for(&obj, "uid-1", Some("ns")), d, "stable");
        assert_eq!(
            d["metadata"]["annotations"]["owner.platform-mesh.io/name"],
            "pm"
        );
        let cluster_scoped = desired_for(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "namespace": "x"}}),
            "u",
            None,
        );
        assert!(cluster_scoped["metadata"].get("namespace").is_none());
    }

    #[test]
    fn identity_needs_api_version_kind_and_name() {
        let (gvk, name) = identity(&json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "metadata": {"name": "x"}})).unwrap();
        assert_eq!(
            (
                gvk.group.as_str(),
                gvk.version.as_str(),
                gvk.kind.as_str(),
                name.as_str()
            ),
            ("helm.toolkit.fluxcd.io", "v2", "HelmRelease", "x")
        );
        let (core, _) =
            identity(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}))
                .unwrap();
        assert_eq!((core.group.as_str(), core.version.as_str()), ("", "v1"));
        assert!(identity(&json!({"kind": "Secret", "metadata": {"name": "s"}})).is_err());
        assert!(
            identity(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ""}}))
                .is_err()
        );
    }
}
