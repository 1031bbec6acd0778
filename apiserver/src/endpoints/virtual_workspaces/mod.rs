//! The virtual workspaces: APIs computed over the workspaces rather than stored in one, each
//! served under `/services/<name>/...`, as kcp's virtual-workspace framework serves them. A
//! virtual workspace decides whether a request is its own, authorizes it by its own rules
//! (the server's filters have authenticated it, resolved its cluster and checked its
//! impersonation), and scopes what it reaches: which types, which objects, which admission.
//!
//! - `/services/apiexport/<cluster>/<export>/clusters/<name|*>`, where an export's owner
//!   reaches the workspaces bound to it, through its permission claims
//!   ([`ApiExportVirtualWorkspace`]);
//! - `/services/initializingworkspaces/<id>/...` and `terminatingworkspaces`, where an
//!   initializer (terminator) finishes its workspaces ([`LifecycleVirtualWorkspace`]);
//! - `/services/marketplace/...` and `/services/contentconfigurations/...`, Platform Mesh's
//!   read-only views ([`ViewsVirtualWorkspace`]).

mod apiexport;
mod lifecycle;
mod views;

use futures::future::BoxFuture;
use http::Response;

use crate::endpoints::exchange::Exchange;
use crate::meta::body::Body;
use crate::request::request_info::RequestInfo;

pub use apiexport::ApiExportVirtualWorkspace;
pub use lifecycle::LifecycleVirtualWorkspace;
pub use views::ViewsVirtualWorkspace;

/// One virtual workspace.
pub trait VirtualWorkspace: Send + Sync {
    /// Whether the request is under this virtual workspace's root path.
    fn matches(&self, info: &RequestInfo) -> bool;
    /// Serves a request it matches.
    fn serve(&self, x: Box<Exchange>) -> BoxFuture<'_, Response<Body>>;
}
