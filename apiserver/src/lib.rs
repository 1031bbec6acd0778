//! Kubernetes-API serving machinery: the HTTPS server, the request path, the registry of served
//! types and the storage beneath them, with kcp-style tenancy (logical clusters, workspaces).
//!
//! The crate's folders are its layers, from the bottom up; a module imports only from its own
//! layer or from layers below it (the workspace's `tests/module_structure.rs` reads the folders
//! and checks it, and that no two modules import each other):
//!
//! ```text
//! meta ← request ← storage ← registry ← admission ← access ← endpoints ← server
//! ```
//!
//! - [`meta`]: the shared vocabulary (statuses, names, selectors, schema and CEL, bodies,
//!   apply, metrics, the audit event).
//! - [`request`]: what is read from the request itself (its attributes, query, negotiation, the
//!   connection's identity).
//! - [`storage`]: the MVCC key-value store (memory, redb or etcd backend) behind the watch cache.
//! - [`registry`]: the served types (built in, kcp's, CRDs, bound APIs), one view per logical
//!   cluster in the catalog, discovery and OpenAPI, and the [`registry::GenericStore`] every
//!   write goes through: the server's metadata, `generateName`, the type's
//!   [`registry::Strategy`], the structural schema and CEL rules, the compare-and-swap loop, and
//!   the one mapping of storage errors to Status.
//! - [`admission`]: what a write passes besides its type's strategy (the namespace lifecycle,
//!   the Platform Mesh rules, per-workspace object limits).
//! - [`access`]: tenancy (the workspace path index), authentication, RBAC and authorization.
//! - [`endpoints`]: the filters each request passes (one per file, each wrapping the next with
//!   one narrow dependency), the router, which only routes, a workspace's own API, the virtual
//!   workspaces (each authorizing and scoping its requests), and the handlers of each verb (over
//!   a narrow `ResourceScope`, never the whole server state), reviews and admission webhooks.
//! - [`server`]: the TLS listener, the server's parts ([`server::AppState`]) and the handler
//!   chain assembled from them in one place ([`server::chain`]).
//!
//! A request:
//!
//! ```text
//! listener ─▶ log ─▶ in-flight ─▶ gzip ─▶ audit ─▶ timeout ─▶ recovery ─▶ valid path
//!   ─▶ authentication ─▶ cluster ─▶ workspace authn ─▶ impersonation ─▶ readiness
//!   ─▶ authorization (non-resource) ─▶ router ─┬─▶ workspace API ─┐
//!                                              └─▶ virtual workspace (authz, scope) ─┤
//!                                                                                    ▼
//!                         handlers (get, list, watch, create, update, patch, delete)
//!                                                                       │
//!        admission.admit ◀──────────────────────────────────────────────┤
//!                                                                       ▼
//!   GenericStore: prepare_for_create ─▶ set_defaults ─▶ schema/CEL ─▶ validate
//!        ─▶ prepare_for_store ─▶ admission.validate ─▶ Store (CAS) ─▶ after_write
//! ```

pub mod access;
pub mod admission;
pub mod endpoints;
pub mod meta;
pub mod registry;
pub mod request;
pub mod server;
pub mod storage;
