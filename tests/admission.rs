//! Admission of Platform Mesh objects: every invalid object of the table is refused with the same
//! field and message through the API server (422) and through the admission webhook
//! (`allowed: false`), and the mutating webhook answers defaults as a JSONPatch.

use base64::Engine;
use http::Method;
use https_client::{ClientConfig, Connection};
use serde_json::{json, Value};

mod common;

use common::in_process as server;

fn review(uid: &str, obj: &Value, operation: &str, old: Option<&Value>) -> Value {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let mut request = json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": ""},
        "name": obj["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": "system:admin"},
        "object": obj,
        "dryRun": false,
    });
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

async fn post(c: &mut Connection, path: &str, body: &Value) -> https_client::Reply {
    c.send(
        Method::POST,
        path,
        Some("application/json"),
        serde_json::to_vec(body).expect("json"),
    )
    .await
    .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_refused_alike_by_the_server_and_the_webhook() {
    let cases = apiserver::admission::rules::invalid_cases();
    assert!(
        cases.len() >= 60,
        "the table needs at least 60 invalid objects, has {}",
        cases.len()
    );
    let kinds: std::collections::BTreeSet<_> = cases.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds.len(),
        8,
        "every Platform Mesh kind needs cases: {kinds:?}"
    );
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    for (i, case) in cases.iter().enumerate() {
        let api_version = case.object["apiVersion"].as_str().expect("apiVersion");
        let path = if case.namespaced {
            format!("/apis/{api_version}/namespaces/default/{}", case.plural)
        } else {
            format!("/apis/{api_version}/{}", case.plural)
        };
        let r = post(&mut c, &path, &case.object).await;
        let status = r.json();
        assert_eq!(r.status, 422, "{}: the server answered {status}", case.name);
        let causes = status["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            causes
                .iter()
                .any(|cause| cause["field"] == case.field && cause["message"] == case.message),
            "{}: expected cause {:?}: {:?}, got {}",
            case.name,
            case.field,
            case.message,
            status
        );
        // A kube-apiserver sends the object as it would store it: namespace filled in.
        let mut sent = case.object.clone();
        if case.namespaced {
            sent["metadata"]["namespace"] = json!("default");
        }
        let uid = format!("uid-{i}");
        let w = post(
            &mut c,
            "/admission/validate?timeout=10s",
            &review(&uid, &sent, "CREATE", None),
        )
        .await;
        assert_eq!(w.status, 200, "{}", case.name);
        let resp = &w.json()["response"];
        assert_eq!(resp["uid"], uid, "{}: uid not echoed", case.name);
        assert_eq!(
            resp["allowed"], false,
            "{}: the webhook allowed it",
            case.name
        );
        assert_eq!(
            resp["status"]["message"], status["message"],
            "{}: messages differ",
            case.name
        );
        assert_eq!(resp["status"]["code"], 422);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_allows_valid_objects_and_patches_defaults() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let pm = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh", "metadata": {"name": "pm", "namespace": "x"}, "spec": {"ocm": {}}});
    let v = post(
        &mut c,
        "/admission/validate",
        &review("a", &pm, "CREATE", None),
    )
    .await
    .json();
    assert_eq!(v["response"]["allowed"], true, "{v}");
    let m = post(
        &mut c,
        "/admission/mutate",
        &review("b", &pm, "CREATE", None),
    )
    .await
    .json();
    let resp = &m["response"];
    assert_eq!(resp["uid"], "b");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch", "{m}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().expect("patch"))
        .expect("base64");
    let ops: Vec<Value> = serde_json::from_slice(&patch).expect("json patch");
    assert!(!ops.is_empty());
    let mut patched = pm.clone();
    let ops: json_patch::Patch = serde_json::from_value(json!(ops)).expect("ops");
    json_patch::patch(&mut patched, &ops).expect("applies");
    assert_ne!(patched, pm);
    // Deletes are not judged.
    let d = post(
        &mut c,
        "/admission/validate",
        &review("c", &pm, "DELETE", None),
    )
    .await
    .json();
    assert_eq!(d["response"]["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_reviews_get_400_and_need_no_client_certificate() {
    let (s, _client, d) = server().await;
    let ca = std::fs::read_to_string(d.path().join("data/pki/ca.crt")).expect("ca");
    let anonymous = ClientConfig::new(s.address, &ca, None).expect("client");
    let mut c = anonymous.connect().await.expect("connect");
    for body in [
        json!("nope"),
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
        json!({"apiVersion": "v1", "kind": "Status"}),
    ] {
        let r = post(&mut c, "/admission/validate", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["kind"], "Status");
    }
    let r = c
        .send(
            Method::POST,
            "/admission/mutate",
            Some("application/json"),
            "{not json",
        )
        .await
        .expect("req");
    assert_eq!(r.status, 400);
    assert_eq!(c.get("/admission/validate").await.expect("get").status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_records_who_created_it() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let account = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
        "metadata": {"name": "acme"}, "spec": {"type": "org", "displayName": "Acme", "creator": "someone-else"}});
    let r = post(
        &mut c,
        "/apis/core.platform-mesh.io/v1alpha1/accounts",
        &account,
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["spec"]["creator"], "admin");
}

/// Small reviews are decided on the request's task, large ones in the admission pool: both paths
/// give the same answer, with the uid echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_large_reviews_get_the_same_answer() {
    let (_s, client, _d) = server().await;
    let mut c = client.connect().await.expect("connect");
    let case = apiserver::admission::rules::invalid_cases()
        .into_iter()
        .find(|c| c.kind == "AcceptAPI")
        .expect("an AcceptAPI case");
    let mut small = case.object.clone();
    small["metadata"]["namespace"] = json!("default");
    let mut large = small.clone();
    large["metadata"]["annotations"] = json!({"padding": "x".repeat(64 * 1024)});
    let mut messages = Vec::new();
    for (uid, obj) in [("small", &small), ("large", &large)] {
        let body = review(uid, obj, "CREATE", None);
        assert_eq!(
            serde_json::to_vec(&body).expect("json").len() > 32 * 1024,
            uid == "large"
        );
        let w = post(&mut c, "/admission/validate?timeout=10s", &body).await;
        assert_eq!(w.status, 200, "{uid}");
        let resp = &w.json()["response"];
        assert_eq!(resp["uid"], uid);
        assert_eq!(resp["allowed"], false, "{uid}: {resp}");
        messages.push(resp["status"]["message"].clone());
    }
    assert_eq!(messages[0], messages[1]);
    assert!(
        messages[0]
            .as_str()
            .is_some_and(|m| m.contains(case.message)),
        "{messages:?} should mention {:?}",
        case.message
    );
}
