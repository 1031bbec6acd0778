//! Request limits: beyond the configured number of short requests in flight the server answers
//! 429 with Retry-After, health checks still answer, and it recovers when load drops; a request
//! that outlives --request-timeout gets 504; a workspace holds at most
//! --max-objects-per-workspace objects.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A connection that starts a create whose body never finishes arriving.
async fn slow_request(
    server: &apiserver::server::RunningServer,
    dir: &tempfile::TempDir,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    slow_request_to(server, dir, "/api/v1/namespaces/default/configmaps").await
}

/// A connection that starts a POST to `path` whose body never finishes arriving.
async fn slow_request_to(
    server: &apiserver::server::RunningServer,
    dir: &tempfile::TempDir,
    path: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let pki = dir.path().join("data/pki");
    let read = |f: &str| std::fs::read(pki.join(f)).expect("pki");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&read("ca.crt")).expect("ca"))
        .expect("root");
    let chain = vec![CertificateDer::from_pem_slice(&read("admin.crt")).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(&read("admin.key")).expect("key");
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    let tcp = tokio::net::TcpStream::connect(server.address)
        .await
        .expect("connect");
    let mut slow = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls");
    let head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{");
    slow.write_all(head.as_bytes()).await.expect("write");
    slow.flush().await.expect("flush");
    slow
}

/// Whether a list is served again within five seconds (a freed slot).
async fn served_again(client: &https_client::ClientConfig) -> bool {
    for _ in 0..50 {
        let mut c = client.connect().await.expect("connect");
        if c.get("/api/v1/namespaces/default/configmaps")
            .await
            .expect("get")
            .status
            == 200
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Only what the router serves as a watch escapes the in-flight limit: a slow write dressed up
/// as a watch (a `watch` flag on a POST, repeated flags, a namespace named `watch`) holds a slot
/// like any short request, so the next request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dressed_as_a_watch_still_counts_against_the_limit() {
    let (server, client, dir) = common::in_process_with(|o| o.max_requests_in_flight = 1).await;
    for path in [
        "/api/v1/namespaces/default/configmaps?watch=1",
        "/api/v1/namespaces/default/configmaps?watch=true&watch=false",
        "/api/v1/namespaces/default/configmaps?watch=0&watch=1",
        "/api/v1/namespaces/watch/configmaps",
        "/api/v1/watch/namespaces/default/configmaps",
        "/clusters/root/api/v1/namespaces/default/configmaps?watch=true",
    ] {
        let slow = slow_request_to(&server, &dir, path).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut c = client.connect().await.expect("connect");
        let r = c
            .get("/api/v1/namespaces/default/configmaps")
            .await
            .expect("get");
        assert_eq!(r.status, 429, "{path} did not hold its slot");
        drop(slow);
        // The slot comes back before the next disguise is tried.
        assert!(
            served_again(&client).await,
            "{path}: the slot never came back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_limit_get_429_and_the_server_recovers() {
    let (server, client, dir) = common::in_process_with(|o| o.max_requests_in_flight = 1).await;
    // Hold the only slot: a request whose body never finishes arriving.
    let slow = slow_request(&server, &dir).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut c = client.connect().await.expect("connect");
    let refused = c
        .get("/api/v1/namespaces/default/configmaps")
        .await
        .expect("get");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["reason"], "TooManyRequests");
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(c.get("/livez").await.expect("livez").status, 200);

    // Load drops: the slot frees and requests are served again.
    drop(slow);
    assert!(served_again(&client).await, "the server did not recover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_request_timeout_gets_504() {
    let (server, client, dir) =
        common::in_process_with(|o| o.request_timeout = Duration::from_secs(1)).await;
    let mut slow = slow_request(&server, &dir).await;
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = slow.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buf[..n]);
            if response.windows(9).any(|w| w == b"\"code\":504") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 20 s");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(text.contains("\"reason\":\"Timeout\""), "{text}");
    // Other requests are unaffected.
    let mut c = client.connect().await.expect("connect");
    assert_eq!(c.get("/api/v1/namespaces").await.expect("get").status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_holds_at_most_the_configured_number_of_objects() {
    let (_server, client, _dir) =
        common::in_process_with(|o| o.max_objects_per_workspace = 60).await;
    let mut c = client.connect().await.expect("connect");
    let r = c
        .post_json(
            "/apis/tenancy.kcp.io/v1alpha1/workspaces",
            &serde_json::json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                                "metadata": {"name": "other"}}),
        )
        .await
        .expect("workspace");
    assert_eq!(r.status, 201, "{:?}", r.json());
    let cm = |name: String| serde_json::json!({"metadata": {"name": name}});
    let path = "/api/v1/namespaces/default/configmaps";
    let mut created = 0;
    let refused = loop {
        let r = c
            .post_json(path, &cm(format!("cm-{created}")))
            .await
            .expect("create");
        if r.status != 201 {
            break r;
        }
        created += 1;
        assert!(created <= 60, "the limit was never enforced");
    };
    assert!(created > 0, "root was full before any create");
    assert_eq!(refused.status, 403, "{:?}", refused.json());
    assert_eq!(refused.json()["reason"], "Forbidden");
    let msg = refused.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("--max-objects-per-workspace allows 60"),
        "{msg}"
    );
    // Server-side apply creates count too.
    let r = c
        .send(
            http::Method::PATCH,
            "/api/v1/namespaces/default/configmaps/applied?fieldManager=test",
            Some("application/apply-patch+yaml"),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"applied"}}"#,
        )
        .await
        .expect("apply");
    assert_eq!(r.status, 403, "{:?}", r.json());
    // Deleting makes room again; the other workspace was never affected.
    let r = c
        .send(
            http::Method::DELETE,
            &format!("{path}/cm-0"),
            None,
            bytes::Bytes::new(),
        )
        .await
        .expect("delete");
    assert_eq!(r.status, 200);
    let r = c
        .post_json(path, &cm("again".into()))
        .await
        .expect("create");
    assert_eq!(r.status, 201, "{:?}", r.json());
    let r = c
        .post_json(
            &format!("/clusters/root:other{path}"),
            &cm("elsewhere".into()),
        )
        .await
        .expect("create");
    assert_eq!(r.status, 201, "{:?}", r.json());
}
