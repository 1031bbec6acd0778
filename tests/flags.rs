//! `serve` flags that only the binary reads, each through the binary: `--in-memory`,
//! `--tls-cert-file`/`--tls-private-key-file`, `--service-account-key-file`,
//! `--service-account-issuer`, `--api-audiences`, `--etcd-prefix` (with `--features etcd`), the
//! controllers' `--runtime-kubeconfig`, `--infra-kubeconfig` and
//! `--remote-runtime-infra-secret-name` (with `certs kubeconfig --workspace`), and a plain
//! SubjectAccessReview as the admin asks it.

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
        https_client::ClientConfig::new(server.address, ca, Some((&admin_cert, &admin_key)))
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
    // (`--request-timeout` in kube's flag syntax, as kube-apiserver's own default is written.)
    let server = Server::start_with(&["--no-controllers", "--request-timeout", "1m0s"]);
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
        .filter(|n| *n != "kube-root-ca.crt")
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

/// Waits until `check` gives `Some`, failing with `what` after `secs` seconds.
async fn wait_for<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited {secs} s for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A CRD of `kind` with an open schema and a status subresource.
fn open_crd(group: &str, kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": match group {
                    "helm.toolkit.fluxcd.io" => "v2",
                    "source.toolkit.fluxcd.io" => "v1",
                    _ => "v1alpha1",
                },
                "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    })
}

/// `serve --runtime-kubeconfig`, `--infra-kubeconfig` and `--remote-runtime-infra-secret-name`
/// (the first two given by upstream's names, `--remote-runtime-kubeconfig` and
/// `--remote-infra-kubeconfig`, which `serve` accepts as well): the PlatformMesh controller of
/// one server reconciles PlatformMeshes of another cluster and deploys into a third, both named
/// by kubeconfig files (here two workspaces of a server running without controllers, reached
/// through kubeconfigs that `certs kubeconfig --workspace` wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_reach_the_runtime_and_infra_clusters_their_flags_name() {
    let clusters = Server::start_with(&["--no-controllers"]);
    let workspaces = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
    for ws in ["runtime", "infra", "remote"] {
        let (code, body) = admin(
            &clusters,
            Method::POST,
            workspaces,
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": ws}}),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    for ws in ["runtime", "infra", "remote"] {
        wait_for(30, &format!("workspace {ws} Ready"), || async {
            let (_, w) = admin(
                &clusters,
                Method::GET,
                &format!("{workspaces}/{ws}"),
                Value::Null,
            )
            .await;
            (w["status"]["phase"] == "Ready").then_some(())
        })
        .await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = |ws: &str| {
        let out = dir.path().join(format!("{ws}.kubeconfig"));
        common::stdout_of(
            Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
                .args(["certs", "kubeconfig", "--user", "controllers", "--group"])
                .args([
                    "system:masters",
                    "--workspace",
                    &format!("root:{ws}"),
                    "--out",
                ])
                .arg(&out)
                .arg("--data-dir")
                .arg(&clusters.data_dir),
            "certs kubeconfig --workspace",
        );
        out
    };
    let (runtime, infra) = (kubeconfig("runtime"), kubeconfig("infra"));
    let written = std::fs::read_to_string(&runtime).expect("runtime kubeconfig");
    assert!(written.contains("/clusters/root:runtime"), "{written}");

    // The clusters hold what the controller needs: its namespace, Flux's HelmRelease in infra
    // and OCM's Resource in runtime.
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "platform-mesh-system"}});
    for (ws, crd) in [
        (
            "infra",
            open_crd("helm.toolkit.fluxcd.io", "HelmRelease", "helmreleases"),
        ),
        (
            "runtime",
            open_crd("delivery.ocm.software", "Resource", "resources"),
        ),
    ] {
        let at = format!("/clusters/root:{ws}");
        let (code, body) = admin(
            &clusters,
            Method::POST,
            &format!("{at}/api/v1/namespaces"),
            ns.clone(),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        let (code, body) = admin(
            &clusters,
            Method::POST,
            &format!("{at}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
            crd,
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }

    // A ManagedProvider's deployments are written beside it, in the runtime cluster.
    for crd in [
        open_crd("helm.toolkit.fluxcd.io", "HelmRelease", "helmreleases"),
        open_crd(
            "source.toolkit.fluxcd.io",
            "OCIRepository",
            "ocirepositories",
        ),
    ] {
        let (code, body) = admin(
            &clusters,
            Method::POST,
            "/clusters/root:runtime/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }

    let controllers = Server::start_with(&[
        "--remote-runtime-kubeconfig",
        runtime.to_str().expect("path"),
        "--remote-infra-kubeconfig",
        infra.to_str().expect("path"),
        "--remote-runtime-infra-secret-name",
        "runtime-kubeconfig",
    ]);
    let rt = "/clusters/root:runtime/api/v1/namespaces/platform-mesh-system";
    let profile = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "platform-mesh-profile", "namespace": "platform-mesh-system"},
        "data": {"profile.yaml": "infra:\n  deploymentTechnology: fluxcd\ncomponents:\n  deploymentTechnology: fluxcd\n  ocm:\n    component:\n      name: platform-mesh\n    repo:\n      name: platform-mesh\n  services:\n    svc-00:\n      enabled: true\n"}});
    let (code, body) = admin(
        &clusters,
        Method::POST,
        &format!("{rt}/configmaps"),
        profile,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let pms = "/clusters/root:runtime/apis/core.platform-mesh.io/v1alpha1/namespaces/platform-mesh-system/platformmeshes";
    let pm = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
        "metadata": {"name": "platform-mesh", "namespace": "platform-mesh-system"}, "spec": {}});
    let (code, body) = admin(&clusters, Method::POST, pms, pm).await;
    assert_eq!(code, 201, "{body}");

    // The Deployment step writes the service's HelmRelease into the infra cluster, reading the
    // runtime cluster through the Secret the flag names.
    let releases = "/clusters/root:infra/apis/helm.toolkit.fluxcd.io/v2/namespaces/platform-mesh-system/helmreleases";
    let release = wait_for(60, "a HelmRelease in the infra cluster", || async {
        let (code, list) = admin(&clusters, Method::GET, releases, Value::Null).await;
        assert_eq!(code, 200, "{list}");
        list["items"].as_array().and_then(|i| i.first().cloned())
    })
    .await;
    assert_eq!(
        release["spec"]["kubeConfig"]["secretRef"]["name"], "runtime-kubeconfig",
        "{release}"
    );
    // Play Flux: the release is Ready, so the PlatformMesh (in the runtime cluster) becomes Ready.
    let name = release["metadata"]["name"].as_str().expect("name");
    let mut conn = clusters.client().connect().await.expect("connect");
    let patched = conn
        .send(
            Method::PATCH,
            &format!("{releases}/{name}/status"),
            Some("application/merge-patch+json"),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "InstallSucceeded",
                "message": "by the test", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
            .to_string()
            .into_bytes(),
        )
        .await
        .expect("patch");
    assert_eq!(patched.status.as_u16(), 200, "{}", patched.json());
    wait_for(
        60,
        "the PlatformMesh in the runtime cluster Ready",
        || async {
            let (_, pm) = admin(
                &clusters,
                Method::GET,
                &format!("{pms}/platform-mesh"),
                Value::Null,
            )
            .await;
            pm["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
                .then_some(())
        },
    )
    .await;
    // KcpSetup went to the kcp, which defaults to the controllers' own server; the server
    // holding the clusters got no workspace tree, and the controllers' server no PlatformMesh.
    let export = "/clusters/root:platform-mesh-system/apis/apis.kcp.io/v1alpha1/apiexports/core.platform-mesh.io";
    let (code, body) = admin(&controllers, Method::GET, export, Value::Null).await;
    assert_eq!(code, 200, "KcpSetup on the controllers' server: {body}");
    let (code, body) = admin(&clusters, Method::GET, export, Value::Null).await;
    assert_eq!(code, 404, "no KcpSetup on the clusters' server: {body}");
    let (code, list) = admin(
        &controllers,
        Method::GET,
        "/apis/core.platform-mesh.io/v1alpha1/platformmeshes",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"], json!([]), "{list}");

    // A ManagedProvider of the runtime cluster whose `runtimeKubeconfigSecretName` names a
    // third cluster (root:remote): its Provider goes to the kcp (the controllers' server), the
    // provider's kubeconfig is copied into the third cluster, and its HelmRelease, written
    // beside it in the runtime cluster, deploys there through the same Secret. (KcpSetup made
    // root:providers:system, where the Provider goes.)
    let remote = std::fs::read(kubeconfig("remote")).expect("remote kubeconfig");
    let (code, body) = admin(
        &clusters,
        Method::POST,
        &format!("{rt}/secrets"),
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "remote-runtime", "namespace": "platform-mesh-system"},
            "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(&remote)}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let mps = "/clusters/root:runtime/apis/providers.platform-mesh.io/v1alpha1/namespaces/platform-mesh-system/managedproviders";
    let (code, body) = admin(
        &clusters,
        Method::POST,
        mps,
        json!({"apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "ManagedProvider",
            "metadata": {"name": "quickstart", "namespace": "platform-mesh-system"},
            "spec": {"platformMeshRef": {"name": "platform-mesh"},
                "runtimeKubeconfigSecretName": "remote-runtime",
                "runtimeDeployments": [{"flux": {"registry": "ghcr.io/platform-mesh/helm-charts",
                    "chart": "example-httpbin-operator", "version": "0.5.14"}}]}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let copied = wait_for(60, "the provider's kubeconfig in the third cluster", || async {
        let (code, s) = admin(
            &clusters,
            Method::GET,
            "/clusters/root:remote/api/v1/namespaces/platform-mesh-system/secrets/quickstart-provider-kubeconfig",
            Value::Null,
        )
        .await;
        (code == 200).then_some(s)
    })
    .await;
    let text = base64::engine::general_purpose::STANDARD
        .decode(copied["data"]["kubeconfig"].as_str().expect("kubeconfig"))
        .expect("base64");
    assert!(
        String::from_utf8_lossy(&text).contains("/clusters/"),
        "a kubeconfig of the provider's workspace"
    );
    let (code, _) = admin(
        &clusters,
        Method::GET,
        &format!("{rt}/secrets/quickstart-provider-kubeconfig"),
        Value::Null,
    )
    .await;
    assert_eq!(code, 404, "the copy goes to the third cluster only");
    let mp_releases = "/clusters/root:runtime/apis/helm.toolkit.fluxcd.io/v2/namespaces/platform-mesh-system/helmreleases";
    let release = wait_for(60, "the ManagedProvider's HelmRelease", || async {
        let (code, r) = admin(
            &clusters,
            Method::GET,
            &format!("{mp_releases}/example-httpbin-operator"),
            Value::Null,
        )
        .await;
        (code == 200).then_some(r)
    })
    .await;
    assert_eq!(
        release["spec"]["kubeConfig"],
        json!({"secretRef": {"name": "remote-runtime", "key": "kubeconfig"}}),
        "{release}"
    );
    // Play Flux: the source has its artifact and the release is installed; the ManagedProvider
    // is Ready.
    let sources = "/clusters/root:runtime/apis/source.toolkit.fluxcd.io/v1/namespaces/platform-mesh-system/ocirepositories";
    for (collection, generation) in [(sources, 1), (mp_releases, 1)] {
        let path = format!("{collection}/example-httpbin-operator/status");
        let mut conn = clusters.client().connect().await.expect("connect");
        let patched = conn
            .send(
                Method::PATCH,
                &path,
                Some("application/merge-patch+json"),
                json!({"status": {"observedGeneration": generation, "conditions": [{"type": "Ready",
                    "status": "True", "reason": "Succeeded", "message": "by the test",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
                .to_string()
                .into_bytes(),
            )
            .await
            .expect("patch");
        assert_eq!(patched.status.as_u16(), 200, "{path}: {}", patched.json());
    }
    wait_for(60, "the ManagedProvider Ready", || async {
        let (_, mp) = admin(
            &clusters,
            Method::GET,
            &format!("{mps}/quickstart"),
            Value::Null,
        )
        .await;
        (mp["status"]["phase"] == "Ready").then_some(())
    })
    .await;
}

/// `--authentication-in-cluster` outside a pod: the server refuses to start and says why, instead
/// of serving without the delegated authentication it was asked for. (Inside a pod it reads the
/// same ConfigMap as `--authentication-kubeconfig`, which `tests/aggregation.rs` runs against a
/// real kube-apiserver; the pod's service-account files live at a fixed path a test cannot fake.)
#[test]
fn authentication_in_cluster_outside_a_pod_stops_with_a_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = common::exits_within(
        Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--authentication-in-cluster",
                "--data-dir",
            ])
            .arg(dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT"),
        30,
    );
    let (status, stderr) = (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--authentication-in-cluster needs to run in a pod with a service account"),
        "{stderr}"
    );
}

/// A `--request-timeout` that is no duration stops the server with what to write instead.
#[test]
fn a_request_timeout_that_is_no_duration_is_refused_with_the_syntax() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["0s", "1x", "1m-1s"] {
        let out = common::exits_within(
            Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
                .args(["serve", "--listen", "127.0.0.1:0"])
                .arg(format!("--request-timeout={bad}"))
                .arg("--data-dir")
                .arg(dir.path()),
            30,
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{bad}: {stderr}");
        assert!(
            stderr.contains("is not a positive duration (want e.g. 1m0s"),
            "{bad}: {stderr}"
        );
    }
}
