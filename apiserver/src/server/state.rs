//! The server as one value: the store, the types, the workspace tree and every other part a
//! request may use, built once at start ([`AppState::new`]); the `chain` module assembles
//! from them the handler chain that serves requests. No global state: the server is this value.

use std::sync::Arc;

use crate::access::authz::{Authorizer, Rbac};
use crate::admission::namespaces;
use crate::endpoints::handlers::ResourceScope;
use crate::endpoints::views::{ViewKind, Views};
use crate::meta::metrics::Metrics;
use crate::registry::catalog::Catalog;
use crate::registry::Registry;
use crate::storage::Store;

/// The server's parts.
pub struct AppState {
    /// Where objects live: the backend given, wrapped so that every write invalidates the RBAC
    /// policies it changes.
    pub store: Arc<dyn Store>,
    /// What every logical cluster serves.
    pub catalog: Arc<Catalog>,
    /// Request counters and latency histograms, served at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// `host:port` clients reach the server at (for `/api`).
    pub advertise_address: String,
    /// Namespace bookkeeping: the `default` namespace, and refusing content in missing or
    /// terminating namespaces.
    pub namespaces: Arc<namespaces::NamespaceLifecycle>,
    /// The workspace tree and the hooks of the tenancy types.
    pub tenancy: Arc<crate::access::tenancy::Tenancy>,
    /// Short requests being served at once; beyond the limit the server answers 429.
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// How requests authenticate.
    pub authn: Arc<crate::access::authn::Authn>,
    /// How long a short request may take before it is answered 504 (`--request-timeout`).
    pub request_timeout: std::time::Duration,
    /// The write path of every type, with the types' strategies.
    pub objects: Arc<crate::registry::GenericStore>,
    /// The admission plugins every write passes: namespace lifecycle, kcp's path annotation,
    /// the object limit (`--max-objects-per-workspace`).
    pub admission: Arc<crate::admission::Chain>,
    /// The decoded RBAC policy of each workspace, kept until its RBAC objects change.
    pub policies: Arc<crate::access::rbac::PolicyCache>,
    /// RBAC authorization over the store and those policies.
    pub rbac: Rbac,
    /// What each user may make the server hold: unread list answers, open watches.
    pub budgets: Arc<crate::access::budget::Budgets>,
    /// Platform Mesh's virtual workspaces (marketplace, content configurations).
    pub views: Arc<Views>,
    /// The read-only handlers' scope of each view, with no strategies and no admission.
    pub view_scopes: Vec<(ViewKind, ResourceScope)>,
    /// Extension mode: the kcp this server fronts, which resolves workspaces and authorizes the
    /// view requests (the server then serves nothing but the views).
    pub extension: Option<Arc<crate::endpoints::views::Extension>>,
    /// kcp's per-workspace authentication (WorkspaceAuthenticationConfigurations), when on.
    pub workspace_authn: Option<Arc<crate::access::workspace_authn::WorkspaceAuthn>>,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<crate::meta::audit::Audit>>,
}

/// What `AppState::new` needs beyond the store and the registry.
#[derive(Debug)]
pub struct StateOptions {
    /// `host:port` clients reach the server at.
    pub advertise_address: String,
    /// Short requests served at once before the server answers 429 (at least 1).
    pub max_requests_in_flight: usize,
    /// How requests authenticate.
    pub authn: crate::access::authn::Authn,
    /// Objects one logical cluster may hold; 0 for no limit.
    pub max_objects_per_workspace: usize,
    /// How long a short request may take before it is answered 504.
    pub request_timeout: std::time::Duration,
    /// Metrics added to `/metrics` beside the server's own.
    pub extra_metrics: Option<crate::meta::metrics::ExtraMetrics>,
    /// Per-user budgets of unread list answers and open watches.
    pub budgets: crate::access::budget::BudgetLimits,
    /// The labels, entity names and core export of Platform Mesh's virtual workspaces.
    pub views: crate::endpoints::views::ViewOptions,
    /// Extension mode: serve only the views, for the workspaces of this upstream kcp.
    pub extension: Option<Arc<crate::endpoints::views::Extension>>,
    /// Whether workspaces may admit users with their own JWT issuers (kcp's
    /// `WorkspaceAuthentication` feature); on unless turned off.
    pub workspace_authentication: bool,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<crate::meta::audit::Audit>>,
}

impl StateOptions {
    /// Defaults for a server reached at `advertise_address`.
    pub fn new(advertise_address: impl Into<String>) -> Self {
        StateOptions {
            advertise_address: advertise_address.into(),
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            authn: crate::access::authn::Authn::default(),
            max_objects_per_workspace: 0,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            extra_metrics: None,
            budgets: crate::access::budget::BudgetLimits::default(),
            views: crate::endpoints::views::ViewOptions::default(),
            extension: None,
            workspace_authentication: true,
            audit: None,
        }
    }
}

/// Default `--request-timeout` (kube-apiserver's).
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Default limit of short (non-watch) requests served at once.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: usize = 400;

impl AppState {
    /// The server's state over `store` (wrapped to keep the RBAC policy cache current) and the
    /// types of `registry`, with namespace and tenancy machinery built on them.
    pub fn new(store: Arc<dyn Store>, registry: Registry, options: StateOptions) -> Arc<Self> {
        let catalog = Arc::new(Catalog::new(registry.resources().to_vec()));
        // Every write made through this process invalidates the policies it changes before it
        // is acknowledged, so a client's next request is authorized by its own RBAC change.
        let policies = Arc::new(crate::access::rbac::PolicyCache::new());
        let observer = policies.clone();
        let store: Arc<dyn Store> = Arc::new(crate::storage::ObservedStore::new(
            store,
            Arc::new(move |key: &str, revision| observer.observe_write(key, revision)),
        ));
        let rbac = Rbac::new(store.clone(), policies.clone());
        // The generic store holds every type's strategy; the namespace and tenancy machinery
        // contribute strategies and write through the store, so they hold it weakly.
        let mut parts = None;
        let objects =
            Arc::new_cyclic(|objects: &std::sync::Weak<crate::registry::GenericStore>| {
                let namespaces = Arc::new(namespaces::NamespaceLifecycle::new(
                    store.clone(),
                    objects.clone(),
                    catalog.clone(),
                    options
                        .authn
                        .service_accounts
                        .as_ref()
                        .map(|tokens| tokens.ca_pem().to_string()),
                ));
                let tenancy =
                    crate::access::tenancy::Tenancy::new(crate::access::tenancy::TenancyDeps {
                        store: store.clone(),
                        objects: objects.clone(),
                        catalog: catalog.clone(),
                        advertise_address: options.advertise_address.clone(),
                        rbac: rbac.clone(),
                        namespaces: namespaces.clone(),
                        policies: policies.clone(),
                    });
                // Each type's behaviour, contributed by the layer that owns it.
                let mut strategies = crate::registry::StrategiesBuilder::default();
                crate::admission::rules::register(&mut strategies);
                strategies.add(
                    "",
                    "secrets",
                    Arc::new(crate::access::serviceaccounts::LegacyTokenSecrets {
                        store: store.clone(),
                        catalog: catalog.clone(),
                        signer: options.authn.service_accounts.clone(),
                    }),
                );
                crate::access::authz::RbacEscalation::register(&rbac, &mut strategies);
                namespaces.add_strategies(&mut strategies);
                tenancy.add_strategies(&mut strategies);
                parts = Some((namespaces, tenancy));
                crate::registry::GenericStore::new(
                    store.clone(),
                    strategies.build(),
                    crate::meta::heavy::HeavyWork::default(),
                )
            });
        let (namespaces, tenancy) = parts.expect("Arc::new_cyclic calls its closure");
        let admission = Arc::new(crate::admission::Chain::new(vec![
            namespaces.clone(),
            Arc::new(crate::access::tenancy::PathAnnotation(tenancy.clone())),
            Arc::new(crate::access::tenancy::ClaimLabels(tenancy.clone())),
            Arc::new(crate::admission::limits::ObjectCountLimit::new(
                crate::admission::limits::ObjectLimit::new(options.max_objects_per_workspace),
                store.clone(),
                catalog.clone(),
            )),
        ]));
        let paths: Arc<dyn crate::endpoints::views::WorkspacePaths> = match &options.extension {
            Some(x) => x.clone(),
            None => tenancy.clone(),
        };
        let views = Views::new(store.clone(), paths, options.views);
        let budgets = Arc::new(crate::access::budget::Budgets::new(options.budgets));
        let view_scopes = [ViewKind::ContentConfigurations, ViewKind::Marketplace]
            .into_iter()
            .map(|kind| {
                let scope = ResourceScope {
                    objects: Arc::new(crate::registry::GenericStore::new(
                        views.store(kind),
                        crate::registry::Strategies::default(),
                        objects.heavy().clone(),
                    )),
                    admission: Arc::new(crate::admission::Chain::default()),
                    catalog: catalog.clone(),
                    namespaces: namespaces.clone(),
                    budgets: budgets.clone(),
                };
                (kind, scope)
            })
            .collect();
        let workspace_authn = (options.workspace_authentication && options.extension.is_none())
            .then(|| {
                crate::access::workspace_authn::WorkspaceAuthn::new(store.clone(), tenancy.clone())
            });
        Arc::new(AppState {
            views,
            view_scopes,
            workspace_authn,
            audit: options.audit,
            extension: options.extension,
            policies,
            rbac,
            budgets,
            objects,
            admission,
            namespaces,
            tenancy,
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                options.max_requests_in_flight.max(1),
            )),
            authn: Arc::new(options.authn),
            request_timeout: options.request_timeout,
            store,
            catalog,
            metrics: Arc::new(Metrics::with_extra(options.extra_metrics.as_ref())),
            advertise_address: options.advertise_address,
        })
    }

    /// Who decides what a caller may do: RBAC of the server's workspaces, or in extension mode
    /// the kcp it fronts.
    pub fn authorizer(&self) -> Arc<dyn Authorizer> {
        match &self.extension {
            Some(x) => x.clone(),
            None => Arc::new(self.rbac.clone()),
        }
    }

    /// The handles the resource handlers work with.
    pub fn resource_scope(&self) -> ResourceScope {
        ResourceScope {
            objects: self.objects.clone(),
            admission: self.admission.clone(),
            catalog: self.catalog.clone(),
            namespaces: self.namespaces.clone(),
            budgets: self.budgets.clone(),
        }
    }
}
