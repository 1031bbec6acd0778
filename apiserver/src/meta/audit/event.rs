//! The audit event (`audit.k8s.io/v1` Event) and the builder that collects one request's event
//! across the stages the server passes.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use super::*;

/// A user as recorded in an event (authentication.k8s.io/v1 `UserInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UserInfo {
    /// The user name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// The user's uid.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The user's groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Extra attributes from the authenticator.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The object a request is about, as recorded in an event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The resource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    /// The namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The object's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The object's uid, when the request body carries it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The API group; empty for the core group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// The API version.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The object's resourceVersion, when the request body carries it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// The subresource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

impl From<&ResourceAttributes> for ObjectRef {
    fn from(r: &ResourceAttributes) -> Self {
        ObjectRef {
            resource: r.resource.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            api_group: r.api_group.clone(),
            api_version: r.api_version.clone(),
            subresource: r.subresource.clone(),
            ..ObjectRef::default()
        }
    }
}

/// The response's status as recorded in an event (a meta/v1 `Status` with the bounded fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseStatus {
    /// The HTTP status code.
    pub code: u16,
    /// `Success` or `Failure`, when the response was a Status object.
    pub status: String,
    /// The human-readable message of a failure.
    pub message: String,
    /// The machine-readable reason of a failure (`NotFound`, `Forbidden`, ...).
    pub reason: String,
    /// The Status object's `details`, if any.
    pub details: Option<Value>,
}

impl ResponseStatus {
    /// A status with only the code (a successful response).
    pub fn with_code(code: u16) -> Self {
        ResponseStatus {
            code,
            ..ResponseStatus::default()
        }
    }

    /// A failure with its reason and message.
    pub fn failure(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ResponseStatus {
            code,
            status: "Failure".to_string(),
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }

    /// The status of a meta/v1 `Status` object (`kind: Status`); `None` for other objects.
    pub fn from_status_object(obj: &Value) -> Option<Self> {
        if obj.get("kind").and_then(Value::as_str) != Some("Status") {
            return None;
        }
        let text = |key: &str| {
            obj.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Some(ResponseStatus {
            code: obj
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            status: text("status"),
            message: text("message"),
            reason: text("reason"),
            details: obj.get("details").filter(|d| !d.is_null()).cloned(),
        })
    }
}

impl Serialize for ResponseStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Status", 6)?;
        st.serialize_field("metadata", &Map::new())?;
        if self.status.is_empty() {
            st.skip_field("status")?;
        } else {
            st.serialize_field("status", &self.status)?;
        }
        if self.message.is_empty() {
            st.skip_field("message")?;
        } else {
            st.serialize_field("message", &self.message)?;
        }
        if self.reason.is_empty() {
            st.skip_field("reason")?;
        } else {
            st.serialize_field("reason", &self.reason)?;
        }
        match &self.details {
            Some(details) => st.serialize_field("details", details)?,
            None => st.skip_field("details")?,
        }
        if self.code == 0 {
            st.skip_field("code")?;
        } else {
            st.serialize_field("code", &self.code)?;
        }
        st.end()
    }
}

/// One audit event (audit.k8s.io/v1 `Event`), serialized as kube-apiserver's log backend writes
/// it: `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":...}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    kind: &'static str,
    api_version: &'static str,
    /// The level the event was recorded at.
    pub level: Level,
    /// The request's audit ID, the same in every event of the request.
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// The stage the event was written at.
    pub stage: Stage,
    /// The request URI: path and query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The verb.
    pub verb: String,
    /// The authenticated user.
    pub user: UserInfo,
    /// The user the request impersonates, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<UserInfo>,
    /// The client addresses: the `X-Forwarded-For` chain, then the peer.
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    /// The client's `User-Agent`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    /// The object of a resource request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    /// The response status (not at `RequestReceived`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    /// The request body (levels `Request` and `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    /// The response body (level `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// When the request arrived.
    #[serde(serialize_with = "serialize_micro_time")]
    pub request_received_timestamp: OffsetDateTime,
    /// When this stage was reached.
    #[serde(serialize_with = "serialize_micro_time")]
    pub stage_timestamp: OffsetDateTime,
    /// Annotations (the logical cluster, the authorization decision, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Event {
    /// The event as one line of JSON, without the newline.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

const MICRO_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");

/// A timestamp as events write it: RFC 3339 in UTC with microseconds
/// (`2026-01-02T03:04:05.123456Z`).
pub fn format_micro_time(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(MICRO_TIME)
        .unwrap_or_default()
}

fn serialize_micro_time<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_micro_time(*t))
}

/// A new audit ID (a random UUID), for a request without an `Audit-ID` header.
pub fn new_audit_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Removes `metadata.managedFields` from an object, or from each item of a list.
fn strip_managed_fields(obj: &mut Value) {
    let strip = |o: &mut Value| {
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    strip(obj);
    if let Some(items) = obj.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
}

/// Collects what one request's events record, and yields the events at its stages.
///
/// Create it once the request is authenticated, with the policy's [`Decision`] for it; then:
///
/// 1. [`request_received`](Self::request_received) right away;
/// 2. [`set_impersonated_user`](Self::set_impersonated_user) if the request impersonates,
///    [`annotate`](Self::annotate) for annotations (authorization decision, ...),
///    [`set_request_object`](Self::set_request_object) once the body is decoded,
///    [`set_response_object`](Self::set_response_object) with the response body (an error's
///    Status included);
/// 3. for long-running requests (watch, exec, proxy), [`response_started`](Self::response_started)
///    when the response headers are sent;
/// 4. [`response_complete`](Self::response_complete) when the response is done, or
///    [`panicked`](Self::panicked) if the handler panicked.
///
/// Each stage method returns the event to hand to the [`LogWriter`], or `None` when the level is
/// `None` or the decision omits the stage.
#[derive(Clone, Debug)]
pub struct EventBuilder {
    decision: Decision,
    audit_id: String,
    request_uri: String,
    verb: String,
    user: UserInfo,
    impersonated_user: Option<UserInfo>,
    source_ips: Vec<String>,
    user_agent: String,
    object_ref: Option<ObjectRef>,
    request_received: OffsetDateTime,
    annotations: BTreeMap<String, String>,
    request_object: Option<Value>,
    response_object: Option<Value>,
    response_status: Option<ResponseStatus>,
}

impl EventBuilder {
    /// The events of one request: `attributes` give the verb, the user (name and groups) and,
    /// for resource requests, the object reference; `request_uri` is the path with the query.
    /// The request counts as received now (see [`received_at`](Self::received_at)).
    pub fn new(
        decision: Decision,
        attributes: &Attributes,
        audit_id: impl Into<String>,
        request_uri: impl Into<String>,
    ) -> Self {
        EventBuilder {
            decision,
            audit_id: audit_id.into(),
            request_uri: request_uri.into(),
            verb: attributes.verb.clone(),
            user: UserInfo {
                username: attributes.user.clone(),
                groups: attributes.groups.clone(),
                ..UserInfo::default()
            },
            impersonated_user: None,
            source_ips: Vec::new(),
            user_agent: String::new(),
            object_ref: match &attributes.target {
                Target::Resource(r) => Some(ObjectRef::from(r)),
                Target::NonResource { .. } => None,
            },
            request_received: OffsetDateTime::now_utc(),
            annotations: BTreeMap::new(),
            request_object: None,
            response_object: None,
            response_status: None,
        }
    }

    /// Sets when the request arrived.
    pub fn received_at(mut self, at: OffsetDateTime) -> Self {
        self.request_received = at;
        self
    }

    /// Replaces the user taken from the attributes (to add its uid and extra).
    pub fn user(mut self, user: UserInfo) -> Self {
        self.user = user;
        self
    }

    /// Sets the client addresses.
    pub fn source_ips(mut self, ips: Vec<String>) -> Self {
        self.source_ips = ips;
        self
    }

    /// Sets the client's `User-Agent`.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Replaces the object reference taken from the attributes.
    pub fn object_ref(mut self, object_ref: Option<ObjectRef>) -> Self {
        self.object_ref = object_ref;
        self
    }

    /// Records the logical cluster the request is for, under the annotations kcp uses:
    /// [`CLUSTER_ANNOTATION`] and [`WORKSPACE_ANNOTATION`] (the cluster's name) and
    /// [`PATH_ANNOTATION`] (its canonical path; empty when not known).
    pub fn logical_cluster(mut self, cluster: &str, canonical_path: &str) -> Self {
        self.set_logical_cluster(cluster, canonical_path);
        self
    }

    /// As [`logical_cluster`](Self::logical_cluster), once the builder is in use (the cluster
    /// is known only after the workspace path is resolved). Events already taken lack it.
    pub fn set_logical_cluster(&mut self, cluster: &str, canonical_path: &str) {
        if !cluster.is_empty() {
            self.annotate(PATH_ANNOTATION, canonical_path);
            self.annotate(WORKSPACE_ANNOTATION, cluster);
            self.annotate(CLUSTER_ANNOTATION, cluster);
        }
    }

    /// The level of the request.
    pub fn level(&self) -> Level {
        self.decision.level
    }

    /// The decision the events follow.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether the request body is recorded: the server can skip handing it over otherwise.
    pub fn wants_request_object(&self) -> bool {
        self.decision.level >= Level::Request
    }

    /// Whether the response body is recorded: the server can skip handing it over otherwise.
    pub fn wants_response_object(&self) -> bool {
        self.decision.level >= Level::RequestResponse
    }

    /// Records the user the request impersonates.
    pub fn set_impersonated_user(&mut self, user: UserInfo) {
        self.impersonated_user = Some(user);
    }

    /// Adds an annotation. As in kube-apiserver, the first value of a key stays.
    pub fn annotate(&mut self, key: impl Into<String>, value: impl Into<String>) {
        if self.decision.level == Level::None {
            return;
        }
        let key = key.into();
        let value = value.into();
        match self.annotations.get(&key) {
            Some(old) if *old != value => {
                tracing::debug!(key = %key, old = %old, new = %value, "audit annotation already set; kept");
            }
            Some(_) => {}
            None => {
                self.annotations.insert(key, value);
            }
        }
    }

    /// Records the decoded request body: its namespace, name, uid and resourceVersion fill what
    /// the object reference lacks, and at levels `Request` and `RequestResponse` the body itself
    /// is recorded.
    pub fn set_request_object(&mut self, obj: &Value) {
        if self.decision.level == Level::None {
            return;
        }
        if let (Some(r), Some(meta)) = (self.object_ref.as_mut(), obj.get("metadata")) {
            let text = |key: &str| meta.get(key).and_then(Value::as_str).unwrap_or_default();
            for (field, key) in [
                (&mut r.namespace, "namespace"),
                (&mut r.name, "name"),
                (&mut r.uid, "uid"),
                (&mut r.resource_version, "resourceVersion"),
            ] {
                if field.is_empty() {
                    *field = text(key).to_string();
                }
            }
        }
        if self.wants_request_object() {
            let mut obj = obj.clone();
            if self.decision.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            self.request_object = Some(obj);
        }
    }

    /// Records the response body: a Status object (an error) becomes the response status, and
    /// at level `RequestResponse` the body itself is recorded.
    pub fn set_response_object(&mut self, obj: &Value) {
        if self.decision.level == Level::None {
            return;
        }
        if let Some(status) = ResponseStatus::from_status_object(obj) {
            self.response_status = Some(status);
        }
        if self.wants_response_object() {
            let mut obj = obj.clone();
            if self.decision.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            self.response_object = Some(obj);
        }
    }

    /// Sets the response status (replacing one taken from a Status body).
    pub fn set_response_status(&mut self, status: ResponseStatus) {
        self.response_status = Some(status);
    }

    /// Sets the HTTP status code of the response, keeping a Status body's reason and message.
    pub fn set_response_code(&mut self, code: u16) {
        self.response_status
            .get_or_insert_with(ResponseStatus::default)
            .code = code;
    }

    /// The event of stage `RequestReceived`: call it once the request is authenticated.
    pub fn request_received(&self) -> Option<Event> {
        self.event_at(Stage::RequestReceived, OffsetDateTime::now_utc())
    }

    /// The event of stage `ResponseStarted`, for a long-running request whose response headers
    /// (status `code`) were just sent.
    pub fn response_started(&mut self, code: u16) -> Option<Event> {
        self.set_response_code(code);
        self.event_at(Stage::ResponseStarted, OffsetDateTime::now_utc())
    }

    /// The event of stage `ResponseComplete`: the response, of status `code`, is done.
    pub fn response_complete(&mut self, code: u16) -> Option<Event> {
        self.set_response_code(code);
        self.event_at(Stage::ResponseComplete, OffsetDateTime::now_utc())
    }

    /// The event of stage `Panic`: the handler panicked with `message`; the response status is
    /// a 500 InternalError.
    pub fn panicked(&mut self, message: &str) -> Option<Event> {
        self.response_status = Some(ResponseStatus::failure(
            500,
            "InternalError",
            format!("the API server panicked while handling the request: {message}"),
        ));
        self.event_at(Stage::Panic, OffsetDateTime::now_utc())
    }

    /// The event of `stage` as of `at`, or `None` when the decision does not record it. At
    /// `RequestReceived` the event has no response status and no bodies.
    pub fn event_at(&self, stage: Stage, at: OffsetDateTime) -> Option<Event> {
        if !self.decision.records(stage) {
            return None;
        }
        let received = stage == Stage::RequestReceived;
        let level = self.decision.level;
        Some(Event {
            kind: "Event",
            api_version: API_VERSION,
            level,
            audit_id: self.audit_id.clone(),
            stage,
            request_uri: self.request_uri.clone(),
            verb: self.verb.clone(),
            user: self.user.clone(),
            impersonated_user: self.impersonated_user.clone(),
            source_ips: self.source_ips.clone(),
            user_agent: self.user_agent.clone(),
            object_ref: self.object_ref.clone(),
            response_status: if received {
                None
            } else {
                self.response_status.clone()
            },
            request_object: if received || level < Level::Request {
                None
            } else {
                self.request_object.clone()
            },
            response_object: if received || level < Level::RequestResponse {
                None
            } else {
                self.response_object.clone()
            },
            request_received_timestamp: self.request_received,
            stage_timestamp: at,
            annotations: self.annotations.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::audit::fixtures::{decision, non_resource, resource};
    use serde_json::json;
    use time::macros::datetime;
    use time::PrimitiveDateTime;

    // --- events ---

    const RECEIVED: OffsetDateTime = datetime!(2026-01-02 03:04:05.123456 UTC);
    const DONE: OffsetDateTime = datetime!(2026-01-02 03:04:05.234567 UTC);

    fn builder(level: Level, attrs: &Attributes) -> EventBuilder {
        EventBuilder::new(
            decision(level),
            attrs,
            "0b9e6c5e-2f5a-4a45-9d7e-1d1f0d6f6a11",
            "/api/v1/namespaces/default/pods?limit=500",
        )
        .received_at(RECEIVED)
        .source_ips(vec!["10.0.0.1".into()])
        .user_agent("kubectl/v1.33.0")
    }

    fn pod_body() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "default", "uid": "u-1",
                            "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]}})
    }

    fn complete(b: &mut EventBuilder, code: u16) -> Value {
        b.set_response_code(code);
        let e = b.event_at(Stage::ResponseComplete, DONE).unwrap();
        serde_json::from_str(&e.to_json().unwrap()).unwrap()
    }

    #[test]
    fn event_metadata_shape() {
        let attrs = resource("list", "", "pods", "", "default", "");
        let mut b = builder(Level::Metadata, &attrs).logical_cluster("root", "root");
        b.set_request_object(&pod_body());
        b.set_response_object(&json!({"kind": "PodList", "items": []}));
        b.set_response_code(200);
        let line = b
            .event_at(Stage::ResponseComplete, DONE)
            .unwrap()
            .to_json()
            .unwrap();
        assert_eq!(
            line,
            concat!(
                r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","#,
                r#""auditID":"0b9e6c5e-2f5a-4a45-9d7e-1d1f0d6f6a11","stage":"ResponseComplete","#,
                r#""requestURI":"/api/v1/namespaces/default/pods?limit=500","verb":"list","#,
                r#""user":{"username":"alice","groups":["dev","system:authenticated"]},"#,
                r#""sourceIPs":["10.0.0.1"],"userAgent":"kubectl/v1.33.0","#,
                r#""objectRef":{"resource":"pods","namespace":"default","name":"p","uid":"u-1","#,
                r#""apiVersion":"v1","resourceVersion":"7"},"#,
                r#""responseStatus":{"metadata":{},"code":200},"#,
                r#""requestReceivedTimestamp":"2026-01-02T03:04:05.123456Z","#,
                r#""stageTimestamp":"2026-01-02T03:04:05.234567Z","#,
                r#""annotations":{"kcp.io/cluster":"root","kcp.io/path":"root","#,
                r#""tenancy.kcp.io/workspace":"root"}}"#
            )
        );
    }

    #[test]
    fn event_request_level_has_request_object_only() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::Request, &attrs);
        assert!(b.wants_request_object());
        assert!(!b.wants_response_object());
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert_eq!(v["requestObject"], pod_body());
        assert!(v.get("responseObject").is_none());
        assert_eq!(v["responseStatus"], json!({"metadata": {}, "code": 201}));
    }

    #[test]
    fn event_request_response_level_has_both_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::RequestResponse, &attrs);
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert_eq!(v["requestObject"], pod_body());
        assert_eq!(v["responseObject"], pod_body());
        assert_eq!(v["level"], "RequestResponse");
    }

    #[test]
    fn event_metadata_level_has_no_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::Metadata, &attrs);
        assert!(!b.wants_request_object());
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert!(v.get("requestObject").is_none());
        assert!(v.get("responseObject").is_none());
    }

    #[test]
    fn event_omits_managed_fields_when_decided() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let d = Decision {
            level: Level::RequestResponse,
            omit_stages: vec![],
            omit_managed_fields: true,
        };
        let mut b = EventBuilder::new(d, &attrs, "id", "/api/v1/namespaces/default/pods");
        b.set_request_object(&pod_body());
        let list = json!({"kind": "PodList", "items": [pod_body(), pod_body()]});
        b.set_response_object(&list);
        let v = complete(&mut b, 200);
        assert!(v["requestObject"]["metadata"]
            .get("managedFields")
            .is_none());
        assert_eq!(v["requestObject"]["metadata"]["name"], "p");
        for item in v["responseObject"]["items"].as_array().unwrap() {
            assert!(item["metadata"].get("managedFields").is_none());
        }
    }

    #[test]
    fn event_level_none_and_omitted_stages_yield_nothing() {
        let attrs = resource("get", "", "pods", "", "default", "p");
        let mut none = builder(Level::None, &attrs);
        assert!(none.request_received().is_none());
        assert!(none.response_started(200).is_none());
        assert!(none.response_complete(200).is_none());
        assert!(none.panicked("boom").is_none());
        let d = Decision {
            level: Level::Metadata,
            omit_stages: vec![Stage::RequestReceived, Stage::Panic],
            omit_managed_fields: false,
        };
        let mut b = EventBuilder::new(d, &attrs, "id", "/api/v1/namespaces/default/pods/p");
        assert!(b.request_received().is_none());
        assert!(b.panicked("boom").is_none());
        assert_eq!(
            b.response_started(200).map(|e| e.stage),
            Some(Stage::ResponseStarted)
        );
        assert_eq!(
            b.response_complete(200).map(|e| e.stage),
            Some(Stage::ResponseComplete)
        );
    }

    #[test]
    fn event_request_received_has_no_status_or_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::RequestResponse, &attrs);
        b.set_request_object(&pod_body());
        b.set_response_code(201);
        let e = b.request_received().unwrap();
        assert_eq!(e.stage, Stage::RequestReceived);
        assert!(e.response_status.is_none());
        assert!(e.request_object.is_none());
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        assert!(v.get("responseStatus").is_none());
        assert!(v.get("requestObject").is_none());
    }

    #[test]
    fn event_failure_status_from_status_object() {
        let attrs = resource("get", "", "pods", "", "default", "missing");
        let mut b = builder(Level::Metadata, &attrs);
        b.set_response_object(&json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "kind": "pods"}, "code": 404}));
        let line = {
            b.set_response_code(404);
            b.event_at(Stage::ResponseComplete, DONE)
                .unwrap()
                .to_json()
                .unwrap()
        };
        assert!(
            line.contains(concat!(
                r#""responseStatus":{"metadata":{},"status":"Failure","#,
                r#""message":"pods \"missing\" not found","reason":"NotFound","details":{"#
            )),
            "{line}"
        );
        assert!(
            line.contains(r#""},"code":404},"requestReceivedTimestamp""#),
            "{line}"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v["responseStatus"]["details"],
            json!({"name": "missing", "kind": "pods"})
        );
    }

    #[test]
    fn event_panic_and_impersonation() {
        let attrs = non_resource("get", "/healthz");
        let mut b = builder(Level::Metadata, &attrs);
        b.set_impersonated_user(UserInfo {
            username: "bob".into(),
            groups: vec!["ops".into()],
            ..UserInfo::default()
        });
        let e = b.panicked("index out of range").unwrap();
        assert_eq!(e.stage, Stage::Panic);
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        assert_eq!(v["responseStatus"]["code"], 500);
        assert_eq!(v["responseStatus"]["status"], "Failure");
        assert_eq!(v["responseStatus"]["reason"], "InternalError");
        assert!(v["responseStatus"]["message"]
            .as_str()
            .unwrap()
            .contains("index out of range"));
        assert_eq!(
            v["impersonatedUser"],
            json!({"username": "bob", "groups": ["ops"]})
        );
        assert!(v.get("objectRef").is_none());
    }

    #[test]
    fn event_object_ref_omits_empty_fields() {
        let attrs = resource("update", "apps", "deployments", "scale", "team", "web");
        let mut b = builder(Level::Metadata, &attrs);
        let v = complete(&mut b, 200);
        assert_eq!(
            v["objectRef"],
            json!({"resource": "deployments", "namespace": "team", "name": "web",
                   "apiGroup": "apps", "apiVersion": "v1beta1", "subresource": "scale"})
        );
        let cluster = resource("list", "", "namespaces", "", "", "");
        let v = complete(&mut builder(Level::Metadata, &cluster), 200);
        assert_eq!(
            v["objectRef"],
            json!({"resource": "namespaces", "apiVersion": "v1"})
        );
    }

    #[test]
    fn event_annotations_keep_the_first_value() {
        let attrs = resource("get", "", "pods", "", "default", "p");
        let mut b = builder(Level::Metadata, &attrs).logical_cluster("2abc", "");
        b.annotate("authorization.k8s.io/decision", "allow");
        b.annotate("authorization.k8s.io/decision", "forbid");
        let e = b.event_at(Stage::ResponseComplete, DONE).unwrap();
        assert_eq!(e.annotations["authorization.k8s.io/decision"], "allow");
        assert_eq!(e.annotations[CLUSTER_ANNOTATION], "2abc");
        assert_eq!(e.annotations[WORKSPACE_ANNOTATION], "2abc");
        assert_eq!(e.annotations[PATH_ANNOTATION], "");
    }

    #[test]
    fn timestamp_format_is_rfc3339_micro_utc() {
        assert_eq!(format_micro_time(RECEIVED), "2026-01-02T03:04:05.123456Z");
        assert_eq!(
            format_micro_time(datetime!(2026-01-02 03:04:05 UTC)),
            "2026-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            format_micro_time(datetime!(2026-01-02 05:04:05.5 +02:00)),
            "2026-01-02T03:04:05.500000Z"
        );
        let attrs = non_resource("get", "/version");
        let e = builder(Level::Metadata, &attrs).request_received().unwrap();
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        let stamp = v["stageTimestamp"].as_str().unwrap();
        assert_eq!(stamp.len(), "2026-01-02T03:04:05.123456Z".len(), "{stamp}");
        assert!(
            stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.',
            "{stamp}"
        );
        assert!(
            PrimitiveDateTime::parse(stamp, MICRO_TIME).is_ok(),
            "{stamp}"
        );
    }
}
