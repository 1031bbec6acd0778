//! `PUT` of an object or its status, and the read-modify-write that patches share.

use http::{Response, StatusCode};
use serde_json::Value;

use super::create::decode_write_body;
use super::Ctx;
use crate::meta::body::Body;
use crate::meta::status::ApiError;

pub(super) async fn update(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let body = decode_write_body(ctx)?;
    // As kube-apiserver: only the built-in kinds take an update without a resourceVersion;
    // custom resources (and CRDs) must say which version they replace.
    let unconditional = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    if unconditional && !ctx.resource.ty.strategic_merge_patch {
        return Err(ApiError::invalid(
            &ctx.resource.ty.plural,
            &ctx.resource.ty.group,
            ctx.req.name.as_deref().unwrap_or(""),
            vec![crate::meta::status::Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: 0: must be specified for an update".into(),
                field: "metadata.resourceVersion".into(),
            }],
        ));
    }
    write_loop(ctx, Tracking::Update, |_current| Ok(body.clone())).await
}

/// How a write accounts for field ownership.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tracking {
    /// A plain write: the changed fields become the manager's (operation Update).
    Update,
    /// Server-side apply: `compute` already set managedFields.
    Apply,
}

/// Writes the named object's new state, computed by `compute` from the current one, through
/// the generic store's compare-and-swap loop, and answers with the result.
pub(super) async fn write_loop(
    ctx: &mut Ctx,
    tracking: Tracking,
    compute: impl FnMut(&Value) -> Result<Value, ApiError> + Send,
) -> Result<Response<Body>, ApiError> {
    let manager = match tracking {
        Tracking::Update => Some(ctx.field_manager()?),
        Tracking::Apply => None,
    };
    let written = {
        let w = ctx.write(manager.as_deref())?;
        ctx.objects
            .update(&w, ctx.admission.as_ref(), compute)
            .await?
    };
    Ok(ctx.respond_written(StatusCode::OK, written))
}
