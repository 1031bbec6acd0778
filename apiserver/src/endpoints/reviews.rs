//! The reviews served here: those a client asks about itself (`SelfSubjectReview` for
//! `kubectl auth whoami`, `SelfSubjectAccessReview` for `kubectl auth can-i`,
//! `SelfSubjectRulesReview` for `kubectl auth can-i --list`), answered from the RBAC objects of
//! the addressed cluster, and TokenRequest, TokenReview and SubjectAccessReview. Nothing is
//! stored.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::access::authz::{user_info, Rbac};
use crate::access::rbac::{Attributes, UserInfo};
use crate::meta::body::Body;
use crate::meta::response::{error_response, json_response};
use crate::meta::status::ApiError;
use crate::request::identity::Identity;
use crate::request::request_info::{ResourceRequest, Verb};

/// Whether a resource request is one of the self reviews.
pub fn is_review(rr: &ResourceRequest) -> bool {
    matches!(
        (rr.group.as_str(), rr.resource.as_str()),
        ("authentication.k8s.io", "selfsubjectreviews")
            | (
                "authorization.k8s.io",
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            )
    )
}

/// Answers a self review.
pub async fn serve(
    rbac: &Rbac,
    cluster: Option<&str>,
    identity: &Identity,
    rr: &ResourceRequest,
    body: &[u8],
) -> Response<Body> {
    if rr.verb != Verb::Create {
        return error_response(&ApiError::method_not_allowed(
            rr.verb.as_str(),
            &crate::meta::status::GroupResource::new(rr.group.clone(), rr.resource.clone()),
        ));
    }
    let Some(request) = crate::meta::protobuf::decode_json_or_protobuf(body) else {
        return error_response(&ApiError::bad_request(
            "the review in the body could not be decoded",
        ));
    };
    let user = user_info(identity, cluster);
    let api_version = format!("{}/{}", rr.group, rr.version);
    let mut out = json!({"kind": request["kind"], "apiVersion": api_version, "metadata": {"creationTimestamp": null}});
    match rr.resource.as_str() {
        "selfsubjectreviews" => {
            out["kind"] = json!("SelfSubjectReview");
            let mut info = crate::access::authn::user_json(identity);
            info["username"] = json!(user.name);
            info["groups"] = json!(user.groups);
            out["status"] = json!({ "userInfo": info });
        }
        resource => {
            let Some(cluster) = cluster else {
                return error_response(&ApiError::bad_request(
                    "reviews need one logical cluster, not /clusters/*",
                ));
            };
            let policy = match rbac.policy_of(cluster).await {
                Ok(p) => p,
                Err(e) => return error_response(&e),
            };
            out["spec"] = request["spec"].clone();
            if resource == "selfsubjectrulesreviews" {
                out["kind"] = json!("SelfSubjectRulesReview");
                let ns = request["spec"]["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty());
                out["status"] = policy.rules_review_status(&user, ns);
            } else {
                out["kind"] = json!("SelfSubjectAccessReview");
                let Some(attrs) = Attributes::from_access_review_spec(user, &request["spec"])
                else {
                    return error_response(&ApiError::bad_request(
                        "spec.resourceAttributes or spec.nonResourceAttributes is required",
                    ));
                };
                let decision = policy.authorize(&attrs);
                let mut status = json!({"allowed": decision.is_allowed()});
                let reason = decision.reason();
                if !reason.is_empty() {
                    status["reason"] = json!(reason);
                }
                out["status"] = status;
            }
        }
    }
    json_response(StatusCode::CREATED, &out)
}

/// Whether a resource request is answered here rather than by the storage handlers:
/// TokenRequest, TokenReview and SubjectAccessReview (after authorization).
pub fn is_special(rr: &ResourceRequest) -> bool {
    matches!(
        (
            rr.group.as_str(),
            rr.resource.as_str(),
            rr.subresource.as_deref()
        ),
        ("", "serviceaccounts", Some("token"))
            | ("authentication.k8s.io", "tokenreviews", None)
            | ("authorization.k8s.io", "subjectaccessreviews", None)
    )
}

/// Serves the requests of [`is_special`].
pub async fn serve_special(
    rbac: &Rbac,
    authn: &crate::access::authn::Authn,
    objects: crate::access::serviceaccounts::Objects<'_>,
    cluster: Option<&str>,
    rr: &ResourceRequest,
    body: &[u8],
) -> Response<Body> {
    let gr = crate::meta::status::GroupResource::new(rr.group.clone(), rr.resource.clone());
    let Some(cluster) = cluster else {
        return error_response(&ApiError::method_not_allowed(rr.verb.as_str(), &gr));
    };
    if rr.resource == "serviceaccounts" {
        return crate::access::serviceaccounts::token_request(
            objects,
            authn.service_accounts.as_deref(),
            cluster,
            rr,
            body,
        )
        .await;
    }
    if rr.verb != Verb::Create || rr.name.is_some() {
        return error_response(&ApiError::method_not_allowed(rr.verb.as_str(), &gr));
    }
    let kind = if rr.resource == "tokenreviews" {
        "TokenReview"
    } else {
        "SubjectAccessReview"
    };
    let request = match crate::access::serviceaccounts::decode_request(body, kind) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let spec = &request["spec"];
    let status = if kind == "TokenReview" {
        let Some(token) = spec["token"].as_str().filter(|t| !t.is_empty()) else {
            return error_response(&ApiError::invalid(
                kind,
                &rr.group,
                "",
                vec![crate::meta::status::Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "spec.token".into(),
                }],
            ));
        };
        let audiences: Vec<String> = crate::registry::objects::str_list(spec.get("audiences"));
        crate::access::authn::review_token(authn, objects, cluster, token, &audiences).await
    } else {
        let groups: Vec<String> = crate::registry::objects::str_list(spec.get("groups"));
        let extra = serde_json::from_value(spec["extra"].clone()).unwrap_or_default();
        let user = UserInfo {
            name: spec["user"].as_str().unwrap_or_default().to_string(),
            groups,
            extra,
        };
        if user.name.is_empty() && user.groups.is_empty() {
            return error_response(&ApiError::bad_request(
                "spec.user or spec.groups is required",
            ));
        }
        let Some(attrs) = Attributes::from_access_review_spec(user, spec) else {
            return error_response(&ApiError::bad_request(
                "spec.resourceAttributes or spec.nonResourceAttributes is required",
            ));
        };
        let policy = match rbac.policy_of(cluster).await {
            Ok(p) => p,
            Err(e) => return error_response(&e),
        };
        let decision = policy.authorize(&attrs);
        let mut status = json!({"allowed": decision.is_allowed()});
        if !decision.reason().is_empty() {
            status["reason"] = json!(decision.reason());
        }
        status
    };
    let mut out = request.clone();
    out["kind"] = json!(kind);
    out["apiVersion"] = json!(format!("{}/{}", rr.group, rr.version));
    if !out["metadata"].is_object() {
        out["metadata"] = json!({});
    }
    out["metadata"]["creationTimestamp"] = Value::Null;
    out["status"] = status;
    json_response(StatusCode::CREATED, &out)
}
