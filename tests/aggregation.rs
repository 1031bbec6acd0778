//! Serving behind kube-apiserver's aggregator: requests shaped exactly as the aggregator sends
//! them (its proxy client certificate from a separate front-proxy CA, TLS server name
//! `<service>.<namespace>.svc`, identity in `X-Remote-*` headers with one header per group and
//! %-escaped extra keys, no Authorization) are served as that user with that user's RBAC; the
//! aggregator's own availability, discovery and OpenAPI probes get through.

mod common;

use http::{Method, StatusCode};
use https_client::{ClientConfig, Reply};
use serde_json::{json, Value};

const SERVICE_HOST: &str = "platform-mesh.platform-mesh-system.svc";

struct Aggregator {
    proxy: ClientConfig,
}

/// The identity the aggregator forwards.
struct Who<'a> {
    user: &'a str,
    groups: &'a [&'a str],
    extra: &'a [(&'a str, &'a str)],
}

const AGGREGATOR: Who<'static> = Who {
    user: "system:kube-aggregator",
    groups: &["system:masters"],
    extra: &[],
};

impl Aggregator {
    /// Sends a request as kube-apiserver proxies it for `user` with `groups` and `extra`.
    async fn send(
        &self,
        method: Method,
        path: &str,
        who: &Who<'_>,
        accept: &str,
        body: Option<&Value>,
    ) -> Reply {
        let mut headers: Vec<(String, String)> = vec![
            ("x-remote-user".into(), who.user.into()),
            (
                "audit-id".into(),
                "4b1c7a52-2f0e-4a5e-9a43-6d1c2f9b1e11".into(),
            ),
            ("accept".into(), accept.into()),
            (
                "user-agent".into(),
                "kubectl/v1.33.0 (linux/amd64) kubernetes/abcdef".into(),
            ),
            ("x-forwarded-for".into(), "10.0.0.7".into()),
        ];
        for g in who.groups {
            headers.push(("x-remote-group".into(), g.to_string()));
        }
        for (k, v) in who.extra {
            headers.push((format!("x-remote-extra-{k}"), v.to_string()));
        }
        let bytes = match body {
            Some(b) => {
                headers.push(("content-type".into(), "application/json".into()));
                serde_json::to_vec(b).expect("json")
            }
            None => Vec::new(),
        };
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut conn = self.proxy.connect_to(SERVICE_HOST).await.expect("connect");
        conn.send_with_headers(method, path, &headers, bytes)
            .await
            .expect("request")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_proxied_by_the_aggregator_are_served_as_the_end_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // The server's PKI (client CA) and a separate front-proxy CA, as kubeadm sets them up.
    let pki = certs::load_or_create(&data.join("pki"), &[]).expect("pki");
    let front_proxy = certs::load_or_create(&dir.path().join("front-proxy"), &[]).expect("fp");
    let (serving_cert, serving_key) = pki
        .issue_serving_certificate(&[SERVICE_HOST.to_string()])
        .expect("serving");
    std::fs::write(dir.path().join("tls.crt"), &serving_cert).expect("write");
    std::fs::write(dir.path().join("tls.key"), &serving_key).expect("write");
    let (running, admin, _guard) = common::in_process_with(|opts| {
        opts.data_dir = data.clone();
        opts.tls_cert_file = Some(dir.path().join("tls.crt"));
        opts.tls_private_key_file = Some(dir.path().join("tls.key"));
        opts.requestheader_client_ca_file = Some(dir.path().join("front-proxy/ca.crt"));
        opts.requestheader_allowed_names = vec!["front-proxy-client".into()];
    })
    .await;
    let (cert, key) = front_proxy
        .issue_client_certificate("front-proxy-client", &[], 1)
        .expect("proxy cert");
    let aggregator = Aggregator {
        proxy: ClientConfig::new(running.address, pki.ca_cert_pem(), Some((&cert, &key)))
            .expect("proxy client"),
    };

    // bob may list and get Accounts in root, nothing else.
    let mut conn = admin.connect().await.expect("admin");
    for (path, obj) in [
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            json!({"metadata": {"name": "account-viewer"},
                   "rules": [{"apiGroups": ["core.platform-mesh.io"], "resources": ["accounts"],
                              "verbs": ["get", "list", "watch"]}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({"metadata": {"name": "dev-views-accounts"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "account-viewer"},
                   "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                 "name": "dev"}]}),
        ),
        (
            "/apis/core.platform-mesh.io/v1alpha1/accounts",
            json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
                   "metadata": {"name": "acme"},
                   "spec": {"type": "org", "displayName": "Acme"}}),
        ),
    ] {
        let r = conn.post_json(path, &obj).await.expect("create");
        assert_eq!(r.status, StatusCode::CREATED, "{path}: {:?}", r.json());
    }

    let json_accept = "application/json, */*";
    let extra = [
        (
            "authentication.kubernetes.io%2fcredential-id",
            "X509SHA256=ab12",
        ),
        ("Scopes", "view"),
        ("Scopes", "edit"),
    ];
    let bob = Who {
        user: "bob",
        groups: &["dev", "system:authenticated"],
        extra: &extra,
    };
    // The end user's request, with its groups and extras.
    let r = aggregator
        .send(
            Method::GET,
            "/apis/core.platform-mesh.io/v1alpha1/accounts?limit=500",
            &bob,
            json_accept,
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    assert_eq!(r.json()["items"][0]["metadata"]["name"], "acme");
    // Refused by bob's RBAC, in kube's words.
    let r = aggregator
        .send(
            Method::DELETE,
            "/apis/core.platform-mesh.io/v1alpha1/accounts/acme",
            &bob,
            json_accept,
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json()["message"],
        "accounts.core.platform-mesh.io \"acme\" is forbidden: User \"bob\" cannot delete resource \"accounts\" in API group \"core.platform-mesh.io\" at the cluster scope"
    );
    // The server sees exactly the identity the aggregator sent.
    let r = aggregator
        .send(
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &bob,
            json_accept,
            Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
    let info = &r.json()["status"]["userInfo"];
    assert_eq!(info["username"], "bob", "{info}");
    assert_eq!(info["groups"], json!(["dev", "system:authenticated"]));
    assert_eq!(
        info["extra"],
        json!({"authentication.kubernetes.io/credential-id": ["X509SHA256=ab12"],
               "scopes": ["view", "edit"]})
    );
    // The aggregator's own calls: availability probe, aggregated discovery, the legacy
    // discovery fallback (no groups at all) and the OpenAPI merge.
    let r = aggregator
        .send(
            Method::GET,
            "/apis/core.platform-mesh.io/v1alpha1",
            &AGGREGATOR,
            json_accept,
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = aggregator
        .send(
            Method::GET,
            "/apis",
            &AGGREGATOR,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap_or_default()
        .contains("as=APIGroupDiscoveryList"));
    let r = aggregator
        .send(
            Method::GET,
            "/apis/providers.platform-mesh.io/v1alpha1",
            &Who {
                user: "system:kube-aggregator",
                groups: &[],
                extra: &[],
            },
            json_accept,
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    for path in ["/openapi/v2", "/openapi/v3"] {
        let r = aggregator
            .send(
                Method::GET,
                path,
                &Who {
                    user: "system:aggregator",
                    groups: &[],
                    extra: &[],
                },
                json_accept,
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
    }
    // Without X-Remote-User the proxy certificate alone is nobody.
    let mut conn = aggregator.proxy.connect_to(SERVICE_HOST).await.expect("c");
    let r = conn
        .get("/apis/core.platform-mesh.io/v1alpha1/accounts")
        .await
        .expect("request");
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

/// In a cluster the server learns whom to trust from the kube-apiserver it extends:
/// `kube-system/extension-apiserver-authentication` (here served by another platform-mesh standing
/// in for the host cluster) names the front-proxy CA, the allowed names and the headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_settings_come_from_the_host_clusters_configmap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let front_proxy = certs::load_or_create(&dir.path().join("front-proxy"), &[]).expect("fp");
    let host = common::Server::start();
    let mut conn = host.client().connect().await.expect("host");
    let r = conn
        .post_json(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}),
        )
        .await
        .expect("namespace");
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": {
            "requestheader-client-ca-file": front_proxy.ca_cert_pem(),
            "requestheader-allowed-names": "[\"front-proxy-client\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        },
    });
    let r = conn
        .post_json("/api/v1/namespaces/kube-system/configmaps", &cm)
        .await
        .expect("create");
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());

    let extension = common::Server::start_with(&[
        "--authentication-kubeconfig",
        host.kubeconfig.to_str().expect("path"),
    ]);
    let ca = std::fs::read_to_string(extension.data_dir.join("pki/ca.crt")).expect("ca");
    let (cert, key) = front_proxy
        .issue_client_certificate("front-proxy-client", &[], 1)
        .expect("proxy cert");
    let proxy = ClientConfig::new(extension.address, &ca, Some((&cert, &key))).expect("proxy");
    let mut conn = proxy.connect().await.expect("connect");
    let r = conn
        .send_with_headers(
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &[
                ("x-remote-user", "jane"),
                ("x-remote-group", "dev"),
                ("content-type", "application/json"),
            ],
            br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#.to_vec(),
        )
        .await
        .expect("request");
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    assert_eq!(r.json()["status"]["userInfo"]["username"], "jane");
    // A proxy-CA certificate with another name is not the proxy.
    let (cert, key) = front_proxy
        .issue_client_certificate("not-the-proxy", &[], 1)
        .expect("cert");
    let other = ClientConfig::new(extension.address, &ca, Some((&cert, &key))).expect("other");
    let r = other
        .connect()
        .await
        .expect("connect")
        .send_with_headers(
            Method::GET,
            "/api/v1/namespaces",
            &[
                ("x-remote-user", "admin"),
                ("x-remote-group", "system:masters"),
            ],
            Vec::new(),
        )
        .await
        .expect("request");
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}
