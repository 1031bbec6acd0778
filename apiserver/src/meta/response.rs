//! Building responses: bytes with a content type, JSON values, text, and the `metav1.Status`
//! of an error (with `Retry-After` when the error asks for one).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::Value;

use crate::meta::body::Body;
use crate::meta::status::ApiError;

/// A response with the given body and content type.
pub fn bytes_response(code: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Body::from_bytes(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON response of a value.
pub fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    bytes_response(
        code,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

/// A plain-text response.
pub fn text_response(code: StatusCode, s: String) -> Response<Body> {
    bytes_response(code, "text/plain; charset=utf-8", Bytes::from(s))
}

/// The Status response of an error.
pub fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, &e.to_status());
    if let Some(retry) = e.details.as_ref().and_then(|d| d.retry_after_seconds) {
        if let Ok(v) = HeaderValue::from_str(&retry.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}
