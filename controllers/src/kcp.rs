//! How the controllers reach kcp: `platform-mesh serve`'s own workspace tree, or a real kcp given
//! by kubeconfig. Every reconciler that writes into kcp workspaces takes a [`Kcp`].
//!
//! A reconcile that writes into another *engaged* workspace reaches it through the runtime's
//! cluster lookup (`ClusterContext::reachable_cluster`, as multicluster-runtime's `GetCluster`),
//! with the same provider, credentials and route as its own: the Account reconciler does so for
//! a child workspace. [`Kcp`] is for the workspaces no cluster provider engages, which upstream's
//! operators also reach with a kcp rest config of their own: the Provider reconciler's
//! `root:providers` and the provider workspace it has just created (neither binds the export
//! the reconciler watches through), and the ManagedProvider reconciler's kcp, which it reaches
//! from the runtime cluster.

use base64::Engine as _;
use kube::config::Kubeconfig;

use crate::runtime::client::{cluster_prefix, scoped_client};

/// How the controller reaches kcp.
pub struct Kcp {
    /// A client of kcp's base address (no `/clusters/...`), allowed everywhere.
    pub client: kube::Client,
    /// The kubeconfig behind `client`; admin provider kubeconfigs are it with servers replaced.
    pub kubeconfig: Kubeconfig,
    /// The address written into provider kubeconfigs (kcp's front proxy as clients reach it).
    pub url: String,
    /// PEM certificates provider kubeconfigs trust.
    pub ca_pem: String,
    /// Namespace (in the runtime cluster) of provider kubeconfig Secrets that name none.
    pub secret_namespace: String,
    /// Settings of the identity provider configuration.
    pub idp: IdpSettings,
}

/// Why kcp access could not be set up from a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KcpConfigError {
    /// The kubeconfig has no usable current cluster.
    #[error("kcp kubeconfig: {0}")]
    Invalid(String),
    /// The client could not be built.
    #[error("kcp kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The client could not be built.
    #[error("kcp client: {0}")]
    Client(#[from] kube::Error),
}

impl Kcp {
    /// Access through `kubeconfig` (its current context). A server URL ending in
    /// `/clusters/<path>` is cut back to kcp's base address. `url` overrides the address written
    /// into provider kubeconfigs (default: that base address).
    pub async fn from_kubeconfig(
        kubeconfig: Kubeconfig,
        url: Option<String>,
    ) -> Result<Kcp, KcpConfigError> {
        let mut kubeconfig = kubeconfig;
        let context = kubeconfig
            .current_context
            .clone()
            .ok_or_else(|| KcpConfigError::Invalid("no current-context".into()))?;
        let cluster_name = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .ok_or_else(|| KcpConfigError::Invalid(format!("context {context:?} not found")))?;
        let named = kubeconfig
            .clusters
            .iter_mut()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.as_mut())
            .ok_or_else(|| {
                KcpConfigError::Invalid(format!("cluster {cluster_name:?} not found"))
            })?;
        let server = named
            .server
            .clone()
            .ok_or_else(|| KcpConfigError::Invalid("the cluster has no server".into()))?;
        let base = base_address(&server);
        named.server = Some(base.clone());
        let ca_pem = match (
            &named.certificate_authority_data,
            &named.certificate_authority,
        ) {
            (Some(data), _) => String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|e| {
                        KcpConfigError::Invalid(format!("certificate-authority-data: {e}"))
                    })?,
            )
            .map_err(|e| KcpConfigError::Invalid(format!("certificate-authority-data: {e}")))?,
            (None, Some(file)) => std::fs::read_to_string(file).map_err(|e| {
                KcpConfigError::Invalid(format!("certificate-authority {file}: {e}"))
            })?,
            (None, None) => String::new(),
        };
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig.clone(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        Ok(Kcp {
            client,
            kubeconfig,
            url: url.unwrap_or(base),
            ca_pem,
            secret_namespace: "platform-mesh-system".into(),
            idp: IdpSettings::default(),
        })
    }

    /// kcp's base address as `client` reaches it (the kubeconfig's current server).
    pub fn base_url(&self) -> String {
        let context = self.kubeconfig.current_context.as_deref().unwrap_or("");
        let cluster = self
            .kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.as_str())
            .unwrap_or("");
        self.kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == cluster)
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .map(|s| base_address(&s))
            .unwrap_or_default()
    }

    /// A client of the workspace at `path` (or logical cluster name).
    pub fn workspace(&self, path: &str) -> kube::Client {
        scoped_client(&self.client, &cluster_prefix(path))
    }
}

/// `https://host:port/clusters/root:x` → `https://host:port`; other paths are kept.
pub fn base_address(server: &str) -> String {
    let trimmed = server.trim_end_matches('/');
    match trimmed.find("/clusters/") {
        Some(i) if trimmed[..i].matches('/').count() == 2 => trimmed[..i].to_string(),
        _ => trimmed.to_string(),
    }
}

/// Settings of the identity provider configuration KcpSetup writes.
#[derive(Debug, Clone, Default)]
pub struct IdpSettings {
    /// Whether users may register themselves.
    pub registration_allowed: bool,
    /// Extra redirect URIs of the portal client.
    pub redirect_uris: Vec<String>,
    /// Extra post-logout redirect URIs of the portal client.
    pub post_logout_redirect_uris: Vec<String>,
    /// The client ids of the `welcome` realm (the audiences of `orgs-authentication`), as the
    /// identity provider reports them in the welcome IdentityProviderConfiguration's status.
    pub welcome_audiences: Vec<String>,
}

/// Whether the kcp serves WorkspaceAuthenticationConfigurations in `workspace` (kcp's
/// per-workspace authentication; kcp v0.28 has none). A workspace where the tenancy group is not
/// served (404) or not visible (403) serves none.
pub async fn serves_workspace_authentication(kcp: &Kcp, workspace: &str) -> Result<bool, String> {
    match kcp
        .workspace(workspace)
        .list_api_group_resources("tenancy.kcp.io/v1alpha1")
        .await
    {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|r| r.name == "workspaceauthenticationconfigurations")),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Ok(false),
        Err(e) => Err(format!(
            "discovering tenancy.kcp.io/v1alpha1 in {workspace}: {e}"
        )),
    }
}

/// `tenancy.kcp.io/v1alpha1` Workspace.
pub fn workspaces() -> kube::api::ApiResource {
    crate::objects::api_resource("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces")
}

/// `tenancy.kcp.io/v1alpha1` WorkspaceType.
pub fn workspace_types() -> kube::api::ApiResource {
    crate::objects::api_resource(
        "tenancy.kcp.io",
        "v1alpha1",
        "WorkspaceType",
        "workspacetypes",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_addresses_drop_the_cluster_path() {
        assert_eq!(
            base_address("https://kcp.example:6443/clusters/root:orgs"),
            "https://kcp.example:6443"
        );
        assert_eq!(
            base_address("https://kcp.example:6443/"),
            "https://kcp.example:6443"
        );
        assert_eq!(
            base_address("https://proxy.example/kcp/clusters/root"),
            "https://proxy.example/kcp/clusters/root"
        );
    }
}
