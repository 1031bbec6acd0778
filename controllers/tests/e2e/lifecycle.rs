//! The subroutine lifecycle against a real server: finalizer first, then status, no write when
//! nothing changed, finalize and finalizer removal on delete.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

use super::TestServer;
use controllers::subroutines::{drive, Lifecycle, Step, Subroutine};

fn platform_meshes() -> ApiResource {
    ApiResource {
        group: "core.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        api_version: "core.platform-mesh.io/v1alpha1".into(),
        kind: "PlatformMesh".into(),
        plural: "platformmeshes".into(),
    }
}

#[derive(Default)]
struct Counts {
    processed: AtomicUsize,
    finalized: AtomicUsize,
}

struct Count(Arc<Counts>);

#[async_trait::async_trait]
impl Subroutine<(), String> for Count {
    fn name(&self) -> &'static str {
        "Deployment"
    }
    fn finalizers(&self) -> &'static [&'static str] {
        &["platform-mesh.core.platform-mesh.io/finalizer"]
    }
    async fn process(&self, _: &()) -> Result<Step, String> {
        self.0.processed.fetch_add(1, Ordering::SeqCst);
        Ok(Step::Done {
            message: "deployed".into(),
            requeue: None,
        })
    }
    async fn finalize(&self, _: &()) -> Result<Step, String> {
        self.0.finalized.fetch_add(1, Ordering::SeqCst);
        Ok(Step::done())
    }
}

fn writes(ts: &TestServer) -> u64 {
    super::deploy::writes(ts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_adds_the_finalizer_writes_status_once_and_finalizes_on_delete() {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &platform_meshes());
    let pm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
        "metadata": {"name": "pm"}, "spec": {}
    }))
    .unwrap();
    api.create(&PostParams::default(), &pm)
        .await
        .expect("create PlatformMesh");
    let counts = Arc::new(Counts::default());
    let lc = Lifecycle::new().step(Count(counts.clone()));

    // 1. The finalizer, and nothing else.
    let obj = api.get("pm").await.unwrap();
    drive(&lc, &api, &obj, &()).await.expect("first drive");
    let obj = api.get("pm").await.unwrap();
    assert_eq!(
        obj.metadata.finalizers.as_deref(),
        Some(&["platform-mesh.core.platform-mesh.io/finalizer".to_string()][..])
    );
    assert_eq!(counts.processed.load(Ordering::SeqCst), 0);

    // 2. The chain runs; status gets conditions and observedGeneration.
    drive(&lc, &api, &obj, &()).await.expect("second drive");
    let obj = api.get("pm").await.unwrap();
    assert_eq!(counts.processed.load(Ordering::SeqCst), 1);
    let conditions = obj.data["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .clone();
    let ready = conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .expect("Ready");
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["reason"], "Complete");
    let step = conditions
        .iter()
        .find(|c| c["type"] == "Deployment")
        .expect("step");
    assert_eq!(step["message"], "deployed");
    assert_eq!(
        obj.data["status"]["observedGeneration"],
        obj.metadata.generation.unwrap()
    );

    // 3. Nothing changed: no write at all.
    let before = writes(&ts);
    drive(&lc, &api, &obj, &()).await.expect("third drive");
    assert_eq!(writes(&ts), before, "an unchanged object costs no write");
    assert_eq!(counts.processed.load(Ordering::SeqCst), 2);

    // 4. Delete: the finalizer holds the object until finalize ran.
    api.delete("pm", &DeleteParams::default())
        .await
        .expect("delete");
    let obj = api.get("pm").await.expect("still there, finalizing");
    assert!(obj.metadata.deletion_timestamp.is_some());
    drive(&lc, &api, &obj, &()).await.expect("finalizing drive");
    assert_eq!(counts.finalized.load(Ordering::SeqCst), 1);
    assert!(
        api.get_opt("pm").await.unwrap().is_none(),
        "gone once its finalizer was removed"
    );
    ts.stop().await;
}
