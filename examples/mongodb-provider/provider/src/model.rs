//! The pure parts of the provider: the kind it serves, where a consumer object goes downstream
//! (namespace, name, labels), what the downstream object holds, how its status comes back, and
//! the connection Secret. Nothing here talks to a cluster, so all of it is unit-tested.

use std::collections::BTreeMap;

use controllers::runtime::{ClusterName, Request, ResourceKind};
use kube::api::{ApiResource, DynamicObject};
use serde_json::{json, Map, Value};

/// The API group of the MongoDB community operator's kind.
pub const GROUP: &str = "mongodbcommunity.mongodb.com";
/// The version served, consumer side and downstream.
pub const VERSION: &str = "v1";
/// The kind.
pub const KIND: &str = "MongoDBCommunity";
/// The plural resource name (the operator's CRD uses the singular form as plural).
pub const PLURAL: &str = "mongodbcommunity";

/// The finalizer the provider keeps on consumer objects until their downstream object is gone.
pub const FINALIZER: &str = "mongodb.platform-mesh.io/downstream";
/// Downstream label: the consumer's logical cluster.
pub const CLUSTER_LABEL: &str = "mongodb.platform-mesh.io/cluster";
/// Downstream label: the consumer object's namespace.
pub const NAMESPACE_LABEL: &str = "mongodb.platform-mesh.io/namespace";
/// Downstream label: the consumer object's name.
pub const NAME_LABEL: &str = "mongodb.platform-mesh.io/name";
/// The label on connection Secrets (the export's permission claim selects it).
pub const CONNECTION_LABEL: &str = "mongodb.platform-mesh.io/connection";
/// The key of the connection string in the connection Secret.
pub const CONNECTION_KEY: &str = "connectionString";

/// The phase in which the downstream database is usable.
pub const RUNNING: &str = "Running";

/// The longest namespace name and label value Kubernetes accepts.
const MAX_LABEL: usize = 63;
/// The longest object name Kubernetes accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// `mongodbcommunity.mongodb.com/v1` MongoDBCommunity, the same coordinates on both sides.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_string(),
        version: VERSION.to_string(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_string(),
        plural: PLURAL.to_string(),
    }
}

/// The kind as the runtime watches it (namespaced).
pub fn resource_kind() -> ResourceKind {
    ResourceKind::dynamic(api_resource(), true)
}

/// Why a consumer object cannot be placed downstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A derived name is longer than Kubernetes allows.
    #[error("the downstream {what} {value:?} is longer than {max} characters")]
    TooLong {
        /// Which name.
        what: &'static str,
        /// The name.
        value: String,
        /// Its limit.
        max: usize,
    },
}

/// Where a consumer object `ns/name` of logical cluster `C` lives downstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The consumer's logical cluster.
    pub cluster: String,
    /// The consumer object's namespace.
    pub namespace: String,
    /// The consumer object's name.
    pub name: String,
}

impl Placement {
    /// The placement of `namespace/name` in logical cluster `cluster`, checked against the
    /// length limits of the names and labels it leads to.
    ///
    /// A consumer namespace is a DNS label and a cluster name a single segment, so neither
    /// contains a dot: `<ns>.<name>` cannot collide with another object's downstream name.
    pub fn new(cluster: &str, namespace: &str, name: &str) -> Result<Self, PlacementError> {
        let placement = Placement {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let checks = [
            ("namespace", placement.downstream_namespace(), MAX_LABEL),
            ("name", placement.downstream_name(), MAX_NAME),
            ("cluster label", cluster.to_string(), MAX_LABEL),
            ("namespace label", namespace.to_string(), MAX_LABEL),
            ("name label", name.to_string(), MAX_LABEL),
        ];
        for (what, value, max) in checks {
            if value.len() > max {
                return Err(PlacementError::TooLong { what, value, max });
            }
        }
        Ok(placement)
    }

    /// The downstream namespace, `consumer-<C>`.
    pub fn downstream_namespace(&self) -> String {
        format!("consumer-{}", self.cluster)
    }

    /// The downstream object name, `<ns>.<name>`.
    pub fn downstream_name(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The labels that lead from the downstream object back to the consumer object.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CLUSTER_LABEL.to_string(), self.cluster.clone()),
            (NAMESPACE_LABEL.to_string(), self.namespace.clone()),
            (NAME_LABEL.to_string(), self.name.clone()),
        ])
    }

    /// The name of the connection Secret in the consumer's namespace, `<name>-connection`.
    pub fn secret_name(&self) -> String {
        format!("{}-connection", self.name)
    }

    /// The connection string of the database, the same in the Rust and the Go provider:
    /// `mongodb://<name>-0.<ns>.<name>.consumer-<C>.svc:27017/?replicaSet=<ns>.<name>`.
    pub fn connection_string(&self) -> String {
        let replica_set = self.downstream_name();
        format!(
            "mongodb://{}-0.{replica_set}.{}.svc:27017/?replicaSet={replica_set}",
            self.name,
            self.downstream_namespace()
        )
    }

    /// The downstream object as the provider wants it: labelled, with the consumer's `spec`
    /// verbatim (an empty object when the consumer has none).
    pub fn downstream_object(&self, consumer: &Value) -> Value {
        json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {
                "name": self.downstream_name(),
                "namespace": self.downstream_namespace(),
                "labels": self.labels(),
            },
            "spec": consumer_spec(consumer),
        })
    }

    /// The stored downstream object updated to carry the consumer's spec and the provider's
    /// labels, or `None` when it already does. Other labels and fields are kept; the status is
    /// the operator's and not touched.
    pub fn updated_downstream(&self, stored: &Value, consumer: &Value) -> Option<Value> {
        let spec = consumer_spec(consumer);
        let labels = self.labels();
        let stored_labels = stored
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let labels_ok = labels.iter().all(|(k, v)| {
            stored_labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v.as_str())
        });
        if labels_ok && stored.get("spec") == Some(&spec) {
            return None;
        }
        let mut updated = stored.clone();
        let object = updated.as_object_mut()?;
        object.insert("spec".to_string(), spec);
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        let metadata = metadata.as_object_mut()?;
        let all_labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if !all_labels.is_object() {
            *all_labels = Value::Object(Map::new());
        }
        if let Some(all_labels) = all_labels.as_object_mut() {
            for (k, v) in labels {
                all_labels.insert(k, Value::String(v));
            }
        }
        Some(updated)
    }
}

/// The consumer's `spec`, verbatim; `{}` when it has none.
pub fn consumer_spec(consumer: &Value) -> Value {
    consumer
        .get("spec")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()))
}

/// The request for the consumer object a downstream object was made for, read from the labels
/// the provider put on it; `None` for downstream objects the provider did not make.
pub fn consumer_request(downstream: &DynamicObject) -> Option<Request> {
    let labels = downstream.metadata.labels.as_ref()?;
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty());
    Some(Request::namespaced(
        ClusterName::from(get(CLUSTER_LABEL)?.as_str()),
        get(NAMESPACE_LABEL)?.clone(),
        get(NAME_LABEL)?.clone(),
    ))
}

/// The status the provider reports on a consumer object: what the operator reports downstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportedStatus {
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.version`, absent while the database is not running that version.
    pub version: Option<String>,
    /// `status.message`.
    pub message: Option<String>,
}

fn string_at(obj: &Value, pointer: &str) -> Option<String> {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl ReportedStatus {
    /// The three fields of `obj`'s `status` (absent when missing or not strings).
    pub fn of(obj: &Value) -> Self {
        ReportedStatus {
            phase: string_at(obj, "/status/phase"),
            version: string_at(obj, "/status/version"),
            message: string_at(obj, "/status/message"),
        }
    }

    /// Whether the downstream database is usable.
    pub fn is_running(&self) -> bool {
        self.phase.as_deref() == Some(RUNNING)
    }

    /// A JSON merge patch of the status subresource that makes a status equal this one (absent
    /// fields are removed).
    pub fn merge_patch(&self) -> Value {
        json!({"status": {
            "phase": self.phase,
            "version": self.version,
            "message": self.message,
        }})
    }
}

/// The consumer object's status patch when it differs from the downstream object's, else
/// `None`.
pub fn status_patch(consumer: &Value, downstream: &Value) -> Option<Value> {
    let want = ReportedStatus::of(downstream);
    (ReportedStatus::of(consumer) != want).then(|| want.merge_patch())
}

/// Whether `obj` is being deleted.
pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn finalizers(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Whether `obj` holds the provider's finalizer.
pub fn has_finalizer(obj: &Value) -> bool {
    finalizers(obj).any(|f| f == FINALIZER)
}

/// A merge patch setting `obj`'s finalizers with the provider's added or removed, guarded by
/// `obj`'s resourceVersion (a conflict means someone else wrote meanwhile: retried).
pub fn finalizer_patch(obj: &Value, present: bool) -> Value {
    let mut list: Vec<&str> = finalizers(obj).filter(|f| *f != FINALIZER).collect();
    if present {
        list.push(FINALIZER);
    }
    json!({"metadata": {
        "resourceVersion": obj.pointer("/metadata/resourceVersion"),
        "finalizers": list,
    }})
}

/// The connection Secret as the provider wants it: labelled for the export's claim, the
/// connection string in `stringData`, controlled by the consumer object.
pub fn connection_secret(placement: &Placement, consumer: &Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": placement.secret_name(),
            "namespace": placement.namespace,
            "labels": {CONNECTION_LABEL: "true"},
            "ownerReferences": [owner_reference(consumer)],
        },
        "type": "Opaque",
        "stringData": {CONNECTION_KEY: placement.connection_string()},
    })
}

/// The controller reference to the consumer object.
pub fn owner_reference(consumer: &Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "name": consumer.pointer("/metadata/name"),
        "uid": consumer.pointer("/metadata/uid"),
        "controller": true,
    })
}

/// The stored connection Secret updated to what the provider wants, or `None` when it already
/// is: the label, the controller reference to the consumer object, the connection string (the
/// stored Secret has it base64-encoded in `data`, which `data_value` decodes).
pub fn updated_secret(
    stored: &Value,
    wanted: &Value,
    data_value: impl Fn(&Value) -> Option<String>,
) -> Option<Value> {
    let label_ok = stored
        .pointer(&format!("/metadata/labels/{}", escape(CONNECTION_LABEL)))
        .and_then(Value::as_str)
        == Some("true");
    let owner = &wanted["metadata"]["ownerReferences"][0];
    let owner_ok = stored
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| {
                r.get("uid") == owner.get("uid") && r.get("controller") == Some(&json!(true))
            })
        });
    let want_string = wanted.pointer(&format!("/stringData/{CONNECTION_KEY}"));
    let data_ok = stored
        .pointer(&format!("/data/{CONNECTION_KEY}"))
        .and_then(&data_value)
        .is_some_and(|s| Some(&Value::String(s)) == want_string);
    if label_ok && owner_ok && data_ok {
        return None;
    }
    let mut updated = stored.clone();
    let object = updated.as_object_mut()?;
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()?;
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(CONNECTION_LABEL.to_string(), json!("true"));
    }
    // The consumer object is the only controller; other (non-controller) owners stay.
    let mut refs: Vec<Value> = metadata
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter(|r| r.get("controller") != Some(&json!(true)))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    refs.push(owner.clone());
    metadata.insert("ownerReferences".to_string(), Value::Array(refs));
    object.insert(
        "stringData".to_string(),
        json!({CONNECTION_KEY: want_string.cloned().unwrap_or(Value::Null)}),
    );
    Some(updated)
}

/// A JSON-pointer segment for `key` (`/` and `~` escaped).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement() -> Placement {
        Placement::new("2x9c1v8nh4nzl5u9", "default", "orders").unwrap()
    }

    fn consumer() -> Value {
        json!({
            "apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
            "metadata": {"name": "orders", "namespace": "default", "uid": "u-1",
                "resourceVersion": "7", "labels": {"mongodb.platform-mesh.io/cluster": "forged"}},
            "spec": {"members": 3, "type": "ReplicaSet", "version": "6.0.5"},
        })
    }

    #[test]
    fn downstream_names_labels_and_secret_name() {
        let p = placement();
        assert_eq!(p.downstream_namespace(), "consumer-2x9c1v8nh4nzl5u9");
        assert_eq!(p.downstream_name(), "default.orders");
        assert_eq!(p.secret_name(), "orders-connection");
        assert_eq!(
            p.labels(),
            BTreeMap::from([
                (CLUSTER_LABEL.into(), "2x9c1v8nh4nzl5u9".into()),
                (NAMESPACE_LABEL.into(), "default".into()),
                (NAME_LABEL.into(), "orders".into()),
            ])
        );
    }

    #[test]
    fn names_too_long_for_kubernetes_are_refused() {
        let long = "n".repeat(64);
        assert!(matches!(
            Placement::new("c", &long, "x"),
            Err(PlacementError::TooLong {
                what: "namespace label",
                ..
            })
        ));
        assert!(matches!(
            Placement::new(&"c".repeat(60), "default", "x"),
            Err(PlacementError::TooLong {
                what: "namespace",
                ..
            })
        ));
        assert!(Placement::new("c", "default", &"x".repeat(63)).is_ok());
        let err = Placement::new("c", "default", &"x".repeat(64)).unwrap_err();
        assert!(err.to_string().contains("longer than 63"), "{err}");
    }

    #[test]
    fn connection_string_is_the_contract_one() {
        assert_eq!(
            placement().connection_string(),
            "mongodb://orders-0.default.orders.consumer-2x9c1v8nh4nzl5u9.svc:27017/?replicaSet=default.orders"
        );
    }

    #[test]
    fn the_downstream_object_carries_the_spec_verbatim_and_only_the_providers_labels() {
        let down = placement().downstream_object(&consumer());
        assert_eq!(
            down,
            json!({
                "apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
                "metadata": {"name": "default.orders", "namespace": "consumer-2x9c1v8nh4nzl5u9",
                    "labels": {CLUSTER_LABEL: "2x9c1v8nh4nzl5u9", NAMESPACE_LABEL: "default",
                               NAME_LABEL: "orders"}},
                "spec": {"members": 3, "type": "ReplicaSet", "version": "6.0.5"},
            })
        );
        let bare = json!({"metadata": {"name": "orders"}});
        assert_eq!(placement().downstream_object(&bare)["spec"], json!({}));
    }

    #[test]
    fn the_downstream_object_is_updated_only_when_spec_or_labels_differ() {
        let p = placement();
        let mut stored = p.downstream_object(&consumer());
        stored["metadata"]["resourceVersion"] = json!("3");
        stored["metadata"]["labels"]["other"] = json!("kept");
        stored["status"] = json!({"phase": "Running"});
        assert_eq!(p.updated_downstream(&stored, &consumer()), None);

        let mut bigger = consumer();
        bigger["spec"]["members"] = json!(5);
        let updated = p.updated_downstream(&stored, &bigger).unwrap();
        assert_eq!(updated["spec"]["members"], json!(5));
        assert_eq!(updated["metadata"]["resourceVersion"], json!("3"));
        assert_eq!(updated["metadata"]["labels"]["other"], json!("kept"));
        assert_eq!(updated["status"], json!({"phase": "Running"}));

        // A field the consumer dropped is dropped downstream too (replace, not merge).
        let mut fewer = consumer();
        fewer["spec"] = json!({"members": 3, "type": "ReplicaSet"});
        let updated = p.updated_downstream(&stored, &fewer).unwrap();
        assert_eq!(updated["spec"], json!({"members": 3, "type": "ReplicaSet"}));

        let mut relabelled = stored.clone();
        relabelled["metadata"]["labels"][CLUSTER_LABEL] = json!("someone-else");
        let updated = p.updated_downstream(&relabelled, &consumer()).unwrap();
        assert_eq!(
            updated["metadata"]["labels"][CLUSTER_LABEL],
            json!("2x9c1v8nh4nzl5u9")
        );
        let mut unlabelled = stored.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        let updated = p.updated_downstream(&unlabelled, &consumer()).unwrap();
        assert_eq!(updated["metadata"]["labels"][NAME_LABEL], json!("orders"));
    }

    #[test]
    fn downstream_objects_map_back_through_their_labels_only() {
        let down: DynamicObject =
            serde_json::from_value(placement().downstream_object(&consumer())).unwrap();
        assert_eq!(
            consumer_request(&down),
            Some(Request::namespaced("2x9c1v8nh4nzl5u9", "default", "orders"))
        );
        let foreign: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
            "metadata": {"name": "default.orders", "namespace": "consumer-x",
                "labels": {CLUSTER_LABEL: "x", NAMESPACE_LABEL: ""}}}))
        .unwrap();
        assert_eq!(consumer_request(&foreign), None);
        let unlabelled: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
            "metadata": {"name": "a.b", "namespace": "consumer-x"}}))
        .unwrap();
        assert_eq!(consumer_request(&unlabelled), None);
    }

    #[test]
    fn status_comes_back_field_by_field_and_absent_fields_are_removed() {
        let running = json!({"status": {"phase": "Running", "version": "6.0.5",
            "observedGeneration": 2}});
        let patch = status_patch(&consumer(), &running).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"phase": "Running", "version": "6.0.5", "message": null}})
        );
        let mut reported = consumer();
        reported["status"] = json!({"phase": "Running", "version": "6.0.5"});
        assert_eq!(status_patch(&reported, &running), None);
        assert!(ReportedStatus::of(&running).is_running());

        let pending = json!({"status": {"phase": "Pending", "message": "deploying 5 members",
            "observedGeneration": 2}});
        assert_eq!(
            status_patch(&reported, &pending),
            Some(json!({"status": {"phase": "Pending", "version": null,
                "message": "deploying 5 members"}}))
        );
        assert!(!ReportedStatus::of(&pending).is_running());
        // Nothing reported downstream yet, nothing reported upstream: no write.
        assert_eq!(status_patch(&consumer(), &json!({})), None);
        assert_eq!(
            ReportedStatus::of(&json!({"status": {"phase": 3}})).phase,
            None
        );
    }

    #[test]
    fn finalizers_are_added_and_removed_under_the_resource_version() {
        let c = consumer();
        assert!(!has_finalizer(&c) && !is_deleting(&c));
        let add = finalizer_patch(&c, true);
        assert_eq!(
            add,
            json!({"metadata": {"resourceVersion": "7", "finalizers": [FINALIZER]}})
        );
        let mut held = c.clone();
        held["metadata"]["finalizers"] = json!(["other", FINALIZER]);
        held["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert!(has_finalizer(&held) && is_deleting(&held));
        assert_eq!(
            finalizer_patch(&held, false)["metadata"]["finalizers"],
            json!(["other"])
        );
        assert_eq!(
            finalizer_patch(&held, true)["metadata"]["finalizers"],
            json!(["other", FINALIZER])
        );
    }

    #[test]
    fn the_connection_secret_is_labelled_owned_and_holds_the_string() {
        let p = placement();
        let secret = connection_secret(&p, &consumer());
        assert_eq!(
            secret,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "orders-connection", "namespace": "default",
                    "labels": {CONNECTION_LABEL: "true"},
                    "ownerReferences": [{"apiVersion": "mongodbcommunity.mongodb.com/v1",
                        "kind": "MongoDBCommunity", "name": "orders", "uid": "u-1",
                        "controller": true}]},
                "type": "Opaque",
                "stringData": {CONNECTION_KEY: p.connection_string()},
            })
        );
    }

    #[test]
    fn the_connection_secret_is_rewritten_only_when_it_differs() {
        let p = placement();
        let wanted = connection_secret(&p, &consumer());
        // The stored form: data instead of stringData (decoded by the closure here).
        let stored = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "orders-connection", "namespace": "default",
                "resourceVersion": "9", "labels": {CONNECTION_LABEL: "true", "x": "y"},
                "ownerReferences": [{"apiVersion": "mongodbcommunity.mongodb.com/v1",
                    "kind": "MongoDBCommunity", "name": "orders", "uid": "u-1",
                    "controller": true}]},
            "data": {CONNECTION_KEY: p.connection_string()},
        });
        let decode = |v: &Value| v.as_str().map(str::to_string);
        assert_eq!(updated_secret(&stored, &wanted, decode), None);

        let mut stale = stored.clone();
        stale["data"][CONNECTION_KEY] = json!("mongodb://elsewhere");
        let updated = updated_secret(&stale, &wanted, decode).unwrap();
        assert_eq!(
            updated["stringData"][CONNECTION_KEY],
            json!(p.connection_string())
        );
        assert_eq!(updated["metadata"]["resourceVersion"], json!("9"));
        assert_eq!(updated["metadata"]["labels"]["x"], json!("y"));

        let mut foreign = stored.clone();
        foreign["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u-2", "controller": true},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "d", "uid": "u-3"},
        ]);
        foreign["metadata"]["labels"] = json!({});
        let updated = updated_secret(&foreign, &wanted, decode).unwrap();
        assert_eq!(
            updated["metadata"]["ownerReferences"],
            json!([
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "d", "uid": "u-3"},
                {"apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
                    "name": "orders", "uid": "u-1", "controller": true},
            ])
        );
        assert_eq!(
            updated["metadata"]["labels"][CONNECTION_LABEL],
            json!("true")
        );
    }

    #[test]
    fn the_kind_is_namespaced_with_the_operators_plural() {
        let kind = resource_kind();
        assert!(kind.namespaced);
        assert_eq!(
            kind.gvr(),
            "mongodbcommunity.mongodbcommunity.mongodb.com/v1"
        );
        assert_eq!(kind.api.api_version, "mongodbcommunity.mongodb.com/v1");
    }
}
