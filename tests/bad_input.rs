//! Bad input gets a clear metav1.Status with the right code and reason, and changes nothing.

mod common;

use bytes::Bytes;
use common::Server;
use http::Method;
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

struct Case {
    what: &'static str,
    method: Method,
    path: String,
    content_type: &'static str,
    body: Bytes,
    code: u16,
    reason: &'static str,
    message_contains: &'static str,
}

#[allow(clippy::too_many_arguments)]
fn case(
    what: &'static str,
    method: Method,
    path: &str,
    ct: &'static str,
    body: impl Into<Bytes>,
    code: u16,
    reason: &'static str,
    msg: &'static str,
) -> Case {
    Case {
        what,
        method,
        path: path.to_string(),
        content_type: ct,
        body: body.into(),
        code,
        reason,
        message_contains: msg,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_status_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.client().connect().await.expect("connect");
    let ok = c
        .post_json(CMS, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "existing"}, "data": {"a": "b"}}))
        .await
        .expect("create");
    assert_eq!(ok.status, 201);
    let before = c.get(CMS).await.expect("list").json();

    let cm = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}).to_string()
    };
    let big = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"x\":\"{}\"}}}}",
        "a".repeat(4 * 1024 * 1024)
    );
    let cases = vec![
        case(
            "malformed JSON",
            Method::POST,
            CMS,
            "application/json",
            "{\"apiVersion\": \"v1\", ",
            400,
            "BadRequest",
            "invalid JSON",
        ),
        case(
            "malformed YAML",
            Method::POST,
            CMS,
            "application/yaml",
            "kind: ConfigMap\n  bad: [indent\n",
            400,
            "BadRequest",
            "YAML",
        ),
        case(
            "JSON that is not an object",
            Method::POST,
            CMS,
            "application/json",
            "[1,2]",
            400,
            "BadRequest",
            "must be an object",
        ),
        case(
            "wrong apiVersion",
            Method::POST,
            CMS,
            "application/json",
            r#"{"apiVersion":"v2","kind":"ConfigMap","metadata":{"name":"x"}}"#,
            400,
            "BadRequest",
            "does not match the expected API version",
        ),
        case(
            "wrong kind",
            Method::POST,
            CMS,
            "application/json",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#,
            400,
            "BadRequest",
            "does not match the kind",
        ),
        case(
            "name differs from URL",
            Method::PUT,
            &format!("{CMS}/existing"),
            "application/json",
            cm("other"),
            400,
            "BadRequest",
            "does not match the name on the URL",
        ),
        case(
            "namespace differs from URL",
            Method::POST,
            CMS,
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"kube-system"}}"#,
            400,
            "BadRequest",
            "namespace of the provided object does not match",
        ),
        case(
            "invalid name",
            Method::POST,
            CMS,
            "application/json",
            cm("Bad_Name"),
            422,
            "Invalid",
            "metadata.name: Invalid value: \"Bad_Name\"",
        ),
        case(
            "missing name",
            Method::POST,
            CMS,
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#,
            422,
            "Invalid",
            "metadata.name: Required value",
        ),
        case(
            "invalid label",
            Method::POST,
            CMS,
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","labels":{"a":"not valid!"}}}"#,
            422,
            "Invalid",
            "metadata.labels",
        ),
        case(
            "unknown resource",
            Method::GET,
            "/api/v1/namespaces/default/widgets",
            "application/json",
            "",
            404,
            "NotFound",
            "could not find the requested resource",
        ),
        case(
            "unknown group",
            Method::GET,
            "/apis/example.com/v1/widgets",
            "application/json",
            "",
            404,
            "NotFound",
            "could not find",
        ),
        case(
            "encoded slash in name",
            Method::GET,
            &format!("{CMS}/a%2Fb"),
            "application/json",
            "",
            400,
            "BadRequest",
            "may not contain '/'",
        ),
        case(
            "dot-dot name",
            Method::GET,
            &format!("{CMS}/%2E%2E"),
            "application/json",
            "",
            400,
            "BadRequest",
            "may not be '.' or '..'",
        ),
        case(
            "body over 3 MiB",
            Method::POST,
            CMS,
            "application/json",
            big,
            413,
            "RequestEntityTooLarge",
            "larger than the limit",
        ),
        case(
            "protobuf body for a Platform Mesh type",
            Method::POST,
            "/apis/providers.platform-mesh.io/v1alpha1/providers",
            "application/vnd.kubernetes.protobuf",
            "k8s\0",
            415,
            "UnsupportedMediaType",
            "unknown format",
        ),
        case(
            "garbage protobuf body",
            Method::POST,
            CMS,
            "application/vnd.kubernetes.protobuf",
            &b"k8s\0\x0a\xff"[..],
            400,
            "BadRequest",
            "cannot be handled",
        ),
        case(
            "strategic merge patch on a Platform Mesh type",
            Method::PATCH,
            "/apis/providers.platform-mesh.io/v1alpha1/providers/x",
            "application/strategic-merge-patch+json",
            "{}",
            415,
            "UnsupportedMediaType",
            "merge-patch",
        ),
        case(
            "stale resourceVersion",
            Method::PUT,
            &format!("{CMS}/existing"),
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"existing","resourceVersion":"1"}}"#,
            409,
            "Conflict",
            "the object has been modified",
        ),
        case(
            "create existing",
            Method::POST,
            CMS,
            "application/json",
            cm("existing"),
            409,
            "AlreadyExists",
            "configmaps \"existing\" already exists",
        ),
        case(
            "namespace missing",
            Method::POST,
            "/api/v1/namespaces/nope/configmaps",
            "application/json",
            cm("x"),
            404,
            "NotFound",
            "namespaces \"nope\" not found",
        ),
        case(
            "bad label selector",
            Method::GET,
            &format!("{CMS}?labelSelector=a%20in%20(b"),
            "application/json",
            "",
            400,
            "BadRequest",
            "",
        ),
        case(
            "unsupported field selector",
            Method::GET,
            &format!("{CMS}?fieldSelector=spec.x%3Dy"),
            "application/json",
            "",
            400,
            "BadRequest",
            "\"spec.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
        ),
        case(
            "bad limit",
            Method::GET,
            &format!("{CMS}?limit=abc"),
            "application/json",
            "",
            400,
            "BadRequest",
            "limit",
        ),
        case(
            "bad continue",
            Method::GET,
            &format!("{CMS}?continue=zzz"),
            "application/json",
            "",
            400,
            "BadRequest",
            "continue",
        ),
        case(
            "invalid JSON patch",
            Method::PATCH,
            &format!("{CMS}/existing"),
            "application/json-patch+json",
            r#"[{"op":"explode"}]"#,
            400,
            "BadRequest",
            "could not be decoded",
        ),
        case(
            "failing JSON patch test",
            Method::PATCH,
            &format!("{CMS}/existing"),
            "application/json-patch+json",
            r#"[{"op":"test","path":"/data/a","value":"zzz"}]"#,
            422,
            "Invalid",
            "",
        ),
        case(
            "bad dryRun",
            Method::POST,
            &format!("{CMS}?dryRun=Maybe"),
            "application/json",
            cm("dry"),
            422,
            "Invalid",
            "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value",
        ),
        case(
            "bad cluster name",
            Method::GET,
            "/clusters/Not_Valid/api/v1/namespaces",
            "application/json",
            "",
            400,
            "BadRequest",
            "invalid cluster",
        ),
        case(
            "write through wildcard",
            Method::POST,
            "/clusters/*/api/v1/namespaces/default/configmaps",
            "application/json",
            cm("w"),
            405,
            "MethodNotAllowed",
            "not supported",
        ),
    ];
    for case in cases {
        // A refused oversized body closes the connection (the rest of it is never read): start fresh.
        let mut c = server.client().connect().await.expect("connect");
        let r = c
            .send(
                case.method.clone(),
                &case.path,
                Some(case.content_type),
                case.body.clone(),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: request failed: {e}", case.what));
        let status = r.json();
        assert_eq!(r.status.as_u16(), case.code, "{}: {status}", case.what);
        assert_eq!(status["kind"], "Status", "{}: {status}", case.what);
        assert_eq!(status["reason"], case.reason, "{}: {status}", case.what);
        assert_eq!(status["code"], case.code, "{}", case.what);
        let message = status["message"].as_str().unwrap_or("");
        assert!(
            message.contains(case.message_contains),
            "{}: message {message:?} lacks {:?}",
            case.what,
            case.message_contains
        );
    }
    let after = c.get(CMS).await.expect("list").json();
    assert_eq!(
        before["items"], after["items"],
        "bad input changed stored objects"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_client_certificate_are_unauthorized() {
    let server = Server::start();
    let ca = std::fs::read_to_string(server.data_dir.join("pki/ca.crt")).expect("ca");
    let anonymous = https_client::ClientConfig::new(server.address, &ca, None).expect("config");
    let mut c = anonymous.connect().await.expect("connect");
    for public in ["/livez", "/readyz", "/healthz", "/version"] {
        assert_eq!(c.get(public).await.expect("get").status, 200, "{public}");
    }
    // `/version` names the build: the commit (as `--version` does, in full) and its date.
    let version = c.get("/version").await.expect("version").json();
    let commit = version["gitCommit"].as_str().unwrap_or_default();
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{version}"
    );
    assert!(
        version["buildDate"]
            .as_str()
            .is_some_and(|d| d.len() == 20 && d.ends_with('Z') && !d.starts_with("1970")),
        "{version}"
    );
    assert!(
        matches!(version["gitTreeState"].as_str(), Some("clean" | "dirty")),
        "{version}"
    );
    let r = c.get("/api/v1/namespaces").await.expect("get");
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "Unauthorized");
    assert_eq!(c.get("/apis").await.expect("get").status, 401);
}

/// A client certificate no CA of the server vouches for (here a self-signed one naming the
/// admin) is 401 Unauthorized, as kube-apiserver answers; it does not fail the handshake
/// (clients then report a TLS error) nor make the request anonymous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_an_unknown_ca_is_unauthorized() {
    let server = Server::start();
    let ca = std::fs::read_to_string(server.data_dir.join("pki/ca.crt")).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "admin");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    let cert = params.self_signed(&key).expect("certificate").pem();
    let stranger =
        https_client::ClientConfig::new(server.address, &ca, Some((&cert, &key.serialize_pem())))
            .expect("config");
    let mut c = stranger.connect().await.expect("the handshake succeeds");
    for path in [
        "/api/v1/namespaces",
        "/apis",
        "/clusters/root/api/v1/namespaces/default",
    ] {
        let r = c.get(path).await.expect("get");
        assert_eq!(r.status, 401, "{path}: {}", r.json());
        assert_eq!(r.json()["reason"], "Unauthorized", "{path}");
    }
    // The server's own client certificates still are who they say.
    let mut admin = server.client().connect().await.expect("connect");
    assert_eq!(
        admin.get("/api/v1/namespaces").await.expect("get").status,
        200
    );
}

/// A mistyped workspace path says what may be wrong, the same for a path that does not exist
/// as for one the caller may not enter (so that nothing about other tenants leaks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_workspace_path_says_it_does_not_exist_or_is_not_yours() {
    let server = Server::start_with(&["--no-controllers"]);
    let mut c = server.client().connect().await.expect("connect");
    for path in [
        "/clusters/root:nope/api/v1/namespaces",
        "/clusters/root:nope/api",
        "/clusters/root:no:such:path/apis",
    ] {
        let r = c.get(path).await.expect("get");
        assert_eq!(r.status, 403, "{path}");
        assert_eq!(r.json()["reason"], "Forbidden", "{path}");
        assert_eq!(
            r.json()["message"],
            "workspace access not permitted: the workspace does not exist, or you may not access it",
            "{path}"
        );
    }
}
