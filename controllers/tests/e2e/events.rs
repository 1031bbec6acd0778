//! Events recorded by a controller land in the object's own logical cluster.

use kube::api::{Api, ApiResource, DynamicObject};

use super::TestServer;

#[tokio::test]
async fn events_are_recorded_in_the_objects_own_cluster() {
    use controllers::runtime::events::{EventRecorder, EventType, Regarding};
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        ),
    );
    let cm: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched", "namespace": "default"}}))
    .unwrap();
    let cm = cms.create(&Default::default(), &cm).await.unwrap();
    let recorder = EventRecorder::new("platform-mesh.io/test", "replica-0");
    recorder
        .publish(
            &client,
            &Regarding::of(&cm),
            EventType::Warning,
            "Broken",
            "Reconcile",
            "something to look at",
        )
        .await
        .expect("event recorded");
    let events: Api<DynamicObject> = Api::namespaced_with(
        client,
        "default",
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("events.k8s.io", "v1", "Event"),
            "events",
        ),
    );
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0].data;
    assert_eq!(e["regarding"]["name"], "watched");
    assert_eq!(e["regarding"]["uid"], serde_json::json!(cm.metadata.uid));
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reportingController"], "platform-mesh.io/test");
    ts.stop().await;
}
