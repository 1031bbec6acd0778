//! What the server does with connections, with its limits shortened so the tests run in
//! seconds (the defaults are kube-apiserver's: 32 s for the first request's headers, 90 s idle,
//! 1 MiB of headers): connections that never finish the TLS handshake, never send a request or
//! stop sending are closed; a watch keeps its connection; oversized headers are refused; the
//! server answers while thousands of silent connections are open. Also the serving
//! certificate and client CA, reloaded when their files change.

mod common;

use std::time::Duration;

use apiserver::server::ConnectionLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn short_limits() -> ConnectionLimits {
    ConnectionLimits {
        tls_handshake_timeout: Duration::from_secs(1),
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        ..ConnectionLimits::default()
    }
}

/// Reads until the peer closes the connection, failing after `secs` seconds.
async fn closed_within(stream: &mut (impl AsyncReadExt + Unpin), secs: u64, what: &str) {
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(secs), read_all)
        .await
        .unwrap_or_else(|_| panic!("{what}: the connection was still open after {secs} s"));
}

const GET_VERSION: &[u8] = b"GET /version HTTP/1.1\r\nhost: localhost\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed() {
    let (_server, client, _dir) =
        common::in_process_with(|o| o.connection_limits = short_limits()).await;

    // No TLS handshake at all.
    let mut tcp = tokio::net::TcpStream::connect(_server.address)
        .await
        .expect("tcp");
    closed_within(&mut tcp, 10, "no handshake").await;

    // A handshake, then nothing.
    let mut silent = client.connect_tls().await.expect("tls");
    closed_within(&mut silent, 10, "no request").await;

    // Half a request's headers, then nothing.
    let mut half = client.connect_tls().await.expect("tls");
    half.write_all(b"GET /version HTTP/1.1\r\nhost: loc")
        .await
        .expect("write");
    closed_within(&mut half, 10, "half the headers").await;

    // One request served, then idle.
    let mut idle = client.connect_tls().await.expect("tls");
    idle.write_all(GET_VERSION).await.expect("write");
    let mut first = vec![0u8; 4096];
    let n = idle.read(&mut first).await.expect("response");
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    closed_within(&mut idle, 10, "idle after a request").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_keeps_its_connection_past_the_idle_timeout() {
    let (_server, client, _dir) =
        common::in_process_with(|o| o.connection_limits = short_limits()).await;
    let mut watch = client.connect_tls().await.expect("tls");
    watch
        .write_all(
            b"GET /api/v1/namespaces/default/configmaps?watch=1 HTTP/1.1\r\nhost: localhost\r\n\r\n",
        )
        .await
        .expect("write");
    let mut head = vec![0u8; 4096];
    let n = watch.read(&mut head).await.expect("watch response");
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    // Three idle timeouts later the watch still delivers.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut conn = client.connect().await.expect("connect");
    let created = conn
        .post_json(
            "/api/v1/namespaces/default/configmaps",
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-idle"}}),
        )
        .await
        .expect("create");
    assert_eq!(created.status.as_u16(), 201);
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("after-idle") {
        let mut buf = vec![0u8; 16 * 1024];
        let n = tokio::time::timeout_at(deadline, watch.read(&mut buf))
            .await
            .expect("the watch delivered nothing within 10 s")
            .expect("watch read");
        assert!(n > 0, "the watch's connection was closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_beyond_the_cap_are_refused() {
    let (_server, client, _dir) = common::in_process_with(|o| {
        o.connection_limits = ConnectionLimits {
            max_header_bytes: 64 * 1024,
            ..ConnectionLimits::default()
        }
    })
    .await;
    for (size, ok) in [(16 * 1024, true), (256 * 1024, false)] {
        let mut tls = client.connect_tls().await.expect("tls");
        let request = format!(
            "GET /version HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\nx-padding: {}\r\n\r\n",
            "p".repeat(size)
        );
        // The server may answer and close before reading everything.
        let _ = tls.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
        let head = String::from_utf8_lossy(&out[..out.len().min(64)]).into_owned();
        if ok {
            assert!(head.starts_with("HTTP/1.1 200"), "{size} bytes: {head}");
        } else {
            assert!(
                head.starts_with("HTTP/1.1 431") || out.is_empty(),
                "{size} bytes of headers were not refused: {head}"
            );
        }
    }
}

/// Raises this process's open-file limit to its hard limit (the test opens both ends of
/// thousands of connections).
fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
    }
    l.rlim_cur
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_while_thousands_of_silent_connections_are_open_and_then_drops_them() {
    let limit = raise_fd_limit();
    // Both ends of each connection are in this process; leave room for the rest.
    let silent = ((limit.saturating_sub(512)) / 2).min(3000) as usize;
    assert!(silent >= 1000, "the open-file limit {limit} is too low");
    let (server, client, _dir) =
        common::in_process_with(|o| o.connection_limits = short_limits()).await;
    let before = open_fds();
    let mut held = Vec::with_capacity(silent);
    for _ in 0..silent {
        held.push(
            tokio::net::TcpStream::connect(server.address)
                .await
                .expect("tcp"),
        );
    }
    // With all of them open (none has sent a byte), a real client is served.
    let mut conn = client
        .connect()
        .await
        .expect("connect beside the silent ones");
    let reply = conn.get("/readyz").await.expect("readyz");
    assert_eq!(reply.status.as_u16(), 200);
    // The server closes every one of them after the handshake timeout.
    for (i, tcp) in held.iter_mut().enumerate() {
        closed_within(tcp, 30, &format!("silent connection {i}")).await;
    }
    drop(held);
    drop(conn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = open_fds();
        if now <= before + 16 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} file descriptors open, {before} before {silent} silent connections"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `contents` to `path` as a renewal does: a new file moved over the old one.
fn replace_file(path: &std::path::Path, contents: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_and_client_ca_are_reloaded_when_their_files_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = |name: &str| certs::load_or_create(&dir.path().join(name), &[]).expect("a CA");
    let (old, new) = (pki("old"), pki("new"));
    let files = dir.path().join("mounted");
    std::fs::create_dir_all(&files).expect("dir");
    let (cert, key, ca) = (
        files.join("tls.crt"),
        files.join("tls.key"),
        files.join("client-ca.crt"),
    );
    let mount = |p: &certs::Pki| {
        replace_file(&key, p.serving_key_pem());
        replace_file(&cert, p.serving_cert_pem());
        replace_file(&ca, p.ca_cert_pem());
    };
    mount(&old);
    let (server, _client, data) = common::in_process_with(|o| {
        o.tls_cert_file = Some(cert.clone());
        o.tls_private_key_file = Some(key.clone());
        o.client_ca_file = Some(ca.clone());
        o.tls_reload_interval = Duration::from_millis(100);
    })
    .await;
    // `trusting`'s CA verifies the server; `user`'s admin certificate is presented.
    let status = |trusting: &certs::Pki, user: &certs::Pki| {
        let client = https_client::ClientConfig::new(
            server.address,
            trusting.ca_cert_pem(),
            Some((user.admin_cert_pem(), user.admin_key_pem())),
        )
        .expect("client");
        // The answer's status, or how the connection was refused (in TLS 1.3 a refused client
        // certificate shows only when the first request fails).
        async move {
            let mut conn = match client.connect().await {
                Ok(conn) => conn,
                Err(e) => return Err(format!("handshake: {e}")),
            };
            match conn.get("/api/v1/namespaces").await {
                Ok(reply) => Ok(reply.status.as_u16()),
                Err(e) => Err(format!("request: {e}")),
            }
        }
    };
    assert_eq!(status(&old, &old).await, Ok(200));
    // The server's own admin certificate (admin.kubeconfig's, the co-located controllers') is
    // still accepted beside the file's CA.
    let own = certs::load_or_create(&data.path().join("data").join("pki"), &[])
        .expect("the server's PKI");
    assert_eq!(status(&old, &own).await, Ok(200));

    // cert-manager renews: new serving certificate and key, new client CA.
    mount(&new);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while status(&new, &new).await != Ok(200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate and client CA were not in use after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old_ca = status(&old, &old).await;
    assert!(
        old_ca.as_ref().is_err_and(|e| e.starts_with("handshake")),
        "a client trusting only the old CA must no longer connect: {old_ca:?}"
    );
    // A certificate of the old CA is no longer accepted.
    let old_cert = status(&new, &old).await;
    assert!(
        old_cert.is_err() || old_cert == Ok(401) || old_cert == Ok(403),
        "a client certificate of the old CA was accepted: {old_cert:?}"
    );

    assert_eq!(
        status(&new, &own).await,
        Ok(200),
        "after a renewal of the client CA file, the server's own CA is still trusted"
    );

    // A half-written renewal (a key that does not match) keeps the working material.
    replace_file(&key, old.serving_key_pem());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status(&new, &new).await, Ok(200));
}
