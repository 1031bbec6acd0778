//! `POST` to a collection: create, with `generateName`, dry run and field validation.

use http::{header, Response, StatusCode};
use serde_json::Value;

use super::Ctx;
use crate::admission::Operation;
use crate::meta::body::Body;
use crate::meta::status::ApiError;
use crate::registry::objects;
use crate::request::negotiation::{body_format, BodyFormat};

/// Decodes a write body (JSON or YAML); other content types are refused with 415.
pub(super) fn decode_write_body(ctx: &Ctx) -> Result<Value, ApiError> {
    match body_format(ctx.header(header::CONTENT_TYPE)) {
        Ok(BodyFormat::Json) => {
            let v = ctx.decode_body(false)?;
            if ctx.query.field_validation(ctx.options_kind())?
                == crate::request::query::FieldValidation::Strict
            {
                if let Some(key) = crate::registry::duplicate_key(&ctx.body) {
                    let r = &ctx.resource;
                    return Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: duplicate field {key:?}",
                        r.kind(),
                        r.ty.version,
                        r.kind()
                    )));
                }
            }
            Ok(v)
        }
        Ok(BodyFormat::Yaml) => ctx.decode_body(true),
        Err(ct)
            if ct == "application/vnd.kubernetes.protobuf"
                && ctx.resource.ty.strategic_merge_patch =>
        {
            crate::meta::protobuf::decode_object(&ctx.body).map_err(|e| {
                ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: {e}",
                    ctx.resource.kind(),
                    ctx.resource.ty.version,
                    ctx.resource.kind()
                ))
            })
        }
        Ok(_) | Err(_) => Err(ApiError::unsupported_media_type(
            ctx.header(header::CONTENT_TYPE).unwrap_or(""),
            &["application/json", "application/yaml"],
        )),
    }
}

/// Fills the namespace from the URL and refuses a body that names another one.
pub(super) fn reconcile_namespace(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
    crate::registry::reconcile_namespace(&ctx.resource, ctx.req.namespace.as_deref(), obj)
}

pub(super) async fn create(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    if ctx.req.name.is_some() {
        // kube-apiserver has no route for a POST to a named object.
        return Err(ApiError::method_not_routed());
    }
    let resource = ctx.resource.clone();
    let heavy = ctx.objects.heavy().clone();
    let mut obj = heavy.run(ctx.body.len(), || decode_write_body(ctx)).await?;
    objects::check_type_meta(&mut obj, &resource)?;
    // kube-apiserver refuses it too (with a 500; it is the client's mistake, so 400 here).
    if obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut obj = resource.to_storage(obj);
    reconcile_namespace(ctx, &mut obj)?;
    let manager = ctx.field_manager()?;
    let written = {
        let w = ctx.write(Some(&manager))?;
        let name = objects::name(&obj).to_string();
        ctx.admission
            .admit(&w.attributes(&name, Operation::Create), &mut obj)
            .await?;
        ctx.objects.create(&w, obj, ctx.admission.as_ref()).await?
    };
    Ok(ctx.respond_written(StatusCode::CREATED, written))
}
