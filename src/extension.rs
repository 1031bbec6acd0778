//! `platform-mesh virtual-workspaces`: Platform Mesh's two virtual workspaces served in front
//! of a kcp this process does not own, as upstream's virtual-workspaces server is.
//!
//! kcp is read with the kubeconfig's identity (an admin of the provider workspace, as upstream's
//! chart gives it): ContentConfigurations, ProviderMetadata and the core export's APIBindings
//! through the core export's endpoint slice (one wildcard watch each), and the APIBindings and
//! APIExports of each workspace those bindings engage (one watch each per workspace; with
//! permission claims these become wildcard watches too). Everything read is mirrored into this
//! server's memory store, where the views are computed exactly as `serve` computes them.
//! Workspaces, tokens and permissions are kcp's: paths resolve through each workspace's
//! LogicalCluster, bearer tokens through a TokenReview, and every view request through a
//! SubjectAccessReview in the workspace asked for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use apiserver::access::rbac::{Attributes, Decision};
use apiserver::endpoints::views::{
    Mirror, SourceKind, Upstream, UpstreamError, ViewOptions, Workspace,
};
use apiserver::request::identity::Identity;
use controllers::cluster_providers::kcp::{cluster_of, endpoint_urls};
use controllers::kcp::Kcp;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// Flags of `platform-mesh virtual-workspaces`: the kcp to front and how to serve.
#[derive(clap::Args)]
pub struct KcpArgs {
    /// Kubeconfig of the kcp to serve the views of; its server is kcp's address (a
    /// `/clusters/<path>` suffix is cut off) and its user reads the provider workspace and
    /// every workspace bound to the core export.
    #[arg(long)]
    pub kcp_kubeconfig: PathBuf,
    /// kcp's address (its front proxy) instead of the kubeconfig's server.
    #[arg(long)]
    pub server_url: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6444")]
    pub listen: SocketAddr,
    /// Directory for the PKI and admin.kubeconfig of this server (nothing else is kept).
    #[arg(long, default_value = ".platform-mesh-virtual-workspaces")]
    pub data_dir: PathBuf,
    /// Serving certificate (PEM) instead of the generated one.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle (PEM) that signs accepted client certificates, instead of the generated CA.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
}

/// kcp, as extension mode asks it.
pub struct KcpUpstream {
    kcp: Kcp,
}

fn unavailable(what: impl Into<String>, e: impl std::fmt::Display) -> UpstreamError {
    UpstreamError::Unavailable {
        what: what.into(),
        reason: e.to_string(),
    }
}

/// Whether a name or path from a request may be put into a URL path as it is: logical-cluster
/// names and workspace paths are lowercase letters, digits, `-` and `:`.
fn plain_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 1024
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b':')
}

impl KcpUpstream {
    /// kcp reached through `kubeconfig` (`server_url` replaces its server).
    pub async fn connect(kubeconfig: &Path, server_url: Option<&str>) -> anyhow::Result<Self> {
        let mut config = kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("reading --kcp-kubeconfig {}", kubeconfig.display()))?;
        if let Some(url) = server_url {
            let context = config.current_context.clone().unwrap_or_default();
            let cluster = config
                .contexts
                .iter()
                .find(|c| c.name == context)
                .and_then(|c| c.context.as_ref())
                .map(|c| c.cluster.clone())
                .unwrap_or_default();
            for named in &mut config.clusters {
                if named.name == cluster {
                    if let Some(c) = named.cluster.as_mut() {
                        c.server = Some(url.to_string());
                    }
                }
            }
        }
        let kcp = Kcp::from_kubeconfig(config, None)
            .await
            .context("the kcp of --kcp-kubeconfig")?;
        Ok(KcpUpstream { kcp })
    }

    async fn post(&self, cluster: &str, path: &str, body: Value) -> Result<Value, kube::Error> {
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap_or_default())
            .map_err(kube::Error::HttpError)?;
        self.kcp.workspace(cluster).request(request).await
    }

    async fn get(&self, cluster: &str, path: &str) -> Result<Value, kube::Error> {
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        self.kcp.workspace(cluster).request(request).await
    }
}

#[async_trait::async_trait]
impl Upstream for KcpUpstream {
    async fn workspace(&self, target: &str) -> Result<Option<Workspace>, UpstreamError> {
        if !plain_path(target) {
            return Ok(None);
        }
        let lc = match self
            .get(target, "/apis/core.kcp.io/v1alpha1/logicalclusters/cluster")
            .await
        {
            Ok(lc) => lc,
            Err(kube::Error::Api(e)) if matches!(e.code, 401 | 403 | 404) => return Ok(None),
            Err(e) => return Err(unavailable(format!("for workspace {target}"), e)),
        };
        let annotations = &lc["metadata"]["annotations"];
        let name = annotations["kcp.io/cluster"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or(target);
        let path = annotations["kcp.io/path"]
            .as_str()
            .filter(|p| !p.is_empty())
            .or_else(|| target.contains(':').then_some(target));
        Ok(path.map(|path| Workspace {
            name: name.to_string(),
            path: path.to_string(),
        }))
    }

    async fn access(&self, cluster: &str, a: &Attributes) -> Result<Decision, UpstreamError> {
        let mut spec = json!({
            "user": a.user.name,
            "groups": a.user.groups,
            "extra": a.user.extra,
        });
        if a.resource_request {
            spec["resourceAttributes"] = json!({
                "verb": a.verb,
                "group": a.api_group,
                "resource": a.resource,
                "subresource": a.subresource,
                "name": a.name,
                "namespace": a.namespace.clone().unwrap_or_default(),
            });
        } else {
            spec["nonResourceAttributes"] = json!({"verb": a.verb, "path": a.path});
        }
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        let answer = self
            .post(
                cluster,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                review,
            )
            .await
            .map_err(|e| unavailable("a SubjectAccessReview", e))?;
        let status = &answer["status"];
        Ok(if status["allowed"] == true {
            Decision::Allow
        } else {
            Decision::Deny(status["reason"].as_str().unwrap_or_default().to_string())
        })
    }

    async fn review_token(&self, token: &str) -> Result<Option<Identity>, UpstreamError> {
        let review = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let answer = self
            .post(
                "root",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                review,
            )
            .await
            .map_err(|e| unavailable("a TokenReview", e))?;
        let status = &answer["status"];
        if status["authenticated"] != true {
            return Ok(None);
        }
        let user = &status["user"];
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut id = Identity::new(
            user["username"].as_str().unwrap_or_default(),
            strings(&user["groups"]),
        );
        id.uid = user["uid"].as_str().unwrap_or_default().to_string();
        if let Some(extra) = user["extra"].as_object() {
            id.extra = extra.iter().map(|(k, v)| (k.clone(), strings(v))).collect();
        }
        Ok(Some(id))
    }
}

fn api_resource(kind: SourceKind) -> ApiResource {
    let (group, version, plural) = kind.resource();
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.kind().into(),
        plural: plural.into(),
    }
}

/// How long to wait before asking kcp again for something that is not there yet.
const RETRY: Duration = Duration::from_secs(2);

/// Keeps the store of a server in extension mode a copy of what the views are computed from,
/// until the returned task is aborted.
pub fn mirror(
    upstream: Arc<KcpUpstream>,
    extension: Arc<apiserver::endpoints::views::Extension>,
    store: Arc<dyn apiserver::storage::Store>,
    views: ViewOptions,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match run_mirror(&upstream, &extension, &store, &views).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "mirroring kcp; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    })
}

/// Aborts its tasks when dropped.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

async fn run_mirror(
    upstream: &KcpUpstream,
    extension: &apiserver::endpoints::views::Extension,
    store: &Arc<dyn apiserver::storage::Store>,
    views: &ViewOptions,
) -> anyhow::Result<()> {
    let provider = upstream
        .workspace(&views.provider_workspace)
        .await?
        .with_context(|| format!("the provider workspace {}", views.provider_workspace))?;
    extension.remember(&provider);
    let export = upstream
        .get(
            &provider.name,
            &format!(
                "/apis/apis.kcp.io/v1alpha1/apiexports/{}",
                views.core_export
            ),
        )
        .await
        .with_context(|| format!("the {} APIExport", views.core_export))?;
    let identity = export["status"]["identityHash"]
        .as_str()
        .filter(|i| !i.is_empty())
        .context("the core APIExport has no identity yet")?
        .to_string();
    let slice = upstream
        .get(
            &provider.name,
            &format!(
                "/apis/apis.kcp.io/v1alpha1/apiexportendpointslices/{}",
                views.core_export
            ),
        )
        .await
        .with_context(|| format!("the {} APIExportEndpointSlice", views.core_export))?;
    let url = endpoint_urls(&slice)
        .into_iter()
        .next()
        .context("the endpoint slice lists no virtual workspace URL yet")?;
    let mirror = Arc::new(Mirror::new(store.clone(), identity));
    let config = kube::Config::from_custom_kubeconfig(
        upstream.kcp.kubeconfig.clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let endpoint = controllers::runtime::client::pooled_client(&config, &url)?;
    let everywhere = controllers::runtime::client::scoped_client(&endpoint, "/clusters/*");
    tracing::info!(%url, provider = %provider.path, "mirroring kcp for the virtual workspaces");
    let _shared = Tasks(
        [
            SourceKind::ContentConfigurations,
            SourceKind::ProviderMetadata,
        ]
        .into_iter()
        .map(|kind| {
            tokio::spawn(follow(
                Api::all_with(everywhere.clone(), &api_resource(kind)),
                mirror.clone(),
                kind,
                None,
            ))
        })
        .collect(),
    );
    // The workspaces the core export reaches, each with its own APIBindings and APIExports
    // followed; the provider workspace always (the core export lives there).
    let mut engaged: HashMap<String, Tasks> = HashMap::new();
    let engage = |cluster: &str| -> Tasks {
        let client = upstream.kcp.workspace(cluster);
        Tasks(
            [SourceKind::ApiBindings, SourceKind::ApiExports]
                .into_iter()
                .map(|kind| {
                    tokio::spawn(follow(
                        Api::all_with(client.clone(), &api_resource(kind)),
                        mirror.clone(),
                        kind,
                        Some(cluster.to_string()),
                    ))
                })
                .collect(),
        )
    };
    engaged.insert(provider.name.clone(), engage(&provider.name));
    let bindings =
        Api::<DynamicObject>::all_with(everywhere.clone(), &api_resource(SourceKind::ApiBindings));
    let mut stream = watcher(bindings, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Vec<String> = Vec::new();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching the core export's bindings");
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(b) => listing.extend(cluster_of(&b).map(str::to_string)),
            watcher::Event::InitDone => {
                let now: std::collections::HashSet<String> = listing.drain(..).collect();
                let gone: Vec<String> = engaged
                    .keys()
                    .filter(|c| !now.contains(*c) && **c != provider.name)
                    .cloned()
                    .collect();
                for c in gone {
                    disengage(&mirror, &mut engaged, &c).await;
                }
                for c in now {
                    if let std::collections::hash_map::Entry::Vacant(slot) = engaged.entry(c) {
                        let tasks = engage(slot.key());
                        slot.insert(tasks);
                    }
                }
            }
            watcher::Event::Apply(b) => {
                if let Some(c) = cluster_of(&b) {
                    if !engaged.contains_key(c) {
                        let tasks = engage(c);
                        engaged.insert(c.to_string(), tasks);
                    }
                }
            }
            watcher::Event::Delete(b) => {
                if let Some(c) = cluster_of(&b).filter(|c| *c != provider.name) {
                    let c = c.to_string();
                    disengage(&mirror, &mut engaged, &c).await;
                }
            }
        }
    }
    Ok(())
}

/// Stops following a workspace and forgets what was mirrored of it.
async fn disengage(mirror: &Mirror, engaged: &mut HashMap<String, Tasks>, cluster: &str) {
    engaged.remove(cluster);
    for kind in [SourceKind::ApiBindings, SourceKind::ApiExports] {
        if let Err(e) = mirror.replace(kind, Some(cluster), Vec::new()).await {
            tracing::warn!(error = %e, cluster, "forgetting a workspace");
        }
    }
}

/// Mirrors one list+watch: objects of logical cluster `cluster` (or of every cluster, each
/// named by its `kcp.io/cluster` annotation).
async fn follow(
    api: Api<DynamicObject>,
    mirror: Arc<Mirror>,
    kind: SourceKind,
    cluster: Option<String>,
) {
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Vec<(String, Value)> = Vec::new();
    let where_of = |o: &DynamicObject| -> Option<String> {
        cluster
            .clone()
            .or_else(|| cluster_of(o).map(str::to_string))
    };
    while let Some(event) = stream.next().await {
        let result = match event {
            Err(e) => {
                tracing::debug!(error = %e, kind = kind.kind(), "watching kcp");
                continue;
            }
            Ok(watcher::Event::Init) => {
                listing.clear();
                Ok(())
            }
            Ok(watcher::Event::InitApply(o)) => {
                if let Some(c) = where_of(&o) {
                    listing.push((c, serde_json::to_value(&o).unwrap_or(Value::Null)));
                }
                Ok(())
            }
            Ok(watcher::Event::InitDone) => {
                mirror
                    .replace(kind, cluster.as_deref(), std::mem::take(&mut listing))
                    .await
            }
            Ok(watcher::Event::Apply(o)) => match where_of(&o) {
                Some(c) => {
                    mirror
                        .put(kind, &c, serde_json::to_value(&o).unwrap_or(Value::Null))
                        .await
                }
                None => Ok(()),
            },
            Ok(watcher::Event::Delete(o)) => match (where_of(&o), o.metadata.name.as_deref()) {
                (Some(c), Some(name)) => mirror.remove(kind, &c, name).await,
                _ => Ok(()),
            },
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, kind = kind.kind(), "mirroring");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_and_paths_reach_a_url() {
        assert!(plain_path("root:orgs:acme"));
        assert!(plain_path("2x9c1v8nh4nzl5u9"));
        for bad in ["", "*", "root/../x", "a?b", "a%2f", "Root", "a b"] {
            assert!(!plain_path(bad), "{bad}");
        }
    }
}
