//! The router, innermost of the handler chain: it only routes. The admission webhooks go to
//! the webhook server, a request under a virtual workspace's root path to that virtual
//! workspace, and everything else to the addressed workspace's own API.

use std::sync::Arc;

use http::{Method, Response};

use crate::endpoints::exchange::{self, Exchange, Handler};
use crate::endpoints::virtual_workspaces::VirtualWorkspace;
use crate::endpoints::webhook;
use crate::endpoints::workspaces::Workspaces;
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::{ApiError, GroupResource};
use crate::request::request_info::{ResourceRequest, Target, Verb};

/// Routes each request to what serves it.
pub struct Router {
    /// The workspaces' own APIs.
    pub workspaces: Arc<Workspaces>,
    /// The virtual workspaces, each asked in turn whether a request is its own.
    pub virtual_workspaces: Vec<Box<dyn VirtualWorkspace>>,
    /// The admission webhook server.
    pub webhook: webhook::Reviewer,
}

impl Handler for Router {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        if let Target::Admission(review) = &x.info.target {
            let review = *review;
            return Box::pin(self.admission(x, review)).await;
        }
        match self
            .virtual_workspaces
            .iter()
            .find(|vw| vw.matches(&x.info))
        {
            Some(vw) => vw.serve(x).await,
            // Boxed: the handlers' future is several KiB, and every filter's future would hold
            // it inline and move it once more; boxed here, they hold a pointer.
            None => Box::pin(self.workspaces.serve(x)).await,
        }
    }
}

impl Router {
    /// An AdmissionReview sent to the webhooks.
    async fn admission(
        &self,
        x: Box<Exchange>,
        review: crate::request::request_info::Review,
    ) -> Response<Body> {
        x.note(|r| {
            r.verb = "admit".to_string();
            r.resource = Some(ResourceRequest {
                group: "admission.k8s.io".into(),
                version: "v1".into(),
                resource: "admissionreviews".into(),
                namespace: None,
                name: None,
                subresource: None,
                verb: Verb::Create,
            });
        });
        if x.parts.method != Method::POST {
            return error_response(&ApiError::method_not_allowed(
                x.parts.method.as_str(),
                &GroupResource::new("admission.k8s.io", "admissionreviews"),
            ));
        }
        match exchange::read_body(x.body).await {
            Ok(body) => webhook::serve(self.webhook.clone(), review, &x.query, body).await,
            Err(e) => error_response(&e),
        }
    }
}
