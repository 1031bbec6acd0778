//! Reviews a client asks about itself: `SelfSubjectReview` (`kubectl auth whoami`),
//! `SelfSubjectAccessReview` (`kubectl auth can-i`) and `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`), answered from the RBAC objects of the addressed cluster.
//! Nothing is stored.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::auth::{Attributes, RbacPolicy, UserInfo};
use crate::body::Body;
use crate::dispatch::{error_response, json_response, AppState, Identity};
use crate::handlers::list_keys;
use crate::objects;
use crate::request_info::{ResourceRequest, Verb};
use crate::status::ApiError;

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

fn user_info(identity: &Identity) -> UserInfo {
    let mut groups = identity.groups.clone();
    if !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    UserInfo {
        name: identity.user.clone(),
        groups,
        extra: Default::default(),
    }
}

/// The RBAC policy of one logical cluster, read from the store.
pub async fn policy_of(state: &AppState, cluster: &str) -> Result<RbacPolicy, ApiError> {
    let mut sets: Vec<Vec<Value>> = Vec::new();
    for plural in [
        "roles",
        "clusterroles",
        "rolebindings",
        "clusterrolebindings",
    ] {
        let (items, _) = list_keys(
            state.store.as_ref(),
            &format!("/rbac.authorization.k8s.io/{plural}/{cluster}/"),
        )
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
        sets.push(
            items
                .iter()
                .filter_map(|kv| objects::decode_stored(&kv.value).ok())
                .collect(),
        );
    }
    Ok(RbacPolicy::from_objects(
        &sets[0], &sets[1], &sets[2], &sets[3],
    ))
}

/// Answers a self review.
pub async fn serve(
    state: &AppState,
    cluster: Option<&str>,
    identity: &Identity,
    rr: &ResourceRequest,
    body: &[u8],
) -> Response<Body> {
    if rr.verb != Verb::Create {
        return error_response(&ApiError::method_not_allowed(
            rr.verb.as_str(),
            &crate::status::GroupResource::new(rr.group.clone(), rr.resource.clone()),
        ));
    }
    // Typed clients (kubectl 1.27's among them) send these as protobuf.
    let decoded = if body.starts_with(b"k8s\x00") {
        crate::protobuf::decode_object(body).ok()
    } else {
        serde_json::from_slice::<Value>(body).ok()
    };
    let request = match decoded {
        Some(v) if v.is_object() => v,
        _ => {
            return error_response(&ApiError::bad_request(
                "the review in the body could not be decoded",
            ))
        }
    };
    let user = user_info(identity);
    let api_version = format!("{}/{}", rr.group, rr.version);
    let mut out = json!({"kind": request["kind"], "apiVersion": api_version, "metadata": {"creationTimestamp": null}});
    match rr.resource.as_str() {
        "selfsubjectreviews" => {
            out["kind"] = json!("SelfSubjectReview");
            out["status"] = json!({"userInfo": {"username": user.name, "groups": user.groups}});
        }
        resource => {
            let Some(cluster) = cluster else {
                return error_response(&ApiError::bad_request(
                    "reviews need one logical cluster, not /clusters/*",
                ));
            };
            let policy = match policy_of(state, cluster).await {
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

/// Authorizes a resource request with the RBAC objects of its cluster. `system:masters` skips the
/// lookup. Wildcard (`/clusters/*`) and virtual-workspace requests are for `system:masters` only
/// until workspace-level access and APIExport permissions are modelled.
pub async fn authorize(
    state: &AppState,
    cluster: Option<&str>,
    identity: &Identity,
    rr: &ResourceRequest,
    virtual_workspace: bool,
) -> Result<(), ApiError> {
    let user = user_info(identity);
    if user.is_master() {
        return Ok(());
    }
    let name = rr.name.clone().unwrap_or_default();
    let mut attrs = Attributes::resource(
        user,
        rr.verb.as_str(),
        &rr.group,
        &rr.resource,
        rr.namespace.as_deref(),
    )
    .with_name(&name);
    if let Some(sub) = &rr.subresource {
        attrs = attrs.with_subresource(sub);
    }
    let decision = match cluster {
        Some(c) if !virtual_workspace => policy_of(state, c).await?.authorize(&attrs),
        _ => crate::auth::Decision::Deny(
            "only system:masters may use wildcard and virtual workspace requests".into(),
        ),
    };
    if decision.is_allowed() {
        return Ok(());
    }
    let gr = crate::status::GroupResource::new(rr.group.clone(), rr.resource.clone());
    let mut e = ApiError::forbidden(crate::auth::forbidden_message(&attrs, decision.reason()));
    e.details = Some(Box::new(crate::status::Details {
        name,
        group: gr.group,
        kind: gr.resource,
        ..Default::default()
    }));
    Err(e)
}

/// Refuses a Role, ClusterRole or binding that would grant its writer permissions it does not
/// hold (unless it may `escalate` or `bind`), as kube-apiserver's RBAC admission does.
pub async fn check_rbac_write(
    state: &AppState,
    cluster: &str,
    identity: Option<&Identity>,
    resource: &crate::registry::Resource,
    obj: &Value,
) -> Result<(), ApiError> {
    if resource.ty.group != crate::auth::RBAC_GROUP {
        return Ok(());
    }
    let Some(identity) = identity else {
        return Ok(());
    };
    let user = user_info(identity);
    if user.is_master() {
        return Ok(());
    }
    let policy = policy_of(state, cluster).await?;
    let checked = if resource.ty.kind.ends_with("Binding") {
        crate::auth::check_binding_write(&user, &policy, obj)
    } else {
        crate::auth::check_role_write(&user, &policy, obj)
    };
    checked.map_err(|why| {
        ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: {why}",
            resource.gr,
            objects::name(obj)
        ))
    })
}
