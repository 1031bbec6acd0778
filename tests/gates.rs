//! The PlatformMesh controller's gates after the applies (upstream's `DeploymentSubroutine`), with
//! a real kube-apiserver as the infra cluster, so that pods are real pods: the rebac-authz
//! webhook's CA handed to kcp and kcp's pod deleted for it, istio's release and the operator's
//! sidecar, kcp-operator's RootShard and FrontProxy. Each is shown waiting with upstream's
//! message and then passing; then the instance is Ready and a further reconcile writes nothing.
//! The runtime cluster is this server, in process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::kube_apiserver::KubeApiserver;
use common::KubeEnv;
use controllers::cluster_providers::fixed::FixedClusters;
use controllers::objects::api_resource as res;
use controllers::objects::platform_meshes;
use controllers::platformmesh::controller::{controller, lifecycle};
use controllers::platformmesh::deployment::{Clusters, Context};
use controllers::platformmesh::gates::{self, Gates, Istio, KcpOperator, WebhookSecrets};
use controllers::platformmesh::vars::Render;
use controllers::runtime::{Cluster, Manager, ManagerOptions};
use controllers::subroutines::drive;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const NS: &str = "platform-mesh-system";

async fn client_of(kubeconfig: &std::path::Path) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// Waits (up to 30 s) until `check` holds, naming `what` when it does not.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Installs a namespaced CRD with an open spec and status, and waits until it is Established.
async fn open_crd(client: &kube::Client, r: &ApiResource) {
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &res(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let name = format!("{}.{}", r.plural, r.group);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"group": r.group, "scope": "Namespaced",
            "names": {"plural": r.plural, "singular": r.kind.to_lowercase(), "kind": r.kind,
                "listKind": format!("{}List", r.kind)},
            "versions": [{"name": r.version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": open, "status": open}}}}]}
    }))
    .expect("crd");
    crds.create(&PostParams::default(), &crd)
        .await
        .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    eventually(&format!("CRD {name} Established"), || async {
        crds.get(&name).await.is_ok_and(|c| {
            c.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
    })
    .await;
}

/// Creates `value` (a namespaced object) through `api`.
async fn create(api: &Api<DynamicObject>, value: Value) {
    let obj: DynamicObject = serde_json::from_value(value).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", obj.metadata.name));
}

/// A pod of [`NS`] with `labels` and containers named `containers` (never scheduled: no
/// scheduler runs beside this kube-apiserver, so its deletion is immediate).
async fn pod(client: &kube::Client, name: &str, labels: Value, containers: &[&str]) {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| json!({"name": c, "image": "registry.invalid/x:1"}))
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": containers, "automountServiceAccountToken": false},
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("pod {name}: {e}"));
}

/// Sets `Type=True` on an object's status, for its current generation.
async fn set_condition(api: &Api<DynamicObject>, name: &str, type_: &str) {
    let obj = api.get(name).await.expect("object");
    let status = json!({"status": {"conditions": [{
        "type": type_, "status": "True", "reason": "Test", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": obj.metadata.generation,
    }]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");
}

/// cert-manager's part for the webhook's certificate, as strict as its certificate controllers
/// (`pkg/controller/certificates/issuing`) are about what this test reaches: a Certificate is
/// issued only when its `issuerRef` names an Issuer of its namespace with a `selfSigned` spec
/// and it has a `secretName` and `dnsNames`. The Secret (type kubernetes.io/tls) holds a
/// self-signed certificate for the names, its key, and as `ca.crt` the certificate itself (a
/// self-signed issuer is its own CA). Returns the CA; `None` when the Certificate is not one
/// cert-manager would issue.
async fn issue_self_signed(client: &kube::Client, name: &str) -> Option<Vec<u8>> {
    let issuers: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &res("cert-manager.io", "v1", "Issuer", "issuers"),
    );
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &res("cert-manager.io", "v1", "Certificate", "certificates"),
    );
    let cert = certificates
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading Certificate {name}: {e}"))?;
    let spec = &cert.data["spec"];
    let secret_name = spec["secretName"].as_str()?;
    let issuer = spec["issuerRef"]["name"].as_str()?;
    let names: Vec<String> = spec["dnsNames"]
        .as_array()?
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    if names.is_empty() || spec["issuerRef"]["kind"].as_str().unwrap_or("Issuer") != "Issuer" {
        return None;
    }
    let issuer = issuers
        .get_opt(issuer)
        .await
        .unwrap_or_else(|e| panic!("reading Issuer {issuer}: {e}"))?;
    issuer.data["spec"]["selfSigned"].as_object()?;
    let key = rcgen::KeyPair::generate().expect("key");
    let pem = rcgen::CertificateParams::new(names)
        .expect("params")
        .self_signed(&key)
        .expect("certificate")
        .pem();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret_name, "namespace": NS},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": pem, "tls.key": key.serialize_pem(), "ca.crt": pem},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the issued Secret");
    Some(pem.into_bytes())
}

/// A profile with one component service and no infra components.
const PROFILE: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: gated-profile
  namespace: platform-mesh-system
data:
  profile.yaml: |
    infra:
      deploymentTechnology: fluxcd
    components:
      deploymentTechnology: fluxcd
      ocm:
        component:
          name: platform-mesh
        repo:
          name: platform-mesh
      services:
        svc-00:
          enabled: true
"#;

/// The Deployment step's condition, once `want` holds for it (failing after 30 s with the last
/// one seen).
async fn deployment_says(pms: &Api<DynamicObject>, what: &str, want: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(o) = pms.get("gated").await {
            last = o.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "DeploymentSubroutine")
                .map(|c| format!("{}: {}", c["status"], c["message"]))
                .unwrap_or_default();
            if want(&last) {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Deployment step never showed {what}; it last said {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the PlatformMesh is Ready for its current generation (failing after 30 s with
/// its status).
async fn ready(pms: &Api<DynamicObject>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let o = pms.get("gated").await.expect("PlatformMesh");
        let ready = o.data["status"]["observedGeneration"].as_i64() == o.metadata.generation
            && o.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if ready {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the PlatformMesh is not Ready within 30 s: {}",
            o.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_gates_wait_with_upstreams_messages_then_pass() {
    let kube = KubeApiserver::start();
    let infra = client_of(&kube.admin_kubeconfig).await;
    let runtime_env = KubeEnv::start().await;
    let runtime = kube::Client::try_from(runtime_env.config.clone()).expect("runtime client");

    // What the infra cluster has before the PlatformMesh: Flux's, cert-manager's and
    // kcp-operator's kinds, and kcp running as a pod.
    for r in [
        res(
            "helm.toolkit.fluxcd.io",
            "v2",
            "HelmRelease",
            "helmreleases",
        ),
        res("cert-manager.io", "v1", "Issuer", "issuers"),
        res("cert-manager.io", "v1", "Certificate", "certificates"),
        gates::root_shards(),
        gates::front_proxies(),
    ] {
        open_crd(&infra, &r).await;
    }
    open_crd(
        &runtime,
        &res("delivery.ocm.software", "v1alpha1", "Resource", "resources"),
    )
    .await;
    for c in [&infra, &runtime] {
        Api::<DynamicObject>::all_with(c.clone(), &res("", "v1", "Namespace", "namespaces"))
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
            )
            .await
            .expect("namespace");
    }
    // kube-controller-manager (not running here) would make the namespace's default
    // ServiceAccount, which pods need.
    Api::<DynamicObject>::namespaced_with(
        infra.clone(),
        NS,
        &res("", "v1", "ServiceAccount", "serviceaccounts"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "default", "namespace": NS}})).unwrap(),
    )
    .await
    .expect("default ServiceAccount");
    pod(
        &infra,
        "kcp-0",
        json!({"app.kubernetes.io/name": "kcp"}),
        &["kcp"],
    )
    .await;

    let clusters = Arc::new(Clusters {
        infra: infra.clone(),
        runtime: runtime.clone(),
        remote: None,
        kcp: None,
        images: Default::default(),
        gates: Gates {
            webhook: Some(WebhookSecrets::default()),
            istio: Some(Istio { is_local: false }),
            kcp_operator: Some(KcpOperator {
                namespace: NS.into(),
                root_shard: Some("root".into()),
                front_proxy: Some("frontproxy".into()),
            }),
        },
    });
    let engine: Arc<dyn Render + Send + Sync> = Arc::new(gotemplate::Engine::default());
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(controller(engine.clone(), clusters.clone()))
        .expect("controller");
    let stop = CancellationToken::new();
    let provider = Arc::new(FixedClusters::new([Cluster::new(
        "runtime",
        runtime.clone(),
    )]));
    tokio::spawn({
        let (m, stop) = (manager.clone(), stop.clone());
        async move { m.run(provider, async move { stop.cancelled().await }).await }
    });

    let profile: Value = serde_saphyr::from_str(PROFILE).expect("profile");
    Api::<DynamicObject>::namespaced_with(
        runtime.clone(),
        NS,
        &res("", "v1", "ConfigMap", "configmaps"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(profile).unwrap(),
    )
    .await
    .expect("profile");
    let pms: Api<DynamicObject> = Api::namespaced_with(runtime.clone(), NS, &platform_meshes());
    create(
        &pms,
        json!({
            "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
            "metadata": {"name": "gated", "namespace": NS},
            "spec": {"kcp": {"providerConnections": []}},
        }),
    )
    .await;

    // The webhook: its Issuer, Certificate and kubeconfig Secret (no CA yet) are made and the
    // chain goes on, to istio, whose release is missing: an error, as upstream.
    deployment_says(&pms, "istiod missing", |m| {
        m.contains("HelmRelease platform-mesh-system/istio-istiod resource not found, waiting for it to be created")
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(infra.clone(), NS);
    let kubeconfig = || async {
        let s = secrets
            .get("kcp-webhook-secret")
            .await
            .expect("the webhook's kubeconfig Secret");
        let text = String::from_utf8(s.data.expect("data")["kubeconfig"].0.clone()).unwrap();
        let k: Kubeconfig = serde_saphyr::from_str(&text).expect("kubeconfig");
        k.clusters[0].cluster.clone().expect("cluster")
    };
    let first = kubeconfig().await;
    assert_eq!(first.server.as_deref(), Some(gates::WEBHOOK_URL));
    assert!(first.certificate_authority_data.is_none());

    // istiod there but not Ready; then Ready.
    let releases: Api<DynamicObject> = Api::namespaced_with(
        infra.clone(),
        NS,
        &res(
            "helm.toolkit.fluxcd.io",
            "v2",
            "HelmRelease",
            "helmreleases",
        ),
    );
    create(
        &releases,
        json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": "istio-istiod", "namespace": NS},
            "spec": {"chartRef": {"kind": "OCIRepository", "name": "istiod"}},
        }),
    )
    .await;
    deployment_says(&pms, "istiod not ready", |m| {
        m.contains("istio-istiod HelmRelease is not ready")
    })
    .await;
    set_condition(&releases, "istio-istiod", "Ready").await;

    // The operator's pod: none is an error; one without the sidecar is deleted to get it.
    deployment_says(&pms, "no operator pod", |m| m.contains("pod not found")).await;
    let pods: Api<Pod> = Api::namespaced(infra.clone(), NS);
    pod(
        &infra,
        "operator-a",
        json!({"app": "platform-mesh-operator"}),
        &["operator"],
    )
    .await;
    eventually("the sidecar-less operator pod deleted", || async {
        pods.get_opt("operator-a").await.is_ok_and(|p| p.is_none())
    })
    .await;
    pod(
        &infra,
        "operator-b",
        json!({"app": "platform-mesh-operator"}),
        &["operator", "istio-proxy"],
    )
    .await;

    // kcp-operator's objects: missing, then one not Available, then both Available.
    deployment_says(&pms, "RootShard waited for", |m| {
        m.contains("RootShard is not ready")
    })
    .await;
    let shards: Api<DynamicObject> = Api::namespaced_with(infra.clone(), NS, &gates::root_shards());
    let proxies: Api<DynamicObject> =
        Api::namespaced_with(infra.clone(), NS, &gates::front_proxies());
    for (api, kind, name) in [
        (&shards, "RootShard", "root"),
        (&proxies, "FrontProxy", "frontproxy"),
    ] {
        create(
            api,
            json!({"apiVersion": "operator.kcp.io/v1alpha1", "kind": kind,
                "metadata": {"name": name, "namespace": NS}, "spec": {}}),
        )
        .await;
    }
    set_condition(&shards, "root", "Available").await;
    deployment_says(&pms, "FrontProxy waited for", |m| {
        m.contains("FrontProxy is not ready")
    })
    .await;
    set_condition(&proxies, "frontproxy", "Available").await;
    // Flux's part for the one release (the Wait step waits for it).
    set_condition(&releases, "svc-00", "Ready").await;
    ready(&pms).await;
    assert!(
        pods.get_opt("kcp-0").await.expect("read").is_some(),
        "kcp is not restarted before the webhook has a CA"
    );

    // cert-manager issues the webhook's certificate: its CA goes into kcp's kubeconfig for the
    // webhook, and kcp's pod is deleted so that it starts with it.
    let ca = issue_self_signed(&infra, gates::WEBHOOK_CERTIFICATE)
        .await
        .expect("the Certificate and its self-signed Issuer were applied");
    // A new generation makes the controller look again at once.
    pms.patch(
        "gated",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"kcp": {"extraWorkspaces": []}}})),
    )
    .await
    .expect("patch");
    eventually("kcp's pod deleted for the new CA", || async {
        pods.get_opt("kcp-0").await.is_ok_and(|p| p.is_none())
    })
    .await;
    let data = kubeconfig()
        .await
        .certificate_authority_data
        .expect("the CA in the webhook's kubeconfig");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        ca
    );
    ready(&pms).await;

    // Nothing changes any more: another reconcile writes nothing and restarts nothing.
    pod(
        &infra,
        "kcp-1",
        json!({"app.kubernetes.io/name": "kcp"}),
        &["kcp"],
    )
    .await;
    let obj = pms.get("gated").await.expect("PlatformMesh");
    let mut context = Context::new(obj.clone(), clusters.clone()).expect("context");
    context.cluster = Some("runtime".into());
    let versions = || async {
        let secret = secrets.get("kcp-webhook-secret").await.unwrap();
        let pm = pms.get("gated").await.unwrap();
        (
            secret.metadata.resource_version,
            pm.metadata.resource_version,
        )
    };
    let before = versions().await;
    drive(&lifecycle(engine), &pms, &obj, &context)
        .await
        .expect("another reconcile");
    assert_eq!(
        versions().await,
        before,
        "a reconcile with every gate passed writes nothing"
    );
    assert!(pods.get_opt("kcp-1").await.expect("read").is_some());
    stop.cancel();
}
