//! What the Deployment step waits for, and sets up, once the releases are applied (upstream's
//! `DeploymentSubroutine` after the applies, in its order):
//!
//! 1. cert-manager's CRDs Established, when the profile deploys cert-manager;
//! 2. the rebac-authz webhook's secrets: cert-manager issues the webhook a certificate, and its
//!    CA goes into the kubeconfig kcp calls the webhook with, after which kcp's pods are deleted
//!    so that they start again with it;
//! 3. istio: the `istio-istiod` release Ready, and this operator's pod with its sidecar;
//! 4. kcp-operator's RootShard and FrontProxy Available (also before KcpSetup and
//!    ProviderSecret).
//!
//! Each waits with upstream's message, rechecked after 5 s. They all look at the cluster the
//! releases install into (see [`Clusters::installed_into`]): upstream looks at its runtime
//! cluster, which is that cluster whenever infra and runtime are one, the usual setup.
//!
//! Differences from upstream, with reasons:
//! - the istio gate is off unless asked for (`--subroutines-deployment-enable-istio`; upstream
//!   defaults it on), since this binary usually runs outside a pod and a mesh;
//! - a pod without its sidecar is deleted but the process does not exit: deleting the pod stops
//!   the process anyway, gracefully, where upstream exits at once;
//! - the kcp-operator gate is off unless the objects are named (`--kcp-root-shard-name`,
//!   `--kcp-front-proxy-name`; upstream always checks `root` and `frontproxy`), since the kcp
//!   here is often this server or a kcp that kcp-operator does not run;
//! - the webhook secrets are set up only where cert-manager's CRDs are Established (upstream's
//!   cert-manager gate, unconditional there, guarantees it).

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

use super::apply::{sync, Policy, Target, FIELD_MANAGER};
use super::deployment::{Clusters, Context};
use super::ocm_resources::{applications, helm_releases};
use super::vars::DeploymentTechnology;
use crate::subroutines::Step;

/// How soon a waiting gate looks again (upstream's 5 s).
pub const RECHECK: Duration = Duration::from_secs(5);

/// The CRDs the cert-manager gate waits for.
pub const CERT_MANAGER_CRDS: [&str; 2] =
    ["issuers.cert-manager.io", "certificates.cert-manager.io"];

/// The namespace of the webhook's Issuer and Certificate (fixed, as upstream's manifests fix it).
pub const WEBHOOK_NAMESPACE: &str = "platform-mesh-system";
/// The webhook's self-signed Issuer.
pub const WEBHOOK_ISSUER: &str = "rebac-authz-webhook-issuer";
/// The webhook's Certificate (and, by default, the Secret cert-manager writes it into).
pub const WEBHOOK_CERTIFICATE: &str = "rebac-authz-webhook-cert";
/// Where kcp reaches the webhook.
pub const WEBHOOK_URL: &str =
    "https://rebac-authz-webhook.platform-mesh-system.svc.cluster.local:9443/authz";
/// The label of kcp's pods, deleted so that they read the webhook's new CA.
pub const KCP_POD_SELECTOR: &str = "app.kubernetes.io/name=kcp";
/// The label of this operator's pods, for the sidecar check (upstream's).
pub const OPERATOR_POD_SELECTOR: &str = "app=platform-mesh-operator";
/// The namespace of this operator's pods (upstream's).
pub const OPERATOR_NAMESPACE: &str = "platform-mesh-system";
/// The release the istio gate waits for.
pub const ISTIOD: &str = "istio-istiod";

/// The gates beyond cert-manager's, as the operator's flags set them.
#[derive(Clone, Debug, Default)]
pub struct Gates {
    /// The rebac-authz webhook's secrets; `None`: not set up.
    pub webhook: Option<WebhookSecrets>,
    /// The istio gate; `None`: off.
    pub istio: Option<Istio>,
    /// kcp-operator's objects that must be Available; `None`: no kcp-operator runs kcp.
    pub kcp_operator: Option<KcpOperator>,
}

/// Names of the webhook's Secrets (upstream's `--authorization-webhook-secret-name` and
/// `--authorization-webhook-secret-ca-name`), both in the PlatformMesh's namespace, and where
/// kcp's pods run.
#[derive(Clone, Debug)]
pub struct WebhookSecrets {
    /// The Secret with the kubeconfig kcp calls the webhook with.
    pub kubeconfig_secret: String,
    /// The Secret cert-manager writes the webhook's certificate into (`ca.crt` is read).
    pub ca_secret: String,
    /// The namespace of kcp's pods.
    pub kcp_namespace: String,
}

impl Default for WebhookSecrets {
    fn default() -> Self {
        WebhookSecrets {
            kubeconfig_secret: "kcp-webhook-secret".into(),
            ca_secret: WEBHOOK_CERTIFICATE.into(),
            kcp_namespace: "platform-mesh-system".into(),
        }
    }
}

/// The istio gate.
#[derive(Clone, Debug, Default)]
pub struct Istio {
    /// Upstream's `--is-local`: the operator does not run in a pod, so it has no sidecar.
    pub is_local: bool,
}

/// kcp-operator's objects (in `namespace`) that must be Available; an absent name is not
/// checked.
#[derive(Clone, Debug, Default)]
pub struct KcpOperator {
    /// Upstream's `--kcp-namespace`.
    pub namespace: String,
    /// Upstream's `--kcp-root-shard-name`.
    pub root_shard: Option<String>,
    /// Upstream's `--kcp-front-proxy-name`.
    pub front_proxy: Option<String>,
}

/// Why a gate could not look.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A request failed.
    #[error("{what}: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// The client error.
        source: Box<kube::Error>,
    },
    /// Applying the webhook's Issuer, Certificate or kubeconfig Secret failed.
    #[error("the rebac-authz webhook's objects: {0}")]
    Apply(#[from] super::apply::DeployError),
    /// The webhook's certificate Secret exists without a CA.
    #[error("Secret {0} has no ca.crt")]
    NoCa(String),
    /// The webhook's kubeconfig Secret does not hold a kubeconfig.
    #[error("Secret {secret}: {reason}")]
    Kubeconfig {
        /// The Secret.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// The istio release is not there (upstream fails the step rather than waiting).
    #[error("{0} resource not found, waiting for it to be created")]
    IstiodMissing(String),
    /// No pod of this operator was found for the sidecar check.
    #[error("pod not found: no pod labelled {OPERATOR_POD_SELECTOR} in {OPERATOR_NAMESPACE}")]
    NoOperatorPod,
}

fn request(what: impl Into<String>) -> impl FnOnce(kube::Error) -> GateError {
    let what = what.into();
    move |source| GateError::Request {
        what,
        source: Box::new(source),
    }
}

/// Runs the gates in upstream's order; `Some` is the step's result when one waits.
pub async fn check(
    ctx: &Context,
    cert_manager_enabled: bool,
    technology: DeploymentTechnology,
) -> Result<Option<Step>, GateError> {
    let cluster = ctx.clusters.installed_into();
    let cert_manager = cert_manager_waiting(cluster).await?;
    match (&cert_manager, cert_manager_enabled) {
        (Some(waiting), true) => return Ok(Some(Step::stop(waiting.clone(), RECHECK))),
        (None, _) => {
            if let Some(webhook) = &ctx.clusters.gates.webhook {
                webhook_secrets(ctx, cluster, webhook).await?;
            }
        }
        (Some(_), false) => {}
    }
    if let Some(istio) = &ctx.clusters.gates.istio {
        if let Some(step) = istio_gate(ctx, istio, technology).await? {
            return Ok(Some(step));
        }
    }
    Ok(kcp_operator_waiting(&ctx.clusters)
        .await
        .map(|waiting| Step::stop(waiting, RECHECK)))
}

/// Upstream's message for the first cert-manager CRD that is missing or not Established.
pub async fn cert_manager_waiting(cluster: &kube::Client) -> Result<Option<String>, GateError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.clone());
    for name in CERT_MANAGER_CRDS {
        let crd = crds
            .get_opt(name)
            .await
            .map_err(request(format!("reading CRD {name}")))?;
        let established = crd
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if !established {
            return Ok(Some(format!("cert-manager CRD {name} is not established")));
        }
    }
    Ok(None)
}

/// The webhook's Issuer and Certificate (in [`WEBHOOK_NAMESPACE`]).
pub fn webhook_certificate_objects(ca_secret: &str) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": WEBHOOK_ISSUER, "namespace": WEBHOOK_NAMESPACE},
            "spec": {"selfSigned": {}},
        }),
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": WEBHOOK_CERTIFICATE, "namespace": WEBHOOK_NAMESPACE},
            "spec": {
                "secretName": ca_secret,
                "dnsNames": ["rebac-authz-webhook.platform-mesh-system.svc.cluster.local"],
                "issuerRef": {"name": WEBHOOK_ISSUER, "kind": "Issuer"},
            },
        }),
    ]
}

/// The kubeconfig kcp calls the webhook with, trusting `ca_data` (base64) when given.
pub fn webhook_kubeconfig(ca_data: Option<&str>) -> Value {
    let mut cluster = json!({"server": WEBHOOK_URL});
    if let Some(ca) = ca_data {
        cluster["certificate-authority-data"] = json!(ca);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "webhook", "cluster": cluster}],
        "users": [{"name": "webhook", "user": {}}],
        "contexts": [{"name": "webhook", "context": {"cluster": "webhook", "user": "webhook"}}],
        "current-context": "webhook",
    })
}

/// Upstream's `manageAuthorizationWebhookSecrets`: the Issuer and Certificate applied, the
/// kubeconfig Secret made when missing, and once cert-manager has issued the certificate, its CA
/// written into every cluster of that kubeconfig; when that changed anything, kcp's pods are
/// deleted so they start again with it. No certificate yet is no wait (upstream goes on too):
/// a later reconcile hands the CA over.
async fn webhook_secrets(
    ctx: &Context,
    cluster: &kube::Client,
    webhook: &WebhookSecrets,
) -> Result<(), GateError> {
    let namespace = ctx.namespace();
    let create_only = Policy {
        field_manager: FIELD_MANAGER,
        prune: false,
        create_only: &["/Secret"],
    };
    let mut objects = webhook_certificate_objects(&webhook.ca_secret);
    let kubeconfig_text =
        serde_saphyr::to_string(&webhook_kubeconfig(None)).map_err(|e| GateError::Kubeconfig {
            secret: webhook.kubeconfig_secret.clone(),
            reason: e.to_string(),
        })?;
    objects.push(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": webhook.kubeconfig_secret, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"kubeconfig": kubeconfig_text},
    }));
    sync(
        &Target {
            client: cluster,
            owner: ctx.uid(),
            default_namespace: namespace,
            annotations: &[],
            policy: create_only,
        },
        &objects,
        &[],
    )
    .await?;

    let secrets: Api<Secret> = Api::namespaced(cluster.clone(), namespace);
    let Some(ca_secret) = secrets
        .get_opt(&webhook.ca_secret)
        .await
        .map_err(request(format!(
            "reading Secret {namespace}/{}",
            webhook.ca_secret
        )))?
    else {
        return Ok(());
    };
    let ca = ca_secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .filter(|c| !c.0.is_empty())
        .ok_or_else(|| GateError::NoCa(format!("{namespace}/{}", webhook.ca_secret)))?;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(&ca.0);

    let what = format!("{namespace}/{}", webhook.kubeconfig_secret);
    let secret = secrets
        .get(&webhook.kubeconfig_secret)
        .await
        .map_err(request(format!("reading Secret {what}")))?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| GateError::Kubeconfig {
            secret: what.clone(),
            reason: "no key kubeconfig".into(),
        })?;
    let mut kubeconfig: Value =
        serde_saphyr::from_str(&text).map_err(|e| GateError::Kubeconfig {
            secret: what.clone(),
            reason: e.to_string(),
        })?;
    let mut changed = false;
    for c in kubeconfig["clusters"].as_array_mut().into_iter().flatten() {
        if c["cluster"]["certificate-authority-data"] != json!(ca_data) && c["cluster"].is_object()
        {
            c["cluster"]["certificate-authority-data"] = json!(ca_data);
            changed = true;
        }
    }
    if !changed {
        return Ok(());
    }
    let text = serde_saphyr::to_string(&kubeconfig).map_err(|e| GateError::Kubeconfig {
        secret: what.clone(),
        reason: e.to_string(),
    })?;
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": webhook.kubeconfig_secret, "namespace": namespace},
        "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(text)},
    });
    secrets
        .patch(
            &webhook.kubeconfig_secret,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(request(format!("writing Secret {what}")))?;
    let pods: Api<Pod> = Api::namespaced(cluster.clone(), &webhook.kcp_namespace);
    let kcp_pods = pods
        .list(&ListParams::default().labels(KCP_POD_SELECTOR))
        .await
        .map_err(request(format!(
            "listing kcp's pods in {}",
            webhook.kcp_namespace
        )))?;
    for pod in kcp_pods.items {
        let name = pod.metadata.name.unwrap_or_default();
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(pod = %name, "deleted kcp's pod so that it trusts the webhook's new CA")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(request(format!(
                    "deleting kcp's pod {}/{name}",
                    webhook.kcp_namespace
                ))(e))
            }
        }
    }
    Ok(())
}

/// Upstream's istio gate: `istio-istiod` (a HelmRelease with Flux, an Application with Argo
/// CD) in the PlatformMesh's namespace Ready, then this operator's pod with its `istio-proxy`
/// sidecar; a pod without one is deleted so that it comes back with it.
async fn istio_gate(
    ctx: &Context,
    istio: &Istio,
    technology: DeploymentTechnology,
) -> Result<Option<Step>, GateError> {
    let infra = &ctx.clusters.infra;
    let namespace = ctx.namespace();
    let argo = technology == DeploymentTechnology::ArgoCd;
    let resource = if argo {
        applications()
    } else {
        helm_releases()
    };
    let api: Api<DynamicObject> = Api::namespaced_with(infra.clone(), namespace, &resource);
    let release = api
        .get_opt(ISTIOD)
        .await
        .map_err(request(format!(
            "reading {} {namespace}/{ISTIOD}",
            resource.kind
        )))?
        .ok_or_else(|| {
            GateError::IstiodMissing(format!("{} {namespace}/{ISTIOD}", resource.kind))
        })?;
    let ready = if argo {
        release.data["status"]["sync"]["status"] == "Synced"
            && release.data["status"]["health"]["status"] == "Healthy"
    } else {
        release.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    if !ready {
        let state = if argo { "synced and healthy" } else { "ready" };
        return Ok(Some(Step::stop(
            format!("{ISTIOD} {} is not {state}", resource.kind),
            RECHECK,
        )));
    }
    if istio.is_local {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(infra.clone(), OPERATOR_NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(OPERATOR_POD_SELECTOR))
        .await
        .map_err(request(format!("listing pods in {OPERATOR_NAMESPACE}")))?;
    let pod = list
        .items
        .into_iter()
        .next()
        .ok_or(GateError::NoOperatorPod)?;
    let has_sidecar = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == "istio-proxy")
    });
    if has_sidecar {
        return Ok(None);
    }
    let name = pod.metadata.name.unwrap_or_default();
    match pods.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(request(format!("deleting pod {OPERATOR_NAMESPACE}/{name}"))(e)),
    }
    Ok(Some(Step::stop(
        format!("restarting pod {OPERATOR_NAMESPACE}/{name} to have the istio sidecar injected"),
        RECHECK,
    )))
}

/// The kind of kcp-operator's root shards.
pub fn root_shards() -> kube::api::ApiResource {
    crate::objects::api_resource("operator.kcp.io", "v1alpha1", "RootShard", "rootshards")
}

/// The kind of kcp-operator's front proxies.
pub fn front_proxies() -> kube::api::ApiResource {
    crate::objects::api_resource("operator.kcp.io", "v1alpha1", "FrontProxy", "frontproxies")
}

/// Upstream's message when kcp-operator's RootShard or FrontProxy is not Available (a failed
/// read counts as not Available, as upstream); `None` when both are, or when none is named.
pub async fn kcp_operator_waiting(clusters: &Clusters) -> Option<String> {
    let gate = clusters.gates.kcp_operator.as_ref()?;
    let checks = [
        (gate.root_shard.as_deref(), root_shards(), "RootShard"),
        (gate.front_proxy.as_deref(), front_proxies(), "FrontProxy"),
    ];
    for (name, resource, kind) in checks {
        let Some(name) = name else { continue };
        let api: Api<DynamicObject> = Api::namespaced_with(
            clusters.installed_into().clone(),
            &gate.namespace,
            &resource,
        );
        let available = match api.get(name).await {
            Ok(obj) => obj.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Available" && c["status"] == "True"),
            Err(_) => false,
        };
        if !available {
            return Some(format!("{kind} is not ready"));
        }
    }
    None
}
