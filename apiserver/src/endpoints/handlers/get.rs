//! `GET` of one object.

use http::{Response, StatusCode};

use super::Ctx;
use crate::meta::body::Body;
use crate::meta::status::ApiError;

pub(super) async fn get(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let kv = ctx.current().await?;
    Ok(ctx.respond_object(StatusCode::OK, kv.value))
}
