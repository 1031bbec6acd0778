//! `PATCH` with `application/apply-patch+yaml`: server-side apply, creating the object when it
//! does not exist, with field-manager conflicts answered as kube-apiserver does.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::create::reconcile_namespace;
use super::update::{write_loop, Tracking};
use super::Ctx;
use crate::admission::Operation;
use crate::meta::apply::{self, ApplyConflicts};
use crate::meta::body::Body;
use crate::meta::status::{ApiError, Cause, Details};
use crate::registry::objects::{self, meta_mut, meta_str, WritePart};
use crate::request::query::FieldValidation;

fn patch_options_error(reason: &str, message: &str, field: &str) -> ApiError {
    ApiError::options_invalid("PatchOptions", field, reason, message)
}

/// The 409 of an apply that conflicts with other managers.
/// Like kube-apiserver's, it names no object, only the conflicting fields.
fn conflict_error(c: &ApplyConflicts) -> ApiError {
    ApiError::new(409, "Conflict", c.message()).with_details(Details {
        causes: c
            .causes()
            .into_iter()
            .map(|(reason, message, field)| Cause {
                reason,
                message,
                field,
            })
            .collect(),
        ..Details::default()
    })
}

/// The applied configuration, decoded, checked and cut to the part the request may write, and
/// the resourceVersion it names: a precondition, as in kube-apiserver.
fn applied_configuration(ctx: &mut Ctx) -> Result<(Value, Option<String>), ApiError> {
    let resource = ctx.resource.clone();
    let mut applied = ctx.decode_body(true)?;
    // An applied configuration says what it is (kube-apiserver decodes it by that).
    let type_meta = |k: &str| applied.get(k).and_then(Value::as_str).unwrap_or("");
    if type_meta("apiVersion").is_empty() || type_meta("kind").is_empty() {
        let api_version = type_meta("apiVersion");
        let gv = if api_version.contains('/') {
            api_version.to_string()
        } else {
            format!("/{api_version}")
        };
        return Err(ApiError::bad_request(format!(
            "invalid object type: {gv}, Kind={}",
            type_meta("kind")
        )));
    }
    objects::check_type_meta(&mut applied, &resource)?;
    match meta_str(&applied, "name") {
        Some(n) if n == ctx.name() => {}
        // kube-apiserver applies a configuration without a name to the object the URL names
        // (the live object carries the name; kcp's e2e tests apply so).
        None | Some("") => {
            objects::meta_mut(&mut applied).insert("name".into(), json!(ctx.name()));
        }
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                ctx.name()
            )))
        }
    }
    reconcile_namespace(ctx, &mut applied)?;
    let unknown = crate::meta::schema::prune(&mut applied, &resource.ty.schema);
    if !unknown.is_empty() {
        match ctx.query.field_validation(ctx.options_kind())? {
            FieldValidation::Strict => {
                return Err(crate::registry::strict_error(&resource, &unknown))
            }
            FieldValidation::Warn => ctx
                .warnings
                .extend(unknown.iter().map(|f| format!("unknown field {f:?}"))),
            FieldValidation::Ignore => {}
        }
    }
    let precondition = meta_str(&applied, "resourceVersion")
        .filter(|rv| !rv.is_empty())
        .map(str::to_string);
    // The server owns these; an applier cannot claim them.
    let m = meta_mut(&mut applied);
    for f in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    ] {
        m.remove(f);
    }
    match ctx.part() {
        WritePart::Main if resource.ty.status_subresource => {
            if let Some(o) = applied.as_object_mut() {
                o.remove("status");
            }
        }
        WritePart::Main | WritePart::Whole => {}
        WritePart::Status => {
            let mut only = json!({"apiVersion": applied["apiVersion"], "kind": applied["kind"], "metadata": {"name": ctx.name()}});
            if let Some(ns) = meta_str(&applied, "namespace") {
                only["metadata"]["namespace"] = json!(ns);
            }
            if let Some(st) = applied.get("status") {
                only["status"] = st.clone();
            }
            applied = only;
        }
    }
    Ok((applied, precondition))
}

pub(super) async fn apply_patch(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let manager = match ctx.query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => {
            return Err(patch_options_error(
                "FieldValueRequired",
                "Required value: is required for apply patch",
                "fieldManager",
            ))
        }
    };
    ctx.field_manager()?;
    let force = ctx.query.flag("force");
    let (applied, precondition) = applied_configuration(ctx)?;
    let resource = ctx.resource.clone();
    let subresource = ctx.req.subresource.clone();
    let now = objects::now_rfc3339();
    match ctx.current().await {
        Ok(_) => {
            let gr = ctx.gr().clone();
            let name = ctx.name().to_string();
            write_loop(ctx, Tracking::Apply, |current| {
                if let Some(rv) = &precondition {
                    if meta_str(current, "resourceVersion") != Some(rv.as_str()) {
                        return Err(ApiError::conflict(&gr, &name));
                    }
                }
                let managed = apply::managed_fields_of(current);
                let (mut merged, managed) = apply::apply(
                    Some(current),
                    &applied,
                    managed,
                    &manager,
                    force,
                    &resource.api_version,
                    subresource.as_deref(),
                    &resource.ty.schema,
                    &now,
                )
                .map_err(|c| conflict_error(&c))?;
                apply::set_managed_fields(&mut merged, &managed);
                Ok(merged)
            })
            .await
        }
        Err(e) if e.code == 404 && subresource.is_none() => {
            let (obj, managed) = apply::apply(
                None,
                &applied,
                Vec::new(),
                &manager,
                force,
                &resource.api_version,
                None,
                &resource.ty.schema,
                &now,
            )
            .map_err(|c| conflict_error(&c))?;
            // Stored in the storage version, as a create stores it (an APIExport applied as
            // v1alpha2 is kept as v1alpha1).
            let mut obj = resource.to_storage(obj);
            apply::set_managed_fields(&mut obj, &managed);
            let written = {
                let w = ctx.write(None)?;
                ctx.admission
                    .admit(&w.attributes(ctx.name(), Operation::Create), &mut obj)
                    .await?;
                ctx.objects.create(&w, obj, ctx.admission.as_ref()).await?
            };
            Ok(ctx.respond_written(StatusCode::CREATED, written))
        }
        Err(e) => Err(e),
    }
}
