//! Wire-protocol details kubectl and client libraries depend on, checked against an in-process
//! server: discovery negotiation, OpenAPI forms, watch semantics, Table and metadata output.

use std::time::Duration;

use http::Method;
use https_client::Connection;
use serde_json::{json, Value};

mod common;

use common::in_process as server;

async fn send_accept(c: &mut Connection, path: &str, accept: &str) -> https_client::Reply {
    c.send_with_headers(
        Method::GET,
        path,
        &[("accept", accept)],
        bytes::Bytes::new(),
    )
    .await
    .expect("request")
}

fn events(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("each watch line is one JSON event"))
        .collect()
}

async fn create_cm(c: &mut Connection, name: &str, labels: Value) -> Value {
    let r = c
        .post_json(
            "/api/v1/namespaces/default/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": name}}),
        )
        .await
        .expect("create");
    assert_eq!(r.status, 201, "{:?}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_the_version_the_client_asked_for() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let v2beta1 = send_accept(&mut c, "/apis", "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json").await;
    assert_eq!(
        v2beta1.headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
    );
    let body = v2beta1.json();
    assert_eq!(body["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    let pm = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|g| g["metadata"]["name"] == "core.platform-mesh.io")
        .expect("group");
    let res = &pm["versions"][0]["resources"];
    assert!(res
        .as_array()
        .expect("resources")
        .iter()
        .all(|r| r["responseKind"]["kind"].is_string()
            && (r["scope"] == "Namespaced" || r["scope"] == "Cluster")));
    let v2 = send_accept(&mut c, "/api", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json").await;
    assert_eq!(v2.json()["apiVersion"], "apidiscovery.k8s.io/v2");
    assert_eq!(v2.json()["items"][0]["metadata"]["name"], "");
    let legacy = send_accept(&mut c, "/api?timeout=32s", "application/json, */*").await;
    assert_eq!(legacy.json()["kind"], "APIVersions");
    let group = c.get("/apis/core.platform-mesh.io").await.expect("group");
    assert_eq!(
        group.json()["preferredVersion"]["groupVersion"],
        "core.platform-mesh.io/v1alpha1"
    );
    let list = c.get("/api/v1").await.expect("resources");
    assert!(list.json()["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .any(|r| r["name"] == "namespaces/status"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_v2_is_protobuf_when_asked_and_v3_paths_are_unprefixed() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let proto = send_accept(
        &mut c,
        "/openapi/v2?timeout=32s",
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    )
    .await;
    assert_eq!(proto.status, 200);
    assert_eq!(
        proto.headers["content-type"],
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    );
    assert_eq!(&proto.body[..5], b"\x0a\x032.0");
    let root = c.get("/clusters/root/openapi/v3").await.expect("v3").json();
    let url = root["paths"]["api/v1"]["serverRelativeURL"]
        .as_str()
        .expect("url");
    assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
    let doc = c.get(url).await.expect("doc");
    assert!(doc.headers.contains_key("etag"));
}

/// The events of the test's own objects: not of the namespace's kube-root-ca.crt, which the
/// server puts in every namespace.
fn ours(events: Vec<Value>) -> Vec<Value> {
    events
        .into_iter()
        .filter(|e| e["object"]["metadata"]["name"] != "kube-root-ca.crt")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_revision_sends_only_later_events() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let a = create_cm(&mut c, "a", json!({"app": "x"})).await;
    let rv = a["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    create_cm(&mut c, "b", json!({"app": "x"})).await;
    let w = c
        .get(&format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1"))
        .await
        .expect("watch");
    let ev = ours(events(&w.body));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[0]["object"]["metadata"]["name"], "b");

    // RV 0: current state first.
    let w = c
        .get("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1")
        .await
        .expect("watch");
    let names: Vec<_> = ours(events(&w.body))
        .iter()
        .map(|e| e["object"]["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("b")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_initial_events_ends_with_the_annotated_bookmark() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    create_cm(&mut c, "a", json!({})).await;
    let w = c
        .get("/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1")
        .await
        .expect("watch");
    let ev = ours(events(&w.body));
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[1]["type"], "BOOKMARK");
    assert_eq!(
        ev[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(ev[1]["object"]["kind"], "ConfigMap");
    let bad = c
        .get("/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true")
        .await
        .expect("watch");
    assert_eq!(bad.status, 422);
    assert!(bad.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_revision_gives_an_error_event_with_410() {
    let (s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let first = create_cm(&mut c, "a", json!({})).await;
    for i in 0..5 {
        create_cm(&mut c, &format!("n{i}"), json!({})).await;
    }
    let current = s.state.store.current_revision();
    s.state.store.compact(current - 1).await.expect("compact");
    let rv = first["metadata"]["resourceVersion"].as_str().expect("rv");
    let w = c
        .get(&format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1"))
        .await
        .expect("watch");
    assert_eq!(w.status, 200);
    let ev = events(&w.body);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["type"], "ERROR");
    assert_eq!(ev[0]["object"]["code"], 410);
    assert_eq!(ev[0]["object"]["reason"], "Expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_changes_turn_into_added_and_deleted_for_a_selecting_watch() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let a = create_cm(&mut c, "a", json!({"app": "x"})).await;
    let rv = a["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let path = "/api/v1/namespaces/default/configmaps/a";
    for labels in [json!({"app": "y"}), json!({"app": "x"})] {
        let r = c
            .send(
                Method::PATCH,
                path,
                Some("application/merge-patch+json"),
                serde_json::to_vec(&json!({"metadata": {"labels": labels}})).expect("json"),
            )
            .await
            .expect("patch");
        assert_eq!(r.status, 200);
    }
    let w = c
        .get(&format!("/api/v1/namespaces/default/configmaps?watch=true&labelSelector=app%3Dx&resourceVersion={rv}&timeoutSeconds=1"))
        .await
        .expect("watch");
    let types: Vec<_> = events(&w.body).iter().map(|e| e["type"].clone()).collect();
    assert_eq!(types, vec![json!("DELETED"), json!("ADDED")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_and_metadata_on_list_get_and_watch() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    create_cm(&mut c, "a", json!({"team": "t"})).await;
    let table = send_accept(
        &mut c,
        "/api/v1/configmaps",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await
    .json();
    assert_eq!(table["kind"], "Table");
    let cols: Vec<_> = table["columnDefinitions"]
        .as_array()
        .expect("cols")
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(cols, vec![json!("Name"), json!("Data"), json!("Age")]);
    let row = &table["rows"][0];
    assert_eq!(row["cells"].as_array().expect("cells").len(), 3);
    assert_eq!(row["cells"][1], 1);
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["metadata"]["labels"]["team"], "t");
    let beta = send_accept(
        &mut c,
        "/api/v1/namespaces/default/configmaps/a",
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
    )
    .await
    .json();
    assert_eq!(beta["apiVersion"], "meta.k8s.io/v1beta1");
    let none = send_accept(
        &mut c,
        "/api/v1/configmaps?includeObject=None",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await
    .json();
    assert_eq!(none["rows"][0].get("object"), Some(&Value::Null));
    let meta = send_accept(
        &mut c,
        "/api/v1/configmaps",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    )
    .await
    .json();
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    assert!(meta["items"][0].get("data").is_none());
    let w = send_accept(
        &mut c,
        "/api/v1/configmaps?watch=true&timeoutSeconds=1",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!(
        events(&w.body)[0]["object"]["kind"],
        "PartialObjectMetadata"
    );
    let w = send_accept(
        &mut c,
        "/api/v1/configmaps?watch=true&timeoutSeconds=1",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await;
    assert_eq!(events(&w.body)[0]["object"]["kind"], "Table");
    let bad = send_accept(
        &mut c,
        "/api/v1/configmaps?includeObject=Everything",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_follow_kube_semantics() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let pm = "/apis/core.platform-mesh.io/v1alpha1/namespaces/default/platformmeshes";
    let created = c
        .post_json(pm, &json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh", "metadata": {"generateName": "pm-"}, "spec": {}, "status": {"conditions": []}}))
        .await
        .expect("create");
    assert_eq!(created.status, 201);
    let obj = created.json();
    let name = obj["metadata"]["name"].as_str().expect("name").to_string();
    assert!(name.starts_with("pm-") && name.len() == 8, "{name}");
    assert_eq!(obj["metadata"]["generation"], 1);
    assert!(
        obj.get("status").is_none(),
        "create must drop status: {obj}"
    );
    let item = format!("{pm}/{name}");
    // A no-op write keeps the resourceVersion.
    let rv = obj["metadata"]["resourceVersion"].clone();
    let noop = c
        .send(
            Method::PATCH,
            &item,
            Some("application/merge-patch+json"),
            "{}",
        )
        .await
        .expect("patch");
    assert_eq!(noop.json()["metadata"]["resourceVersion"], rv);
    // Status writes do not bump generation; main writes ignore status.
    let st = c
        .send(Method::PATCH, &format!("{item}/status"), Some("application/merge-patch+json"), r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Ok","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]},"spec":{"exposure":{"port":1}}}"#)
        .await
        .expect("status");
    assert_eq!(st.status, 200, "{:?}", st.body);
    assert_eq!(st.json()["metadata"]["generation"], 1);
    assert!(st.json()["spec"].get("exposure").is_none());
    let main = c
        .send(
            Method::PATCH,
            &item,
            Some("application/merge-patch+json"),
            r#"{"status":null,"spec":{"exposure":{"port":2}}}"#,
        )
        .await
        .expect("main");
    assert_eq!(main.json()["metadata"]["generation"], 2);
    assert_eq!(main.json()["status"]["conditions"][0]["type"], "Ready");
    // Dry run stores nothing.
    let dry = c
        .send(Method::DELETE, &format!("{item}?dryRun=All"), None, "")
        .await
        .expect("dry delete");
    assert_eq!(dry.status, 200);
    assert_eq!(c.get(&item).await.expect("get").status, 200);
    // Strict field validation names unknown fields; Warn answers with Warning headers.
    let strict = c
        .post_json(&format!("{pm}?fieldValidation=Strict"), &json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh", "metadata": {"name": "s"}, "spec": {"bogus": 1}}))
        .await
        .expect("strict");
    assert_eq!(strict.status, 400);
    assert!(
        strict.json()["message"]
            .as_str()
            .unwrap_or("")
            .contains("unknown field \"spec.bogus\""),
        "{:?}",
        strict.json()
    );
    let warn = c
        .post_json(pm, &json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh", "metadata": {"name": "w"}, "spec": {"bogus": 1}}))
        .await
        .expect("warn");
    assert_eq!(warn.status, 201);
    assert!(
        warn.headers.get_all("warning").iter().any(|v| v
            .to_str()
            .unwrap_or("")
            .contains("unknown field \\\"spec.bogus\\\"")),
        "{:?}",
        warn.headers
    );
    assert!(warn.json()["spec"].get("bogus").is_none());
    // The wildcard list carries the cluster of every object.
    let all = c
        .get("/clusters/*/apis/core.platform-mesh.io/v1alpha1/platformmeshes")
        .await
        .expect("wildcard")
        .json();
    assert!(all["items"]
        .as_array()
        .expect("items")
        .iter()
        .all(|i| i["metadata"]["annotations"]["kcp.io/cluster"] == "root"));
    // Namespace deletion removes what is inside.
    c.post_json(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}}),
    )
    .await
    .expect("ns");
    c.post_json(
        "/api/v1/namespaces/gone/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
    )
    .await
    .expect("cm");
    let del = c
        .send(Method::DELETE, "/api/v1/namespaces/gone", None, "")
        .await
        .expect("delete ns");
    assert_eq!(del.json()["status"]["phase"], "Terminating");
    let mut gone = false;
    for _ in 0..50 {
        if c.get("/api/v1/namespaces/gone").await.expect("get").status == 404 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "namespace was not removed");
    assert_eq!(
        c.get("/api/v1/namespaces/gone/configmaps/x")
            .await
            .expect("get")
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_as_kube_apiserver_and_only_of_served_types() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    c.get("/api/v1/namespaces/default/configmaps")
        .await
        .expect("list");
    // Paths that name no served type: a hostile client's way to add series, if they counted.
    for i in 0..50 {
        let r = c
            .get(&format!("/api/v1/namespaces/default/made-up-{i}"))
            .await
            .expect("get");
        assert_eq!(r.status, 404);
        let r = c
            .get(&format!("/apis/made.up/v{i}/things"))
            .await
            .expect("get");
        assert_eq!(r.status, 404);
    }
    let m = c.get("/metrics").await.expect("metrics");
    assert_eq!(
        m.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains(
            "apiserver_request_total{code=\"200\",dry_run=\"\",component=\"apiserver\",group=\"\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.lines().any(
            |l| l.starts_with("apiserver_request_sli_duration_seconds_bucket{")
                && l.contains("resource=\"configmaps\"")
                && l.contains("verb=\"LIST\"")
        ),
        "{text}"
    );
    assert!(
        !text.contains("made"),
        "unserved types are not counted: {text}"
    );
}

/// Patches without a resourceVersion racing on one object all land, as on kube-apiserver (its
/// GuaranteedUpdate reads again and re-applies a patch whose write lost the race); a patch
/// naming a stale resourceVersion is refused with 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_patches_without_a_resource_version_all_land() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let created = create_cm(&mut c, "raced", json!({})).await;
    let stale = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string();
    let item = "/api/v1/namespaces/default/configmaps/raced";
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = client.connect().await.expect("connect");
            let mut codes = Vec::new();
            for i in 0..EACH {
                let patch = json!({"data": {format!("w{w}-{i}"): "x"}}).to_string();
                let r = c
                    .send(
                        Method::PATCH,
                        item,
                        Some("application/merge-patch+json"),
                        patch,
                    )
                    .await
                    .expect("patch");
                codes.push(r.status.as_u16());
            }
            codes
        }));
    }
    for t in tasks {
        let codes = t.await.expect("writer");
        assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    }
    let r = c.get(item).await.expect("get");
    let data = r.json()["data"].as_object().cloned().unwrap_or_default();
    assert_eq!(data.len(), 1 + WRITERS * EACH, "{data:?}");
    let r = c
        .send(
            Method::PATCH,
            item,
            Some("application/merge-patch+json"),
            json!({"metadata": {"resourceVersion": stale}, "data": {"late": "x"}}).to_string(),
        )
        .await
        .expect("patch");
    assert_eq!(r.status.as_u16(), 409, "{}", r.json());
}
