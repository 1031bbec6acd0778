//! `PUT` of an object or its status, and the read-modify-write loop that patches share.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::create::{decode_write_body, reconcile_namespace};
use super::Ctx;
use crate::body::Body;
use crate::objects::{self, meta_mut, meta_str, WritePart};
use crate::status::ApiError;
use crate::storage::StorageError;

/// Internal retries of an update that carries no resourceVersion precondition.
const UNCONDITIONAL_RETRIES: usize = 16;

pub(super) async fn update(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let body = decode_write_body(ctx)?;
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

/// The part of the object the request writes.
pub(super) fn write_part(ctx: &Ctx) -> WritePart {
    if ctx.req.subresource.as_deref() == Some("status") {
        WritePart::Status
    } else {
        WritePart::Main
    }
}

/// Reads the current object, computes the new one with `compute`, applies the update rules
/// and writes it with compare-and-swap, retrying on a lost race when the client gave no
/// resourceVersion. A write that changes nothing is not stored and emits no event.
pub(super) async fn write_loop(
    ctx: &mut Ctx,
    tracking: Tracking,
    mut compute: impl FnMut(&Value) -> Result<Value, ApiError>,
) -> Result<Response<Body>, ApiError> {
    let resource = ctx.resource.clone();
    let part = write_part(ctx);
    let dry_run = ctx.dry_run()?;
    for _ in 0..UNCONDITIONAL_RETRIES {
        let current = ctx.current().await?;
        // Decoding, patching and admitting a large object is long CPU work: off the async
        // workers, so other tenants' requests are not queued behind it.
        let work = current.value.len() + ctx.body.len() + ctx.extra_work;
        let state = ctx.state.clone();
        let (old, mut new, precondition) = state
            .heavy
            .run(work, || {
                let old = objects::decode_stored(&current.value)?;
                let mut new = compute(&resource.to_served(old.clone()))?;
                objects::check_type_meta(&mut new, &resource)?;
                let mut new = resource.to_storage(new);
                let precondition = match meta_str(&new, "resourceVersion") {
                    None | Some("") => false,
                    Some(rv) => {
                        if objects::parse_resource_version(rv)? != current.mod_revision {
                            return Err(ApiError::conflict(ctx.gr(), ctx.name()));
                        }
                        true
                    }
                };
                match meta_str(&new, "name") {
                    None | Some("") => {
                        meta_mut(&mut new).insert("name".into(), json!(ctx.name()));
                    }
                    Some(n) if n == ctx.name() => {}
                    Some(n) => {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({n}) does not match the name on the URL ({})",
                            ctx.name()
                        )))
                    }
                }
                reconcile_namespace(ctx, &mut new)?;
                objects::prepare_for_update(&mut new, &old, &resource, part)?;
                ctx.warnings.clear();
                ctx.admit(&mut new, Some(&old))?;
                if tracking == Tracking::Update {
                    ctx.record_update(Some(&old), &mut new)?;
                }
                Ok((old, new, precondition))
            })
            .await?;
        let cluster = ctx.cluster_name()?.to_string();
        ctx.state
            .tenancy
            .prepare_as(
                &resource,
                &cluster,
                &mut new,
                Some(&old),
                ctx.identity.as_deref(),
            )
            .await?;
        crate::authz::check_rbac_write(
            &ctx.state.rbac,
            &cluster,
            ctx.identity.as_deref(),
            &resource,
            &new,
        )
        .await?;
        ctx.check_size(&new)?;
        if objects::same_object(&new, &old) {
            return Ok(ctx.respond_object(StatusCode::OK, current.value));
        }
        let key = ctx.key()?;
        if objects::is_deleting(&new) && objects::finalizers(&new).is_empty() {
            // The last finalizer is gone: the object goes now.
            if dry_run {
                return Ok(ctx.respond_value(StatusCode::OK, &new));
            }
            return match ctx
                .state
                .store
                .delete(&key, current.mod_revision, objects::encoder(new))
                .await
            {
                Ok(event) => {
                    ctx.state.namespaces.object_removed(&cluster, &resource);
                    ctx.state
                        .tenancy
                        .after_write_bytes(&resource, &cluster, &event.value, true)
                        .await;
                    Ok(ctx.respond_object(StatusCode::OK, event.value))
                }
                Err(StorageError::Conflict { .. }) if !precondition => continue,
                Err(e) => Err(ctx.storage_error(e)),
            };
        }
        if dry_run {
            return Ok(ctx.respond_value(StatusCode::OK, &new));
        }
        match ctx
            .state
            .store
            .update(&key, current.mod_revision, objects::encoder(new))
            .await
        {
            Ok(kv) => {
                ctx.state
                    .tenancy
                    .after_write_bytes(&resource, &cluster, &kv.value, false)
                    .await;
                return Ok(ctx.respond_object(StatusCode::OK, kv.value));
            }
            Err(StorageError::Conflict { .. }) if !precondition => continue,
            Err(StorageError::NotFound(_)) if !precondition => continue,
            Err(e) => return Err(ctx.storage_error(e)),
        }
    }
    Err(ApiError::conflict(ctx.gr(), ctx.name()))
}
