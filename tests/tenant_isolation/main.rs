//! Tenant isolation: a user with every right in workspace A gets 403 for every verb on every
//! resource in workspace B, addressed by cluster name, by path, across all workspaces (`*`) and
//! through B's APIExport virtual workspace; a user cannot grant itself more than it holds or
//! impersonate its way out; a ServiceAccount token scoped like ProviderSecret's reaches exactly
//! what its ClusterRole allows, in its own workspace only; expired, tampered and orphaned tokens
//! get 401; forged `X-Remote-*` headers without the proxy's certificate are ignored.

#[path = "../common/mod.rs"]
mod common;

mod attacks;

use std::time::Duration;

use base64::Engine;
use http::{Method, StatusCode};
use https_client::{ClientConfig, Connection, Reply};
use serde_json::{json, Value};

struct Env {
    server: apiserver::server::RunningServer,
    admin: Caller,
    pki: certs::Pki,
    ca: String,
    dir: tempfile::TempDir,
}

/// One identity's connection: a client certificate and/or headers sent with every request.
struct Caller {
    conn: Connection,
    headers: Vec<(String, String)>,
}

impl Caller {
    async fn new(config: &ClientConfig, headers: &[(&str, &str)]) -> Caller {
        Caller {
            conn: config.connect().await.expect("connect"),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    async fn call(&mut self, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let content_type = match method {
            Method::PATCH => "application/merge-patch+json",
            _ => "application/json",
        };
        let mut headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        headers.push(("accept", "application/json"));
        let bytes = match body {
            Some(b) => {
                headers.push(("content-type", content_type));
                serde_json::to_vec(b).expect("json")
            }
            None => Vec::new(),
        };
        self.conn
            .send_with_headers(method, path, &headers, bytes)
            .await
            .expect("request")
    }

    /// A request with an explicit content type (patches of every form).
    async fn call_with(
        &mut self,
        method: Method,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> Reply {
        let mut headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        headers.push(("accept", "application/json"));
        headers.push(("content-type", content_type));
        self.conn
            .send_with_headers(
                method,
                path,
                &headers,
                serde_json::to_vec(body).expect("json"),
            )
            .await
            .expect("request")
    }

    async fn get(&mut self, path: &str) -> Reply {
        self.call(Method::GET, path, None).await
    }

    async fn post(&mut self, path: &str, body: &Value) -> Reply {
        self.call(Method::POST, path, Some(body)).await
    }
}

/// Creates `root:<name>` as `admin` and returns its logical cluster name once Ready.
async fn create_workspace(admin: &mut Caller, name: &str) -> String {
    let r = admin
        .post(
            "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces",
            &json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                    "metadata": {"name": name}, "spec": {"type": {"name": "universal"}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    for _ in 0..200 {
        let ws = admin
            .get(&format!(
                "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces/{name}"
            ))
            .await
            .json();
        if ws["status"]["phase"] == "Ready" {
            return ws["spec"]["cluster"].as_str().expect("cluster").to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("workspace {name} never became Ready");
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("yaml")
}

impl Env {
    async fn start(
        adjust: impl FnOnce(&mut apiserver::server::ServeOptions, &std::path::Path),
    ) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let mut opts =
            apiserver::server::ServeOptions::new("127.0.0.1:0".parse().expect("addr"), &data);
        opts.store = apiserver::server::StoreKind::Memory;
        adjust(&mut opts, dir.path());
        let server = apiserver::server::start(opts).await.expect("start");
        let pki = certs::load_or_create(&data.join("pki"), &[]).expect("pki");
        let ca = pki.ca_cert_pem().to_string();
        let admin_config = ClientConfig::new(
            server.address,
            &ca,
            Some((pki.admin_cert_pem(), pki.admin_key_pem())),
        )
        .expect("admin");
        let admin = Caller::new(&admin_config, &[]).await;
        Env {
            server,
            admin,
            pki,
            ca,
            dir,
        }
    }

    /// A caller authenticated by a client certificate from the server's CA.
    async fn user(&self, name: &str, groups: &[&str]) -> Caller {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let (cert, key) = self
            .pki
            .issue_client_certificate(name, &groups, 1)
            .expect("cert");
        let config =
            ClientConfig::new(self.server.address, &self.ca, Some((&cert, &key))).expect("config");
        Caller::new(&config, &[]).await
    }

    /// A caller with a bearer token and no client certificate.
    async fn bearer(&self, token: &str) -> Caller {
        let config = ClientConfig::new(self.server.address, &self.ca, None).expect("config");
        Caller::new(&config, &[("authorization", &format!("Bearer {token}"))]).await
    }

    /// Creates `root:<name>` and returns its logical cluster name once Ready.
    async fn workspace(&mut self, name: &str) -> String {
        create_workspace(&mut self.admin, name).await
    }

    /// Creates an object as admin at `collection` (a path under /clusters/<c>).
    async fn create(&mut self, collection: &str, obj: Value) -> Value {
        let r = self.admin.post(collection, &obj).await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "{collection}: {:?}",
            r.json()
        );
        r.json()
    }
}

const EVERYTHING: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: everything}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
- nonResourceURLs: ["*"]
  verbs: ["*"]
"#;

fn binding(name: &str, role: &str, subject: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [subject]})
}

fn user_subject(name: &str) -> Value {
    json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name})
}

/// Every resource (and subresource) the admin's discovery lists in a cluster:
/// `(api prefix, plural[/sub], namespaced, verbs)`.
async fn discovered(admin: &mut Caller, cluster: &str) -> Vec<(String, String, bool, Vec<String>)> {
    let mut prefixes = vec!["/api/v1".to_string()];
    let groups = admin.get(&format!("/clusters/{cluster}/apis")).await.json();
    for g in groups["groups"].as_array().expect("groups") {
        for v in g["versions"].as_array().expect("versions") {
            prefixes.push(format!(
                "/apis/{}",
                v["groupVersion"].as_str().expect("groupVersion")
            ));
        }
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        let list = admin
            .get(&format!("/clusters/{cluster}{prefix}"))
            .await
            .json();
        for r in list["resources"].as_array().expect("resources") {
            let verbs = r["verbs"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                prefix.clone(),
                r["name"].as_str().expect("name").to_string(),
                r["namespaced"].as_bool().unwrap_or(false),
                verbs,
            ));
        }
    }
    out
}

/// Self reviews answer about the caller, in any workspace, as in kube: they reveal nothing of B.
fn is_self_review(plural: &str) -> bool {
    plural.starts_with("selfsubject")
}

/// The request of one verb on one resource: method, path (after the cluster part) and body.
fn request_for(
    prefix: &str,
    plural: &str,
    namespaced: bool,
    verb: &str,
) -> Option<(Method, String, Option<Value>)> {
    let (resource, sub) = match plural.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (plural, None),
    };
    let ns = if namespaced {
        "/namespaces/default"
    } else {
        ""
    };
    let collection = format!("{prefix}{ns}/{resource}");
    let named = match sub {
        Some(s) => format!("{collection}/target/{s}"),
        None => format!("{collection}/target"),
    };
    let body = json!({"metadata": {"name": "target"}});
    Some(match (verb, sub) {
        ("get", _) => (Method::GET, named, None),
        ("list", None) => (Method::GET, collection, None),
        ("watch", None) => (
            Method::GET,
            format!("{collection}?watch=true&timeoutSeconds=1"),
            None,
        ),
        ("create", None) => (Method::POST, collection, Some(body)),
        ("create", Some(_)) => (Method::POST, named, Some(body)),
        ("update", _) => (Method::PUT, named, Some(body)),
        ("patch", _) => (Method::PATCH, named, Some(json!({}))),
        ("delete", None) => (Method::DELETE, named, None),
        ("deletecollection", None) => (Method::DELETE, collection, None),
        _ => return None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_workspace_a_reaches_nothing_in_workspace_b() {
    let mut env = Env::start(|_, _| {}).await;
    let a = env.workspace("tenant-a").await;
    let b = env.workspace("tenant-b").await;

    // alice may do everything in A.
    env.create(
        &format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
        yaml(EVERYTHING),
    )
    .await;
    env.create(
        &format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
        binding("alice-everything", "everything", user_subject("alice")),
    )
    .await;
    // B holds data and exports an API.
    env.create(
        &format!("/clusters/{b}/api/v1/namespaces/default/configmaps"),
        json!({"metadata": {"name": "target"}, "data": {"k": "secret value"}}),
    )
    .await;
    for (path, text) in [
        (
            "apiresourceschemas",
            include_str!("../../examples/workspaces/widget-schema.yaml"),
        ),
        (
            "apiexports",
            include_str!("../../examples/workspaces/widget-export.yaml"),
        ),
    ] {
        env.create(
            &format!("/clusters/{b}/apis/apis.kcp.io/v1alpha1/{path}"),
            yaml(text),
        )
        .await;
    }

    let mut alice = env.user("alice", &["tenants"]).await;
    // Positive controls: the same requests work in A, so a 403 in B is isolation, not breakage.
    let r = alice
        .get(&format!(
            "/clusters/{a}/api/v1/namespaces/default/configmaps"
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = alice.get("/clusters/root:tenant-a/api/v1/namespaces").await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = alice
        .post(
            &format!("/clusters/{a}/api/v1/namespaces/default/configmaps"),
            &json!({"metadata": {"name": "mine"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());

    // Every verb on every resource of B, by cluster name and by path.
    let resources = discovered(&mut env.admin, &b).await;
    assert!(resources.len() > 20, "discovery of B: {resources:?}");
    let mut checked = 0;
    for (prefix, plural, namespaced, verbs) in &resources {
        if is_self_review(plural) {
            continue;
        }
        for verb in verbs {
            let Some((method, rest, body)) = request_for(prefix, plural, *namespaced, verb) else {
                continue;
            };
            for base in [
                format!("/clusters/{b}"),
                "/clusters/root:tenant-b".to_string(),
            ] {
                let path = format!("{base}{rest}");
                let r = alice.call(method.clone(), &path, body.as_ref()).await;
                assert_eq!(
                    r.status,
                    StatusCode::FORBIDDEN,
                    "{verb} {path}: {:?}",
                    r.json()
                );
                assert_eq!(r.json()["reason"], "Forbidden", "{path}");
                checked += 1;
            }
            // Across every workspace: lists and watches only, and only for system:masters.
            if matches!(verb.as_str(), "list" | "watch") && !plural.contains('/') {
                let path = format!("/clusters/*{rest}").replace("/namespaces/default", "");
                let r = alice.call(method.clone(), &path, None).await;
                assert_eq!(r.status, StatusCode::FORBIDDEN, "{verb} {path}");
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "only {checked} requests checked");
    // Discovery and OpenAPI of B are closed too, as is a token for a service account there.
    for path in ["/api", "/apis", "/api/v1", "/openapi/v3", "/openapi/v2"] {
        let r = alice.get(&format!("/clusters/{b}{path}")).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
    }
    let r = alice
        .post(
            &format!("/clusters/{b}/api/v1/namespaces/default/serviceaccounts/default/token"),
            &json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "spec": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // B's virtual workspace: data, discovery and the export's bindings.
    let vw = format!("/services/apiexport/{b}/widgets.example.platform-mesh.io/clusters/*");
    for path in [
        format!("{vw}/apis/example.platform-mesh.io/v1/widgets"),
        format!("{vw}/apis/example.platform-mesh.io/v1/widgets?watch=true&timeoutSeconds=1"),
        format!("{vw}/apis"),
        format!("{vw}/apis/apis.kcp.io/v1alpha1/apibindings"),
    ] {
        let r = alice.get(&path).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {:?}", r.json());
    }
    // Someone allowed on the export's content (in B) gets through: the rule is the export's.
    env.create(
        &format!("/clusters/{b}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
        json!({"metadata": {"name": "widgets-content"},
               "rules": [{"apiGroups": ["apis.kcp.io"], "resources": ["apiexports/content"],
                          "resourceNames": ["widgets.example.platform-mesh.io"],
                          "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    env.create(
        &format!("/clusters/{b}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
        binding(
            "operator-content",
            "widgets-content",
            user_subject("operator"),
        ),
    )
    .await;
    let mut operator = env.user("operator", &[]).await;
    let r = operator
        .get(&format!("{vw}/apis/example.platform-mesh.io/v1/widgets"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = operator.get(&format!("{vw}/apis")).await;
    assert_eq!(r.status, StatusCode::OK);
    // ... and may read through it, not write.
    let r = operator
        .post(
            &format!("/services/apiexport/{b}/widgets.example.platform-mesh.io/clusters/{a}/apis/example.platform-mesh.io/v1/namespaces/default/widgets"),
            &json!({"apiVersion": "example.platform-mesh.io/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{:?}", r.json());
    // Nothing in B changed.
    let cm = env
        .admin
        .get(&format!(
            "/clusters/{b}/api/v1/namespaces/default/configmaps/target"
        ))
        .await
        .json();
    assert_eq!(cm["data"]["k"], "secret value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cannot_grant_itself_more_or_impersonate_its_way_out() {
    let mut env = Env::start(|_, _| {}).await;
    let a = env.workspace("tenant-a").await;
    let rbac = format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1");
    env.create(&format!("{rbac}/clusterroles"), yaml(EVERYTHING))
        .await;
    env.create(
        &format!("{rbac}/clusterroles"),
        json!({"metadata": {"name": "rbac-writer"},
               "rules": [
                 {"apiGroups": ["rbac.authorization.k8s.io"],
                  "resources": ["roles", "rolebindings", "clusterroles", "clusterrolebindings"],
                  "verbs": ["get", "list", "create", "update", "patch"]},
                 {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
    )
    .await;
    env.create(
        &format!("{rbac}/clusterrolebindings"),
        binding("carol-rbac", "rbac-writer", user_subject("carol")),
    )
    .await;
    let mut carol = env.user("carol", &[]).await;

    // Binding herself to a bigger role, or writing one, is refused.
    for (path, obj) in [
        (
            format!("{rbac}/clusterrolebindings"),
            binding("carol-everything", "everything", user_subject("carol")),
        ),
        (
            format!("{rbac}/namespaces/default/rolebindings"),
            json!({"metadata": {"name": "carol-everything"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "everything"},
                   "subjects": [user_subject("carol")]}),
        ),
        (
            format!("{rbac}/clusterroles"),
            json!({"metadata": {"name": "secrets"},
                   "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
        ),
    ] {
        let r = carol.post(&path, &obj).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {:?}", r.json());
        let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("not currently held"), "{msg}");
    }
    // Also not by server-side apply or by editing her own binding.
    let r = carol
        .conn
        .send_with_headers(
            Method::PATCH,
            &format!("{rbac}/clusterrolebindings/carol-everything?fieldManager=carol"),
            &[("content-type", "application/apply-patch+yaml")],
            serde_json::to_vec(&binding(
                "carol-everything",
                "everything",
                user_subject("carol"),
            ))
            .expect("json"),
        )
        .await
        .expect("apply");
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{:?}", r.json());
    let r = carol
        .call(
            Method::PATCH,
            &format!("{rbac}/clusterrolebindings/carol-rbac"),
            Some(&json!({"roleRef": {"name": "everything"}})),
        )
        .await;
    assert!(
        r.status == StatusCode::FORBIDDEN || r.status == StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        r.json()
    );
    // Granting what she holds is fine.
    let r = carol
        .post(
            &format!("{rbac}/clusterroles"),
            &json!({"metadata": {"name": "cm-reader"},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());

    // Impersonation needs the impersonate verb: refused for carol, allowed for the admin.
    for headers in [
        vec![
            ("impersonate-user", "admin"),
            ("impersonate-group", "system:masters"),
        ],
        vec![
            ("impersonate-user", "carol"),
            ("impersonate-group", "system:masters"),
        ],
        vec![("impersonate-user", "system:serviceaccount:default:default")],
        vec![("impersonate-group", "system:masters")],
    ] {
        let r = carol
            .conn
            .send_with_headers(
                Method::GET,
                &format!("/clusters/{a}/api/v1/namespaces/default/secrets"),
                &headers,
                Vec::new(),
            )
            .await
            .expect("request");
        assert!(
            r.status == StatusCode::FORBIDDEN || r.status == StatusCode::BAD_REQUEST,
            "{headers:?}: {:?}",
            r.json()
        );
        assert_ne!(r.status, StatusCode::OK);
    }
    let r = env
        .admin
        .conn
        .send_with_headers(
            Method::POST,
            &format!("/clusters/{a}/apis/authentication.k8s.io/v1/selfsubjectreviews"),
            &[
                ("impersonate-user", "carol"),
                ("impersonate-group", "auditors"),
                ("content-type", "application/json"),
            ],
            br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#.to_vec(),
        )
        .await
        .expect("request");
    let info = &r.json()["status"]["userInfo"];
    assert_eq!(info["username"], "carol", "{info}");
    assert_eq!(info["groups"], json!(["auditors", "system:authenticated"]));
    // Impersonating carol, the admin has carol's rights only.
    let r = env
        .admin
        .conn
        .send_with_headers(
            Method::GET,
            &format!("/clusters/{a}/api/v1/namespaces/default/secrets"),
            &[("impersonate-user", "carol")],
            Vec::new(),
        )
        .await
        .expect("request");
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("User \"carol\" cannot list resource \"secrets\""),
        "{msg}"
    );
}

/// The ClusterRole ProviderSecret derives from an APIExport: the exported resources and binding
/// the export.
const PROVIDER_SCOPE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: provider-scope}
rules:
- apiGroups: ["apis.kcp.io"]
  resources: ["apiexports"]
  verbs: ["get", "list", "create"]
- apiGroups: ["apis.kcp.io"]
  resources: ["apiexports"]
  resourceNames: ["widgets.example.platform-mesh.io"]
  verbs: ["bind"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list"]
"#;

fn jwt_parts(token: &str) -> Vec<String> {
    token.split('.').map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_token_reaches_exactly_its_cluster_role() {
    let mut env = Env::start(|_, _| {}).await;
    let a = env.workspace("provider-a").await;
    let b = env.workspace("tenant-b").await;
    let core = format!("/clusters/{a}/api/v1/namespaces/default");
    env.create(
        &format!("{core}/serviceaccounts"),
        json!({"metadata": {"name": "provider"}}),
    )
    .await;
    env.create(
        &format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
        yaml(PROVIDER_SCOPE),
    )
    .await;
    let sa_subject = json!({"kind": "ServiceAccount", "name": "provider", "namespace": "default"});
    env.create(
        &format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
        binding("provider-scope", "provider-scope", sa_subject.clone()),
    )
    .await;
    // B binds a service account of the same name: a token from A must not match it.
    env.create(
        &format!("/clusters/{b}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
        yaml(EVERYTHING),
    )
    .await;
    env.create(
        &format!("/clusters/{b}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
        binding("same-name", "everything", sa_subject),
    )
    .await;

    // A bound token (TokenRequest) and a legacy Secret token.
    let r = env
        .admin
        .post(
            &format!("{core}/serviceaccounts/provider/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let bound = r.json()["status"]["token"]
        .as_str()
        .expect("token")
        .to_string();
    assert!(r.json()["status"]["expirationTimestamp"].is_string());
    let secret = env
        .create(
            &format!("{core}/secrets"),
            json!({"metadata": {"name": "provider-token",
                                "annotations": {"kubernetes.io/service-account.name": "provider"}},
                   "type": "kubernetes.io/service-account-token"}),
        )
        .await;
    let legacy = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["token"].as_str().expect("token in secret"))
            .expect("base64"),
    )
    .expect("utf8");
    assert!(secret["data"]["ca.crt"].is_string() && secret["data"]["namespace"].is_string());
    assert!(secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"].is_string());

    for token in [&bound, &legacy] {
        let mut sa = env.bearer(token).await;
        let whoami = sa
            .post(
                &format!("/clusters/{a}/apis/authentication.k8s.io/v1/selfsubjectreviews"),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
            )
            .await
            .json();
        assert_eq!(
            whoami["status"]["userInfo"]["username"],
            "system:serviceaccount:default:provider"
        );
        // Allowed: exactly the ClusterRole's rules.
        for path in [
            format!("/clusters/{a}/api/v1/namespaces/default/configmaps"),
            format!("/clusters/{a}/apis/apis.kcp.io/v1alpha1/apiexports"),
        ] {
            let r = sa.get(&path).await;
            assert_eq!(r.status, StatusCode::OK, "{path}: {:?}", r.json());
        }
        // Not allowed: anything else in A, anything in B or root.
        for (method, path) in [
            (
                Method::GET,
                format!("/clusters/{a}/api/v1/namespaces/default/secrets"),
            ),
            (
                Method::POST,
                format!("/clusters/{a}/api/v1/namespaces/default/configmaps"),
            ),
            (
                Method::DELETE,
                format!("/clusters/{a}/apis/apis.kcp.io/v1alpha1/apiexports/x"),
            ),
            (
                Method::GET,
                format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            ),
            (
                Method::GET,
                format!("/clusters/{b}/api/v1/namespaces/default/configmaps"),
            ),
            (
                Method::GET,
                format!("/clusters/{b}/apis/apis.kcp.io/v1alpha1/apiexports"),
            ),
            (Method::GET, "/clusters/root/api/v1/namespaces".to_string()),
            (Method::GET, "/clusters/*/api/v1/configmaps".to_string()),
        ] {
            let body = (method == Method::POST).then(|| json!({"metadata": {"name": "x"}}));
            let r = sa.call(method.clone(), &path, body.as_ref()).await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "{method} {path}: {:?}",
                r.json()
            );
        }
        let r = sa
            .post(
                &format!("/clusters/{a}/apis/apis.kcp.io/v1alpha1/apiexports"),
                &yaml(include_str!("../../examples/workspaces/widget-export.yaml")),
            )
            .await;
        assert!(
            r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT,
            "{:?}",
            r.json()
        );
    }

    // Tokens that must not work: tampered, signed by another key, expired, not-yet-valid,
    // for another audience, and tokens whose service account or Secret is gone.
    let key =
        std::fs::read_to_string(env.dir.path().join("data/pki/service-account.key")).expect("key");
    let signer = apiserver::access::serviceaccounts::ServiceAccountTokens::from_pem(
        &key,
        apiserver::access::serviceaccounts::DEFAULT_ISSUER,
        &[],
        "",
    )
    .expect("signer");
    let parts = jwt_parts(&bound);
    let claims: apiserver::access::serviceaccounts::Claims = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&parts[1])
            .expect("payload"),
    )
    .expect("claims");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut expired = claims.clone();
    expired.exp = Some(now - 10);
    expired.iat = now - 4000;
    expired.nbf = now - 4000;
    let mut early = claims.clone();
    early.nbf = now + 3600;
    let mut elsewhere = claims.clone();
    elsewhere.aud = vec!["https://vault.example.com".into()];
    let mut tampered_claims = claims.clone();
    tampered_claims.kube.serviceaccount.name = "default".into();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&tampered_claims).expect("json")),
        parts[2]
    );
    let mut flipped_sig = parts.clone();
    flipped_sig[2] = flipped_sig[2].chars().rev().collect();
    let other_key = {
        let other = tempfile::tempdir().expect("tempdir");
        apiserver::access::serviceaccounts::ServiceAccountTokens::load_or_create(
            &other.path().join("k"),
            apiserver::access::serviceaccounts::DEFAULT_ISSUER,
            &[],
            "",
        )
        .expect("other")
        .sign(&claims)
        .expect("sign")
    };
    let refused = [
        ("expired", signer.sign(&expired).expect("sign")),
        ("not yet valid", signer.sign(&early).expect("sign")),
        ("other audience", signer.sign(&elsewhere).expect("sign")),
        ("tampered payload", tampered),
        ("tampered signature", flipped_sig.join(".")),
        ("other key", other_key),
        ("garbage", "not-a-token".to_string()),
    ];
    let probe = format!("/clusters/{a}/api/v1/namespaces/default/configmaps");
    for (what, token) in &refused {
        let r = env.bearer(token).await.get(&probe).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {:?}", r.json());
        assert_eq!(r.json()["reason"], "Unauthorized", "{what}");
    }
    // The token review says the same, naming no token.
    let review = env
        .admin
        .post(
            &format!("/clusters/{a}/apis/authentication.k8s.io/v1/tokenreviews"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": refused[0].1}}),
        )
        .await
        .json();
    assert_eq!(review["status"]["authenticated"], false, "{review}");
    assert_eq!(review["status"]["error"], "token has expired");
    let review = env
        .admin
        .post(
            &format!("/clusters/{a}/apis/authentication.k8s.io/v1/tokenreviews"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": bound}}),
        )
        .await
        .json();
    assert_eq!(review["status"]["authenticated"], true, "{review}");
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:default:provider"
    );

    // Deleting the Secret ends the legacy token; deleting the account ends both.
    let r = env
        .admin
        .call(
            Method::DELETE,
            &format!("{core}/secrets/provider-token"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        env.bearer(&legacy).await.get(&probe).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        env.bearer(&bound).await.get(&probe).await.status,
        StatusCode::OK
    );
    let r = env
        .admin
        .call(
            Method::DELETE,
            &format!("{core}/serviceaccounts/provider"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        env.bearer(&bound).await.get(&probe).await.status,
        StatusCode::UNAUTHORIZED
    );

    // Token requests: too short, missing account.
    let r = env
        .admin
        .post(
            &format!("{core}/serviceaccounts/provider/token"),
            &json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "spec": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.json());
    env.create(
        &format!("{core}/serviceaccounts"),
        json!({"metadata": {"name": "short"}}),
    )
    .await;
    let r = env
        .admin
        .post(
            &format!("{core}/serviceaccounts/short/token"),
            &json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                    "spec": {"expirationSeconds": 60}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.json()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("may not specify a duration less than 10 minutes"));
    // A re-created account of the same name is a new account: the old token stays dead.
    env.create(
        &format!("{core}/serviceaccounts"),
        json!({"metadata": {"name": "provider"}}),
    )
    .await;
    assert_eq!(
        env.bearer(&bound).await.get(&probe).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_remote_user_headers_are_ignored_without_the_proxy_certificate() {
    let proxy_dir = tempfile::tempdir().expect("tempdir");
    let proxy_pki = certs::load_or_create(proxy_dir.path(), &[]).expect("proxy pki");
    let proxy_ca = proxy_dir.path().join("ca.crt");
    let env = Env::start(|opts, _| {
        opts.requestheader_client_ca_file = Some(proxy_ca.clone());
        opts.requestheader_allowed_names = vec!["front-proxy-client".into()];
    })
    .await;
    let forged: &[(&str, &str)] = &[
        ("x-remote-user", "admin"),
        ("x-remote-group", "system:masters"),
    ];
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let secrets = "/api/v1/namespaces/default/secrets";
    let issue = |cn: &str| {
        proxy_pki
            .issue_client_certificate(cn, &[], 1)
            .expect("cert")
    };
    let config = |client: Option<&(String, String)>| {
        ClientConfig::new(
            env.server.address,
            &env.ca,
            client.map(|(c, k)| (c.as_str(), k.as_str())),
        )
        .expect("config")
    };
    // A user's certificate plus forged headers: still that user.
    let mut alice = env.user("alice", &[]).await;
    alice.headers = forged
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let r = alice.post(whoami, &review).await;
    assert_eq!(
        r.json()["status"]["userInfo"]["username"],
        "alice",
        "{:?}",
        r.json()
    );
    assert_eq!(alice.get(secrets).await.status, StatusCode::FORBIDDEN);
    // No certificate at all, or a proxy-CA certificate with a name that is not allowed: nobody,
    // whatever the headers say.
    for client in [None, Some(issue("someone-else"))] {
        let mut caller = Caller::new(&config(client.as_ref()), forged).await;
        assert_eq!(caller.get(secrets).await.status, StatusCode::UNAUTHORIZED);
    }
    // The real proxy: the headers count.
    let mut proxy = Caller::new(&config(Some(&issue("front-proxy-client"))), forged).await;
    let r = proxy.post(whoami, &review).await;
    assert_eq!(
        r.json()["status"]["userInfo"]["username"],
        "admin",
        "{:?}",
        r.json()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_ca_may_not_be_the_client_ca_without_allowed_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let pki = certs::load_or_create(&data.join("pki"), &[]).expect("pki");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, pki.ca_cert_pem()).expect("ca");
    let mut opts = apiserver::server::ServeOptions::new("127.0.0.1:0".parse().expect("a"), &data);
    opts.store = apiserver::server::StoreKind::Memory;
    opts.requestheader_client_ca_file = Some(ca);
    let err = apiserver::server::start(opts).await.err().expect("refused");
    assert!(
        err.to_string().contains("--requestheader-allowed-names"),
        "{err}"
    );
}
