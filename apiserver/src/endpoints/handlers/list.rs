//! `GET` of a collection: the list options and their resourceVersion semantics, and the answer
//! in the JSON, Table and PartialObjectMetadataList forms. The generic store reads the pages.

use bytes::{BufMut, Bytes, BytesMut};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{encode, partial_metadata, Ctx};
use crate::meta::body::Body;
use crate::meta::response::bytes_response;
use crate::meta::status::ApiError;
use crate::meta::table;
use crate::registry::{decode_continue, objects};
use crate::request::negotiation::{Encoding, Output};
use crate::storage::KeyValue;

/// A forbidden combination of list (and watch) options.
pub(super) fn list_options_error(message: &str, field: &str) -> ApiError {
    ApiError::options_invalid(
        "ListOptions",
        field,
        "FieldValueForbidden",
        format!("Forbidden: {message}"),
    )
}

/// The stored bytes of a page's objects.
fn size_of(items: &[KeyValue]) -> usize {
    items.iter().map(|kv| kv.value.len()).sum()
}

pub(super) async fn list(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let q = &ctx.query;
    // Part of the list options, checked even though a list answers at once.
    q.u64("timeoutSeconds")?;
    let rv = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rvm = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let cont = q.get("continue").filter(|s| !s.is_empty());
    if q.get("sendInitialEvents").is_some() {
        return Err(list_options_error(
            "sendInitialEvents is forbidden for list",
            "sendInitialEvents",
        ));
    }
    if let Some(m) = rvm {
        if rv.is_none() {
            return Err(list_options_error(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
                "resourceVersionMatch",
            ));
        }
        if cont.is_some() {
            return Err(list_options_error(
                "resourceVersionMatch is forbidden when continue is provided",
                "resourceVersionMatch",
            ));
        }
        if m != "Exact" && m != "NotOlderThan" {
            return Err(ApiError::options_invalid(
                "ListOptions",
                "resourceVersionMatch",
                "FieldValueNotSupported",
                format!(
                    "Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            ));
        }
        if m == "Exact" && rv == Some("0") {
            return Err(list_options_error(
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                "resourceVersionMatch",
            ));
        }
    }
    if cont.is_some() && rv.is_some_and(|v| v != "0") {
        // A 400, not a 422: kube-apiserver checks this outside the options' validation.
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let selection = ctx.selection()?;
    let limit = q.u64("limit")?.unwrap_or(0) as usize;
    let (start, at) = match cont {
        Some(token) => {
            let (rev, start) = decode_continue(token)?;
            (Some(start), Some(rev))
        }
        None => match (rv, rvm) {
            (Some(v), Some("Exact")) => (None, Some(objects::parse_resource_version(v)?)),
            (Some("0"), _) | (None, _) => (None, None),
            (Some(v), _) => {
                let want = objects::parse_resource_version(v)?;
                ctx.objects
                    .wait_for_revision(ctx.collection(), want)
                    .await?;
                (None, None)
            }
        },
    };
    let page = match ctx
        .objects
        .list(ctx.collection(), &selection, limit, start, at)
        .await
    {
        Err(e) if e.code == 410 && cont.is_some() => {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ))
        }
        other => other?,
    };
    // An answer waiting to be read stays in memory: it counts against its user's budget, taken
    // before the answer is built, so a refused one costs nothing.
    let held = ctx
        .budgets
        .hold_list(ctx.identity.as_deref(), size_of(&page.items))?;
    let mut list_meta = json!({"resourceVersion": page.revision.to_string()});
    match &page.continue_token {
        Some(t) => list_meta["continue"] = json!(t),
        // Plain lists of custom resources say it even when empty, as kube-apiserver's do.
        None if !ctx.resource.ty.strategic_merge_patch
            && matches!(ctx.negotiated.output, Output::Object) =>
        {
            list_meta["continue"] = json!("")
        }
        None => {}
    }
    let r = &ctx.resource;
    let size = size_of(&page.items);
    let resp = match (&ctx.negotiated.output, ctx.negotiated.encoding) {
        // Stored objects are already JSON: a copy, large ones off the async workers.
        (Output::Object, Encoding::Json) if r.conversion.is_none() => ctx.objects.heavy().copy(size, || {
            // Stored objects are already JSON with their resourceVersion: splice, don't re-encode.
            let size: usize = page.items.iter().map(|kv| kv.value.len() + 1).sum();
            let mut out = BytesMut::with_capacity(size + 256);
            out.put_slice(b"{\"kind\":");
            out.put_slice(
                serde_json::to_string(&r.ty.list_kind)
                    .unwrap_or_default()
                    .as_bytes(),
            );
            out.put_slice(b",\"apiVersion\":");
            out.put_slice(
                serde_json::to_string(&r.api_version)
                    .unwrap_or_default()
                    .as_bytes(),
            );
            out.put_slice(b",\"metadata\":");
            out.put_slice(list_meta.to_string().as_bytes());
            out.put_slice(b",\"items\":[");
            for (i, kv) in page.items.iter().enumerate() {
                if i > 0 {
                    out.put_u8(b',');
                }
                out.put_slice(&kv.value);
            }
            out.put_slice(b"]}");
            bytes_response(StatusCode::OK, "application/json", Bytes::from(out))
        }),
        // Decoding and encoding every object is heavy work.
        (output, encoding) => ctx.objects.heavy().run(size, || {
            let objs: Vec<Value> = page
                .items
                .iter()
                .map(|kv| objects::decode_stored(&kv.value).map(|v| r.to_served(v)))
                .collect::<Result<_, _>>()?;
            let v = match output {
                Output::Object => json!({
                    "kind": r.ty.list_kind,
                    "apiVersion": r.api_version,
                    "metadata": list_meta,
                    "items": objs,
                }),
                Output::Table { version } => {
                    let include = table::parse_include_object(q.get("includeObject"))
                        .map_err(ApiError::bad_request)?;
                    let refs: Vec<&Value> = objs.iter().collect();
                    table::build_table(
                        &r.columns,
                        &refs,
                        include,
                        &format!("meta.k8s.io/{version}"),
                        list_meta,
                        time::OffsetDateTime::now_utc(),
                        false,
                    )
                }
                Output::Metadata { version } => json!({
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": format!("meta.k8s.io/{version}"),
                    "metadata": list_meta,
                    "items": objs.iter().map(|o| partial_metadata(o, version)).collect::<Vec<_>>(),
                }),
            };
            Ok::<_, ApiError>(encode(StatusCode::OK, &v, encoding))
        }).await?,
    };
    Ok(resp.map(|body| body.holding_all(held)))
}
