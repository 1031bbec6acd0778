//! The resource broker across four servers (coordination, consumer, two providers): upstream's
//! certs walkthrough with a tiny test issuer on each provider, and a two-stage VM migration from
//! an x86 to an arm64 provider.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::ResourceExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{eventually, TestServer};
use controllers::broker::generic::Brokered;
use controllers::broker::staging::{staging_name, APIEXPORT_ANNOTATION};
use controllers::broker::wiring::{Broker, BrokerOptions};
use controllers::broker::{parse_kind, GENERIC_FINALIZER, PROVIDER_CLUSTER};
use controllers::cluster_providers::FixedClusters;
use controllers::runtime::Cluster;

const WAIT: Duration = Duration::from_secs(30);

/// The consumer's cluster name: the kubeconfig path and context upstream's example uses, so
/// provider-side names match upstream's (`d480f64dc494-...`).
const CONSUMER: &str = "/kubeconfigs/consumer/kubeconfig+default";

pub(crate) fn certificates() -> ApiResource {
    ApiResource {
        group: "example.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        api_version: "example.platform-mesh.io/v1alpha1".into(),
        kind: "Certificate".into(),
        plural: "certificates".into(),
    }
}

fn vms() -> ApiResource {
    ApiResource {
        group: "example.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        api_version: "example.platform-mesh.io/v1alpha1".into(),
        kind: "VM".into(),
        plural: "vms".into(),
    }
}

/// Installs a CRD and waits until its API answers.
pub(crate) async fn install_crd(client: &kube::Client, crd: Value, served: &ApiResource) {
    let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("crd");
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("create crd");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), served);
    eventually(WAIT, "the CRD's API answers", || {
        let api = api.clone();
        async move { api.list(&ListParams::default()).await.is_ok() }
    })
    .await;
}

pub(crate) fn certificate_crd() -> Value {
    serde_saphyr::from_str(include_str!(
        "../../../examples/broker-certs/certificate-crd.yaml"
    ))
    .expect("certificate CRD parses")
}

fn vm_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "vms.example.platform-mesh.io"},
        "spec": {"group": "example.platform-mesh.io", "scope": "Namespaced",
            "names": {"kind": "VM", "listKind": "VMList", "plural": "vms", "singular": "vm"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "arch": {"type": "string", "enum": ["x86_64", "arm64"]},
                        "memory": {"type": "integer", "minimum": 128}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

/// A tiny certificate issuer for one provider: a Certificate first goes `Provisioning`, then
/// gets a Secret `<name>` holding a self-signed certificate for its `fqdn` (and the issuer's
/// name under `issuer`), named in `status.relatedResources.secret`, and goes `Available`.
pub(crate) fn test_issuer(client: kube::Client, issuer: &'static str, stop: CancellationToken) {
    tokio::spawn(async move {
        let certs: Api<DynamicObject> = Api::all_with(client.clone(), &certificates());
        while !stop.is_cancelled() {
            for cert in certs
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let _ = issue(&client, &cert, issuer).await;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    });
}

async fn issue(
    client: &kube::Client,
    cert: &DynamicObject,
    issuer: &str,
) -> Result<(), kube::Error> {
    let ns = cert.metadata.namespace.clone().unwrap_or_default();
    let name = cert.metadata.name.clone().unwrap_or_default();
    let fqdn = cert.data["spec"]["fqdn"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &certificates());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let state = cert.data["status"]["status"].as_str().unwrap_or_default();
    let issued_for = secrets
        .get_opt(&name)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| {
            d.get("fqdn")
                .map(|v| String::from_utf8_lossy(&v.0).to_string())
        });
    if state == "Available" && issued_for.as_deref() == Some(fqdn.as_str()) {
        return Ok(());
    }
    if state.is_empty() {
        let patch = json!({"status": {"status": "Provisioning"}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(());
    }
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![fqdn.clone()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, fqdn.clone());
    let pem = params.self_signed(&key).expect("self-signed").pem();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(&pem), "tls.key": b64(&key.serialize_pem()), "ca.crt": b64(&pem),
                 "fqdn": b64(&fqdn), "issuer": b64(issuer)}
    }))
    .expect("secret");
    match secrets.get_opt(&name).await? {
        Some(_) => {
            secrets
                .replace(&name, &PostParams::default(), &secret)
                .await?;
        }
        None => {
            secrets.create(&PostParams::default(), &secret).await?;
        }
    }
    let patch = json!({"status": {"status": "Available", "relatedResources": {"secret": {
        "name": name, "namespace": ns, "gvk": {"group": "core", "version": "v1", "kind": "Secret"}}}}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The common name in a Secret's `tls.crt`.
pub(crate) fn subject_cn(secret: &Secret) -> Option<String> {
    let pem = secret.data.as_ref()?.get("tls.crt")?.0.clone();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some(cn)
}

pub(crate) fn data_text(secret: &Secret, key: &str) -> Option<String> {
    Some(String::from_utf8_lossy(&secret.data.as_ref()?.get(key)?.0).to_string())
}

pub(crate) fn accept_api(name: &str, resource: &str, filter: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "AcceptAPI",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"gvr": {"group": "example.platform-mesh.io", "version": "v1alpha1", "resource": resource},
                 "filters": [filter]}
    }))
    .expect("acceptapi")
}

/// Creates AcceptAPI `default/<name>` for `resource` of example.platform-mesh.io with one filter.
pub(crate) async fn create_accept_api(
    client: &kube::Client,
    name: &str,
    resource: &str,
    filter: Value,
) {
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &acceptapis())
        .create(&PostParams::default(), &accept_api(name, resource, filter))
        .await
        .expect("acceptapi");
}

/// A consumer Certificate `default/<name>` for `fqdn`.
fn certificate(name: &str, fqdn: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.platform-mesh.io/v1alpha1", "kind": "Certificate",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"fqdn": fqdn}
    }))
    .expect("certificate")
}

pub(crate) fn acceptapis() -> ApiResource {
    ApiResource {
        group: "broker.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        api_version: "broker.platform-mesh.io/v1alpha1".into(),
        kind: "AcceptAPI".into(),
        plural: "acceptapis".into(),
    }
}

/// Four servers and the broker over them.
struct Env {
    servers: Vec<TestServer>,
    coordination: kube::Client,
    consumer: kube::Client,
    providers: Vec<(String, kube::Client)>,
    stop: CancellationToken,
}

impl Env {
    async fn start(kind: &str, providers: &[&str]) -> Env {
        Env::start_with(kind, providers, false).await
    }

    /// `migrations_apart`: the Migration controller runs on a manager of its own, as a sharded
    /// replica runs it while it leads.
    async fn start_with(kind: &str, providers: &[&str], migrations_apart: bool) -> Env {
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..providers.len() + 2 {
            let s = TestServer::start().await;
            clients.push(s.client("root").await);
            servers.push(s);
        }
        let coordination = clients[0].clone();
        let consumer = clients[1].clone();
        let providers: Vec<(String, kube::Client)> = providers
            .iter()
            .zip(clients[2..].iter())
            .map(|(n, c)| (n.to_string(), c.clone()))
            .collect();
        let brokered = Brokered::new(parse_kind(kind).expect("kind"), None);
        let stop = CancellationToken::new();
        let broker = Broker::new(BrokerOptions {
            consumers: Arc::new(FixedClusters::new([Cluster::new(
                CONSUMER,
                consumer.clone(),
            )])),
            providers: Arc::new(FixedClusters::new(
                providers
                    .iter()
                    .map(|(n, c)| Cluster::new(n.as_str(), c.clone())),
            )),
            accept_apis: None,
            staging: None,
            coordination: Some(Cluster::new("coord", coordination.clone())),
            compute: None,
            kinds: vec![brokered],
            workers: 2,
            metrics: Default::default(),
            migrations_apart,
            consumer_aliases: Vec::new(),
            provider_aliases: Vec::new(),
        })
        .expect("broker");
        if let Some(migrations) = broker.migrations() {
            let s = stop.clone();
            tokio::spawn(async move { migrations.run(s).await });
        }
        let s = stop.clone();
        tokio::spawn(async move { broker.run(s).await });
        Env {
            servers,
            coordination,
            consumer,
            providers,
            stop,
        }
    }

    fn provider(&self, name: &str) -> kube::Client {
        self.providers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
            .expect("provider")
    }

    async fn stop(self) {
        self.stop.cancel();
        for s in self.servers {
            s.stop().await;
        }
    }
}

/// A check that the consumer's Secret `cert-from-consumer` is for `cn` and from `issuer`.
fn issued_by(
    secrets: &Api<Secret>,
    cn: &'static str,
    issuer: &'static str,
) -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    let secrets = secrets.clone();
    move || {
        let secrets = secrets.clone();
        Box::pin(async move {
            read(&secrets, "cert-from-consumer").await.is_some_and(|s| {
                subject_cn(&s).as_deref() == Some(cn)
                    && data_text(&s, "issuer").as_deref() == Some(issuer)
            })
        })
    }
}

/// Whether the consumer object `name` records `provider` as its provider.
async fn provider_is(api: &Api<DynamicObject>, name: &str, provider: &str) -> bool {
    read(api, name).await.is_some_and(|o| {
        o.metadata
            .annotations
            .unwrap_or_default()
            .get(PROVIDER_CLUSTER)
            .map(String::as_str)
            == Some(provider)
    })
}

/// `name` as stored, `None` when the server says NotFound; any other answer fails the test (a
/// 403 or a 500 is not "gone").
async fn read<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

async fn exists(api: &Api<DynamicObject>, name: &str) -> bool {
    read(api, name).await.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certs_move_between_issuers_when_the_fqdn_changes() {
    let env = Env::start(
        "Certificate.v1alpha1.example.platform-mesh.io",
        &["internalca", "externalca"],
    )
    .await;
    let certs = certificates();
    for c in [
        env.consumer.clone(),
        env.provider("internalca"),
        env.provider("externalca"),
    ] {
        install_crd(&c, certificate_crd(), &certs).await;
    }
    for (name, suffix) in [("internalca", "internal.corp"), ("externalca", "corp.com")] {
        let client = env.provider(name);
        create_accept_api(
            &client,
            "certificates.example.platform-mesh.io",
            "certificates",
            json!({"key": "fqdn", "suffix": suffix}),
        )
        .await;
        test_issuer(client, name, env.stop.clone());
    }
    // The AcceptAPIs say they are registered.
    for name in ["internalca", "externalca"] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.provider(name), "default", &acceptapis());
        eventually(WAIT, "AcceptAPI Registered", || {
            let api = api.clone();
            async move {
                api.get("certificates.example.platform-mesh.io")
                    .await
                    .is_ok_and(|a| {
                        a.data["status"]["conditions"][0]["type"] == "Registered"
                            && a.data["status"]["conditions"][0]["status"] == "True"
                    })
            }
        })
        .await;
    }

    let consumer: Api<DynamicObject> =
        Api::namespaced_with(env.consumer.clone(), "default", &certs);
    let cert = certificate("cert-from-consumer", "app.internal.corp");
    consumer
        .create(&PostParams::default(), &cert)
        .await
        .expect("create cert");

    // internalca gets the copy under upstream's name; the consumer gets the Secret.
    let remote = "d480f64dc494-cert-from-consumer";
    let internal: Api<DynamicObject> =
        Api::namespaced_with(env.provider("internalca"), "default", &certs);
    let external: Api<DynamicObject> =
        Api::namespaced_with(env.provider("externalca"), "default", &certs);
    eventually(WAIT, "the copy on internalca", || exists(&internal, remote)).await;
    let copy = internal.get(remote).await.expect("copy");
    assert_eq!(copy.data["spec"]["fqdn"], "app.internal.corp");
    assert!(copy
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&GENERIC_FINALIZER.to_string()));
    let secrets: Api<Secret> = Api::namespaced(env.consumer.clone(), "default");
    let issued_by = |cn: &'static str, issuer: &'static str| issued_by(&secrets, cn, issuer);
    eventually(
        WAIT,
        "the consumer's Secret from internalca",
        issued_by("app.internal.corp", "internalca"),
    )
    .await;
    let secret = secrets.get("cert-from-consumer").await.expect("secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let owner = &secret.metadata.owner_references.expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Certificate", "cert-from-consumer")
    );
    let status = consumer.get("cert-from-consumer").await.expect("cert").data["status"].clone();
    assert_eq!(status["status"], "Available");
    assert_eq!(
        status["relatedResources"]["secret"]["name"],
        "cert-from-consumer"
    );

    // A related resource the provider stops naming is deleted from the consumer.
    internal
        .patch_status(
            remote,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"relatedResources": null}})),
        )
        .await
        .expect("unlist the Secret");
    eventually(
        WAIT,
        "the unlisted Secret deleted from the consumer",
        || {
            let secrets = secrets.clone();
            async move { read(&secrets, "cert-from-consumer").await.is_none() }
        },
    )
    .await;

    // Patching to app.corp.com moves it to externalca; the internalca copy goes.
    consumer
        .patch(
            "cert-from-consumer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fqdn": "app.corp.com"}})),
        )
        .await
        .expect("patch");
    eventually(WAIT, "the copy on externalca", || exists(&external, remote)).await;
    eventually(
        WAIT,
        "the consumer's Secret from externalca",
        issued_by("app.corp.com", "externalca"),
    )
    .await;
    eventually(WAIT, "the internalca copy gone", || {
        let internal = internal.clone();
        async move { !exists(&internal, remote).await }
    })
    .await;
    eventually(WAIT, "the consumer object names externalca", || {
        provider_is(&consumer, "cert-from-consumer", "provider#externalca")
    })
    .await;

    // Nobody accepts app.example.org until a provider says it does.
    let org = certificate("org", "app.example.org");
    consumer
        .create(&PostParams::default(), &org)
        .await
        .expect("create");
    // A certificate externalca accepts, created after it: once the broker has placed this one,
    // it has had its look at the first.
    let after = certificate("after-org", "after.corp.com");
    consumer
        .create(&PostParams::default(), &after)
        .await
        .expect("create");
    let remote_of = |name: &str| {
        format!(
            "{}-{name}",
            controllers::broker::cluster_hash(&format!("consumer#{CONSUMER}"))
        )
    };
    let after_remote = remote_of("after-org");
    eventually(WAIT, "the certificate created after it placed", || {
        exists(&external, &after_remote)
    })
    .await;
    let org_remote = remote_of("org");
    assert!(!exists(&internal, &org_remote).await && !exists(&external, &org_remote).await);
    create_accept_api(
        &env.provider("externalca"),
        "orgs",
        "certificates",
        json!({"key": "fqdn", "suffix": ".org"}),
    )
    .await;
    eventually(WAIT, "the .org certificate placed once accepted", || {
        exists(&external, &org_remote)
    })
    .await;

    // Deleting the consumer object removes the copy, the Secret and then the object.
    consumer
        .delete("cert-from-consumer", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(WAIT, "everything of cert-from-consumer gone", || {
        let (consumer, external, secrets) = (consumer.clone(), external.clone(), secrets.clone());
        async move {
            !exists(&consumer, "cert-from-consumer").await
                && !exists(&external, remote).await
                && read(&secrets, "cert-from-consumer").await.is_none()
        }
    })
    .await;
    env.stop().await;
}

/// A VM on x86 whose consumer object has just been moved to arm64, with a
/// MigrationConfiguration of `stages` for VMs: the environment, the consumer's, x86's and
/// arm64's VM APIs, the copies' name and the coordination cluster's Migrations.
struct VmMove {
    env: Env,
    consumer: Api<DynamicObject>,
    x86: Api<DynamicObject>,
    arm: Api<DynamicObject>,
    remote: String,
    migrations: Api<DynamicObject>,
}

async fn vm_moved_to_arm64(stages: Value, migrations_apart: bool) -> VmMove {
    let env = Env::start_with(
        "VM.v1alpha1.example.platform-mesh.io",
        &["x86", "arm64"],
        migrations_apart,
    )
    .await;
    let vm_api = vms();
    for c in [
        env.consumer.clone(),
        env.provider("x86"),
        env.provider("arm64"),
    ] {
        install_crd(&c, vm_crd(), &vm_api).await;
    }
    for (name, arch) in [("x86", "x86_64"), ("arm64", "arm64")] {
        create_accept_api(
            &env.provider(name),
            &format!("accept-{name}"),
            "vms",
            json!({"key": "arch", "valueIn": [arch]}),
        )
        .await;
    }
    let config: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "MigrationConfiguration",
        "metadata": {"name": "migrate-vm", "namespace": "default"},
        "spec": {
            "from": {"group": "example.platform-mesh.io", "version": "v1alpha1", "kind": "VM"},
            "to": {"group": "example.platform-mesh.io", "version": "v1alpha1", "kind": "VM"},
            "stages": stages
        }
    }))
    .expect("config");
    let mc = ApiResource {
        kind: "MigrationConfiguration".into(),
        plural: "migrationconfigurations".into(),
        ..acceptapis()
    };
    Api::<DynamicObject>::namespaced_with(env.coordination.clone(), "default", &mc)
        .create(&PostParams::default(), &config)
        .await
        .expect("configuration");

    let consumer: Api<DynamicObject> =
        Api::namespaced_with(env.consumer.clone(), "default", &vm_api);
    let vm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.platform-mesh.io/v1alpha1", "kind": "VM",
        "metadata": {"name": "test-vm", "namespace": "default"},
        "spec": {"arch": "x86_64", "memory": 512}
    }))
    .expect("vm");
    consumer
        .create(&PostParams::default(), &vm)
        .await
        .expect("create vm");
    let remote = format!(
        "{}-test-vm",
        controllers::broker::cluster_hash(&format!("consumer#{CONSUMER}"))
    );
    let x86: Api<DynamicObject> = Api::namespaced_with(env.provider("x86"), "default", &vm_api);
    let arm: Api<DynamicObject> = Api::namespaced_with(env.provider("arm64"), "default", &vm_api);
    eventually(WAIT, "the VM on x86", || exists(&x86, &remote)).await;
    x86.patch_status(
        &remote,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"status": "Available"}})),
    )
    .await
    .expect("x86 status");

    // The broker writes the VM meanwhile (finalizer, status): a merge patch can lose the race
    // more often than the server retries it and get 409, as from kube-apiserver; a client then
    // tries again.
    let mut tries = 0;
    loop {
        match consumer
            .patch(
                "test-vm",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"arch": "arm64"}})),
            )
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && tries < 20 => tries += 1,
            Err(e) => panic!("patch: {e}"),
        }
    }
    let migrations: Api<DynamicObject> = Api::namespaced_with(
        env.coordination.clone(),
        "default",
        &ApiResource {
            kind: "Migration".into(),
            plural: "migrations".into(),
            ..acceptapis()
        },
    );
    VmMove {
        env,
        consumer,
        x86,
        arm,
        remote,
        migrations,
    }
}

/// The one Migration, if any (an error reading them fails the test).
async fn the_migration(migrations: &Api<DynamicObject>) -> Option<DynamicObject> {
    migrations
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing Migrations: {e}"))
        .items
        .into_iter()
        .next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_migrates_from_x86_to_arm64_in_two_stages() {
    two_stage_migration(false).await;
}

/// The same with the Migration controller on a manager of its own, as sharded brokers run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_migrates_with_the_migration_controller_apart() {
    two_stage_migration(true).await;
}

async fn two_stage_migration(migrations_apart: bool) {
    let VmMove {
        env,
        consumer,
        x86,
        arm,
        remote,
        migrations,
    } = vm_moved_to_arm64(json!([
        {"name": "copy-disk", "progress": true,
         "templates": {"disk": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"phase": "copying"}}},
         "successConditions": ["disk.data.phase == 'copied'"]},
        {"name": "switch-over",
         "templates": {"switch": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"ready": "no"}}},
         "successConditions": ["to.status.status == 'Available'", "switch.data.ready == 'yes'"]}
    ]), migrations_apart)
    .await;
    // Every state the Migration passes through, as a watch sees its writes (a state held for a
    // single write, such as InitialCompleted, is seen too).
    const DELETED: &str = "<deleted>";
    let states = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = tokio::spawn({
        let (migrations, states) = (migrations.clone(), states.clone());
        async move {
            use futures::TryStreamExt;
            let mut events = migrations
                .watch(&WatchParams::default(), "0")
                .await
                .unwrap_or_else(|e| panic!("watching Migrations: {e}"))
                .boxed();
            while let Some(ev) = events
                .try_next()
                .await
                .unwrap_or_else(|e| panic!("the Migration watch: {e}"))
            {
                let m = match ev {
                    WatchEvent::Added(m) | WatchEvent::Modified(m) => m,
                    WatchEvent::Deleted(_) => {
                        states
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(DELETED.into());
                        continue;
                    }
                    WatchEvent::Error(e) => panic!("the Migration watch: {e:?}"),
                    WatchEvent::Bookmark(_) => continue,
                };
                if let Some(state) = m.data["status"]["state"].as_str() {
                    let mut seen = states.lock().unwrap_or_else(|p| p.into_inner());
                    if seen.last().map(String::as_str) != Some(state) {
                        seen.push(state.to_string());
                    }
                }
            }
        }
    });
    let migration = || the_migration(&migrations);
    let state_is = |want: &'static str, stage: &'static str| {
        move || async move {
            migration().await.is_some_and(|m| {
                m.data["status"]["state"] == want && m.data["status"]["stage"] == stage
            })
        }
    };
    eventually(
        WAIT,
        "stage copy-disk running",
        state_is("InitialInProgress", "copy-disk"),
    )
    .await;
    let m = migration().await.expect("migration");
    assert_eq!(m.data["spec"]["from"]["clusterName"], "provider#x86");
    assert_eq!(m.data["spec"]["to"]["clusterName"], "provider#arm64");
    assert_eq!(m.data["spec"]["to"]["name"], remote.as_str());
    let id = m.data["status"]["id"].as_str().expect("id").to_string();
    assert!(
        exists(&arm, &remote).await,
        "the new copy exists while the old one still serves"
    );
    assert!(exists(&x86, &remote).await);

    // Stage one succeeds when the disk copy says so.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.coordination.clone(), "default");
    let disk = format!("{id}-disk");
    let stage_object = cms.get(&disk).await.expect("stage object");
    assert_eq!(
        stage_object
            .metadata
            .labels
            .unwrap_or_default()
            .get("broker.platform-mesh.io/migration-stage")
            .map(String::as_str),
        Some("copy-disk")
    );
    cms.patch(
        &disk,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"phase": "copied"}})),
    )
    .await
    .expect("disk copied");
    eventually(
        WAIT,
        "stage switch-over running",
        state_is("CutoverInProgress", "switch-over"),
    )
    .await;
    assert!(
        cms.get_opt(&disk).await.expect("read").is_none(),
        "stage one's objects are deleted"
    );
    assert!(
        exists(&x86, &remote).await,
        "the old copy stays until cutover"
    );

    // Stage two needs the new copy Available and the switch flipped.
    arm.patch_status(
        &remote,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"status": "Available"}})),
    )
    .await
    .expect("arm status");
    let switch = format!("{id}-switch");
    eventually(WAIT, "switch object", || {
        let cms = cms.clone();
        let switch = switch.clone();
        async move {
            cms.get_opt(&switch)
                .await
                .unwrap_or_else(|e| panic!("reading {switch}: {e}"))
                .is_some()
        }
    })
    .await;
    cms.patch(
        &switch,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"ready": "yes"}})),
    )
    .await
    .expect("switch");
    eventually(WAIT, "the x86 copy deleted after cutover", || {
        let x86 = x86.clone();
        let remote = remote.clone();
        async move { !exists(&x86, &remote).await }
    })
    .await;
    eventually(WAIT, "the consumer object names arm64", || {
        provider_is(&consumer, "test-vm", "provider#arm64")
    })
    .await;
    let moved = consumer.get("test-vm").await.expect("vm");
    assert_eq!(moved.data["status"]["status"], "Available");
    eventually(WAIT, "the finished Migration removed", || async {
        migration().await.is_none()
    })
    .await;
    // Its DELETED event comes after every write: once the recorder has it, it has them all.
    eventually(WAIT, "the watch sees the Migration deleted", || async {
        states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|s| s == DELETED)
    })
    .await;
    recorder.abort();
    let seen = states.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let expected = [
        "InitialInProgress",
        "InitialCompleted",
        "CutoverInProgress",
        "CutoverCompleted",
    ];
    let mut at = seen.iter();
    assert!(
        expected.iter().all(|e| at.any(|s| s == e)),
        "the Migration's states {seen:?} lack {expected:?} in this order"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_whose_condition_can_never_hold_fails_and_the_vm_stays() {
    // `disk.data.phase` is a string, never a bool: the condition can never hold.
    let VmMove {
        env,
        consumer,
        x86,
        arm: _,
        remote,
        migrations,
    } = vm_moved_to_arm64(json!([
        {"name": "copy-disk",
         "templates": {"disk": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"phase": "copying"}}},
         "successConditions": ["disk.data.phase"]}
    ]), false)
    .await;
    eventually(WAIT, "the Migration Failed", || async {
        the_migration(&migrations)
            .await
            .is_some_and(|m| m.data["status"]["state"] == "Failed")
    })
    .await;
    let m = the_migration(&migrations).await.expect("migration");
    let ready = m.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_else(|| panic!("no Ready condition: {}", m.data["status"]));
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(m.data["status"]["stage"], "copy-disk");
    // The VM stays where it was: the x86 copy serves the consumer, which still names x86.
    assert!(exists(&x86, &remote).await, "the old copy was deleted");
    assert!(
        provider_is(&consumer, "test-vm", "provider#x86").await,
        "the consumer object moved to a provider the migration never reached"
    );
    env.stop().await;
}

fn kcp_kind(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "apis.kcp.io".into(),
        version: "v1alpha1".into(),
        api_version: "apis.kcp.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Publishes the Certificate API as APIExport `certificates` of `client`'s workspace.
pub(crate) async fn export_certificates(client: &kube::Client) {
    let mut crd = certificate_crd();
    // An APIResourceSchema version holds the structural schema itself, not under openAPIV3Schema.
    for v in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
        v["schema"] = v["schema"]["openAPIV3Schema"].take();
    }
    let schema: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
        "metadata": {"name": "v1alpha1.certificates.example.platform-mesh.io"},
        "spec": {"group": crd["spec"]["group"], "names": crd["spec"]["names"], "scope": "Namespaced",
                 "versions": crd["spec"]["versions"]}
    }))
    .expect("schema");
    Api::<DynamicObject>::all_with(
        client.clone(),
        &kcp_kind("APIResourceSchema", "apiresourceschemas"),
    )
    .create(&PostParams::default(), &schema)
    .await
    .expect("schema");
    let export: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
        "metadata": {"name": "certificates"},
        "spec": {"latestResourceSchemas": ["v1alpha1.certificates.example.platform-mesh.io"],
                 // The certificates' Secrets reach consumers through this claim.
                 "permissionClaims": [{"resource": "secrets", "all": true}]}
    }))
    .expect("export");
    Api::<DynamicObject>::all_with(client.clone(), &kcp_kind("APIExport", "apiexports"))
        .create(&PostParams::default(), &export)
        .await
        .expect("export");
}

/// Binds `path`'s APIExport `certificates` in `client`'s workspace.
pub(crate) async fn bind_certificates(client: &kube::Client, path: &str) {
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "certificates"},
        "spec": {"reference": {"export": {"path": path, "name": "certificates"}},
                 "permissionClaims": [{"resource": "secrets", "all": true, "state": "Accepted"}]}
    }))
    .expect("binding");
    Api::<DynamicObject>::all_with(client.clone(), &kcp_kind("APIBinding", "apibindings"))
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &certificates());
    eventually(WAIT, "the bound Certificate API answers", || {
        let api = api.clone();
        async move { api.list(&ListParams::default()).await.is_ok() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certs_are_brokered_between_kcp_workspaces_of_one_server() {
    let ts = TestServer::start().await;
    ts.workspace("platform").await;
    let consumer_id = ts.workspace("consumer").await;
    export_certificates(&ts.client("root:platform").await).await;
    let consumer_client = ts.client("root:consumer").await;
    bind_certificates(&consumer_client, "root:platform").await;
    let certs = certificates();
    let stop = CancellationToken::new();
    let mut providers = Vec::new();
    for (name, suffix) in [("internalca", "internal.corp"), ("externalca", "corp.com")] {
        ts.workspace(name).await;
        let client = ts.client(&format!("root:{name}")).await;
        install_crd(&client, certificate_crd(), &certs).await;
        create_accept_api(
            &client,
            "certificates.example.platform-mesh.io",
            "certificates",
            json!({"key": "fqdn", "suffix": suffix}),
        )
        .await;
        test_issuer(client.clone(), name, stop.clone());
        providers.push(client);
    }
    let brokered = Brokered::new(
        parse_kind("Certificate.v1alpha1.example.platform-mesh.io").expect("kind"),
        None,
    );
    let options = controllers::broker::kcp::options(
        &ts.root_config().await,
        "root:platform",
        "certificates",
        vec![brokered],
        2,
    )
    .expect("options");
    let broker = Broker::new(options).expect("broker");
    let s = stop.clone();
    tokio::spawn(async move { broker.run(s).await });

    let consumer: Api<DynamicObject> =
        Api::namespaced_with(consumer_client.clone(), "default", &certs);
    let cert = certificate("cert-from-consumer", "app.internal.corp");
    consumer
        .create(&PostParams::default(), &cert)
        .await
        .expect("create cert");
    let remote = controllers::broker::provider_name(
        &format!("consumer#{consumer_id}"),
        "cert-from-consumer",
    );
    let internal: Api<DynamicObject> =
        Api::namespaced_with(providers[0].clone(), "default", &certs);
    let external: Api<DynamicObject> =
        Api::namespaced_with(providers[1].clone(), "default", &certs);
    eventually(WAIT, "the copy in root:internalca", || {
        exists(&internal, &remote)
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(consumer_client.clone(), "default");
    let issued_by = |cn: &'static str, issuer: &'static str| issued_by(&secrets, cn, issuer);
    eventually(
        WAIT,
        "the consumer's Secret from internalca",
        issued_by("app.internal.corp", "internalca"),
    )
    .await;
    consumer
        .patch(
            "cert-from-consumer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fqdn": "app.corp.com"}})),
        )
        .await
        .expect("patch");
    eventually(
        WAIT,
        "the consumer's Secret from externalca",
        issued_by("app.corp.com", "externalca"),
    )
    .await;
    assert!(exists(&external, &remote).await);
    eventually(WAIT, "the internalca copy gone", || {
        let (internal, remote) = (internal.clone(), remote.clone());
        async move { !exists(&internal, &remote).await }
    })
    .await;
    consumer
        .delete("cert-from-consumer", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(WAIT, "the copy and the consumer object gone", || {
        let (consumer, external, remote) = (consumer.clone(), external.clone(), remote.clone());
        async move {
            !exists(&consumer, "cert-from-consumer").await && !exists(&external, &remote).await
        }
    })
    .await;
    stop.cancel();
    ts.stop().await;
}

/// Through staging workspaces, a consumer's annotation naming another consumer's staging
/// workspace is not followed: the broker does not make (or touch) that workspace again, and the
/// object goes to the consumer's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_cannot_make_the_broker_use_another_consumers_staging_workspace() {
    let ts = TestServer::start().await;
    ts.workspace("platform").await;
    let platform = ts.client("root:platform").await;
    export_certificates(&platform).await;
    let acceptapis_export: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport", "metadata": {"name": "acceptapis"},
        "spec": {"permissionClaims": [{"group": "broker.platform-mesh.io", "resource": "acceptapis", "all": true}]}}))
    .expect("export");
    Api::<DynamicObject>::all_with(platform.clone(), &kcp_kind("APIExport", "apiexports"))
        .create(&PostParams::default(), &acceptapis_export)
        .await
        .expect("acceptapis export");
    // The provider: its own Certificate export, the AcceptAPI export bound, an AcceptAPI naming
    // its export.
    let provider_id = ts.workspace("issuer").await;
    let provider = ts.client("root:issuer").await;
    export_certificates(&provider).await;
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "acceptapis"},
        "spec": {"reference": {"export": {"path": "root:platform", "name": "acceptapis"}},
                 "permissionClaims": [{"group": "broker.platform-mesh.io", "resource": "acceptapis",
                                       "all": true, "state": "Accepted"}]}}))
    .expect("binding");
    Api::<DynamicObject>::all_with(provider.clone(), &kcp_kind("APIBinding", "apibindings"))
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind acceptapis");
    let mut accept = accept_api(
        "certificates",
        "certificates",
        json!({"key": "fqdn", "suffix": "corp"}),
    );
    accept
        .annotations_mut()
        .insert(APIEXPORT_ANNOTATION.into(), "certificates".into());
    Api::<DynamicObject>::namespaced_with(provider.clone(), "default", &acceptapis())
        .create(&PostParams::default(), &accept)
        .await
        .expect("acceptapi");
    let mut consumers = Vec::new();
    for name in ["tenant-a", "tenant-b"] {
        let id = ts.workspace(name).await;
        let client = ts.client(&format!("root:{name}")).await;
        bind_certificates(&client, "root:platform").await;
        consumers.push((
            id,
            Api::<DynamicObject>::namespaced_with(client, "default", &certificates()),
        ));
    }
    let brokered = Brokered::new(
        parse_kind("Certificate.v1alpha1.example.platform-mesh.io").expect("kind"),
        None,
    );
    let options = controllers::broker::kcp::staging_options(
        &ts.root_config().await,
        "root:platform",
        "certificates",
        "acceptapis",
        "root:platform",
        vec![brokered],
        2,
    )
    .expect("options");
    let broker = Broker::new(options).expect("broker");
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move { broker.run(s).await });

    let (a_id, a) = &consumers[0];
    let (b_id, b) = &consumers[1];
    let a_staging = staging_name(a_id, &provider_id, "certificates");
    let b_staging = staging_name(b_id, &provider_id, "certificates");
    let (a_named, b_named) = (
        format!("provider#{a_staging}"),
        format!("provider#{b_staging}"),
    );
    a.create(&PostParams::default(), &certificate("mine", "a.corp"))
        .await
        .expect("a's certificate");
    eventually(
        WAIT,
        "tenant-a's object placed in its staging workspace",
        || provider_is(a, "mine", &a_named),
    )
    .await;
    // tenant-a's object goes, and with it its staging workspace.
    let workspaces = Api::<DynamicObject>::all_with(
        platform.clone(),
        &ApiResource {
            group: "tenancy.kcp.io".into(),
            version: "v1alpha1".into(),
            api_version: "tenancy.kcp.io/v1alpha1".into(),
            kind: "Workspace".into(),
            plural: "workspaces".into(),
        },
    );
    a.delete("mine", &DeleteParams::default())
        .await
        .expect("delete a's certificate");
    eventually(WAIT, "tenant-a's staging workspace gone", || {
        let (workspaces, a_staging) = (workspaces.clone(), a_staging.clone());
        async move { !exists(&workspaces, &a_staging).await }
    })
    .await;
    // tenant-b names tenant-a's staging workspace on its own object.
    let mut steered = certificate("steered", "b.corp");
    steered
        .annotations_mut()
        .insert(PROVIDER_CLUSTER.into(), a_named.clone());
    b.create(&PostParams::default(), &steered)
        .await
        .expect("b's certificate");
    eventually(
        WAIT,
        "tenant-b's object placed in its own staging workspace",
        || provider_is(b, "steered", &b_named),
    )
    .await;
    assert!(
        !exists(&workspaces, &a_staging).await,
        "tenant-a's staging workspace was made again for tenant-b"
    );
    let in_b: Api<DynamicObject> = Api::namespaced_with(
        ts.client(&format!("root:platform:{b_staging}")).await,
        "default",
        &certificates(),
    );
    let b_copy = controllers::broker::provider_name(&format!("consumer#{b_id}"), "steered");
    // The annotation is written before the copy.
    eventually(WAIT, "tenant-b's copy in its own staging workspace", || {
        exists(&in_b, &b_copy)
    })
    .await;
    stop.cancel();
    ts.stop().await;
}
