//! The filters every request passes before the router, one per file, each a [`Handler`] that
//! does one thing and hands the exchange to the next, as kube-apiserver's handler chain. From
//! the outside in (the server assembles them in this order, `server::chain`):
//!
//! | filter | does |
//! |---|---|
//! | [`RequestLog`] | the request's span, its log line, its metrics and its `Audit-Id` header |
//! | [`MaxInFlight`] | 429 beyond `--max-requests-inflight` short requests |
//! | [`Compression`] | gzip for large answers to clients that accept it |
//! | [`Auditing`] | the audit events, from what the inner filters recorded |
//! | [`Timeout`] | 504 after `--request-timeout` for short requests |
//! | [`Recovery`] | a panic becomes a 500 |
//! | [`ValidPath`] | a path the server cannot read is answered before anything reads it |
//! | [`Authentication`] | who the request is from; 401 for credentials nobody accepts |
//! | [`ClusterResolution`] | the logical cluster a workspace path names |
//! | [`WorkspaceAuthentication`] | a refused token may be one of the workspace's own issuers' |
//! | [`Impersonation`] | `Impersonate-*` headers, authorized in the addressed workspace |
//! | [`WorkspaceReadiness`] | a workspace not Ready or marked inactive is refused |
//! | [`Authorization`] | non-resource paths; resource requests are authorized where they are served |
//!
//! [`Handler`]: crate::endpoints::exchange::Handler

mod audit;
mod authentication;
mod authorization;
mod cluster;
mod compression;
mod impersonation;
mod in_flight;
mod readiness;
mod recovery;
mod request_log;
mod timeout;
mod valid_path;
mod workspace_authentication;

pub use audit::Auditing;
pub use authentication::Authentication;
pub use authorization::Authorization;
pub use cluster::{ClusterResolution, Resolver};
pub use compression::{Compression, GZIP_MIN_BYTES};
pub use impersonation::Impersonation;
pub use in_flight::MaxInFlight;
pub use readiness::WorkspaceReadiness;
pub use recovery::Recovery;
pub use request_log::{RequestLog, REQUESTS_TARGET};
pub use timeout::Timeout;
pub use valid_path::ValidPath;
pub use workspace_authentication::WorkspaceAuthentication;
