//! `DELETE` of one object (finalizers, preconditions, dry run) and of a collection.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::list::{collect_matching, ListFilter};
use super::Ctx;
use crate::body::Body;
use crate::objects::{self, meta_mut};
use crate::status::{success_status, ApiError, Cause};
use crate::storage::{KeyValue, StorageError};

/// What a delete request asked for (`DeleteOptions` from the body and the query).
#[derive(Debug, Default)]
struct DeleteOptions {
    uid: Option<String>,
    resource_version: Option<String>,
}

fn options_error(field: &str, message: String) -> ApiError {
    ApiError::invalid(
        "DeleteOptions",
        "meta.k8s.io",
        "",
        vec![Cause {
            reason: "FieldValueNotSupported".into(),
            message,
            field: field.into(),
        }],
    )
}

fn parse_options(ctx: &Ctx) -> Result<DeleteOptions, ApiError> {
    let body: Value = if ctx.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
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
                format!("Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""),
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
    Ok(DeleteOptions {
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

/// The outcome of deleting one object.
enum Deleted {
    /// Removed from storage; the final state as watchers saw it.
    Gone(bytes::Bytes),
    /// Marked for deletion, waiting for finalizers.
    Pending(bytes::Bytes),
    /// What a dry run would have done.
    DryRun(Value),
}

/// Deletes the object at `key` whose current state is `current`.
async fn delete_one(
    ctx: &Ctx,
    key: &str,
    mut current: KeyValue,
    opts: &DeleteOptions,
    dry_run: bool,
) -> Result<Deleted, ApiError> {
    let resource = ctx.resource.clone();
    loop {
        let mut obj = objects::decode_stored(&current.value)?;
        let name = objects::name(&obj).to_string();
        let uid = objects::meta_str(&obj, "uid").unwrap_or("").to_string();
        if let Some(want) = &opts.uid {
            if *want != uid {
                return Err(ApiError::conflict_with(
                    ctx.gr(),
                    &name,
                    &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
                ));
            }
        }
        if let Some(want) = &opts.resource_version {
            if *want != current.mod_revision.to_string() {
                return Err(ApiError::conflict_with(
                    ctx.gr(),
                    &name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {}",
                        current.mod_revision
                    ),
                ));
            }
        }
        let is_namespace = resource.ty.group.is_empty() && resource.ty.plural == "namespaces";
        if is_namespace || !objects::finalizers(&obj).is_empty() {
            if objects::is_deleting(&obj) {
                return Ok(Deleted::Pending(current.value));
            }
            let m = meta_mut(&mut obj);
            m.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if is_namespace {
                obj["status"] = json!({"phase": "Terminating"});
            }
            if dry_run {
                return Ok(Deleted::DryRun(obj));
            }
            match ctx
                .state
                .store
                .update(key, current.mod_revision, objects::encoder(obj))
                .await
            {
                Ok(kv) => {
                    if is_namespace {
                        ctx.state.namespaces.terminate(ctx.cluster_name()?, &name);
                    }
                    ctx.state
                        .tenancy
                        .after_write_bytes(&resource, ctx.cluster_name()?, &kv.value, false)
                        .await;
                    return Ok(Deleted::Pending(kv.value));
                }
                Err(StorageError::Conflict { .. }) => {}
                Err(e) => return Err(ctx.storage_error(e)),
            }
        } else {
            if dry_run {
                return Ok(Deleted::DryRun(obj));
            }
            match ctx
                .state
                .store
                .delete(key, current.mod_revision, objects::encoder(obj))
                .await
            {
                Ok(event) => {
                    ctx.state
                        .namespaces
                        .object_removed(ctx.cluster_name()?, &resource);
                    ctx.state
                        .tenancy
                        .after_write_bytes(&resource, ctx.cluster_name()?, &event.value, true)
                        .await;
                    return Ok(Deleted::Gone(event.value));
                }
                Err(StorageError::Conflict { .. }) => {}
                Err(e) => return Err(ctx.storage_error(e)),
            }
        }
        // Lost a race: read again and retry.
        current = match ctx.state.store.get(key).await {
            Ok(Some(kv)) => kv,
            Ok(None) => return Err(ApiError::not_found(ctx.gr(), ctx.name())),
            Err(e) => return Err(ctx.storage_error(e)),
        };
    }
}

pub(super) async fn delete(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let opts = parse_options(ctx)?;
    let dry_run = body_dry_run(ctx)?;
    let current = ctx.current().await?;
    let key = ctx.key()?;
    match delete_one(ctx, &key, current, &opts, dry_run).await? {
        Deleted::Pending(bytes) => Ok(ctx.respond_object(StatusCode::OK, bytes)),
        Deleted::DryRun(v) => Ok(ctx.respond_value(StatusCode::OK, &v)),
        Deleted::Gone(bytes) => {
            if ctx.resource.ty.strategic_merge_patch {
                // Built-in kinds answer with a Status, as kube-apiserver's generic store does.
                let obj = objects::decode_stored(&bytes)?;
                let uid = objects::meta_str(&obj, "uid").unwrap_or("");
                Ok(ctx
                    .respond_value_raw(StatusCode::OK, &success_status(ctx.gr(), ctx.name(), uid)))
            } else {
                Ok(ctx.respond_object(StatusCode::OK, bytes))
            }
        }
    }
}

pub(super) async fn delete_collection(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let opts = parse_options(ctx)?;
    let dry_run = body_dry_run(ctx)?;
    let filter = ListFilter::from_query(ctx)?;
    let (items, _rev) = collect_matching(ctx, &filter).await?;
    let mut deleted = Vec::new();
    for kv in items {
        match delete_one(ctx, &kv.key, kv.clone(), &opts, dry_run).await {
            Ok(Deleted::Gone(b) | Deleted::Pending(b)) => deleted.push(objects::decode_stored(&b)?),
            Ok(Deleted::DryRun(v)) => deleted.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": ctx.resource.ty.list_kind,
        "apiVersion": ctx.resource.api_version,
        "metadata": {"resourceVersion": ctx.state.store.current_revision().to_string()},
        "items": deleted,
    });
    Ok(ctx.respond_value_raw(StatusCode::OK, &list))
}
