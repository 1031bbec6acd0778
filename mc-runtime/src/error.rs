//! How a failed reconcile is retried: every reconciler error says whether it is transient
//! (retried with per-item backoff) or fatal (retrying the same input cannot help).

use std::convert::Infallible;

use super::cache::CacheError;

/// The error of a [`Reconciler`](super::Reconciler), classified for the retry path.
///
/// A transient error (the default) is retried with the controller's per-item exponential
/// backoff, as every error was before the classification existed. A fatal error is logged and
/// its backoff forgotten, and the request is not requeued: as controller-runtime's
/// `TerminalError`, it waits for the next event on the object or on what the controller
/// watches, since the same input would only fail again.
pub trait ReconcileError: std::error::Error + Send + 'static {
    /// Whether retrying the same request later may succeed (`true` unless overridden).
    fn is_transient(&self) -> bool {
        true
    }
}

impl ReconcileError for Infallible {}

impl ReconcileError for kube::Error {
    fn is_transient(&self) -> bool {
        kube_error_is_transient(self)
    }
}

impl ReconcileError for CacheError {
    fn is_transient(&self) -> bool {
        match self {
            CacheError::NotSynced { .. } => true,
            CacheError::Decode(_) | CacheError::NoPrimary(_) => false,
        }
    }
}

/// Whether a Kubernetes client error may go away on retry.
///
/// Fatal: API answers 400 Bad Request, 403 Forbidden, 404 Not Found and 422 Unprocessable
/// Entity, and requests that cannot be built (configuration, TLS or proxy setup, a malformed
/// request). Everything else is transient: 409 Conflict, 429 Too Many Requests, 5xx, other
/// statuses, transport and stream errors, undecodable answers.
pub fn kube_error_is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => !matches!(status.code, 400 | 403 | 404 | 422),
        kube::Error::BuildRequest(_)
        | kube::Error::HttpError(_)
        | kube::Error::InferConfig(_)
        | kube::Error::InferKubeconfig(_)
        | kube::Error::ProxyProtocolUnsupported { .. }
        | kube::Error::ProxyProtocolDisabled { .. }
        | kube::Error::TlsRequired => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("x", "y").with_code(code),
        ))
    }

    #[test]
    fn kube_errors_are_classified_by_status() {
        for code in [409, 429, 500, 503, 410] {
            assert!(kube_error_is_transient(&api(code)), "{code}");
        }
        for code in [400, 403, 404, 422] {
            assert!(!kube_error_is_transient(&api(code)), "{code}");
        }
        assert!(!kube_error_is_transient(&kube::Error::TlsRequired));
    }
}
