//! `POST` to a collection: create, with `generateName`, dry run and field validation.

use http::{header, Response, StatusCode};
use serde_json::{json, Value};

use super::Ctx;
use crate::body::Body;
use crate::negotiation::{body_format, BodyFormat};
use crate::objects::{self, meta_mut, meta_str};
use crate::status::ApiError;
use crate::storage::StorageError;

/// Tries before giving up on a generated name that keeps colliding.
const GENERATE_NAME_ATTEMPTS: usize = 8;

fn random_suffix_char() -> char {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let i = rand::random_range(0..ALPHABET.len());
    ALPHABET[i] as char
}

/// Decodes a write body (JSON or YAML); other content types are refused with 415.
pub(super) fn decode_write_body(ctx: &Ctx) -> Result<Value, ApiError> {
    match body_format(ctx.header(header::CONTENT_TYPE)) {
        Ok(BodyFormat::Json) => ctx.decode_body(false),
        Ok(BodyFormat::Yaml) => ctx.decode_body(true),
        Err(ct)
            if ct == "application/vnd.kubernetes.protobuf"
                && ctx.resource.ty.strategic_merge_patch =>
        {
            crate::protobuf::decode_object(&ctx.body).map_err(|e| {
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
    if !ctx.resource.ty.namespaced {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("namespace");
        }
        return Ok(());
    }
    let url_ns = ctx.req.namespace.clone().unwrap_or_default();
    match meta_str(obj, "namespace") {
        None | Some("") => {
            meta_mut(obj).insert("namespace".into(), json!(url_ns));
            Ok(())
        }
        Some(ns) if ns == url_ns => Ok(()),
        Some(_) => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
}

pub(super) async fn create(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    if ctx.req.name.is_some() {
        return Err(ApiError::method_not_allowed("create", ctx.gr()));
    }
    let cluster = ctx.cluster_name()?.to_string();
    let resource = ctx.resource.clone();
    let work = ctx.body.len();
    let state = ctx.state.clone();
    let mut obj = state.heavy.run(work, || decode_write_body(ctx)).await?;
    objects::check_type_meta(&mut obj, &resource)?;
    let mut obj = resource.to_storage(obj);
    reconcile_namespace(ctx, &mut obj)?;
    if resource.ty.namespaced {
        let ns = ctx.req.namespace.clone().unwrap_or_default();
        ctx.state.namespaces.check_for_create(&cluster, &ns).await?;
    }
    let generate = meta_str(&obj, "name")
        .is_none_or(str::is_empty)
        .then(|| meta_str(&obj, "generateName").unwrap_or("").to_string())
        .filter(|p| !p.is_empty());
    if let Some(prefix) = &generate {
        let name = crate::names::generate_name(prefix, random_suffix_char);
        meta_mut(&mut obj).insert("name".into(), json!(name));
    }
    objects::prepare_for_create(&mut obj, &resource, &cluster);
    if resource.ty.group == crate::rules::CORE_GROUP && resource.ty.kind == "Account" {
        // As upstream's mutating webhook: the creator is whoever creates the account.
        if let Some(id) = &ctx.identity {
            crate::rules::default_account_creator(&mut obj, &id.user);
        }
    }
    state
        .heavy
        .run(work, || {
            ctx.admit(&mut obj, None)?;
            ctx.record_update(None, &mut obj)
        })
        .await?;
    ctx.prepare_new(&cluster, &mut obj).await?;
    let dry_run = ctx.dry_run()?;
    if !dry_run {
        ctx.check_object_limit(&cluster, objects::name(&obj))
            .await?;
    }
    let mut attempt = 0;
    loop {
        let name = objects::name(&obj).to_string();
        ctx.req.name = Some(name.clone());
        if dry_run {
            return Ok(ctx.respond_value(StatusCode::CREATED, &obj));
        }
        let key = ctx.key()?;
        match ctx
            .state
            .store
            .create(&key, objects::encoder(obj.clone()))
            .await
        {
            Ok(kv) => return Ok(ctx.created(&cluster, kv).await),
            Err(StorageError::AlreadyExists(_))
                if generate.is_some() && attempt + 1 < GENERATE_NAME_ATTEMPTS =>
            {
                attempt += 1;
                let prefix = generate.as_deref().unwrap_or_default();
                let name = crate::names::generate_name(prefix, random_suffix_char);
                meta_mut(&mut obj).insert("name".into(), json!(name));
            }
            Err(StorageError::AlreadyExists(_)) if generate.is_some() => {
                let mut e = ApiError::already_exists(ctx.gr(), &name);
                e.message
                    .push_str(", the server was not able to generate a unique name for the object");
                return Err(e);
            }
            Err(e) => return Err(ctx.storage_error(e)),
        }
    }
}
