//! Crash safety of the default (redb) store: kill -9 in the middle of 64 concurrent writers, restart,
//! and every acknowledged write is there, whole, with resourceVersions still increasing.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use serde_json::{json, Value};

const WRITERS: usize = 64;

fn payload(name: &str) -> String {
    // Deterministic content that lets a reader tell a whole object from a damaged one.
    name.repeat(16)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_concurrent_writes_loses_no_acknowledged_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut server = Server::start_in(&dir, "127.0.0.1:0");
    let client = server.client();

    let acknowledged: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(mut conn) = client.connect().await else { return };
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w:02}-{i:05}");
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"payload": payload(&name)}});
                match conn.post_json("/api/v1/namespaces/default/configmaps", &body).await {
                    Ok(r) if r.status == 201 => {
                        let rv = r.json()["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
                        acknowledged.lock().expect("lock").insert(name, rv);
                    }
                    _ => return,
                }
                i += 1;
            }
        }));
    }
    // Let the writers run, then kill the server while they are mid-flight.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = acknowledged.lock().expect("lock").len();
    assert!(
        before > 64,
        "writers made too little progress before the kill: {before}"
    );
    server.kill();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    let max_rv = acknowledged.values().copied().max().unwrap_or(0);

    let server = Server::start_in(&dir, "127.0.0.1:0");
    let mut conn = server
        .client()
        .connect()
        .await
        .expect("connect after restart");
    let list = conn
        .get("/api/v1/namespaces/default/configmaps")
        .await
        .expect("list");
    assert_eq!(list.status, 200);
    let list = list.json();
    let items = list["items"].as_array().expect("items");
    let mut found: HashMap<String, &Value> = HashMap::new();
    for item in items {
        let name = item["metadata"]["name"].as_str().expect("name").to_string();
        if name == "kube-root-ca.crt" {
            continue; // the namespace's own, made by the server
        }
        assert_eq!(
            item["data"]["payload"],
            payload(&name),
            "object {name} is damaged"
        );
        found.insert(name, item);
    }
    for (name, rv) in &acknowledged {
        let item = found
            .get(name)
            .unwrap_or_else(|| panic!("acknowledged write {name} (rv {rv}) is lost"));
        assert_eq!(
            item["metadata"]["resourceVersion"],
            rv.to_string(),
            "{name} changed revision"
        );
    }
    // Revisions keep increasing across the restart.
    let created = conn
        .post_json(
            "/api/v1/namespaces/default/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-restart"}}),
        )
        .await
        .expect("create after restart");
    assert_eq!(created.status, 201, "{:?}", created.body);
    let rv: u64 = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    let list_rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("list rv");
    assert!(
        rv > max_rv && rv > list_rv,
        "revision went backwards: {rv} <= {max_rv} / {list_rv}"
    );
}
