//! Kubernetes-API serving machinery: the HTTPS server, the request path, the registry of served
//! types and the storage beneath them, with kcp-style tenancy (logical clusters, workspaces).
//!
//! A request runs down these layers:
//!
//! - [`server`] accepts the connection over TLS (HTTP/1.1 and HTTP/2) and reads the client
//!   certificate the connection presented.
//! - [`dispatch`] guards the request (in-flight limit: 429; timeout: 504; panic guard: 500), then
//!   authenticates it ([`authn`]), resolves the workspace path to a logical cluster with the path
//!   index in [`tenancy`], applies impersonation and authorization ([`authz`]), and routes it.
//! - The endpoints: [`handlers`] (one file per verb, over a narrow
//!   [`handlers::ResourceScope`], never the whole server state), the [`discovery`] and
//!   [`openapi`] documents, [`reviews`] (access and token reviews) and [`webhook`] (admission
//!   webhooks).
//! - A write's mutating [`admission`] (the [`namespaces`] lifecycle), then the
//!   [`registry::GenericStore`]: the server's metadata, `generateName`, the type's
//!   [`registry::Strategy`] (the Platform Mesh [`rules`], a legacy token Secret, RBAC
//!   escalation, namespaces, the tenancy types), the structural [`schema`] and CEL rules,
//!   validating admission (kcp's path annotation, the per-workspace object [`limits`]), the
//!   compare-and-swap loop, and the one mapping of storage errors to Status.
//! - The [`registry`] of served types (built in, [`kcp_types`], CRDs, bound APIs), one view per
//!   logical cluster in the [`catalog`].
//! - [`storage`]: the MVCC key-value store (memory, redb or etcd backend) behind the watch cache.
//!
//! ```text
//! request ─▶ server ─▶ dispatch: authn ─▶ tenancy (path) ─▶ authz ─▶ handlers
//!                                                                       │
//!        admission.admit ◀──────────────────────────────────────────────┤
//!                                                                       ▼
//!   GenericStore: prepare_for_create ─▶ set_defaults ─▶ schema/CEL ─▶ validate
//!        ─▶ prepare_for_store ─▶ admission.validate ─▶ Store (CAS) ─▶ after_write
//! ```
//!
//! `tests/layers.rs` checks that imports run down the layers only (the modules of each layer are
//! listed in that test):
//!
//! ```text
//! meta ← request ← storage ← registry ← admission ← tenancy/authn/authz ← endpoints ← server
//! ```
//!
//! `meta` is the shared vocabulary (status, names, selectors, schema, ...) and `request` what is
//! read from the request itself (request_info, query, negotiation, identity).

pub mod admission;
pub mod apply;
pub mod audit;
pub mod auth;
pub mod authn;
pub mod authz;
pub mod body;
pub mod budget;
pub mod catalog;
pub mod client;
pub mod discovery;
pub mod dispatch;
pub mod field_error;
pub mod handlers;
pub mod heavy;
pub mod identity;
pub mod jsonpath;
pub mod kcp_types;
pub mod lifecycle_vw;
pub mod limits;
pub mod metrics;
pub mod names;
pub mod namespaces;
pub mod negotiation;
pub mod objects;
pub mod openapi;
pub mod protobuf;
pub mod query;
pub mod registry;
pub mod request_info;
pub mod response;
pub mod reviews;
pub mod rules;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod serviceaccounts;
pub mod status;
pub mod storage;
pub mod strategic_merge;
pub mod table;
pub mod tenancy;
pub mod views;
pub mod webhook;
pub mod workspace_authn;
