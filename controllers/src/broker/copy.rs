//! How the broker copies objects between clusters: the provider copy of a consumer object, the
//! consumer's view of the provider's status, and the consumer copies of related resources.
//!
//! A copy carries every top-level field of its source except `metadata` and `status`, so fields
//! removed in the source are removed in the copy too (upstream keeps them). Labels and
//! annotations are not copied; the broker adds its own.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{BrokerError, CONSUMER_CLUSTER, CONSUMER_NAME, GENERIC_FINALIZER};

/// The top-level fields a copy carries: everything but `metadata` and `status`.
pub fn content(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.as_str() != "metadata" && k.as_str() != "status")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn strings<'a>(obj: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    obj["metadata"][field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The annotation `key` of `obj`, if set and not empty.
pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][key]
        .as_str()
        .filter(|s| !s.is_empty())
}

/// Whether `obj` carries finalizer `f`.
pub fn has_finalizer(obj: &Value, f: &str) -> bool {
    strings(obj, "finalizers").any(|x| x == f)
}

/// The finalizers of `obj` with `f` added or removed.
pub fn finalizers_with(obj: &Value, f: &str, present: bool) -> Vec<String> {
    let mut out: Vec<String> = strings(obj, "finalizers")
        .filter(|x| *x != f)
        .map(str::to_string)
        .collect();
    if present {
        out.push(f.to_string());
    }
    out
}

/// The provider copy of consumer object `consumer`: its content under `name` in `namespace`,
/// annotated with where it came from and holding the broker's finalizer.
pub fn provider_copy(
    consumer: &Value,
    name: &str,
    namespace: Option<&str>,
    consumer_cluster: &str,
    consumer_name: &str,
) -> Value {
    let mut obj = content(consumer);
    let mut meta = json!({
        "name": name,
        "annotations": {CONSUMER_CLUSTER: consumer_cluster, CONSUMER_NAME: consumer_name},
        "finalizers": [GENERIC_FINALIZER],
    });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    obj.insert("metadata".into(), meta);
    Value::Object(obj)
}

/// `stored` updated to carry `wanted`'s content and the broker's annotations and finalizer,
/// keeping everything else others wrote into its metadata; `None` when nothing differs.
pub fn updated_copy(stored: &Value, wanted: &Value) -> Option<Value> {
    let mut meta = stored["metadata"].clone();
    let mut changed = false;
    for (k, v) in wanted["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if meta["annotations"][k] != *v {
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            meta["annotations"][k] = v.clone();
            changed = true;
        }
    }
    for f in strings(wanted, "finalizers") {
        if !has_finalizer(stored, f) {
            meta["finalizers"] = json!(finalizers_with(stored, f, true));
            changed = true;
        }
    }
    let content_wanted = content(wanted);
    if content(stored) != content_wanted {
        changed = true;
    }
    if !changed {
        return None;
    }
    let mut out = content_wanted;
    out.insert("metadata".into(), meta);
    if let Some(status) = stored.get("status") {
        out.insert("status".into(), status.clone());
    }
    Some(Value::Object(out))
}

/// `name` without the provider-side prefix `prefix` (`<hash>-`).
pub fn strip_prefix<'a>(name: &'a str, prefix: &str) -> &'a str {
    name.strip_prefix(prefix).unwrap_or(name)
}

/// The consumer's view of a provider status: the same, with the provider-side prefix removed
/// from the names of related resources.
pub fn consumer_status(provider_status: &Value, prefix: &str) -> Value {
    let mut status = provider_status.clone();
    if let Some(related) = status
        .get_mut("relatedResources")
        .and_then(Value::as_object_mut)
    {
        for entry in related.values_mut() {
            if let Some(name) = entry.get("name").and_then(Value::as_str) {
                let stripped = strip_prefix(name, prefix).to_string();
                entry["name"] = json!(stripped);
            }
        }
    }
    status
}

/// A resource a provider names in `status.relatedResources` (the Secret of a certificate).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Related {
    /// API group (`core` is read as the core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Name on the provider.
    pub name: String,
    /// Namespace on the provider (the provider copy's namespace when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// What a consumer copy of a related resource is recorded as: kind and consumer-side name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Copied {
    /// `apiVersion` of the copy.
    pub api_version: String,
    /// Kind of the copy.
    pub kind: String,
    /// Name of the copy (in the consumer object's namespace).
    pub name: String,
}

/// The related resources of a provider object, or why an entry is unusable.
pub fn related(provider_obj: &Value) -> Result<Vec<Related>, BrokerError> {
    let Some(map) = provider_obj["status"]["relatedResources"].as_object() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (key, entry) in map {
        let text = |f: &str| entry[f].as_str().unwrap_or_default().to_string();
        let gvk = &entry["gvk"];
        let (version, kind, name) = (
            gvk["version"].as_str().unwrap_or_default().to_string(),
            gvk["kind"].as_str().unwrap_or_default().to_string(),
            text("name"),
        );
        if version.is_empty() || kind.is_empty() || name.is_empty() {
            return Err(BrokerError::RelatedResources(format!(
                "status.relatedResources.{key} needs name, gvk.version and gvk.kind"
            )));
        }
        let group = gvk["group"].as_str().unwrap_or_default();
        out.push(Related {
            group: if group == "core" {
                String::new()
            } else {
                group.to_string()
            },
            version,
            kind,
            name,
            namespace: entry["namespace"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        });
    }
    Ok(out)
}

/// The consumer copy of related object `source`: its content as `name` in `namespace`, owned
/// (not controlled) by the consumer object `owner`.
pub fn related_copy(source: &Value, name: &str, namespace: Option<&str>, owner: &Value) -> Value {
    let mut obj = content(source);
    let mut meta = json!({
        "name": name,
        "ownerReferences": [{
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
        }],
    });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    obj.insert("metadata".into(), meta);
    Value::Object(obj)
}

/// `stored` updated to `wanted`'s content with `wanted`'s owner reference added; `None` when
/// nothing differs.
pub fn updated_related(stored: &Value, wanted: &Value) -> Option<Value> {
    let owner = &wanted["metadata"]["ownerReferences"][0];
    let mut refs: Vec<Value> = stored["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let owned = refs.iter().any(|r| r["uid"] == owner["uid"]);
    if owned && content(stored) == content(wanted) {
        return None;
    }
    if !owned {
        refs.push(owner.clone());
    }
    let mut out = content(wanted);
    let mut meta = stored["metadata"].clone();
    meta["ownerReferences"] = json!(refs);
    out.insert("metadata".into(), meta);
    Some(Value::Object(out))
}

/// Whether `obj` has an owner reference to the object with `uid`.
pub fn owned_by(obj: &Value, uid: &str) -> bool {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
}

/// What a provider says of an object in `status.status`, when it says anything.
pub fn provider_state(obj: &Value) -> Option<&str> {
    obj["status"]["status"].as_str()
}

/// Whether the provider is still working on the object (`""`, `Unknown`, `Provisioning`).
pub fn still_provisioning(state: &str) -> bool {
    matches!(state, "" | "Unknown" | "Provisioning")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert() -> Value {
        json!({
            "apiVersion": "example.platform-mesh.io/v1alpha1", "kind": "Certificate",
            "metadata": {"name": "c", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                         "labels": {"team": "a"}, "finalizers": ["x"]},
            "spec": {"fqdn": "app.internal.corp"},
            "status": {"conditions": []}
        })
    }

    #[test]
    fn provider_copies_carry_content_and_broker_metadata_only() {
        let copy = provider_copy(&cert(), "abc-c", Some("default"), "consumer#k", "c");
        assert_eq!(copy["spec"]["fqdn"], "app.internal.corp");
        assert_eq!(copy["metadata"]["name"], "abc-c");
        assert_eq!(copy["metadata"]["annotations"][CONSUMER_NAME], "c");
        assert!(copy["metadata"].get("labels").is_none());
        assert!(copy.get("status").is_none());

        // A stored copy that matches needs no write; a removed spec field is removed.
        let mut stored = copy.clone();
        stored["metadata"]["resourceVersion"] = json!("3");
        stored["metadata"]["finalizers"] = json!([GENERIC_FINALIZER, "issuer"]);
        stored["status"] = json!({"status": "Available"});
        assert!(updated_copy(&stored, &copy).is_none());
        stored["spec"]["extra"] = json!(1);
        let updated = updated_copy(&stored, &copy).unwrap();
        assert!(updated["spec"].get("extra").is_none());
        assert_eq!(updated["metadata"]["resourceVersion"], "3");
        assert_eq!(updated["metadata"]["finalizers"][1], "issuer");
    }

    #[test]
    fn status_and_related_resources_lose_the_prefix() {
        let status = json!({"status": "Available", "relatedResources": {
            "secret": {"name": "abc-c", "namespace": "default",
                       "gvk": {"group": "core", "version": "v1", "kind": "Secret"}}}});
        let shown = consumer_status(&status, "abc-");
        assert_eq!(shown["relatedResources"]["secret"]["name"], "c");
        let found = related(&json!({"status": status})).unwrap();
        assert_eq!(found[0].group, "");
        assert_eq!(found[0].name, "abc-c");
        assert!(related(&json!({"status": {"relatedResources": {"x": {"name": "a"}}}})).is_err());

        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "abc-c", "namespace": "ns", "uid": "s"}, "data": {"tls.crt": "AA=="}});
        let copy = related_copy(&secret, "c", Some("default"), &cert());
        assert_eq!(copy["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(copy["data"]["tls.crt"], "AA==");
        assert!(updated_related(&copy, &copy).is_none());
        let mut changed = secret.clone();
        changed["data"]["tls.crt"] = json!("BB==");
        let wanted = related_copy(&changed, "c", Some("default"), &cert());
        assert_eq!(
            updated_related(&copy, &wanted).unwrap()["data"]["tls.crt"],
            "BB=="
        );
        assert!(owned_by(&copy, "u1"));
    }
}
