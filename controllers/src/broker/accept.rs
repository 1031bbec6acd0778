//! What providers accept: AcceptAPI filters, the registry of AcceptAPIs by API and provider,
//! the deterministic choice among accepting providers, and the controller that keeps the
//! registry and each AcceptAPI's `Registered` condition current.
//!
//! Filter rules (differences from upstream are deliberate):
//! - a filter's `key` is a dot path under `spec` (`a.b` means `spec.a.b`);
//! - a key the object does not set fails the filter: a provider that narrowed a key has not said
//!   it accepts objects without it;
//! - `valueIn` compares the value's text (strings as they are, numbers and booleans as JSON
//!   writes them);
//! - `boundary` needs a number (or a string holding one); both bounds are inclusive and may be
//!   negative;
//! - `suffix` needs a string ending in it;
//! - every criterion of every filter must hold; several AcceptAPIs of one provider for one API
//!   accept when any of them does.
//!
//! Choosing among several accepting providers: each provider gets the score
//! `sha256(provider cluster name + "\n" + object key)`, and the highest score wins (rendezvous
//! hashing). The same object always lands on the same provider, objects spread evenly over the
//! providers, and adding a provider moves no object whose provider still accepts it (a chosen
//! provider is kept while it accepts).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use api::broker::{AcceptAPI, AcceptAPISpec, Filter, GroupVersionResource};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::staging::{valid_export_name, Staging, APIEXPORT_ANNOTATION};
use super::{set_finalizer, BrokerError};
use crate::runtime::{Action, ClusterContext, ClusterName, Reconciler, Request};
use crate::subroutines;

/// The finalizer that keeps an AcceptAPI registered until the broker saw its deletion.
pub const ACCEPTAPI_FINALIZER: &str = "broker.platform-mesh.io/acceptapi-finalizer";

/// Why a filter rejects an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The filter key (or `gvr`).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

/// `group/version/resource`, for messages and keys (`v1/configmaps` for the core group).
pub fn gvr_text(gvr: &GroupVersionResource) -> String {
    if gvr.group.is_empty() {
        format!("{}/{}", gvr.version, gvr.resource)
    } else {
        format!("{}/{}/{}", gvr.group, gvr.version, gvr.resource)
    }
}

/// The value at dot path `key` under `spec`.
fn spec_value<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.')
        .try_fold(obj.get("spec")?, |v, part| v.as_object()?.get(part))
        .filter(|v| !v.is_null())
}

/// The text a value is compared as.
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The number a value holds, if any.
fn value_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Why `filter` rejects `obj` (nothing when it accepts).
pub fn check_filter(filter: &Filter, obj: &Value) -> Vec<Denial> {
    let deny = |reason: String| Denial {
        key: filter.key.clone(),
        reason,
    };
    let Some(value) = spec_value(obj, &filter.key) else {
        return vec![deny(format!("spec.{} is not set", filter.key))];
    };
    let mut denials = Vec::new();
    let text = value_text(value);
    if let Some(allowed) = filter.value_in.as_ref().filter(|v| !v.is_empty()) {
        if !allowed.contains(&text) {
            denials.push(deny(format!(
                "{text:?} is not one of [{}]",
                allowed.join(", ")
            )));
        }
    }
    if let Some(b) = &filter.boundary {
        match value_number(value) {
            None if b.min.is_some() || b.max.is_some() => {
                denials.push(deny(format!("{text:?} is not a number")))
            }
            None => {}
            Some(n) => {
                if let Some(min) = b.min.filter(|m| n < *m as f64) {
                    denials.push(deny(format!("{text} is below the minimum {min}")));
                }
                if let Some(max) = b.max.filter(|m| n > *m as f64) {
                    denials.push(deny(format!("{text} is above the maximum {max}")));
                }
            }
        }
    }
    if let Some(suffix) = filter.suffix.as_deref().filter(|s| !s.is_empty()) {
        if !value.as_str().is_some_and(|s| s.ends_with(suffix)) {
            denials.push(deny(format!("{text:?} does not end in {suffix:?}")));
        }
    }
    denials
}

/// Why `spec` rejects `obj` of API `gvr` (nothing when it accepts).
pub fn check(spec: &AcceptAPISpec, gvr: &GroupVersionResource, obj: &Value) -> Vec<Denial> {
    if spec.gvr != *gvr {
        return vec![Denial {
            key: "gvr".into(),
            reason: format!("accepts {}, not {}", gvr_text(&spec.gvr), gvr_text(gvr)),
        }];
    }
    spec.filters
        .iter()
        .flatten()
        .flat_map(|f| check_filter(f, obj))
        .collect()
}

/// The rendezvous score of `provider` for the object `key`.
fn score(provider: &ClusterName, key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(provider.as_str().as_bytes());
    h.update(b"\n");
    h.update(key.as_bytes());
    h.finalize().into()
}

/// Orders `providers` by preference for the object `key`, best first.
pub fn rank(mut providers: Vec<ClusterName>, key: &str) -> Vec<ClusterName> {
    providers.sort_by_cached_key(|p| std::cmp::Reverse(score(p, key)));
    providers
}

/// Where one AcceptAPI lives: provider cluster, namespace, name.
type Origin = (ClusterName, String, String);

/// Every registered AcceptAPI, by API and provider. Keyed by namespace and name, so AcceptAPIs
/// of the same name in different namespaces do not overwrite each other, and moved when an
/// AcceptAPI's `gvr` changes.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<RwLock<RegistryInner>>,
    on_change: Arc<RwLock<Vec<ChangeHook>>>,
}

type ChangeHook = Arc<dyn Fn(&GroupVersionResource) + Send + Sync>;

/// AcceptAPIs of one API: by provider, then by namespace and name.
type ByProvider = BTreeMap<ClusterName, BTreeMap<(String, String), AcceptAPISpec>>;

#[derive(Default)]
struct RegistryInner {
    by_api: HashMap<GroupVersionResource, ByProvider>,
    origin: HashMap<Origin, GroupVersionResource>,
}

impl Registry {
    /// Calls `hook` with the API whenever what is accepted for it changes.
    pub fn on_change(&self, hook: impl Fn(&GroupVersionResource) + Send + Sync + 'static) {
        self.on_change
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(hook));
    }

    fn changed(&self, gvrs: &[GroupVersionResource]) {
        let hooks = self
            .on_change
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for gvr in gvrs {
            for hook in &hooks {
                hook(gvr);
            }
        }
    }

    /// Registers (or updates) the AcceptAPI `namespace/name` of `provider`.
    pub fn set(&self, provider: &ClusterName, namespace: &str, name: &str, spec: AcceptAPISpec) {
        let origin = (provider.clone(), namespace.to_string(), name.to_string());
        let mut changed = vec![spec.gvr.clone()];
        {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            if let Some(old) = inner.origin.get(&origin).cloned() {
                if old != spec.gvr {
                    inner.remove_entry(&origin, &old);
                    changed.push(old);
                } else if inner
                    .by_api
                    .get(&old)
                    .and_then(|p| p.get(provider))
                    .and_then(|n| n.get(&(origin.1.clone(), origin.2.clone())))
                    == Some(&spec)
                {
                    return;
                }
            }
            inner.origin.insert(origin.clone(), spec.gvr.clone());
            inner
                .by_api
                .entry(spec.gvr.clone())
                .or_default()
                .entry(provider.clone())
                .or_default()
                .insert((origin.1, origin.2), spec);
        }
        self.changed(&changed);
    }

    /// Forgets the AcceptAPI `namespace/name` of `provider`.
    pub fn remove(&self, provider: &ClusterName, namespace: &str, name: &str) {
        let origin = (provider.clone(), namespace.to_string(), name.to_string());
        let gvr = {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            let Some(gvr) = inner.origin.remove(&origin) else {
                return;
            };
            inner.remove_entry(&origin, &gvr);
            gvr
        };
        self.changed(&[gvr]);
    }

    /// Forgets every AcceptAPI of `provider` (it went away).
    pub fn remove_provider(&self, provider: &ClusterName) {
        let gvrs: Vec<_> = {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            let origins: Vec<_> = inner
                .origin
                .keys()
                .filter(|o| &o.0 == provider)
                .cloned()
                .collect();
            origins
                .into_iter()
                .filter_map(|o| {
                    let gvr = inner.origin.remove(&o)?;
                    inner.remove_entry(&o, &gvr);
                    Some(gvr)
                })
                .collect()
        };
        self.changed(&gvrs);
    }

    /// Whether `provider` registered the AcceptAPI `namespace/name`.
    pub fn contains(&self, provider: &ClusterName, namespace: &str, name: &str) -> bool {
        let origin = (provider.clone(), namespace.to_string(), name.to_string());
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .origin
            .contains_key(&origin)
    }

    /// Whether `provider` accepts `obj` of API `gvr` (any of its AcceptAPIs does), with the
    /// reasons each AcceptAPI gave when none does.
    pub fn accepts(
        &self,
        provider: &ClusterName,
        gvr: &GroupVersionResource,
        obj: &Value,
    ) -> Result<(), Vec<Denial>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(specs) = inner.by_api.get(gvr).and_then(|p| p.get(provider)) else {
            return Err(vec![Denial {
                key: "gvr".into(),
                reason: format!("{provider} has no AcceptAPI for {}", gvr_text(gvr)),
            }]);
        };
        let mut denials = Vec::new();
        for spec in specs.values() {
            let d = check(spec, gvr, obj);
            if d.is_empty() {
                return Ok(());
            }
            denials.extend(d);
        }
        Err(denials)
    }

    /// The providers accepting `obj` of API `gvr`, ranked for the object `key`, best first.
    pub fn accepting(
        &self,
        gvr: &GroupVersionResource,
        obj: &Value,
        key: &str,
    ) -> Vec<ClusterName> {
        let providers: Vec<ClusterName> = {
            let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
            inner
                .by_api
                .get(gvr)
                .map(|p| {
                    p.iter()
                        .filter(|(_, specs)| specs.values().any(|s| check(s, gvr, obj).is_empty()))
                        .map(|(name, _)| name.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        rank(providers, key)
    }

    /// The providers with AcceptAPIs for `gvr`.
    pub fn providers(&self, gvr: &GroupVersionResource) -> Vec<ClusterName> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_api
            .get(gvr)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How many providers registered AcceptAPIs for `gvr`.
    pub fn providers_of(&self, gvr: &GroupVersionResource) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_api
            .get(gvr)
            .map_or(0, |p| p.len())
    }
}

impl RegistryInner {
    fn remove_entry(&mut self, origin: &Origin, gvr: &GroupVersionResource) {
        if let Some(providers) = self.by_api.get_mut(gvr) {
            if let Some(names) = providers.get_mut(&origin.0) {
                names.remove(&(origin.1.clone(), origin.2.clone()));
                if names.is_empty() {
                    providers.remove(&origin.0);
                }
            }
            if providers.is_empty() {
                self.by_api.remove(gvr);
            }
        }
    }
}

/// Keeps the registry in step with the AcceptAPIs of provider clusters and says on each
/// AcceptAPI whether it is registered (condition `Registered`): `True` when this broker brokers
/// its API, `False` with reason `NotBrokered` when it does not.
pub struct AcceptApiReconciler {
    /// The registry to keep.
    pub registry: Registry,
    /// The APIs this broker brokers.
    pub brokered: Vec<GroupVersionResource>,
    /// On kcp through staging workspaces: where the export each AcceptAPI names is recorded
    /// (an AcceptAPI naming none is not registered).
    pub staging: Option<Arc<Staging>>,
}

impl Reconciler for AcceptApiReconciler {
    type Error = BrokerError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, BrokerError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        let api: Api<AcceptAPI> = ctx.namespaced(&namespace);
        let cluster = ctx.cluster_name().clone();
        let origin = (cluster.clone(), namespace.clone(), req.name.clone());
        let forget = || {
            self.registry.remove(&cluster, &namespace, &req.name);
            if let Some(staging) = &self.staging {
                staging.remove_export(&origin);
            }
        };
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(obj) = ctx.requested::<AcceptAPI>(&req).await? else {
            forget();
            return Ok(Action::await_change());
        };
        if obj.metadata.deletion_timestamp.is_some() {
            forget();
            set_finalizer(&api, &obj, ACCEPTAPI_FINALIZER, false).await?;
            return Ok(Action::await_change());
        }
        set_finalizer(&api, &obj, ACCEPTAPI_FINALIZER, true).await?;
        if let Some(staging) = &self.staging {
            let export = obj.annotations().get(APIEXPORT_ANNOTATION).cloned();
            let refused = match &export {
                None => Some(("NoAPIExport", format!(
                    "the broker places copies into staging workspaces bound to the provider's APIExport: \
                     annotate this AcceptAPI with {APIEXPORT_ANNOTATION} naming the APIExport of this \
                     workspace that serves {}", gvr_text(&obj.spec.gvr)))),
                Some(e) if !valid_export_name(e) => Some(("InvalidAPIExport", format!(
                    "{APIEXPORT_ANNOTATION}: {e:?} is not an APIExport name (a DNS-1123 subdomain)"))),
                Some(_) => None,
            };
            if let Some((reason, message)) = refused {
                forget();
                set_condition(&api, &obj, "Registered", "False", reason, &message).await?;
                return Ok(Action::await_change());
            }
            staging.set_export(
                origin.clone(),
                obj.spec.gvr.clone(),
                export.unwrap_or_default(),
            );
        }
        let brokered = self.brokered.contains(&obj.spec.gvr);
        self.registry
            .set(&cluster, &namespace, &req.name, obj.spec.clone());
        let (status, reason, message) = if brokered {
            let filters = obj.spec.filters.as_ref().map_or(0, |f| f.len());
            (
                "True",
                "Registered",
                format!(
                    "accepting {} with {filters} filter(s)",
                    gvr_text(&obj.spec.gvr)
                ),
            )
        } else {
            let known: Vec<_> = self.brokered.iter().map(gvr_text).collect();
            (
                "False",
                "NotBrokered",
                format!(
                    "this broker does not broker {}; it brokers: {}",
                    gvr_text(&obj.spec.gvr),
                    known.join(", ")
                ),
            )
        };
        set_condition(&api, &obj, "Registered", status, reason, &message).await?;
        Ok(Action::await_change())
    }
}

/// Sets condition `type_` on an AcceptAPI's status unless it already says the same.
async fn set_condition(
    api: &Api<AcceptAPI>,
    obj: &AcceptAPI,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<(), BrokerError> {
    let mut conditions = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let before = conditions.clone();
    let now = Time(Timestamp::now());
    subroutines::set(
        &mut conditions,
        type_,
        status,
        reason,
        message,
        obj.metadata.generation,
        &now,
    );
    if conditions == before {
        return Ok(());
    }
    let patch = json!({"status": {"conditions": conditions}});
    api.patch_status(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|e| BrokerError::kube("writing status", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::broker::Boundary;

    fn gvr() -> GroupVersionResource {
        GroupVersionResource {
            group: "example.platform-mesh.io".into(),
            version: "v1alpha1".into(),
            resource: "certificates".into(),
        }
    }

    fn filter(key: &str) -> Filter {
        Filter {
            key: key.into(),
            ..Default::default()
        }
    }

    #[test]
    fn suffix_value_in_and_boundaries() {
        let cert =
            json!({"spec": {"fqdn": "app.internal.corp", "size": 5, "nested": {"arch": "arm64"}}});
        let suffix = Filter {
            suffix: Some("internal.corp".into()),
            ..filter("fqdn")
        };
        assert!(check_filter(&suffix, &cert).is_empty());
        let other = Filter {
            suffix: Some("corp.com".into()),
            ..filter("fqdn")
        };
        assert_eq!(
            check_filter(&other, &cert)[0].reason,
            "\"app.internal.corp\" does not end in \"corp.com\""
        );
        let arch = Filter {
            value_in: Some(vec!["x86_64".into(), "arm64".into()]),
            ..filter("nested.arch")
        };
        assert!(check_filter(&arch, &cert).is_empty());
        let size = |min, max| Filter {
            boundary: Some(Boundary { min, max }),
            ..filter("size")
        };
        assert!(check_filter(&size(Some(5), Some(5)), &cert).is_empty());
        assert!(check_filter(&size(Some(-3), None), &cert).is_empty());
        assert_eq!(check_filter(&size(Some(6), None), &cert).len(), 1);
        assert_eq!(check_filter(&size(None, Some(4)), &cert).len(), 1);
        let number_as_text = Filter {
            value_in: Some(vec!["5".into()]),
            ..filter("size")
        };
        assert!(check_filter(&number_as_text, &cert).is_empty());
        // A key the object does not set fails the filter.
        assert_eq!(
            check_filter(&size(Some(1), None), &json!({"spec": {}}))[0].reason,
            "spec.size is not set"
        );
        // A boundary on a non-number fails.
        assert_eq!(
            check_filter(&size(Some(1), None), &json!({"spec": {"size": "big"}}))[0].reason,
            "\"big\" is not a number"
        );
    }

    #[test]
    fn gvr_must_match_and_filters_are_anded() {
        let spec = AcceptAPISpec {
            gvr: gvr(),
            filters: Some(vec![
                Filter {
                    suffix: Some(".corp".into()),
                    ..filter("fqdn")
                },
                Filter {
                    value_in: Some(vec!["ecdsa".into()]),
                    ..filter("algorithm")
                },
            ]),
        };
        let ok = json!({"spec": {"fqdn": "a.corp", "algorithm": "ecdsa"}});
        assert!(check(&spec, &gvr(), &ok).is_empty());
        let half = json!({"spec": {"fqdn": "a.corp", "algorithm": "rsa"}});
        assert_eq!(check(&spec, &gvr(), &half).len(), 1);
        let mut vms = gvr();
        vms.resource = "vms".into();
        assert_eq!(check(&spec, &vms, &ok)[0].key, "gvr");
    }

    #[test]
    fn registry_ors_acceptapis_and_ranks_deterministically() {
        let reg = Registry::default();
        let internal = ClusterName::from("provider#internalca");
        let external = ClusterName::from("provider#externalca");
        let with_suffix = |s: &str| AcceptAPISpec {
            gvr: gvr(),
            filters: Some(vec![Filter {
                suffix: Some(s.into()),
                ..filter("fqdn")
            }]),
        };
        reg.set(&internal, "default", "certs", with_suffix("internal.corp"));
        reg.set(&external, "default", "certs", with_suffix("corp.com"));
        let cert = |fqdn: &str| json!({"spec": {"fqdn": fqdn}});
        assert_eq!(
            reg.accepting(&gvr(), &cert("app.internal.corp"), "k"),
            vec![internal.clone()]
        );
        assert_eq!(
            reg.accepting(&gvr(), &cert("app.corp.com"), "k"),
            vec![external.clone()]
        );
        assert!(reg.accepting(&gvr(), &cert("app.org"), "k").is_empty());
        // A second AcceptAPI of the same name in another namespace adds to the first.
        reg.set(&internal, "other", "certs", with_suffix(".com"));
        assert_eq!(reg.accepting(&gvr(), &cert("app.corp.com"), "k").len(), 2);
        assert!(reg.accepts(&internal, &gvr(), &cert("x.com")).is_ok());
        // Changing the API moves the entry.
        let mut moved = with_suffix(".com");
        moved.gvr.resource = "vms".into();
        reg.set(&internal, "other", "certs", moved);
        assert!(reg.accepts(&internal, &gvr(), &cert("x.com")).is_err());
        reg.remove(&internal, "default", "certs");
        assert_eq!(reg.providers_of(&gvr()), 1);
        reg.remove_provider(&external);
        assert_eq!(reg.providers_of(&gvr()), 0);

        // Ranking: the same key always gives the same order, and keys spread over providers.
        let providers: Vec<ClusterName> = (0..2).map(|i| format!("provider#{i}").into()).collect();
        let first = rank(providers.clone(), "ns/obj-1");
        assert_eq!(
            first,
            rank(providers.iter().rev().cloned().collect(), "ns/obj-1")
        );
        let to_first = (0..1000)
            .filter(|i| rank(providers.clone(), &format!("ns/obj-{i}"))[0] == providers[0])
            .count();
        assert!(
            (400..600).contains(&to_first),
            "{to_first} of 1000 on one provider"
        );
    }
}
