//! `PATCH`: JSON patch, JSON merge patch, and strategic merge patch for the built-in kinds.

use http::{header, Response};
use serde_json::Value;

use super::update::{write_loop, Tracking};
use super::Ctx;
use crate::meta::body::Body;
use crate::meta::status::{ApiError, Cause};
use crate::request::negotiation::{body_format, BodyFormat};

/// kube-apiserver's limit on the operations of one JSON patch.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// kube-apiserver's `JSONPatchMaxCopyBytes`: how many bytes the `copy` operations of one JSON
/// patch may duplicate in all (each copy can double the document, so without this a 1 KB patch
/// of 40 copies asks for terabytes).
pub(crate) const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Applies a JSON patch operation by operation, refusing before a `copy` would push the bytes
/// copied so far past [`MAX_JSON_PATCH_COPY_BYTES`]. `add` and `replace` bring their values from
/// the (size-limited) request and `move` only relocates, so copies are the only way the result
/// can outgrow the request; the size of what a copy duplicates is measured up to the limit only.
pub(crate) fn apply_json_patch(doc: &mut Value, ops: &json_patch::Patch) -> Result<(), String> {
    let mut copied = 0usize;
    for op in ops.iter() {
        if let json_patch::PatchOperation::Copy(c) = op {
            if let Some(from) = doc.pointer(c.from.as_str()) {
                let budget = MAX_JSON_PATCH_COPY_BYTES - copied;
                match crate::registry::objects::json_len_within(from, budget) {
                    Some(n) => copied += n,
                    None => {
                        return Err(format!(
                            "unable to copy {:?}: the copies of this patch would exceed {MAX_JSON_PATCH_COPY_BYTES} bytes",
                            c.from.as_str()
                        ))
                    }
                }
            }
        }
        json_patch::patch(doc, std::slice::from_ref(op)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub(super) async fn patch(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let content_type = ctx.header(header::CONTENT_TYPE).unwrap_or("").to_string();
    let mut supported = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    if ctx.resource.ty.strategic_merge_patch {
        supported.push("application/strategic-merge-patch+json");
    }
    let format = match body_format(Some(&content_type)) {
        Ok(BodyFormat::ApplyPatch) => return super::apply::apply_patch(ctx).await,
        Ok(f @ (BodyFormat::JsonPatch | BodyFormat::MergePatch)) => f,
        Ok(BodyFormat::StrategicMergePatch) if ctx.resource.ty.strategic_merge_patch => {
            BodyFormat::StrategicMergePatch
        }
        _ => return Err(ApiError::unsupported_media_type(&content_type, &supported)),
    };
    if ctx.query.get("force").is_some() {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            vec![Cause {
                reason: "FieldValueForbidden".into(),
                message: "Forbidden: may not be specified for non-apply patch".into(),
                field: "force".into(),
            }],
        ));
    }
    let bad = |why: String| {
        ApiError::bad_request(format!("the body of the patch could not be decoded: {why}"))
    };
    let patch_doc: Value = serde_json::from_slice(&ctx.body).map_err(|e| bad(e.to_string()))?;
    let kind = ctx.resource.kind().to_string();
    let group = ctx.resource.ty.group.clone();
    let name = ctx.name().to_string();
    let invalid = move |why: String| {
        ApiError::invalid(
            &kind,
            &group,
            &name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: why,
                field: String::new(),
            }],
        )
    };
    match format {
        BodyFormat::JsonPatch => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch_doc).map_err(|e| bad(e.to_string()))?;
            if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(invalid(format!(
                    "the allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    ops.0.len()
                )));
            }
            if ops
                .iter()
                .any(|op| matches!(op, json_patch::PatchOperation::Copy(_)))
            {
                ctx.extra_work = MAX_JSON_PATCH_COPY_BYTES;
            }
            write_loop(ctx, Tracking::Update, |current| {
                let mut doc = current.clone();
                apply_json_patch(&mut doc, &ops).map_err(&invalid)?;
                Ok(doc)
            })
            .await
        }
        BodyFormat::MergePatch => {
            if !patch_doc.is_object() {
                return Err(bad("a merge patch must be a JSON object".into()));
            }
            write_loop(ctx, Tracking::Update, |current| {
                let mut doc = current.clone();
                json_patch::merge(&mut doc, &patch_doc);
                Ok(doc)
            })
            .await
        }
        _ => {
            if !patch_doc.is_object() {
                return Err(bad("a strategic merge patch must be a JSON object".into()));
            }
            let keys = crate::meta::strategic_merge::merge_keys_for(
                &ctx.resource.ty.group,
                ctx.resource.kind(),
            );
            write_loop(ctx, Tracking::Update, |current| {
                crate::meta::strategic_merge::apply(current, &patch_doc, &keys)
                    .map_err(|e| invalid(e.to_string()))
            })
            .await
        }
    }
}
