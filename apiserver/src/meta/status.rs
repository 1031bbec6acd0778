//! API errors and their `metav1.Status` wire form.
//!
//! Every error that reaches a client goes through [`ApiError`], so codes, reasons and messages follow kube-apiserver.

use std::fmt;

use serde_json::{json, Value};

/// A group and a plural resource, printed the way Kubernetes qualifies resources (`widgets.example.com`, `configmaps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupResource {
    /// The API group; empty for the core group.
    pub group: String,
    /// The plural resource name (`configmaps`, `widgets`).
    pub resource: String,
}

impl GroupResource {
    /// A group resource from a group and a plural resource name.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        GroupResource {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// One cause of an error (`details.causes[]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    /// The machine-readable cause type (`FieldValueRequired`, `FieldValueInvalid`).
    pub reason: String,
    /// The human-readable description of the cause.
    pub message: String,
    /// The path of the offending field (`metadata.name`, `spec.a`); empty when the cause names no field.
    pub field: String,
}

/// An error answered to a client as a `metav1.Status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status code, also the Status's `code`.
    pub code: u16,
    /// The `metav1.StatusReason` (`NotFound`, `Conflict`, ...); empty leaves `reason` out of the Status.
    pub reason: &'static str,
    /// The human-readable message of the Status.
    pub message: String,
    /// Boxed: errors travel through `Result`s everywhere, and most carry no details.
    pub details: Option<Box<Details>>,
}

/// `metav1.StatusDetails`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Details {
    /// The name of the object the error is about.
    pub name: String,
    /// The API group of the object.
    pub group: String,
    /// The kind, or for errors about a named resource (not found, already exists, conflict) its
    /// plural resource name, as kube-apiserver fills it.
    pub kind: String,
    /// The UID of the object, when known.
    pub uid: String,
    /// The individual causes, such as the field errors of a validation failure.
    pub causes: Vec<Cause>,
    /// How long the client should wait before retrying; also sent as the `Retry-After` header.
    pub retry_after_seconds: Option<u32>,
}

/// The message of [`ApiError::workspace_forbidden`]: it says both what may be wrong (a
/// mistyped path, or a workspace not shared with the caller) without telling which.
pub const WORKSPACE_FORBIDDEN: &str =
    "workspace access not permitted: the workspace does not exist, or you may not access it";

impl ApiError {
    /// An error with an HTTP code, a Status reason and a message, without details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// Attaches `details`.
    pub fn with_details(mut self, details: Details) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    fn resource_details(gr: &GroupResource, name: &str) -> Details {
        Details {
            name: name.to_string(),
            group: gr.group.clone(),
            kind: gr.resource.clone(),
            ..Details::default()
        }
    }

    /// A 400 `BadRequest`: the request itself is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// A 401 `Unauthorized`: the request carries no credentials the server accepts.
    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// The one answer for a workspace the caller may not reach, whether it exists or not (as
    /// kcp answers absent and forbidden alike), so that nothing about other tenants leaks.
    pub fn workspace_forbidden() -> Self {
        Self::forbidden(WORKSPACE_FORBIDDEN)
    }

    /// A 403 `Forbidden` refusing a write of object `name` of `gr` (an admission plugin's
    /// answer): `<resource>.<group> "<name>" is forbidden: <why>`, with the object's details.
    pub fn forbidden_object(gr: &GroupResource, name: &str, why: impl std::fmt::Display) -> Self {
        ApiError::forbidden(format!("{gr} {name:?} is forbidden: {why}"))
            .with_details(Self::resource_details(gr, name))
    }

    /// A 403 `Forbidden`: the caller may not do what it asked.
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }

    /// A 404 `NotFound` for the object `name` of resource `gr`.
    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(404, "NotFound", format!("{gr} \"{name}\" not found"))
            .with_details(Self::resource_details(gr, name))
    }

    /// A 404 for a URL that names no served resource.
    pub fn path_not_found() -> Self {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Details::default())
    }

    /// A 409 `AlreadyExists`: a create for a name that is already taken.
    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{gr} \"{name}\" already exists"),
        )
        .with_details(Self::resource_details(gr, name))
    }

    /// The optimistic-lock failure of an update or patch.
    pub fn conflict(gr: &GroupResource, name: &str) -> Self {
        Self::conflict_with(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// A 409 `Conflict` on the object `name` of resource `gr`, with `why` as the reason it cannot be done.
    pub fn conflict_with(gr: &GroupResource, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} \"{name}\": {why}"),
        )
        .with_details(Self::resource_details(gr, name))
    }

    /// A 410 `Expired`, as for a list or watch from a resourceVersion that is no longer available.
    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    /// A 405 `MethodNotAllowed`: the resource does not support `verb`.
    pub fn method_not_allowed(verb: &str, gr: &GroupResource) -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{verb} is not supported on resources of kind \"{gr}\""),
        )
    }

    /// A 422 for invalid request options (`CreateOptions`, `ListOptions`, `PatchOptions`, …), in
    /// kube-apiserver's words: `<options>.meta.k8s.io "" is invalid: <field>: <message>`.
    pub fn options_invalid(
        options: &str,
        field: &str,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        ApiError::invalid(
            options,
            "meta.k8s.io",
            "",
            vec![Cause {
                reason: reason.into(),
                message: message.into(),
                field: field.into(),
            }],
        )
    }

    /// A 405 for a method the URL has no route for (a PUT of a collection, a POST of a
    /// namespaced kind outside a namespace), in kube-apiserver's words.
    pub fn method_not_routed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(Details::default())
    }

    /// A 406 `NotAcceptable`: no media type in the `Accept` header can be served.
    pub fn not_acceptable(accept: &str) -> Self {
        ApiError::new(
            406,
            "NotAcceptable",
            format!("only the following media types are accepted: application/json, application/yaml; got {accept:?}"),
        )
    }

    /// A 415 `UnsupportedMediaType`: the request body's `Content-Type` is not one of `supported`.
    pub fn unsupported_media_type(content_type: &str, supported: &[&str]) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}; got {content_type:?}",
                supported.join(", ")
            ),
        )
    }

    /// A 413 `RequestEntityTooLarge`: the request body exceeds `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// The same error with another message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// A 429 `TooManyRequests` that asks the client to retry after `retry_after` seconds.
    pub fn too_many_requests(retry_after: u32) -> Self {
        ApiError::new(
            429,
            "TooManyRequests",
            "too many requests, please try again later",
        )
        .with_details(Details {
            retry_after_seconds: Some(retry_after),
            ..Details::default()
        })
    }

    /// A watch cut off because its client read too slowly: 429, so clients (client-go's
    /// reflector, kube-rs' watcher) back off and watch again from their last resourceVersion.
    pub fn slow_watcher(message: impl Into<String>) -> Self {
        ApiError::new(429, "TooManyRequests", message).with_details(Details {
            retry_after_seconds: Some(1),
            ..Details::default()
        })
    }

    /// A 500 `InternalError`: the server failed, not the request.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message)
    }

    /// A 504 `Timeout`: the request did not complete in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        ApiError::new(504, "Timeout", message)
    }

    /// A 422 for an object: `<Kind>.<group> "<name>" is invalid: <causes>`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let rendered: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        let summary = match rendered.len() {
            1 => rendered[0].clone(),
            _ => format!("[{}]", rendered.join(", ")),
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {summary}"),
        )
        .with_details(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            causes,
            ..Details::default()
        })
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let mut details = serde_json::Map::new();
            if !d.name.is_empty() {
                details.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                details.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), json!(d.kind));
            }
            if !d.uid.is_empty() {
                details.insert("uid".into(), json!(d.uid));
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| {
                        // As metav1.StatusCause: an empty field is left out.
                        let mut cause = json!({"reason": c.reason, "message": c.message});
                        if !c.field.is_empty() {
                            cause["field"] = json!(c.field);
                        }
                        cause
                    })
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            if let Some(r) = d.retry_after_seconds {
                details.insert("retryAfterSeconds".into(), json!(r));
            }
            status["details"] = Value::Object(details);
        }
        if self.reason.is_empty() {
            if let Some(m) = status.as_object_mut() {
                m.remove("reason");
            }
        }
        status
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// A `Status` of success, as returned by a delete that removed the object right away.
pub fn success_status(gr: &GroupResource, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": gr.resource, "uid": uid});
    if !gr.group.is_empty() {
        details["group"] = json!(gr.group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_qualifies_group() {
        let e = ApiError::not_found(
            &GroupResource::new("core.platform-mesh.io", "platformmeshes"),
            "pm",
        );
        let s = e.to_status();
        assert_eq!(
            s["message"],
            "platformmeshes.core.platform-mesh.io \"pm\" not found"
        );
        assert_eq!(s["details"]["kind"], "platformmeshes");
        assert_eq!(s["code"], 404);
        let core = ApiError::not_found(&GroupResource::new("", "configmaps"), "x");
        assert_eq!(core.message, "configmaps \"x\" not found");
    }

    #[test]
    fn invalid_lists_causes() {
        let one = ApiError::invalid(
            "ConfigMap",
            "",
            "x",
            vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "metadata.name".into(),
            }],
        );
        assert_eq!(
            one.message,
            "ConfigMap \"x\" is invalid: metadata.name: Required value"
        );
        let two = ApiError::invalid(
            "Provider",
            "providers.platform-mesh.io",
            "p",
            vec![
                Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "spec.a".into(),
                },
                Cause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value: 5".into(),
                    field: "spec.b".into(),
                },
            ],
        );
        assert_eq!(
            two.message,
            "Provider.providers.platform-mesh.io \"p\" is invalid: [spec.a: Required value, spec.b: Invalid value: 5]"
        );
        assert_eq!(two.to_status()["details"]["causes"][1]["field"], "spec.b");
        assert_eq!(two.to_status()["details"]["kind"], "Provider");
    }

    #[test]
    fn conflict_message() {
        let e = ApiError::conflict(&GroupResource::new("", "configmaps"), "a");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
        );
        assert_eq!(e.reason, "Conflict");
    }
}
