//! The `security` workspace type's initializer (`root:security`), as Platform Mesh's security
//! operator runs it: every organisation and account workspace waits for it (their types extend
//! `security`), and it finishes them through kcp's `initializingworkspaces` virtual workspace,
//! whose URL the WorkspaceType publishes. It reaches a new workspace only while that workspace
//! waits for it, and then with the workspace owner's rights; it writes nothing there but the
//! AccountInfo wiring, and removes only its own name.
//!
//! For an organisation (`root:orgs:<org>`), in order:
//! 1. wait for the AccountInfo `account` the Account controller writes while the workspace is
//!    Initializing;
//! 2. the organisation's authorization store ([`StoreProvisioner`]: the extension point where an
//!    OpenFGA store is made; this project ships none, see its docs);
//! 3. the IdentityProviderConfiguration `<org>` in `root:orgs` (a confidential client `<org>`
//!    for the portal, a public `kubectl` client);
//! 4. AccountInfo `spec.oidc`: the realm's issuer and the clients;
//! 5. the WorkspaceAuthenticationConfiguration `<org>` in `root:orgs`, admitting the users of
//!    the organisation's realm (audiences: its clients), and every WorkspaceType of the
//!    organisation in `root:orgs` (label `core.platform-mesh.io/org=<org>`) referencing it, so
//!    that the realm's tokens authenticate in the organisation's workspaces; only where the kcp
//!    serves the kind (kcp v0.28 does not: there the step is skipped, as a kcp without
//!    per-workspace authentication could not use it);
//! 6. remove `root:security` from the LogicalCluster's `status.initializers`.
//!
//! For an account below an organisation only the store step applies (upstream writes the
//! account's tuples into the organisation's store), then step 6.
//!
//! It is also the type's terminator: a deleted organisation or account workspace waits for it
//! in the terminating virtual workspace; the store forgets the workspace and the terminator
//! removes its name, after which the workspace's content goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::kcp::Kcp;

/// The initializer's id: the `security` WorkspaceType in `root`.
pub const INITIALIZER: &str = "root:security";
/// Where organisation workspaces live.
const ORGS: &str = "root:orgs";
/// How often workspaces still waiting are looked at again.
const RESYNC: Duration = Duration::from_secs(1);
/// The longest pause between looks while the same prerequisite is missing.
const RESYNC_WAITING: Duration = Duration::from_secs(4);

/// Why a workspace could not be initialized (yet).
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The kcp answered with an error.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The security WorkspaceType publishes no initializing virtual workspace (yet).
    #[error("WorkspaceType root:security has no initializing virtual workspace URL yet")]
    NoVirtualWorkspace,
    /// The virtual workspace URL does not parse.
    #[error("initializing virtual workspace URL {0:?}: {1}")]
    BadUrl(String, String),
    /// What the kcp serves could not be read.
    #[error("{0}")]
    Discovery(String),
    /// The store extension point failed.
    #[error("authorization store for {0}: {1}")]
    Store(String, String),
    /// An object of the organisation in `root:orgs` could not be written.
    #[error(transparent)]
    Ensure(#[from] crate::ensure::EnsureError),
}

fn kube_error(context: &str) -> impl FnOnce(kube::Error) -> SecurityError + '_ {
    move |source| SecurityError::Kube {
        context: context.to_string(),
        source,
    }
}

/// Creates `<kind> <name>` with `spec` through `api`, or replaces the stored one whose spec
/// differs (the initializer owns the whole spec).
async fn ensure_spec(
    api: &Api<DynamicObject>,
    api_version: &str,
    kind: &str,
    name: &str,
    spec: Value,
) -> Result<(), SecurityError> {
    let wanted = json!({"apiVersion": api_version, "kind": kind,
                        "metadata": {"name": name}, "spec": spec});
    crate::ensure::ensure(api, wanted, |stored| {
        (stored.data["spec"] != spec).then(|| {
            let mut updated = stored.clone();
            updated.data["spec"] = spec.clone();
            updated
        })
    })
    .await?;
    Ok(())
}

/// The extension point for an organisation's (and its accounts') authorization store: upstream
/// creates an OpenFGA store per organisation and writes owner tuples for every account. A
/// deployment with OpenFGA plugs its provisioner in here; returning `Ok(None)` means "no store"
/// (AccountInfo then names none).
#[async_trait::async_trait]
pub trait StoreProvisioner: Send + Sync {
    /// Makes (or finds) the store of organisation `org`, created by `creator`; its id.
    async fn organisation(
        &self,
        org: &str,
        creator: Option<&str>,
    ) -> Result<Option<String>, String>;
    /// Records account `path` (below its organisation) in the organisation's store.
    async fn account(&self, path: &str) -> Result<(), String>;
    /// Forgets the organisation or account at `path` (it is being deleted).
    async fn removed(&self, path: &str) -> Result<(), String>;
}

/// No authorization store: this project runs without OpenFGA.
pub struct NoStore;

#[async_trait::async_trait]
impl StoreProvisioner for NoStore {
    async fn organisation(&self, _: &str, _: Option<&str>) -> Result<Option<String>, String> {
        Ok(None)
    }

    async fn account(&self, _: &str) -> Result<(), String> {
        Ok(())
    }

    async fn removed(&self, _: &str) -> Result<(), String> {
        Ok(())
    }
}

/// What the initializer writes that depends on the installation.
#[derive(Clone, Debug)]
pub struct SecurityOptions {
    /// `host[:port]` of the portal; realms are at `https://<it>/keycloak/realms/<org>`.
    pub base_domain: String,
    /// PEM CA of the realms' TLS (`certificateAuthority` of the organisations'
    /// WorkspaceAuthenticationConfigurations); the system's roots when empty.
    pub domain_ca: String,
    /// Audiences accepted beside the organisation's clients.
    pub additional_audiences: Vec<String>,
    /// The claim naming a user (`email`).
    pub user_claim: String,
    /// The claim listing a user's groups (`groups`).
    pub group_claim: String,
    /// Admit users whose email is not verified (the username is then `claims.email` by
    /// expression, beside a rule that reads `email_verified`, as kube requires).
    pub allow_unverified_emails: bool,
}

impl Default for SecurityOptions {
    fn default() -> Self {
        SecurityOptions {
            base_domain: "portal.dev.local:8443".into(),
            domain_ca: String::new(),
            additional_audiences: Vec::new(),
            user_claim: "email".into(),
            group_claim: "groups".into(),
            allow_unverified_emails: false,
        }
    }
}

/// The label naming the organisation of a per-organisation WorkspaceType.
const ORG_LABEL: &str = "core.platform-mesh.io/org";

impl SecurityOptions {
    /// The issuer of organisation `org`'s realm.
    pub fn issuer(&self, org: &str) -> String {
        format!("https://{}/keycloak/realms/{org}", self.base_domain)
    }

    /// The `spec` of organisation `org`'s WorkspaceAuthenticationConfiguration, accepting
    /// tokens for `client_ids` and the additional audiences.
    pub fn authentication_spec(&self, org: &str, client_ids: &[String]) -> Value {
        let mut audiences: Vec<String> = client_ids.to_vec();
        for a in &self.additional_audiences {
            if !audiences.contains(a) {
                audiences.push(a.clone());
            }
        }
        let mut issuer = json!({"url": self.issuer(org), "audiences": audiences,
                                "audienceMatchPolicy": "MatchAny"});
        if !self.domain_ca.is_empty() {
            issuer["certificateAuthority"] = json!(self.domain_ca);
        }
        let groups = json!({"claim": self.group_claim, "prefix": ""});
        let mut jwt = if self.allow_unverified_emails {
            json!({"issuer": issuer, "claimMappings": {
                       "username": {"expression": format!("claims.{}", self.user_claim)},
                       "groups": groups},
                   "claimValidationRules": [{
                       "expression": "!has(claims.email_verified) || claims.email_verified == true || claims.email_verified == false",
                       "message": "email_verified must be a boolean"}]})
        } else {
            json!({"issuer": issuer, "claimMappings": {
                "username": {"claim": self.user_claim, "prefix": ""}, "groups": groups}})
        };
        if let Some(m) = jwt.as_object_mut() {
            m.entry("claimValidationRules").or_insert_with(|| json!([]));
        }
        json!({"jwt": [jwt]})
    }
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn logical_clusters() -> ApiResource {
    ar(
        "core.kcp.io",
        "v1alpha1",
        "LogicalCluster",
        "logicalclusters",
    )
}

/// The security initializer.
pub struct SecurityInitializer {
    kcp: Arc<Kcp>,
    store: Arc<dyn StoreProvisioner>,
    options: SecurityOptions,
}

/// What one look at a waiting workspace came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its steps are done and the initializer removed itself.
    Done,
    /// Something it needs is not there yet.
    Waiting(&'static str),
}

impl SecurityInitializer {
    /// An initializer working with `kcp`'s admin access for `root:orgs` and `store` for the
    /// authorization stores.
    pub fn new(kcp: Arc<Kcp>, store: Arc<dyn StoreProvisioner>, options: SecurityOptions) -> Self {
        SecurityInitializer {
            kcp,
            store,
            options,
        }
    }

    /// Runs until `stop`: finds the initializing virtual workspace, then finishes every
    /// workspace waiting for `root:security` as its prerequisites appear.
    pub async fn run(self, stop: CancellationToken) {
        let mut last_error = String::new();
        // While a prerequisite stays missing (no PlatformMesh set kcp up yet), looks come less
        // often, up to `RESYNC_WAITING` apart; once passes succeed, every `RESYNC`.
        let mut delay = RESYNC;
        while !stop.is_cancelled() {
            match self.pass().await {
                Ok(()) => {
                    last_error.clear();
                    delay = RESYNC;
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::info!(error = %text, "security initializer: waiting");
                        last_error = text;
                        delay = RESYNC;
                    } else {
                        delay = (delay * 2).min(RESYNC_WAITING);
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One pass over the workspaces waiting for the initializer, then over the deleted ones
    /// waiting for the terminator.
    pub async fn pass(&self) -> Result<(), SecurityError> {
        self.initialize_pass().await?;
        self.terminate_pass().await
    }

    /// The terminator's pass: the authorization store forgets the workspace
    /// ([`StoreProvisioner::removed`]), then `root:security` leaves `status.terminators`.
    async fn terminate_pass(&self) -> Result<(), SecurityError> {
        // A kcp without terminators (v0.28) publishes no terminating virtual workspace.
        let Ok(vw) = self.virtual_workspace("/terminatingworkspaces/").await else {
            return Ok(());
        };
        let all: Api<DynamicObject> = Api::all_with(self.vw_client(&vw, "*")?, &logical_clusters());
        let deleting = all.list(&ListParams::default()).await.map_err(kube_error(
            "listing the workspaces waiting for root:security to terminate",
        ))?;
        for lc in deleting.items {
            let annotations = lc.metadata.annotations.clone().unwrap_or_default();
            let (Some(cluster), path) = (
                annotations.get("kcp.io/cluster"),
                annotations.get("kcp.io/path").cloned().unwrap_or_default(),
            ) else {
                continue;
            };
            if let Err(e) = self.store.removed(&path).await {
                tracing::warn!(cluster, error = %e, "security terminator: authorization store");
                continue;
            }
            let left: Vec<Value> = lc.data["status"]["terminators"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|i| *i != INITIALIZER)
                .cloned()
                .collect();
            let api: Api<DynamicObject> =
                Api::all_with(self.vw_client(&vw, cluster)?, &logical_clusters());
            match api
                .patch_status(
                    "cluster",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"terminators": left}})),
                )
                .await
            {
                Ok(_) => tracing::info!(cluster, "security terminator: workspace released"),
                Err(e) => tracing::warn!(cluster, error = %e, "security terminator"),
            }
        }
        Ok(())
    }

    async fn initialize_pass(&self) -> Result<(), SecurityError> {
        let vw = self.virtual_workspace("/initializingworkspaces/").await?;
        let all: Api<DynamicObject> = Api::all_with(self.vw_client(&vw, "*")?, &logical_clusters());
        let waiting = all.list(&ListParams::default()).await.map_err(kube_error(
            "listing the workspaces waiting for root:security",
        ))?;
        for lc in waiting.items {
            let Some(cluster) = lc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kcp.io/cluster"))
                .cloned()
            else {
                continue;
            };
            match self.initialize(&vw, &cluster, &lc).await {
                Ok(Outcome::Done) => {
                    tracing::info!(cluster, "security initializer: workspace initialized")
                }
                Ok(Outcome::Waiting(why)) => tracing::debug!(cluster, why, "security initializer"),
                Err(e) => tracing::warn!(cluster, error = %e, "security initializer"),
            }
        }
        Ok(())
    }

    /// The URL of one of the type's virtual workspaces (`kind` is in its path), from the
    /// WorkspaceType's status.
    async fn virtual_workspace(&self, kind: &str) -> Result<String, SecurityError> {
        let types: Api<DynamicObject> = Api::all_with(
            self.kcp.workspace("root"),
            &ar(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceType",
                "workspacetypes",
            ),
        );
        let Some(wt) = types
            .get_opt("security")
            .await
            .map_err(kube_error("reading WorkspaceType root:security"))?
        else {
            return Err(SecurityError::NoVirtualWorkspace);
        };
        wt.data["status"]["virtualWorkspaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["url"].as_str())
            .find(|u| u.contains(kind))
            .map(str::to_string)
            .ok_or(SecurityError::NoVirtualWorkspace)
    }

    /// A client of `<vw>/clusters/<cluster>`, through the kcp client when the URL is on the
    /// same address.
    fn vw_client(&self, vw: &str, cluster: &str) -> Result<kube::Client, SecurityError> {
        let base = self.kcp.base_url();
        let rest = vw
            .strip_prefix(&base)
            .filter(|r| r.starts_with('/'))
            .ok_or_else(|| {
                SecurityError::BadUrl(vw.to_string(), format!("not served at {base}"))
            })?;
        Ok(mc_runtime::client::scoped_client(
            &self.kcp.client,
            &format!("{rest}/clusters/{cluster}"),
        ))
    }

    /// The steps for one waiting workspace.
    pub async fn initialize(
        &self,
        vw: &str,
        cluster: &str,
        lc: &DynamicObject,
    ) -> Result<Outcome, SecurityError> {
        let path = lc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kcp.io/path"))
            .cloned()
            .unwrap_or_default();
        let inside = self.vw_client(vw, cluster)?;
        match path.strip_prefix("root:orgs:").filter(|o| !o.contains(':')) {
            Some(org) => {
                if let Outcome::Waiting(why) = self.organisation(&inside, org).await? {
                    return Ok(Outcome::Waiting(why));
                }
            }
            None => self
                .store
                .account(&path)
                .await
                .map_err(|e| SecurityError::Store(path.clone(), e))?,
        }
        self.remove_self(&inside, lc).await?;
        Ok(Outcome::Done)
    }

    async fn organisation(
        &self,
        inside: &kube::Client,
        org: &str,
    ) -> Result<Outcome, SecurityError> {
        let infos: Api<DynamicObject> = Api::all_with(
            inside.clone(),
            &ar(
                "core.platform-mesh.io",
                "v1alpha1",
                "AccountInfo",
                "accountinfos",
            ),
        );
        let info = match infos.get_opt("account").await {
            Ok(Some(i)) => i,
            Ok(None) => return Ok(Outcome::Waiting("AccountInfo account not written yet")),
            // Not served yet: the workspace's bindings are still coming.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                return Ok(Outcome::Waiting("AccountInfo not served yet"))
            }
            Err(e) => return Err(kube_error("reading AccountInfo account")(e)),
        };
        let accounts: Api<DynamicObject> = Api::all_with(
            self.kcp.workspace(ORGS),
            &ar("core.platform-mesh.io", "v1alpha1", "Account", "accounts"),
        );
        let creator = accounts
            .get_opt(org)
            .await
            .map_err(kube_error("reading the organisation's Account"))?
            .and_then(|a| a.data["spec"]["creator"].as_str().map(str::to_string));
        let store = self
            .store
            .organisation(org, creator.as_deref())
            .await
            .map_err(|e| SecurityError::Store(org.to_string(), e))?;
        self.identity_provider(org).await?;
        let mut clients = BTreeMap::new();
        for name in [org, "kubectl"] {
            clients.insert(name.to_string(), json!({"clientId": name}));
        }
        let mut spec = json!({"oidc": {
            "issuerUrl": format!("https://{}/keycloak/realms/{org}", self.options.base_domain),
            "clients": clients,
        }});
        if let Some(id) = store {
            spec["fga"] = json!({"store": {"id": id}});
        }
        if info.data["spec"]["oidc"] != spec["oidc"]
            || (spec.get("fga").is_some() && info.data["spec"]["fga"] != spec["fga"])
        {
            infos
                .patch(
                    "account",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": spec})),
                )
                .await
                .map_err(kube_error("wiring AccountInfo account"))?;
        }
        if crate::kcp::serves_workspace_authentication(&self.kcp, ORGS)
            .await
            .map_err(SecurityError::Discovery)?
        {
            let client_ids: Vec<String> = spec["oidc"]["clients"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, c)| c["clientId"].as_str().map(str::to_string))
                .collect();
            self.workspace_authentication(org, &client_ids).await?;
        }
        Ok(Outcome::Done)
    }

    /// Organisation `org`'s WorkspaceAuthenticationConfiguration in `root:orgs`, and its
    /// WorkspaceTypes referencing it.
    async fn workspace_authentication(
        &self,
        org: &str,
        client_ids: &[String],
    ) -> Result<(), SecurityError> {
        let configs: Api<DynamicObject> = Api::all_with(
            self.kcp.workspace(ORGS),
            &ar(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceAuthenticationConfiguration",
                "workspaceauthenticationconfigurations",
            ),
        );
        ensure_spec(
            &configs,
            "tenancy.kcp.io/v1alpha1",
            "WorkspaceAuthenticationConfiguration",
            org,
            self.options.authentication_spec(org, client_ids),
        )
        .await?;
        let types: Api<DynamicObject> = Api::all_with(
            self.kcp.workspace(ORGS),
            &ar(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceType",
                "workspacetypes",
            ),
        );
        let wanted = json!([{"name": org}]);
        let labelled = types
            .list(&ListParams::default().labels(&format!("{ORG_LABEL}={org}")))
            .await
            .map_err(kube_error("listing the organisation's WorkspaceTypes"))?;
        for t in labelled.items {
            if t.data["spec"]["authenticationConfigurations"] == wanted {
                continue;
            }
            let name = t.metadata.name.clone().unwrap_or_default();
            types
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"authenticationConfigurations": wanted}})),
                )
                .await
                .map_err(kube_error(
                    "referencing the configuration from a WorkspaceType",
                ))?;
        }
        Ok(())
    }

    /// The organisation's IdentityProviderConfiguration in `root:orgs`.
    async fn identity_provider(&self, org: &str) -> Result<(), SecurityError> {
        let api: Api<DynamicObject> = Api::all_with(
            self.kcp.workspace(ORGS),
            &ar(
                "core.platform-mesh.io",
                "v1alpha1",
                "IdentityProviderConfiguration",
                "identityproviderconfigurations",
            ),
        );
        let domain = &self.options.base_domain;
        let spec = json!({"clients": [
            {"clientName": org, "clientType": "confidential",
             "redirectUris": [format!("https://{org}.{domain}/*")],
             "postLogoutRedirectUris": [format!("https://{org}.{domain}/logout*")],
             "secretRef": {"name": format!("portal-client-secret-{org}-{org}"), "namespace": "default"}},
            {"clientName": "kubectl", "clientType": "public",
             "redirectUris": ["http://localhost:8000/*", "http://localhost:18000/*"]},
        ]});
        ensure_spec(
            &api,
            "core.platform-mesh.io/v1alpha1",
            "IdentityProviderConfiguration",
            org,
            spec,
        )
        .await
    }

    /// Removes `root:security` from the LogicalCluster's initializers (only that name: the
    /// virtual workspace refuses anything else).
    async fn remove_self(
        &self,
        inside: &kube::Client,
        lc: &DynamicObject,
    ) -> Result<(), SecurityError> {
        let left: Vec<Value> = lc.data["status"]["initializers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| *i != INITIALIZER)
            .cloned()
            .collect();
        let api: Api<DynamicObject> = Api::all_with(inside.clone(), &logical_clusters());
        let mut patch = json!({"status": {"initializers": left}});
        if let Some(rv) = &lc.metadata.resource_version {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        api.patch_status("cluster", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(kube_error("removing root:security from the initializers"))
    }
}
