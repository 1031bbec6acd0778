//! Object metadata rules shared by every type (the generic half of a registry strategy):
//! server-owned fields, generation, the status split, finalizers, and encoding for storage.

use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::meta::status::{ApiError, Cause};
use crate::registry::resource::Resource;
use crate::storage::{Encoder, Revision};

/// Annotation naming the logical cluster an object lives in (as kcp sets it).
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds, `Z`).
pub fn now_rfc3339() -> String {
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    now.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// The object's `metadata`, if it is an object.
pub fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The object's `metadata`, created if missing or not an object.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just set to an object"),
    }
}

/// A string field of `metadata` (`namespace`, `uid`, `resourceVersion`), if present.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// The object's `metadata.name`; empty if it has none.
pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

/// The object's `metadata.finalizers`; empty if it has none.
pub fn finalizers(obj: &Value) -> Vec<String> {
    str_list(meta(obj).and_then(|m| m.get("finalizers")))
}

/// The strings of a JSON array (other elements skipped); empty when it is not an array.
pub fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the object is marked for deletion: `metadata.deletionTimestamp` is set, and the
/// object stays until its finalizers are gone.
pub fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

/// Whether a stored object is marked for deletion, without building its JSON tree (for checks
/// on every write, like the namespace of each create).
pub fn stored_is_deleting(stored: &[u8]) -> Result<bool, ApiError> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "deletionTimestamp")]
        deletion_timestamp: Option<serde::de::IgnoredAny>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Option<Meta>,
    }
    let obj: Object = serde_json::from_slice(stored)
        .map_err(|e| ApiError::internal(format!("stored object is not valid JSON: {e}")))?;
    Ok(obj.metadata.is_some_and(|m| m.deletion_timestamp.is_some()))
}

/// Checks `apiVersion`/`kind` of a request body against the resource, filling them when absent.
pub fn check_type_meta(obj: &mut Value, r: &Resource) -> Result<(), ApiError> {
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: the body must be a JSON or YAML object",
            r.kind(),
            r.ty.version,
            r.kind()
        )));
    };
    // Custom resources are decoded by what the body says it is, as kube-apiserver does: both
    // must be there. Built-in kinds take them from the URL.
    for field in ["kind", "apiVersion"] {
        if !r.ty.strategic_merge_patch
            && map
                .get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): Object '{}' is missing",
                r.kind(),
                if field == "kind" { "Kind" } else { field }
            )));
        }
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(r.api_version));
        }
        Some(v) if v == r.api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                r.api_version
            )))
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(r.kind()));
        }
        Some(k) if k == r.kind() => {}
        // A custom resource of another kind is decoded, then found invalid (kube-apiserver).
        Some(k) if !r.ty.strategic_merge_patch => {
            let name = map
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            return Err(ApiError::invalid(
                k,
                &r.ty.group,
                name,
                vec![Cause {
                    reason: "FieldValueInvalid".into(),
                    message: format!("Invalid value: {k:?}: must be {}", r.kind()),
                    field: "kind".into(),
                }],
            ));
        }
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: the kind in the body ({k:?}) does not match the kind of the resource",
                r.kind(),
                r.ty.version,
                r.kind()
            )))
        }
    }
    if map
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: metadata must be an object",
            r.kind(),
            r.ty.version,
            r.kind()
        )));
    }
    Ok(())
}

/// Everything but `metadata` (and `status` when it is a subresource): what `generation` tracks.
fn spec_part(obj: &Value, status_subresource: bool) -> Value {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("apiVersion");
    m.remove("kind");
    if status_subresource {
        m.remove("status");
    }
    Value::Object(m)
}

/// Whether an update changes what `metadata.generation` counts.
pub fn spec_changed(old: &Value, new: &Value, status_subresource: bool) -> bool {
    spec_part(old, status_subresource) != spec_part(new, status_subresource)
}

/// Fields a client may not set on create.
const SERVER_OWNED_ON_CREATE: &[&str] = &[
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "resourceVersion",
    "generation",
    "managedFields",
];

/// Whether objects of the type count their spec's changes in `metadata.generation`: custom
/// resources (CRDs, bound APIs, the Platform Mesh and kcp kinds) do; the built-in kinds served
/// here (ConfigMaps, Secrets, Namespaces, RBAC, Leases, Events, …) have no spec and, as in
/// kube-apiserver, no generation.
pub fn tracks_generation(r: &Resource) -> bool {
    !r.ty.strategic_merge_patch
}

/// Sets the server-owned metadata of a new object.
pub fn prepare_for_create(obj: &mut Value, r: &Resource, cluster: &str) {
    if r.ty.status_subresource {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    let tracks = tracks_generation(r);
    let meta = meta_mut(obj);
    for f in SERVER_OWNED_ON_CREATE {
        // Where the server does not count generations, kube-apiserver keeps what the client
        // sent (and updates keep it from then on).
        if *f != "generation" || tracks {
            meta.remove(*f);
        }
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    if tracks {
        meta.insert("generation".into(), json!(1));
    }
    set_cluster_annotation(meta, cluster);
    if r.ty.group.is_empty() && r.ty.plural == "namespaces" {
        obj["status"] = json!({"phase": "Active"});
    }
}

fn set_cluster_annotation(meta: &mut Map<String, Value>, cluster: &str) {
    if !meta.get("annotations").is_some_and(Value::is_object) {
        meta.insert("annotations".into(), json!({}));
    }
    if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        a.insert(CLUSTER_ANNOTATION.into(), json!(cluster));
    }
}

/// Which part of the object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePart {
    /// The main resource: everything but status when status is a subresource.
    Main,
    /// The status subresource: only `.status`.
    Status,
    /// The main resource and its status together: only the server's own controllers write so
    /// (the generic store's `own` writes).
    Whole,
}

/// Carries the server-owned and subresource-owned parts of `old` into `new`, checks the
/// immutable fields and the finalizer rule, and bumps `generation` when the spec changed.
pub fn prepare_for_update(
    new: &mut Value,
    old: &Value,
    r: &Resource,
    part: WritePart,
) -> Result<(), ApiError> {
    if part == WritePart::Status {
        let status = new.get("status").cloned();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(m) = merged.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        *new = merged;
        return Ok(());
    }
    if r.ty.status_subresource && part == WritePart::Main {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    let old_meta = meta(old).cloned().unwrap_or_default();
    let mut causes = Vec::new();
    {
        let new_meta = meta_mut(new);
        match (new_meta.get("uid"), old_meta.get("uid")) {
            (None, Some(v)) | (Some(Value::Null), Some(v)) => {
                new_meta.insert("uid".into(), v.clone());
            }
            // A uid in the body is a precondition, as kube-apiserver's storage checks it.
            (Some(n), Some(o)) if n != o => {
                return Err(ApiError::conflict_with(
                    &r.gr,
                    name(old),
                    &format!(
                        "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                        n.as_str().unwrap_or_default(),
                        o.as_str().unwrap_or_default()
                    ),
                ))
            }
            _ => {}
        }
        // As kube-apiserver: the stored creation time stays, whatever the client sends back
        // (the official JavaScript client sends it with milliseconds).
        if let Some(created) = old_meta.get("creationTimestamp") {
            new_meta.insert("creationTimestamp".into(), created.clone());
        }
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
        ] {
            match old_meta.get(f) {
                Some(v) => {
                    new_meta.insert(f.into(), v.clone());
                }
                None => {
                    new_meta.remove(f);
                }
            }
        }
        if let Some(cluster) = old_meta
            .get("annotations")
            .and_then(|a| a.get(CLUSTER_ANNOTATION))
            .and_then(Value::as_str)
        {
            set_cluster_annotation(new_meta, cluster);
        }
    }
    if is_deleting(old) {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            causes.push(Cause {
                reason: "FieldValueForbidden".into(),
                message: format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    added.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
                ),
                field: "metadata.finalizers".into(),
            });
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(r.kind(), &r.ty.group, name(old), causes));
    }
    if tracks_generation(r) && spec_changed(old, new, r.ty.status_subresource) {
        let g = meta(old)
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(1);
        meta_mut(new).insert("generation".into(), json!(g + 1));
    }
    Ok(())
}

/// Whether two versions of an object are the same write (resourceVersion ignored).
pub fn same_object(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        v
    };
    strip(a) == strip(b)
}

/// The encoder that stores `obj` with its `resourceVersion` set to the commit revision.
pub fn encoder(mut obj: Value) -> Encoder {
    Box::new(move |rev: Revision| {
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rev.to_string()));
        encode_exact(&obj)
    })
}

/// `v` as compact JSON in a buffer exactly as long as the encoding (see
/// [`crate::storage::kept`]). The encoding grows a scratch buffer of this thread instead of a
/// fresh one, so an object costs one allocation instead of one per doubling.
fn encode_exact(v: &Value) -> Vec<u8> {
    /// A scratch buffer larger than this is let go after use, so one huge object does not pin
    /// its size on the thread.
    const SCRATCH_KEPT: usize = 64 * 1024;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        // Writing a `Value` to a `Vec` cannot fail (its map keys are strings).
        let out = match serde_json::to_writer(&mut *buf, v) {
            Ok(()) => buf.as_slice().to_vec(),
            Err(_) => Vec::new(),
        };
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        out
    })
}

/// The length of `v` as compact JSON if it is at most `limit` bytes; `None` beyond (measured
/// only up to the limit, so a huge value costs no more than a small one).
pub fn json_len_within(v: &Value, limit: usize) -> Option<usize> {
    struct Counter {
        n: usize,
        limit: usize,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n += buf.len();
            if self.n > self.limit {
                return Err(std::io::Error::other("over the limit"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter { n: 0, limit };
    serde_json::to_writer(&mut c, v).ok()?;
    Some(c.n)
}

/// Parses stored bytes (written by this server, so always JSON objects).
pub fn decode_stored(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::internal(format!("stored object is not valid JSON: {e}")))
}

/// A resourceVersion given by a client, as a revision.
pub fn parse_resource_version(rv: &str) -> Result<Revision, ApiError> {
    rv.parse::<Revision>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {rv:?}: must be a decimal number"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::resource::TypeInfo;

    fn resource(plural: &str) -> std::sync::Arc<Resource> {
        let ty = api::serving::served_types()
            .into_iter()
            .map(TypeInfo::from)
            .find(|t| t.plural == plural)
            .expect("a built-in type");
        std::sync::Arc::new(Resource::new(ty))
    }

    #[test]
    fn the_encoder_returns_exactly_the_bytes_of_the_object() {
        // Sizes around the scratch buffer's doublings and beyond what it keeps.
        for n in [0, 900, 1_300, 2_100, 70_000, 10] {
            let obj = json!({"metadata": {"name": "a"}, "data": {"x": "x".repeat(n)}});
            let bytes = encoder(obj.clone())(7);
            assert_eq!(bytes.capacity(), bytes.len(), "payload of {n}");
            let mut expected = obj;
            expected["metadata"]["resourceVersion"] = json!("7");
            assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), expected);
        }
    }

    #[test]
    fn stored_deletion_mark_read_without_the_tree() {
        let deleting = br#"{"metadata":{"name":"a","deletionTimestamp":"2026-01-01T00:00:00Z"}}"#;
        assert!(stored_is_deleting(deleting).unwrap());
        for live in [
            &br#"{"metadata":{"name":"a"},"spec":{"finalizers":["kubernetes"]}}"#[..],
            br#"{"metadata":{"name":"a","deletionTimestamp":null}}"#,
            br#"{"kind":"Namespace"}"#,
        ] {
            assert!(!stored_is_deleting(live).unwrap());
        }
        let err = stored_is_deleting(b"{not json").unwrap_err();
        assert_eq!(err.code, 500);
    }

    #[test]
    fn create_sets_server_fields_and_drops_status() {
        let r = resource("platformmeshes");
        let mut obj = json!({"metadata": {"name": "a", "uid": "x", "resourceVersion": "5"}, "spec": {}, "status": {"x": 1}});
        prepare_for_create(&mut obj, &r, "root");
        let m = meta(&obj).expect("meta");
        assert_ne!(m["uid"], "x");
        assert!(m.get("resourceVersion").is_none());
        assert_eq!(m["generation"], 1);
        assert_eq!(m["annotations"][CLUSTER_ANNOTATION], "root");
        assert!(obj.get("status").is_none());
    }

    #[test]
    fn generation_and_status_split() {
        let r = resource("platformmeshes");
        let old = json!({"metadata": {"name": "a", "uid": "u", "generation": 3, "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"a": 1}, "status": {"s": 1}});
        let mut same = json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"a": 1}, "status": {"s": 2}});
        prepare_for_update(&mut same, &old, &r, WritePart::Main).expect("update");
        assert_eq!(same["metadata"]["generation"], 3);
        assert_eq!(same["status"]["s"], 1);
        let mut changed = json!({"metadata": {"name": "a"}, "spec": {"a": 2}});
        prepare_for_update(&mut changed, &old, &r, WritePart::Main).expect("update");
        assert_eq!(changed["metadata"]["generation"], 4);
        let mut status = json!({"metadata": {"name": "a", "labels": {"no": "pe"}}, "spec": {"a": 9}, "status": {"s": 7}});
        prepare_for_update(&mut status, &old, &r, WritePart::Status).expect("status");
        assert_eq!(status["spec"]["a"], 1);
        assert_eq!(status["status"]["s"], 7);
        assert!(status["metadata"].get("labels").is_none());
    }

    #[test]
    fn no_new_finalizers_while_deleting() {
        let r = resource("configmaps");
        let old = json!({"metadata": {"name": "a", "deletionTimestamp": "2020-01-01T00:00:00Z", "finalizers": ["a"]}});
        let mut new = json!({"metadata": {"name": "a", "finalizers": ["a", "b"]}});
        let err = prepare_for_update(&mut new, &old, &r, WritePart::Main).expect_err("forbidden");
        assert_eq!(err.code, 422);
        assert!(
            err.message.contains("no new finalizers can be added"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_different_uid_is_a_failed_precondition() {
        let r = resource("configmaps");
        let old = json!({"metadata": {"name": "a", "uid": "u1"}});
        let mut new = json!({"metadata": {"name": "a", "uid": "u2"}});
        let err = prepare_for_update(&mut new, &old, &r, WritePart::Main).expect_err("conflict");
        assert_eq!(err.code, 409);
        assert!(
            err.message
                .ends_with("Precondition failed: UID in precondition: u2, UID in object meta: u1"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_stored_creation_time_stays_whatever_an_update_sends() {
        let r = resource("configmaps");
        let old = json!({"metadata": {"name": "a", "uid": "u1",
            "creationTimestamp": "2026-11-26T04:08:01Z"}});
        for sent in [
            json!("2026-11-26T04:08:01.000Z"),
            json!("1999-01-01T00:00:00Z"),
            Value::Null,
        ] {
            let mut new =
                json!({"metadata": {"name": "a", "uid": "u1", "creationTimestamp": sent}});
            prepare_for_update(&mut new, &old, &r, WritePart::Main).expect("accepted");
            assert_eq!(new["metadata"]["creationTimestamp"], "2026-11-26T04:08:01Z");
        }
    }

    #[test]
    fn encoder_embeds_revision() {
        let bytes = encoder(json!({"metadata": {"name": "a"}}))(42);
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["metadata"]["resourceVersion"], "42");
    }
}
