//! Response compression as kube-apiserver does it: responses of 128 KiB or more are gzipped
//! for clients that accept gzip (`Content-Encoding: gzip`, `Vary: Accept-Encoding`); smaller
//! responses, clients that do not ask and watch streams are sent as they are. kube-rs (with its
//! gzip feature, as the controllers use it) reads the compressed lists; kubectl and the Python
//! client read them in `tests/kubectl.rs` and `tests/official_clients.rs`.

mod common;

use std::io::Read as _;

use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// Creates `n` ConfigMaps of about 1.5 KB each.
async fn fill(client: &https_client::ClientConfig, n: usize) {
    let mut conn = client.connect().await.expect("connect");
    for i in 0..n {
        let r = conn
            .post_json(
                CONFIGMAPS,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("big-{i:04}")},
                    "data": {"payload": format!("{i}-{}", "z".repeat(1500))}}),
            )
            .await
            .expect("create");
        assert_eq!(
            r.status.as_u16(),
            201,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip stream");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_are_gzipped_for_clients_that_ask() {
    let (_server, client, _dir) = common::in_process().await;
    fill(&client, 120).await;
    let mut conn = client.connect().await.expect("connect");
    let plain = conn
        .send_with_headers(Method::GET, CONFIGMAPS, &[], Vec::new())
        .await
        .expect("list");
    assert_eq!(plain.status.as_u16(), 200);
    assert!(plain.body.len() >= 128 * 1024, "{} bytes", plain.body.len());
    assert!(plain.headers.get("content-encoding").is_none());

    let gz = conn
        .send_with_headers(
            Method::GET,
            CONFIGMAPS,
            &[("accept-encoding", "deflate, gzip;q=0.8")],
            Vec::new(),
        )
        .await
        .expect("list with gzip");
    assert_eq!(gz.status.as_u16(), 200);
    assert_eq!(gz.headers["content-encoding"], "gzip");
    assert!(gz
        .headers
        .get_all("vary")
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("Accept-Encoding"))));
    assert!(
        gz.body.len() * 4 < plain.body.len(),
        "{} gzipped bytes of {}",
        gz.body.len(),
        plain.body.len()
    );
    let list: Value = serde_json::from_slice(&gunzip(&gz.body)).expect("JSON");
    // 120, and the namespace's kube-root-ca.crt
    assert_eq!(list["items"].as_array().map(Vec::len), Some(121));

    // Not asked for (q=0), small, or a watch: as they are.
    let refused = conn
        .send_with_headers(
            Method::GET,
            CONFIGMAPS,
            &[("accept-encoding", "gzip;q=0")],
            Vec::new(),
        )
        .await
        .expect("list");
    assert!(refused.headers.get("content-encoding").is_none());
    let one = conn
        .send_with_headers(
            Method::GET,
            &format!("{CONFIGMAPS}/big-0001"),
            &[("accept-encoding", "gzip")],
            Vec::new(),
        )
        .await
        .expect("get");
    assert_eq!(one.status.as_u16(), 200);
    assert!(one.headers.get("content-encoding").is_none());
    // A watch from resourceVersion 0 (every object, well over 128 KiB) that ends after a
    // second: its stream is not gzipped.
    let watch = conn
        .send_with_headers(
            Method::GET,
            &format!("{CONFIGMAPS}?watch=1&resourceVersion=0&timeoutSeconds=1"),
            &[("accept-encoding", "gzip")],
            Vec::new(),
        )
        .await
        .expect("watch");
    assert_eq!(watch.status.as_u16(), 200);
    assert!(watch.headers.get("content-encoding").is_none());
    assert!(String::from_utf8_lossy(&watch.body).contains("big-0119"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_reads_gzipped_lists() {
    let env = common::KubeEnv::start().await;
    let client = env.client("root");
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    for i in 0..120 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("kr-{i:04}")},
            "data": {"payload": "k".repeat(1500)}}))
            .expect("cm");
        api.create(&Default::default(), &cm).await.expect("create");
    }
    let list = api.list(&Default::default()).await.expect("list");
    // (beside the namespace's kube-root-ca.crt)
    let ours = list
        .items
        .iter()
        .filter(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("kr-"))
        })
        .count();
    assert_eq!(ours, 120);
}
