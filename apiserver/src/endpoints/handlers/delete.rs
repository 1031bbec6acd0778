//! `DELETE` of one object (finalizers, preconditions, dry run) and of a collection.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::Ctx;
use crate::meta::body::Body;
use crate::meta::status::{success_status, ApiError};
use crate::registry::objects;
use crate::registry::{Deleted, Preconditions};
use crate::storage::KeyValue;

fn options_error(field: &str, message: String) -> ApiError {
    ApiError::options_invalid("DeleteOptions", field, "FieldValueNotSupported", message)
}

fn parse_options(ctx: &Ctx) -> Result<Preconditions, ApiError> {
    let body: Value = if ctx.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else if ctx.body.starts_with(crate::meta::protobuf::MAGIC) {
        // client-go sends them as protobuf for the kinds it prefers protobuf for.
        crate::meta::protobuf::decode_object(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the DeleteOptions in the body could not be decoded: {e}"
            ))
        })?
    } else {
        serde_json::from_slice(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the DeleteOptions in the body could not be decoded: {e}"
            ))
        })?
    };
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the DeleteOptions in the body must be an object",
        ));
    }
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| ctx.query.get("propagationPolicy").map(str::to_string));
    if let Some(p) = policy.as_deref() {
        if !matches!(p, "Orphan" | "Background" | "Foreground") {
            return Err(options_error(
                "propagationPolicy",
                format!("Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""),
            ));
        }
    }
    if body.get("orphanDependents").is_some_and(|v| !v.is_null()) && policy.is_some() {
        return Err(options_error(
            "propagationPolicy",
            "Invalid value: \"\": orphanDependents and deletionPropagation cannot be both set"
                .into(),
        ));
    }
    if let Some(dry) = body.get("dryRun").and_then(Value::as_array) {
        for d in dry {
            if d.as_str() != Some("All") {
                return Err(options_error(
                    "dryRun",
                    format!("Unsupported value: {d}: supported values: \"All\""),
                ));
            }
        }
    }
    let pre = body.get("preconditions");
    Ok(Preconditions {
        uid: pre
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: pre
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

fn body_dry_run(ctx: &Ctx) -> Result<bool, ApiError> {
    let from_body = serde_json::from_slice::<Value>(&ctx.body)
        .ok()
        .and_then(|b| b.get("dryRun").and_then(Value::as_array).cloned())
        .is_some_and(|d| !d.is_empty());
    Ok(from_body || ctx.dry_run()?)
}

/// Deletes the object at `key` whose current state is `current`, through the generic store.
async fn delete_one(
    ctx: &Ctx,
    key: &str,
    current: KeyValue,
    opts: &Preconditions,
    dry_run: bool,
) -> Result<Deleted, ApiError> {
    let mut w = ctx.write(None)?;
    w.dry_run = dry_run;
    ctx.objects.delete(&w, key, current, opts).await
}

pub(super) async fn delete(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let opts = parse_options(ctx)?;
    let dry_run = body_dry_run(ctx)?;
    let current = ctx.current().await?;
    let key = ctx.key()?;
    match delete_one(ctx, &key, current, &opts, dry_run).await? {
        Deleted::Pending(bytes) => Ok(ctx.respond_object(StatusCode::OK, bytes)),
        // As kube-apiserver's generic store: an object that is gone (or would be, in a dry
        // run) is answered with a Status naming it; one that waits for finalizers, as itself.
        Deleted::DryRun(v) if objects::is_deleting(&v) && !objects::finalizers(&v).is_empty() => {
            Ok(ctx.respond_value(StatusCode::OK, &v))
        }
        Deleted::DryRun(v) => Ok(gone(ctx, &v)),
        Deleted::Gone(bytes) => Ok(gone(ctx, &objects::decode_stored(&bytes)?)),
    }
}

/// The Status of a deleted object `obj`.
fn gone(ctx: &Ctx, obj: &Value) -> Response<Body> {
    let uid = objects::meta_str(obj, "uid").unwrap_or("");
    ctx.respond_value_raw(StatusCode::OK, &success_status(ctx.gr(), ctx.name(), uid))
}

pub(super) async fn delete_collection(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let opts = parse_options(ctx)?;
    let dry_run = body_dry_run(ctx)?;
    let selection = ctx.selection()?;
    let (items, _rev) = ctx.objects.list_all(ctx.collection(), &selection).await?;
    let mut deleted = Vec::new();
    for kv in items {
        match delete_one(ctx, &kv.key, kv.clone(), &opts, dry_run).await {
            Ok(Deleted::Gone(b) | Deleted::Pending(b)) => deleted.push(objects::decode_stored(&b)?),
            Ok(Deleted::DryRun(v)) => deleted.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let mut metadata = json!({"resourceVersion": ctx.objects.current_revision().to_string()});
    if !ctx.resource.ty.strategic_merge_patch {
        // As a list of custom resources from kube-apiserver.
        metadata["continue"] = json!("");
    }
    let list = json!({
        "kind": ctx.resource.ty.list_kind,
        "apiVersion": ctx.resource.api_version,
        "metadata": metadata,
        "items": deleted,
    });
    Ok(ctx.respond_value_raw(StatusCode::OK, &list))
}
