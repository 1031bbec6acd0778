//! Events a controller records about the objects it reconciles: `events.k8s.io/v1` Events,
//! written into the object's own logical cluster (through that cluster's client).

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

/// Whether an event is routine or worth a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Routine.
    Normal,
    /// Something a person may need to act on.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Regarding {
    /// `group/version` of the object.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

impl Regarding {
    /// The reference of a dynamic object.
    pub fn of(obj: &DynamicObject) -> Self {
        Regarding {
            api_version: obj
                .types
                .as_ref()
                .map(|t| t.api_version.clone())
                .unwrap_or_default(),
            kind: obj
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_default(),
            namespace: obj.metadata.namespace.clone().unwrap_or_default(),
            name: obj.metadata.name.clone().unwrap_or_default(),
            uid: obj.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// Records events for one controller instance.
///
/// ```no_run
/// # async fn f(client: kube::Client, obj: kube::api::DynamicObject) -> Result<(), kube::Error> {
/// use mc_runtime::events::{EventRecorder, EventType, Regarding};
/// let recorder = EventRecorder::new("widget-controller", "pod-1");
/// recorder.publish(&client, &Regarding::of(&obj), EventType::Normal, "Synced", "Reconcile", "copied the spec").await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EventRecorder {
    controller: String,
    instance: String,
}

fn events_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("events.k8s.io", "v1", "Event"),
        "events",
    )
}

impl EventRecorder {
    /// A recorder reporting as `controller` (e.g. `platform-mesh.io/widgets`) from `instance`.
    pub fn new(controller: impl Into<String>, instance: impl Into<String>) -> Self {
        EventRecorder {
            controller: controller.into(),
            instance: instance.into(),
        }
    }

    /// Writes one Event about `regarding` with the cluster's `client`; cluster-scoped objects get
    /// their events in `default`, as Kubernetes does.
    pub async fn publish(
        &self,
        client: &kube::Client,
        regarding: &Regarding,
        kind: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<DynamicObject, kube::Error> {
        let namespace = if regarding.namespace.is_empty() {
            "default"
        } else {
            regarding.namespace.as_str()
        };
        let suffix: u64 = rand::random();
        let event: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": format!("{}.{suffix:016x}", regarding.name), "namespace": namespace},
            "eventTime": crate::lease::now_micro(),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "note": note,
            "type": kind.as_str(),
            "regarding": {
                "apiVersion": regarding.api_version,
                "kind": regarding.kind,
                "namespace": regarding.namespace,
                "name": regarding.name,
                "uid": regarding.uid,
            },
        }))
        .map_err(kube::Error::SerdeError)?;
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &events_resource())
            .create(&PostParams::default(), &event)
            .await
    }
}
