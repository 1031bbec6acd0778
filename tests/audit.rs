//! kube-apiserver's audit log through the binary: `--audit-policy-file` decides each request's
//! level and stages, `--audit-log-path` receives audit.k8s.io/v1 Events as JSON lines, with the
//! logical cluster as kcp's annotations and the `Audit-Id` response header as their `auditID`;
//! `--audit-log-maxsize` and `--audit-log-maxbackup` rotate the log.

mod common;

use std::path::Path;
use std::time::Duration;

use common::Server;
use http::Method;
use serde_json::{json, Value};

const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
- level: RequestResponse
  resources:
  - group: ""
    resources: ["configmaps"]
  namespaces: ["audited"]
- level: Request
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["secrets"]
- level: Metadata
"#;

/// The events of the log so far: its complete lines (a tail may be mid-write, as for any log
/// shipper reading a file being appended to).
fn events(path: &Path) -> Vec<Value> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let end = bytes.iter().rposition(|b| *b == b'\n').unwrap_or(0);
    std::str::from_utf8(&bytes[..end])
        .expect("the audit log is UTF-8")
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("an audit line is not JSON ({e}): {l}"))
        })
        .collect()
}

/// Waits until an event satisfies `want`, failing after 20 s with the events seen.
async fn event(path: &Path, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let all = events(path);
        if let Some(e) = all.iter().find(|e| want(e)) {
            return e.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no audit event {what} within 20 s; the log has {} events:\n{}",
            all.len(),
            all.iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn request(
    server: &Server,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> https_client::Reply {
    let mut conn = server.client().connect().await.expect("connect");
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    conn.send_with_headers(
        method,
        path,
        &all,
        if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        },
    )
    .await
    .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_audited_at_the_level_the_policy_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (policy, log) = (dir.path().join("policy.yaml"), dir.path().join("audit.log"));
    std::fs::write(&policy, POLICY).expect("policy");
    let server = Server::start_with(&[
        "--no-controllers",
        "--audit-policy-file",
        policy.to_str().expect("path"),
        "--audit-log-path",
        log.to_str().expect("path"),
    ]);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "audited"}});
    assert_eq!(
        request(&server, Method::POST, "/api/v1/namespaces", &[], ns)
            .await
            .status,
        201
    );

    // RequestResponse: both bodies; the client's Audit-ID is kept and answered.
    let created = request(
        &server,
        Method::POST,
        "/api/v1/namespaces/audited/configmaps",
        &[("audit-id", "client-chosen-id-1")],
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept"}, "data": {"k": "v"}}),
    )
    .await;
    assert_eq!(created.status, 201);
    assert_eq!(created.headers["audit-id"], "client-chosen-id-1");
    let e = event(&log, "for the ConfigMap create", |e| {
        e["auditID"] == "client-chosen-id-1"
    })
    .await;
    assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["level"], "RequestResponse");
    assert_eq!(e["stage"], "ResponseComplete");
    assert_eq!(e["verb"], "create");
    assert_eq!(e["user"]["username"], "admin");
    assert_eq!(e["objectRef"]["resource"], "configmaps");
    assert_eq!(e["objectRef"]["namespace"], "audited");
    assert_eq!(e["objectRef"]["name"], "kept");
    assert_eq!(e["responseStatus"]["code"], 201);
    assert_eq!(e["requestObject"]["data"]["k"], "v");
    assert_eq!(e["responseObject"]["metadata"]["name"], "kept");
    assert_eq!(e["annotations"]["kcp.io/cluster"], "root");
    assert_eq!(e["annotations"]["kcp.io/path"], "root");
    assert!(e["requestReceivedTimestamp"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert_eq!(e["requestURI"], "/api/v1/namespaces/audited/configmaps");
    // RequestReceived is omitted by the policy.
    assert!(events(&log).iter().all(|e| e["stage"] != "RequestReceived"));

    // Request: the request body only.
    let secret = request(
        &server,
        Method::POST,
        "/api/v1/namespaces/default/secrets",
        &[],
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"p": "w"}}),
    )
    .await;
    assert_eq!(secret.status, 201);
    let id = secret.headers["audit-id"].to_str().expect("id").to_string();
    let e = event(&log, "for the Secret create", |e| {
        e["auditID"] == id.as_str()
    })
    .await;
    assert_eq!(e["level"], "Request");
    assert_eq!(e["requestObject"]["metadata"]["name"], "s");
    assert!(e.get("responseObject").is_none(), "{e}");

    // Metadata: no bodies; a refusal keeps its status.
    let missing = request(
        &server,
        Method::GET,
        "/api/v1/namespaces/default/configmaps/absent",
        &[],
        Value::Null,
    )
    .await;
    assert_eq!(missing.status, 404);
    let id = missing.headers["audit-id"]
        .to_str()
        .expect("id")
        .to_string();
    let e = event(&log, "for the 404", |e| e["auditID"] == id.as_str()).await;
    assert_eq!(e["level"], "Metadata");
    assert_eq!(e["responseStatus"]["code"], 404);
    assert_eq!(e["responseStatus"]["reason"], "NotFound");
    assert!(
        e.get("requestObject").is_none() && e.get("responseObject").is_none(),
        "{e}"
    );

    // Impersonation: decided for the authenticated user, the acting one recorded beside.
    let as_alice = request(
        &server,
        Method::GET,
        "/api/v1/namespaces/default/configmaps",
        &[("impersonate-user", "alice")],
        Value::Null,
    )
    .await;
    assert_eq!(as_alice.status, 403);
    let id = as_alice.headers["audit-id"]
        .to_str()
        .expect("id")
        .to_string();
    let e = event(&log, "for the impersonated list", |e| {
        e["auditID"] == id.as_str()
    })
    .await;
    assert_eq!(e["user"]["username"], "admin");
    assert_eq!(e["impersonatedUser"]["username"], "alice");
    assert_eq!(e["responseStatus"]["code"], 403);

    // A workspace: its logical cluster and path.
    let ws = request(
        &server,
        Method::POST,
        "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces",
        &[],
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": "team"}}),
    )
    .await;
    assert_eq!(ws.status, 201);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let in_team = loop {
        let r = request(
            &server,
            Method::GET,
            "/clusters/root:team/api/v1/namespaces/default/configmaps",
            &[],
            Value::Null,
        )
        .await;
        if r.status == 200 {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "root:team not Ready: {}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let id = in_team.headers["audit-id"]
        .to_str()
        .expect("id")
        .to_string();
    let e = event(&log, "in root:team", |e| e["auditID"] == id.as_str()).await;
    assert_eq!(e["annotations"]["kcp.io/path"], "root:team");
    let cluster = e["annotations"]["kcp.io/cluster"]
        .as_str()
        .expect("cluster");
    assert!(cluster != "root" && !cluster.is_empty(), "{e}");
    assert_eq!(e["annotations"]["tenancy.kcp.io/workspace"], cluster);

    // A watch: ResponseStarted when it starts, ResponseComplete when it ends.
    let watch = request(
        &server,
        Method::GET,
        "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1",
        &[],
        Value::Null,
    )
    .await;
    assert_eq!(watch.status, 200);
    let id = watch.headers["audit-id"].to_str().expect("id").to_string();
    event(&log, "ResponseStarted of the watch", |e| {
        e["auditID"] == id.as_str() && e["stage"] == "ResponseStarted"
    })
    .await;
    event(&log, "ResponseComplete of the watch", |e| {
        e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete"
    })
    .await;

    // Level None: probes are not recorded (checked after later requests were).
    let healthz = request(&server, Method::GET, "/healthz", &[], Value::Null).await;
    let id = healthz.headers["audit-id"]
        .to_str()
        .expect("id")
        .to_string();
    let after = request(&server, Method::GET, "/api/v1/namespaces", &[], Value::Null).await;
    let after_id = after.headers["audit-id"].to_str().expect("id").to_string();
    event(&log, "after /healthz", |e| {
        e["auditID"] == after_id.as_str()
    })
    .await;
    assert!(
        events(&log).iter().all(|e| e["auditID"] != id.as_str()),
        "/healthz was audited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_rotates_and_keeps_the_backups_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (policy, log) = (dir.path().join("policy.yaml"), dir.path().join("audit.log"));
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n",
    )
    .expect("policy");
    let server = Server::start_with(&[
        "--no-controllers",
        "--audit-policy-file",
        policy.to_str().expect("path"),
        "--audit-log-path",
        log.to_str().expect("path"),
        "--audit-log-maxsize",
        "1",
        "--audit-log-maxbackup",
        "2",
    ]);
    // About 4 MB of events: each create records 100 KB twice.
    let payload = "a".repeat(100 * 1024);
    for i in 0..20 {
        let r = request(
            &server,
            Method::POST,
            "/api/v1/namespaces/default/configmaps",
            &[],
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("big-{i}")}, "data": {"p": payload}}),
        )
        .await;
        assert_eq!(r.status, 201);
    }
    let last = request(
        &server,
        Method::GET,
        "/api/v1/namespaces/default/configmaps/big-19",
        &[],
        Value::Null,
    )
    .await;
    let id = last.headers["audit-id"].to_str().expect("id").to_string();
    event(&log, "of the last request", |e| e["auditID"] == id.as_str()).await;
    let backups: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("audit-") && n.ends_with(".log"))
        .collect();
    assert_eq!(backups.len(), 2, "backups kept: {backups:?}");
    assert!(
        std::fs::metadata(&log).expect("log").len() <= 1024 * 1024 + 512 * 1024,
        "the current log outgrew --audit-log-maxsize"
    );
}

#[test]
fn a_policy_without_a_log_or_an_invalid_policy_stops_the_server_with_a_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Everything\n",
    )
    .expect("policy");
    let log = dir.path().join("audit.log");
    for (args, says) in [
        (
            vec!["--audit-policy-file", policy.to_str().expect("path")],
            "--audit-policy-file needs --audit-log-path",
        ),
        (
            vec![
                "--audit-policy-file",
                policy.to_str().expect("path"),
                "--audit-log-path",
                log.to_str().expect("path"),
            ],
            "Everything",
        ),
    ] {
        let out = common::exits_within(
            std::process::Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
                .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
                .arg(dir.path().join("data"))
                .args(&args),
            30,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
