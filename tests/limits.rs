//! Request limits: beyond the configured number of short requests in flight the server answers
//! 429 with Retry-After, health checks still answer, and it recovers when load drops.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_limit_get_429_and_the_server_recovers() {
    let (server, client, dir) = common::in_process_with(|o| o.max_requests_in_flight = 1).await;
    // Hold the only slot: a request whose body never finishes arriving.
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
    slow.write_all(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        .await
        .expect("write");
    slow.flush().await.expect("flush");
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
    let mut served = false;
    for _ in 0..50 {
        let mut c = client.connect().await.expect("connect");
        if c.get("/api/v1/namespaces/default/configmaps")
            .await
            .expect("get")
            .status
            == 200
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the server did not recover");
}
