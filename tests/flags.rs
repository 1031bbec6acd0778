//! `serve` flags that only the binary reads, each through the binary: `--in-memory`,
//! `--tls-cert-file`/`--tls-private-key-file`, `--service-account-key-file`,
//! `--service-account-issuer`, `--api-audiences`, `--etcd-prefix` (with `--features etcd`), and
//! a plain SubjectAccessReview as the admin asks it.

mod common;

use std::path::Path;
use std::process::Command;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::Server;
use http::Method;
use serde_json::{json, Value};

/// `(status, body)` of a request by the admin.
async fn admin(server: &Server, method: Method, path: &str, body: Value) -> (u16, Value) {
    let mut conn = server.client().connect().await.expect("connect");
    let reply = conn
        .send(
            method,
            path,
            Some("application/json"),
            if body.is_null() {
                Vec::new()
            } else {
                body.to_string().into_bytes()
            },
        )
        .await
        .expect("request");
    (reply.status.as_u16(), reply.json())
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_keeps_nothing_across_a_restart_and_the_default_store_does() {
    let path = "/api/v1/namespaces/default/configmaps";
    for (flags, survives) in [(&["--in-memory"][..], false), (&[][..], true)] {
        let mut server = Server::start_with(flags);
        let (code, body) = admin(&server, Method::POST, path, configmap("kept")).await;
        assert_eq!(code, 201, "{body}");
        server.restart(flags);
        let (code, _) = admin(&server, Method::GET, &format!("{path}/kept"), Value::Null).await;
        assert_eq!(
            code == 200,
            survives,
            "{flags:?}: GET after a restart answered {code}"
        );
        assert_eq!(
            server.data_dir.join("store.redb").exists(),
            survives,
            "{flags:?}: store.redb"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cert_file_serves_that_certificate() {
    let other = tempfile::tempdir().expect("tempdir");
    let pki = certs::load_or_create(other.path(), &[]).expect("another CA");
    let (cert, key) = (other.path().join("tls.crt"), other.path().join("tls.key"));
    std::fs::write(&cert, pki.serving_cert_pem()).expect("cert");
    std::fs::write(&key, pki.serving_key_pem()).expect("key");
    let server = Server::start_with(&[
        "--tls-cert-file",
        cert.to_str().expect("path"),
        "--tls-private-key-file",
        key.to_str().expect("path"),
    ]);
    let own = std::fs::read_to_string(server.data_dir.join("pki/ca.crt")).expect("own CA");
    let admin_pem =
        |f: &str| std::fs::read_to_string(server.data_dir.join("pki").join(f)).expect("admin cert");
    let (admin_cert, admin_key) = (admin_pem("admin.crt"), admin_pem("admin.key"));
    // Trusting the given certificate's CA works; the generated CA no longer vouches for it.
    let trusting = |ca: &str| {
        apiserver::client::ClientConfig::new(server.address, ca, Some((&admin_cert, &admin_key)))
            .expect("client")
    };
    let mut conn = trusting(pki.ca_cert_pem())
        .connect()
        .await
        .expect("connect with its CA");
    let reply = conn.get("/api/v1/namespaces").await.expect("list");
    assert_eq!(reply.status.as_u16(), 200);
    assert!(
        trusting(&own).connect().await.is_err(),
        "the generated CA verified the --tls-cert-file certificate"
    );
}

fn p256_key(path: &Path) {
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(path)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("payload");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64")).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_follow_the_key_issuer_and_audiences_given() {
    let keys = tempfile::tempdir().expect("tempdir");
    let (key, other_key) = (keys.path().join("sa.key"), keys.path().join("other.key"));
    p256_key(&key);
    p256_key(&other_key);
    let flags = |key: &Path| {
        vec![
            "--service-account-key-file".to_string(),
            key.display().to_string(),
            "--service-account-issuer".to_string(),
            "https://issuer.example".to_string(),
            "--api-audiences".to_string(),
            "aud-a,aud-b".to_string(),
        ]
    };
    let own_flags = flags(&key);
    let own: Vec<&str> = own_flags.iter().map(String::as_str).collect();
    let mut server = Server::start_with(&own);
    let ca = std::fs::read_to_string(server.data_dir.join("pki/ca.crt")).expect("ca");
    let sa = "/api/v1/namespaces/default/serviceaccounts";
    let (code, body) = admin(
        &server,
        Method::POST,
        sa,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = admin(
        &server,
        Method::POST,
        &format!("{sa}/bot/token"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let token = body["status"]["token"].as_str().expect("token").to_string();
    let c = claims(&token);
    assert_eq!(c["iss"], "https://issuer.example");
    assert_eq!(c["aud"], json!(["aud-a", "aud-b"]));

    let review = |audiences: Value| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token, "audiences": audiences}})
    };
    let reviews = "/apis/authentication.k8s.io/v1/tokenreviews";
    let (_, body) = admin(&server, Method::POST, reviews, review(json!(["aud-b"]))).await;
    assert_eq!(body["status"]["authenticated"], true, "{body}");
    assert_eq!(body["status"]["audiences"], json!(["aud-b"]));
    let (_, body) = admin(&server, Method::POST, reviews, review(json!(["other"]))).await;
    assert_eq!(body["status"]["authenticated"], false, "{body}");

    let whoami = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let ssr = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let (code, body) = common::with_bearer(
        server.address,
        &ca,
        &token,
        Method::POST,
        ssr,
        &whoami.clone(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        body["status"]["userInfo"]["username"],
        "system:serviceaccount:default:bot"
    );
    // The same key after a restart: the token still holds. Another key: it no longer does.
    server.restart(&own);
    let (code, _) = common::with_bearer(
        server.address,
        &ca,
        &token,
        Method::POST,
        ssr,
        &whoami.clone(),
    )
    .await;
    assert_eq!(code, 201);
    let other_flags = flags(&other_key);
    let other: Vec<&str> = other_flags.iter().map(String::as_str).collect();
    server.restart(&other);
    let (code, _) =
        common::with_bearer(server.address, &ca, &token, Method::POST, ssr, &whoami).await;
    assert_eq!(code, 401, "a token of another signing key was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_access_review_answers_for_the_user_it_names() {
    let server = Server::start_with(&["--no-controllers"]);
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    let (code, body) = admin(
        &server,
        Method::POST,
        &format!("{rbac}/clusterroles"),
        json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = admin(&server, Method::POST, &format!("{rbac}/namespaces/default/rolebindings"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ann-reads", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ann"}]})).await;
    assert_eq!(code, 201, "{body}");
    let sar = |user: &str, verb: &str, namespace: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
               "spec": {"user": user, "resourceAttributes":
                   {"namespace": namespace, "verb": verb, "resource": "configmaps"}}})
    };
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    for (user, verb, ns, allowed) in [
        ("ann", "list", "default", true),
        ("ann", "delete", "default", false),
        ("ann", "list", "kube-system", false),
        ("bob", "list", "default", false),
    ] {
        let (code, body) = admin(&server, Method::POST, path, sar(user, verb, ns)).await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(
            body["status"]["allowed"], allowed,
            "{user} {verb} configmaps in {ns}: {body}"
        );
        assert_eq!(body["kind"], "SubjectAccessReview");
    }
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_with_different_etcd_prefixes_share_an_etcd_without_seeing_each_other() {
    let etcd = apiserver::storage::etcd::testing::EtcdProcess::start()
        .await
        .expect("etcd");
    let endpoint = etcd.endpoint();
    let on = |prefix: &'static str| {
        Server::start_with(&[
            "--etcd-servers",
            endpoint.as_str(),
            "--etcd-prefix",
            prefix,
            "--no-controllers",
        ])
    };
    let (a, b) = (on("/tenant-a"), on("/tenant-b"));
    let path = "/api/v1/namespaces/default/configmaps";
    let (code, body) = admin(&a, Method::POST, path, configmap("only-in-a")).await;
    assert_eq!(code, 201, "{body}");
    let (code, _) = admin(&b, Method::GET, &format!("{path}/only-in-a"), Value::Null).await;
    assert_eq!(code, 404, "b sees a's ConfigMap");
    // The same name in b is b's own object, not a conflict with a's.
    let (code, body) = admin(&b, Method::POST, path, configmap("only-in-a")).await;
    assert_eq!(code, 201, "{body}");
    let (_, list) = admin(&a, Method::GET, path, Value::Null).await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["only-in-a"]);
    // A replica on a's prefix sees a's objects: the prefix, not the process, decides.
    let a2 = Server::start_replica(
        &a,
        &[
            "--etcd-servers",
            endpoint.as_str(),
            "--etcd-prefix",
            "/tenant-a",
            "--no-controllers",
        ],
    );
    let (code, _) = admin(&a2, Method::GET, &format!("{path}/only-in-a"), Value::Null).await;
    assert_eq!(code, 200);
}
