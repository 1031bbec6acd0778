//! `GET` of a collection: selectors, consistent pages with `limit`/`continue`, resourceVersion
//! semantics, and the Table / PartialObjectMetadataList forms.

use std::time::Duration;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{encode, partial_metadata, Ctx};
use crate::meta::body::Body;
use crate::meta::response::bytes_response;
use crate::meta::selectors::{FieldSelector, LabelSelector, SelectorError};
use crate::meta::status::ApiError;
use crate::meta::table;
use crate::registry::objects;
use crate::request::negotiation::{Encoding, Output};
use crate::request::request_info::ClusterTarget;
use crate::storage::{KeyValue, ListOptions, Revision, StorageError, Store};

/// Page size used when reading the store for a filtered list.
const STORE_PAGE: usize = 500;

/// Which objects of a collection a request selects.
pub(crate) struct ListFilter {
    pub label: Option<LabelSelector>,
    pub field: Option<FieldSelector>,
    /// Namespace to keep when the key prefix cannot express it (wildcard cluster).
    pub namespace: Option<String>,
    /// Single object name (URL name of a watch, or `metadata.name=` field selector).
    pub name: Option<String>,
}

/// Field selector labels every type supports, plus a few per built-in kind.
fn selectable_fields(ctx: &Ctx) -> Vec<&'static str> {
    let mut f = vec!["metadata.name", "metadata.namespace"];
    match (
        ctx.resource.ty.group.as_str(),
        ctx.resource.ty.kind.as_str(),
    ) {
        ("", "Secret") => f.push("type"),
        ("", "Namespace") => f.push("status.phase"),
        ("", "Event") => f.extend([
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]),
        ("events.k8s.io", "Event") => f.extend([
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ]),
        _ => {}
    }
    f
}

impl ListFilter {
    pub fn from_query(ctx: &Ctx) -> Result<Self, ApiError> {
        let user = ctx
            .query
            .get("labelSelector")
            .filter(|s| !s.trim().is_empty());
        let combined = match (user, ctx.forced_selector.as_deref()) {
            (Some(u), Some(f)) => Some(format!("{u},{f}")),
            (Some(u), None) => Some(u.to_string()),
            (None, Some(f)) => Some(f.to_string()),
            (None, None) => None,
        };
        let label = match combined {
            Some(s) => {
                Some(LabelSelector::parse(&s).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            None => None,
        };
        let field = match ctx
            .query
            .get("fieldSelector")
            .filter(|s| !s.trim().is_empty())
        {
            Some(s) => {
                let f =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let allowed = selectable_fields(ctx);
                f.validate_fields(&allowed).map_err(|e| match e {
                    // Built-in kinds with only the metadata fields say it kube-apiserver's way
                    // (its default field label conversion); the others as the error says.
                    SelectorError::UnsupportedField(field)
                        if ctx.resource.ty.strategic_merge_patch && allowed.len() == 2 =>
                    {
                        ApiError::bad_request(format!(
                            "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                        ))
                    }
                    e => ApiError::bad_request(e.to_string()),
                })?;
                Some(f)
            }
            None => None,
        };
        let namespace = match ctx.cluster {
            ClusterTarget::Wildcard => ctx.req.namespace.clone(),
            ClusterTarget::Name(_) => None,
        };
        let name = ctx.req.name.clone().or_else(|| {
            field
                .as_ref()
                .and_then(|f| f.requested_name().map(str::to_string))
        });
        Ok(ListFilter {
            label,
            field,
            namespace,
            name,
        })
    }

    /// Whether the filter can only be decided on the decoded object.
    pub fn needs_object(&self) -> bool {
        self.label.is_some() || self.field.is_some()
    }

    /// Decides on the storage key alone where possible (`None` = need the object).
    pub fn matches_key(&self, prefix_len: usize, key: &str) -> bool {
        let rest = key.get(prefix_len..).unwrap_or("");
        let parts: Vec<&str> = rest.split('/').collect();
        let name = parts.last().copied().unwrap_or("");
        if let Some(n) = &self.name {
            if n != name {
                return false;
            }
        }
        if let Some(ns) = &self.namespace {
            // Wildcard keys are `<cluster>/<namespace>/<name>` below the type prefix.
            if parts.len() != 3 || parts[1] != ns {
                return false;
            }
        }
        true
    }

    /// Whether a stored object matches. A label selector alone reads only the object's labels
    /// (skipping the rest of the JSON without building it); a field selector decodes it whole.
    pub fn matches_stored(&self, stored: &[u8]) -> Result<bool, ApiError> {
        if self.field.is_none() {
            if let Some(l) = &self.label {
                #[derive(serde::Deserialize)]
                struct Meta {
                    #[serde(default)]
                    labels: Option<serde_json::Map<String, Value>>,
                }
                #[derive(serde::Deserialize)]
                struct Labels {
                    #[serde(default)]
                    metadata: Option<Meta>,
                }
                let only: Labels = serde_json::from_slice(stored)
                    .map_err(|e| ApiError::internal(format!("stored object: {e}")))?;
                let labels = only.metadata.and_then(|m| m.labels).map(Value::Object);
                return Ok(l.matches(labels.as_ref()));
            }
            return Ok(true);
        }
        Ok(self.matches_object(&objects::decode_stored(stored)?))
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        if let Some(l) = &self.label {
            if !l.matches(obj.get("metadata").and_then(|m| m.get("labels"))) {
                return false;
            }
        }
        if let Some(f) = &self.field {
            if !f.matches(obj) {
                return false;
            }
        }
        true
    }
}

/// The opaque continue token: snapshot revision and last key read.
fn encode_continue(rev: Revision, key: &str) -> String {
    let raw = json!({"rv": rev, "start": key}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .to_string();
    Ok((rev, start))
}

/// A forbidden combination of list (and watch) options.
pub(super) fn list_options_error(message: &str, field: &str) -> ApiError {
    ApiError::options_invalid(
        "ListOptions",
        field,
        "FieldValueForbidden",
        format!("Forbidden: {message}"),
    )
}

/// Waits briefly for the store to reach `rev`; a client that saw a newer revision elsewhere
/// (another replica) gets 504 if it never comes.
pub(crate) async fn wait_for_revision(
    store: &dyn Store,
    rev: Revision,
) -> Result<(), StorageError> {
    for _ in 0..30 {
        let current = store.latest_revision().await?;
        if current >= rev {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(StorageError::FutureRevision {
        requested: rev,
        current: store.current_revision(),
    })
}

/// The stored bytes of a page's objects.
fn size_of(items: &[KeyValue]) -> usize {
    items.iter().map(|kv| kv.value.len()).sum()
}

/// One page of matching objects.
struct Page {
    items: Vec<KeyValue>,
    revision: Revision,
    continue_token: Option<String>,
}

async fn read_page(
    ctx: &Ctx,
    filter: &ListFilter,
    limit: usize,
    start: Option<String>,
    at: Option<Revision>,
) -> Result<Page, ApiError> {
    let prefix = ctx
        .resource
        .prefix(ctx.cluster.name(), ctx.req.namespace.as_deref());
    let type_prefix_len = ctx.resource.all_clusters_prefix().len();
    let mut items = Vec::new();
    let mut start_after = start;
    let mut revision = at;
    loop {
        let want = if limit == 0 {
            STORE_PAGE
        } else {
            (limit - items.len()).max(1)
        };
        let page = ctx
            .objects
            .storage()
            .list(ListOptions {
                prefix: &prefix,
                start_after: start_after.as_deref(),
                limit: if filter.needs_object()
                    || filter.namespace.is_some()
                    || filter.name.is_some()
                {
                    STORE_PAGE.max(want)
                } else {
                    want
                },
                revision,
            })
            .await
            .map_err(|e| ctx.storage_error(e))?;
        revision = Some(page.revision);
        let mut last_key = None;
        let mut filled = false;
        for kv in page.items {
            last_key = Some(kv.key.to_string());
            if filter.matches_key(type_prefix_len, &kv.key) {
                let keep = if filter.needs_object() {
                    filter.matches_stored(&kv.value)?
                } else {
                    true
                };
                if keep {
                    items.push(kv);
                }
            }
            if limit != 0 && items.len() >= limit {
                filled = true;
                break;
            }
        }
        let rev = page.revision;
        if filled {
            // More may follow if the store page had more or we stopped inside it.
            let k = last_key.unwrap_or_default();
            let probe = ctx
                .objects
                .storage()
                .list(ListOptions {
                    prefix: &prefix,
                    start_after: Some(&k),
                    limit: 1,
                    revision: Some(rev),
                })
                .await
                .map_err(|e| ctx.storage_error(e))?;
            let token = (!probe.items.is_empty()).then(|| encode_continue(rev, &k));
            return Ok(Page {
                items,
                revision: rev,
                continue_token: token,
            });
        }
        if !page.more || last_key.is_none() {
            return Ok(Page {
                items,
                revision: rev,
                continue_token: None,
            });
        }
        start_after = last_key;
    }
}

/// Every object of the request's scope that matches `filter`, at one revision.
pub(crate) async fn collect_matching(
    ctx: &Ctx,
    filter: &ListFilter,
) -> Result<(Vec<KeyValue>, Revision), ApiError> {
    let page = read_page(ctx, filter, 0, None, None).await?;
    Ok((page.items, page.revision))
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
    let filter = ListFilter::from_query(ctx)?;
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
                wait_for_revision(ctx.objects.storage().as_ref(), want)
                    .await
                    .map_err(|e| ctx.storage_error(e))?;
                (None, None)
            }
        },
    };
    let page = match read_page(ctx, &filter, limit, start, at).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_round_trip() {
        let t = encode_continue(42, "/core/configmaps/root/default/a");
        assert_eq!(
            decode_continue(&t).ok(),
            Some((42, "/core/configmaps/root/default/a".to_string()))
        );
        assert!(decode_continue("garbage!").is_err());
    }
}
