//! The admission webhook server: `AdmissionReview` v1 on `/admission/validate` and
//! `/admission/mutate`, for Platform Mesh kinds held as CRDs in another cluster. It runs the same
//! admission code as the API server's own writes.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::meta::body::Body;
use crate::meta::response::{error_response, json_response};
use crate::meta::schema::FieldValidation;
use crate::meta::status::ApiError;
use crate::registry::catalog::Catalog;
use crate::registry::objects;
use crate::registry::GenericStore;
use crate::registry::{Resource, Strategy};
use crate::request::query::Query;

pub use crate::request::request_info::Review;

/// How long a review may take when the caller gives no `timeout` (kube-apiserver's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The parts of an `AdmissionRequest` this server reads.
struct Request {
    uid: String,
    group: String,
    version: String,
    kind: String,
    operation: String,
    object: Option<Value>,
    old_object: Option<Value>,
}

fn parse_request(body: &[u8]) -> Result<(String, Request), ApiError> {
    let review: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the AdmissionReview could not be decoded: {e}"))
    })?;
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if api_version != "admission.k8s.io/v1"
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Err(ApiError::bad_request(format!(
            "expected an admission.k8s.io/v1 AdmissionReview, got apiVersion {api_version:?}"
        )));
    }
    let req = review
        .get("request")
        .filter(|r| r.is_object())
        .ok_or_else(|| ApiError::bad_request("the AdmissionReview has no request"))?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let uid = s(req.get("uid"));
    if uid.is_empty() {
        return Err(ApiError::bad_request(
            "the AdmissionReview request has no uid",
        ));
    }
    let kind = req.get("kind");
    let object = req.get("object").filter(|o| o.is_object()).cloned();
    let old_object = req.get("oldObject").filter(|o| o.is_object()).cloned();
    Ok((
        api_version.to_string(),
        Request {
            uid,
            group: s(kind.and_then(|k| k.get("group"))),
            version: s(kind.and_then(|k| k.get("version"))),
            kind: s(kind.and_then(|k| k.get("kind"))),
            operation: s(req.get("operation")),
            object,
            old_object,
        },
    ))
}

fn review_response(api_version: &str, response: Value) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response}),
    )
}

/// What a review reads: the built-in types, and the store whose strategies judge them (the
/// same ones the server's own writes go through).
#[derive(Clone)]
pub struct Reviewer {
    /// The served types; reviews are of built-in ones.
    pub catalog: Arc<Catalog>,
    /// Holds each type's strategy.
    pub objects: Arc<GenericStore>,
}

fn find_resource(catalog: &Catalog, r: &Request) -> Option<Arc<Resource>> {
    catalog
        .builtin_view()
        .registry
        .resources()
        .iter()
        .find(|res| res.ty.group == r.group && res.ty.version == r.version && res.ty.kind == r.kind)
        .cloned()
}

/// Admission of one request: allowed or not, the Status, warnings and the defaulting patch.
fn decide(resource: &Resource, strategy: &dyn Strategy, review: Review, req: &Request) -> Value {
    let mut response = json!({"uid": req.uid, "allowed": true});
    let Some(original) = req.object.clone() else {
        return response;
    };
    let mut obj = original.clone();
    let old = if req.operation == "UPDATE" {
        req.old_object.as_ref()
    } else {
        None
    };
    let outcome = crate::registry::validate_object(
        resource,
        strategy,
        &mut obj,
        old,
        FieldValidation::Ignore,
    );
    if !outcome.warnings.is_empty() {
        response["warnings"] = json!(outcome.warnings);
    }
    match review {
        Review::Validate => {
            if !outcome.errors.is_empty() {
                let err =
                    crate::registry::invalid(resource, objects::name(&original), &outcome.errors);
                response["allowed"] = json!(false);
                response["status"] = err.to_status();
            }
        }
        Review::Mutate => {
            // Only defaults are patched in; pruning is the API server's business.
            let mut defaulted = original.clone();
            strategy.set_defaults(&mut defaulted);
            crate::meta::schema::default(&mut defaulted, &resource.ty.schema);
            let patch = json_patch::diff(&original, &defaulted);
            if !patch.0.is_empty() {
                let bytes = serde_json::to_vec(&patch).unwrap_or_default();
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
        }
    }
    response
}

/// Answers one review. Never lets a panic or a slow rule hold the caller past its timeout.
pub async fn serve(
    reviewer: Reviewer,
    review: Review,
    query: &Query,
    body: Bytes,
) -> Response<Body> {
    let (api_version, req) = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let Some(resource) = find_resource(&reviewer.catalog, &req) else {
        return review_response(
            &api_version,
            json!({"uid": req.uid, "allowed": true, "warnings": [format!(
                "platform-mesh does not admit {}/{} {}; check the webhook configuration's rules",
                req.group, req.version, req.kind
            )]}),
        );
    };
    if !matches!(req.operation.as_str(), "CREATE" | "UPDATE") {
        return review_response(&api_version, json!({"uid": req.uid, "allowed": true}));
    }
    let timeout = query
        .get("timeout")
        .and_then(crate::request::query::parse_go_duration)
        .unwrap_or(DEFAULT_TIMEOUT)
        .saturating_sub(Duration::from_millis(200))
        .max(Duration::from_millis(100));
    let uid = req.uid.clone();
    if body.len() <= INLINE_REVIEW_BYTES {
        // Small objects are decided right here: the rules are the fixed ones of our own types, so
        // their cost is bounded by the object's size, and a hop to the pool would cost more than
        // the review itself (tens of microseconds).
        let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decide(
                &resource,
                reviewer.objects.strategy(&resource).as_ref(),
                review,
                &req,
            )
        }));
        let response = decided.unwrap_or_else(|_| {
            refused(
                &uid,
                500,
                "InternalError",
                "admission failed unexpectedly; the object was not admitted",
            )
        });
        return review_response(&api_version, response);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decide(
                &resource,
                reviewer.objects.strategy(&resource).as_ref(),
                review,
                &req,
            )
        }));
        let _ = tx.send(decided.ok());
    });
    if admission_pool().send(job).is_err() {
        return error_response(&ApiError::internal("the admission workers are gone"));
    }
    let response = match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(Some(r))) => r,
        Ok(_) => refused(
            &uid,
            500,
            "InternalError",
            "admission failed unexpectedly; the object was not admitted",
        ),
        Err(_) => refused(
            &uid,
            504,
            "Timeout",
            "admission did not finish in time; the object was not admitted",
        ),
    };
    review_response(&api_version, response)
}

type Job = Box<dyn FnOnce() + Send>;

/// Reviews up to this size are decided on the request's own task; larger ones (whose list rules
/// may cost time in proportion to their size) go to the admission pool, where the caller's
/// timeout still holds.
const INLINE_REVIEW_BYTES: usize = 32 * 1024;

/// A few threads (one per core) that run admission off the async workers: a slow rule then
/// delays only its own review, which is answered when its caller's timeout runs out, and a
/// burst of reviews never spawns a thread each.
fn admission_pool() -> &'static std::sync::mpsc::Sender<Job> {
    static POOL: std::sync::OnceLock<std::sync::mpsc::Sender<Job>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2);
        for i in 0..threads {
            let rx = rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("admission-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
        }
        tx
    })
}

fn refused(uid: &str, code: u16, reason: &'static str, message: &str) -> Value {
    json!({"uid": uid, "allowed": false, "status": ApiError::new(code, reason, message).to_status()})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_reviews_are_bad_requests() {
        for body in [
            &b"not json"[..],
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}"#,
        ] {
            let err = parse_request(body).err().map(|e| e.code);
            assert_eq!(err, Some(400), "{}", String::from_utf8_lossy(body));
        }
    }
}
