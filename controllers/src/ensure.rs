//! Create-or-update of single objects for the controllers' steps: an object is created when
//! missing and replaced only when the caller says the stored one differs, so a steady state costs
//! reads only.

use kube::api::{Api, DynamicObject, PostParams};
use serde_json::Value;

/// Creates `obj` with `api`, or replaces the stored one when `differs(stored)` says so (keeping
/// its metadata). Returns the object as stored.
pub async fn ensure(
    api: &Api<DynamicObject>,
    obj: Value,
    differs: impl Fn(&DynamicObject) -> Option<DynamicObject>,
) -> Result<DynamicObject, String> {
    ensure_written(api, obj, differs).await.map(|(o, _)| o)
}

/// [`ensure`], also telling whether it wrote.
pub async fn ensure_written(
    api: &Api<DynamicObject>,
    obj: Value,
    differs: impl Fn(&DynamicObject) -> Option<DynamicObject>,
) -> Result<(DynamicObject, bool), String> {
    let wanted: DynamicObject = serde_json::from_value(obj).map_err(|e| e.to_string())?;
    let name = wanted.metadata.name.clone().unwrap_or_default();
    let kind = wanted
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    match api
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading {kind} {name}: {e}"))?
    {
        None => match api.create(&PostParams::default(), &wanted).await {
            Ok(o) => Ok((o, true)),
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&name)
                .await
                .map(|o| (o, true))
                .map_err(|e| format!("reading {kind} {name}: {e}")),
            Err(e) => Err(format!("creating {kind} {name}: {e}")),
        },
        Some(stored) => match differs(&stored) {
            None => Ok((stored, false)),
            Some(updated) => api
                .replace(&name, &PostParams::default(), &updated)
                .await
                .map(|o| (o, true))
                .map_err(|e| format!("updating {kind} {name}: {e}")),
        },
    }
}
