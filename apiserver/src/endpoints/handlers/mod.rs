//! Resource handlers, one file per verb, over one generic store: every served type goes
//! through the same code; a type only contributes its [`Resource`] description.

mod apply;
mod create;
mod delete;
mod get;
mod list;
mod patch;
mod update;
mod watch;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use crate::access::budget::Budgets;
use crate::admission::namespaces::NamespaceLifecycle;
use crate::admission::Admission;
use crate::endpoints::exchange::ServedType;
use crate::meta::body::Body;
use crate::meta::response::{bytes_response, error_response};
use crate::meta::status::{ApiError, Cause, GroupResource};
use crate::meta::table;
use crate::registry::catalog::Catalog;
use crate::registry::objects::{self, WritePart};
use crate::registry::{GenericStore, Resource, Stored, Write, Written};
use crate::request::identity::Identity;
use crate::request::negotiation::{negotiate_resource, Encoding, Negotiated, Output};
use crate::request::query::{FieldValidation, Query};
use crate::request::request_info::{ClusterTarget, ResourceRequest, Verb};
use crate::storage::KeyValue;

pub use crate::registry::MAX_OBJECT_BYTES;

/// What the resource handlers work with: narrow handles, not the whole server.
#[derive(Clone)]
pub struct ResourceScope {
    /// The write path of every type, and the storage lists and watches read.
    pub objects: Arc<GenericStore>,
    /// The admission every write passes.
    pub admission: Arc<dyn Admission>,
    /// What every logical cluster serves (wildcard requests look types up across clusters).
    pub catalog: Arc<Catalog>,
    /// The `default` namespace of every cluster.
    pub namespaces: Arc<NamespaceLifecycle>,
    /// What each user may make the server hold: unread list answers, open watches.
    pub budgets: Arc<Budgets>,
}

/// One resource request with everything the verb handlers need.
pub struct ResourceCall {
    /// The handles the handlers work with (a virtual workspace puts its own admission here).
    pub scope: ResourceScope,
    /// The API surface the request sees.
    pub view: Arc<crate::registry::catalog::ApiView>,
    /// Where the type of a request across every cluster (`/clusters/*`) is looked up.
    pub types: TypeLookup,
    /// Which objects the request may see; `None` for all of them.
    pub visibility: Option<Arc<dyn Visibility>>,
    /// The logical cluster the request addresses, already resolved from a workspace path.
    pub cluster: ClusterTarget,
    /// Group, version, resource, namespace, name, subresource and verb from the URL.
    pub request: ResourceRequest,
    /// The decoded query string.
    pub query: Query,
    /// The request headers.
    pub headers: HeaderMap,
    /// The request body, read whole (empty for reads).
    pub body: Bytes,
    /// The user the request acts as, after impersonation; `None` only if unauthenticated (the
    /// filters let no unauthenticated request reach a resource).
    pub identity: Option<Arc<Identity>>,
    /// Marked once the request names a served type by a route it has.
    pub served: ServedType,
}

/// Where a request's type is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeLookup {
    /// In the view, and for a request across every cluster in any cluster's types (a
    /// workspace's own API, and the lifecycle virtual workspaces).
    Workspaces,
    /// In the view only (an APIExport's virtual workspace serves its export's types, also
    /// across clusters).
    ViewOnly,
}

/// Which objects of a resource a request sees: a virtual workspace may show only those that
/// carry a label.
pub trait Visibility: Send + Sync {
    /// The label selector the objects of `resource` must match, when only some are visible.
    fn selector(&self, resource: &Resource) -> Option<String>;
}

/// Only the objects a label selector picks, whatever their resource.
pub struct Labelled(pub String);

impl Visibility for Labelled {
    fn selector(&self, _: &Resource) -> Option<String> {
        Some(self.0.clone())
    }
}

/// The parts of a call after the resource was resolved.
pub(crate) struct Ctx {
    /// The write path and storage.
    pub objects: Arc<GenericStore>,
    /// The admission every write passes.
    pub admission: Arc<dyn Admission>,
    /// Per-user budgets of unread answers and watches.
    pub budgets: Arc<Budgets>,
    pub resource: Arc<Resource>,
    pub cluster: ClusterTarget,
    pub req: ResourceRequest,
    pub query: Query,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub negotiated: Negotiated,
    pub warnings: Vec<String>,
    /// A label selector lists and watches must also satisfy.
    pub forced_selector: Option<String>,
    /// The authenticated user.
    pub identity: Option<Arc<Identity>>,
    /// Bytes of work a write may do beyond its body and the stored object (a JSON patch's
    /// copies), to decide whether it runs off the async workers.
    pub extra_work: usize,
}

impl Ctx {
    /// The addressed cluster; wildcard requests are read-only and never reach writes.
    pub fn cluster_name(&self) -> Result<&str, ApiError> {
        self.cluster
            .name()
            .ok_or_else(|| ApiError::method_not_allowed(self.req.verb.as_str(), &self.resource.gr))
    }

    pub fn gr(&self) -> &GroupResource {
        &self.resource.gr
    }

    pub fn name(&self) -> &str {
        self.req.name.as_deref().unwrap_or("")
    }

    /// The storage key of the named object.
    pub fn key(&self) -> Result<String, ApiError> {
        Ok(self.resource.key(
            self.cluster_name()?,
            self.req.namespace.as_deref(),
            self.name(),
        ))
    }

    pub fn header(&self, name: header::HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The collection the request reads.
    pub fn collection(&self) -> crate::registry::Collection<'_> {
        crate::registry::Collection {
            resource: &self.resource,
            cluster: self.cluster.name(),
            namespace: self.req.namespace.as_deref(),
            name: self.name(),
        }
    }

    /// The objects of the collection the request selects: its label selector (with the one
    /// the surface forces), its field selector, its URL's name and namespace.
    pub fn selection(&self) -> Result<crate::registry::Selection, ApiError> {
        let user = self
            .query
            .get("labelSelector")
            .filter(|s| !s.trim().is_empty());
        let labels = match (user, self.forced_selector.as_deref()) {
            (Some(u), Some(f)) => Some(format!("{u},{f}")),
            (Some(u), None) => Some(u.to_string()),
            (None, Some(f)) => Some(f.to_string()),
            (None, None) => None,
        };
        crate::registry::Selection::new(
            &self.resource,
            self.cluster == ClusterTarget::Wildcard,
            self.req.namespace.as_deref(),
            self.req.name.as_deref(),
            labels.as_deref(),
            self.query
                .get("fieldSelector")
                .filter(|s| !s.trim().is_empty()),
        )
    }

    /// Reads the current state of the named object.
    pub async fn current(&self) -> Result<KeyValue, ApiError> {
        self.objects
            .get(
                &self.resource,
                self.cluster_name()?,
                self.req.namespace.as_deref(),
                self.name(),
            )
            .await
    }

    /// The part of the object the request writes.
    pub fn part(&self) -> WritePart {
        if self.req.subresource.as_deref() == Some("status") {
            WritePart::Status
        } else {
            WritePart::Main
        }
    }

    /// The write this request makes, for the generic store; `manager` is the field manager a
    /// plain write records (`None` for server-side apply, which records its own).
    pub fn write<'a>(&'a self, manager: Option<&'a str>) -> Result<Write<'a>, ApiError> {
        Ok(Write {
            resource: &self.resource,
            cluster: self.cluster_name()?,
            namespace: self.req.namespace.as_deref(),
            name: self.name(),
            part: self.part(),
            user: self.identity.as_deref(),
            dry_run: self.dry_run()?,
            field_validation: schema_mode(self.query.field_validation(self.options_kind())?),
            field_manager: manager,
            work: self.body.len() + self.extra_work,
        })
    }

    /// Answers with what the generic store wrote, its warnings added.
    pub fn respond_written(&mut self, code: StatusCode, written: Written) -> Response<Body> {
        self.warnings.extend(written.warnings);
        match written.stored {
            Stored::Object(bytes) => self.respond_object(code, bytes),
            Stored::DryRun(v) => self.respond_value(code, &v),
        }
    }

    /// Decodes a JSON or YAML request body into an object.
    pub fn decode_body(&self, yaml: bool) -> Result<Value, ApiError> {
        let r = &self.resource;
        let cannot = |why: String| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {why}",
                r.kind(),
                r.ty.version,
                r.kind()
            ))
        };
        if self.body.is_empty() {
            return Err(cannot("the request body is empty".into()));
        }
        let v: Value = if yaml {
            let text = std::str::from_utf8(&self.body)
                .map_err(|_| cannot("the body is not UTF-8".into()))?;
            serde_saphyr::from_str(text)
                .map_err(|e| cannot(format!("error converting YAML to JSON: {e}")))?
        } else {
            serde_json::from_slice(&self.body).map_err(|e| cannot(format!("invalid JSON: {e}")))?
        };
        if !v.is_object() {
            return Err(cannot("the body must be an object".into()));
        }
        Ok(v)
    }

    /// Answers with one object in the negotiated representation.
    pub fn respond_object(&self, code: StatusCode, stored: Bytes) -> Response<Body> {
        let result = match (&self.negotiated.output, self.negotiated.encoding) {
            (Output::Object, Encoding::Json) if self.resource.conversion.is_none() => {
                Ok(bytes_response(code, "application/json", stored))
            }
            _ => objects::decode_stored(&stored).and_then(|v| self.render_value(code, &v)),
        };
        let mut resp = result.unwrap_or_else(|e| error_response(&e));
        self.add_warnings(&mut resp);
        resp
    }

    /// Answers with an object given as a value (dry runs, deleted objects).
    pub fn respond_value(&self, code: StatusCode, v: &Value) -> Response<Body> {
        let mut resp = self
            .render_value(code, v)
            .unwrap_or_else(|e| error_response(&e));
        self.add_warnings(&mut resp);
        resp
    }

    /// Answers with a value exactly as given (Status, lists), JSON or YAML.
    pub fn respond_value_raw(&self, code: StatusCode, v: &Value) -> Response<Body> {
        let mut resp = encode(code, v, self.negotiated.encoding);
        self.add_warnings(&mut resp);
        resp
    }

    fn render_value(&self, code: StatusCode, v: &Value) -> Result<Response<Body>, ApiError> {
        let converted;
        let v = if self.resource.conversion.is_some() {
            converted = self.resource.to_served(v.clone());
            &converted
        } else {
            v
        };
        let out = match &self.negotiated.output {
            Output::Object => v.clone(),
            Output::Table { version } => {
                let include = table::parse_include_object(self.query.get("includeObject"))
                    .map_err(ApiError::bad_request)?;
                table::build_table(
                    &self.resource.columns,
                    &[v],
                    include,
                    &format!("meta.k8s.io/{version}"),
                    // The Table of one object carries its resourceVersion, as kube-apiserver's.
                    match objects::meta_str(v, "resourceVersion") {
                        Some(rv) => json!({"resourceVersion": rv}),
                        None => json!({}),
                    },
                    time::OffsetDateTime::now_utc(),
                    false,
                )
            }
            Output::Metadata { version } => partial_metadata(v, version),
        };
        Ok(encode(code, &out, self.negotiated.encoding))
    }

    pub fn add_warnings(&self, resp: &mut Response<Body>) {
        for w in &self.warnings {
            let text = format!("299 - {:?}", w);
            if let Ok(v) = HeaderValue::from_str(&text) {
                resp.headers_mut().append(header::WARNING, v);
            }
        }
    }

    /// The field manager of a write: `fieldManager`, else the User-Agent up to its first `/`
    /// (its printable characters), else `unknown`, as kube-apiserver names it.
    pub fn field_manager(&self) -> Result<String, ApiError> {
        let mut name = match self.query.get("fieldManager").filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None => self
                .header(header::USER_AGENT)
                .map(|ua| {
                    ua.split('/')
                        .next()
                        .unwrap_or("")
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(128)
                        .collect()
                })
                .unwrap_or_default(),
        };
        if name.is_empty() {
            name = "unknown".into();
        }
        if name.chars().count() > 128 || name.chars().any(|c| c.is_control()) {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                vec![Cause {
                    reason: "FieldValueInvalid".into(),
                    message:
                        "Invalid value: the field manager must be at most 128 printable characters"
                            .into(),
                    field: "fieldManager".into(),
                }],
            ));
        }
        Ok(name)
    }

    /// Whether this is a dry run.
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        self.query.dry_run(self.options_kind())
    }

    /// The kind of the options of this request, as errors about them name it.
    pub fn options_kind(&self) -> &'static str {
        use crate::request::request_info::Verb;
        match self.req.verb {
            Verb::Create => "CreateOptions",
            Verb::Update => "UpdateOptions",
            Verb::Patch => "PatchOptions",
            Verb::Delete | Verb::DeleteCollection => "DeleteOptions",
            Verb::Get => "GetOptions",
            Verb::List | Verb::Watch => "ListOptions",
        }
    }
}

fn schema_mode(mode: FieldValidation) -> crate::meta::schema::FieldValidation {
    match mode {
        FieldValidation::Ignore => crate::meta::schema::FieldValidation::Ignore,
        FieldValidation::Warn => crate::meta::schema::FieldValidation::Warn,
        FieldValidation::Strict => crate::meta::schema::FieldValidation::Strict,
    }
}

/// `PartialObjectMetadata` of an object.
pub(crate) fn partial_metadata(v: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Encodes a value as JSON or YAML.
pub(crate) fn encode(code: StatusCode, v: &Value, encoding: Encoding) -> Response<Body> {
    match encoding {
        Encoding::Json => bytes_response(
            code,
            "application/json",
            Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        ),
        Encoding::Yaml => match serde_saphyr::to_string(v) {
            Ok(s) => bytes_response(code, "application/yaml", Bytes::from(s)),
            Err(e) => error_response(&ApiError::internal(format!("encoding YAML: {e}"))),
        },
    }
}

/// Serves one resource request; marks `call.served` once the type and route are known.
pub async fn serve(call: ResourceCall) -> Response<Body> {
    let req = &call.request;
    let resource = match (&call.cluster, call.types) {
        (ClusterTarget::Wildcard, TypeLookup::Workspaces) => {
            call.scope
                .catalog
                .wildcard_lookup(&req.group, &req.version, &req.resource)
        }
        _ => call
            .view
            .registry
            .lookup(&req.group, &req.version, &req.resource)
            .cloned(),
    };
    let Some(resource) = resource else {
        return error_response(&ApiError::path_not_found());
    };
    if let Err(e) = crate::access::tenancy::check_request(req, call.identity.as_deref()) {
        call.served.mark();
        return error_response(&e);
    }
    if let Err(e) = route(req, &resource) {
        return error_response(&e);
    }
    call.served.mark();
    match serve_inner(call, resource).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// Refuses what kube-apiserver has no route for: a subresource the type lacks, a method its
/// status does not take, a namespace on a cluster-scoped type, writes of a whole collection,
/// and creating a namespaced kind outside a namespace.
fn route(req: &ResourceRequest, resource: &Resource) -> Result<(), ApiError> {
    match req.subresource.as_deref() {
        None => {}
        Some("status")
            if resource.ty.status_subresource
                && !matches!(req.verb, Verb::Get | Verb::Update | Verb::Patch) =>
        {
            return Err(ApiError::method_not_allowed(
                req.verb.as_str(),
                &resource.gr,
            ));
        }
        Some("status") if resource.ty.status_subresource => {}
        Some(_) => return Err(ApiError::path_not_found()),
    }
    if req.namespace.is_some() && !resource.ty.namespaced {
        return Err(ApiError::path_not_found());
    }
    let unrouted = match req.verb {
        Verb::Update | Verb::Patch => req.name.is_none(),
        Verb::Create => req.namespace.is_none() && resource.ty.namespaced,
        _ => false,
    };
    if unrouted {
        // Custom resources have no route there at all (404); built-in kinds refuse the method.
        return Err(if resource.ty.strategic_merge_patch {
            ApiError::method_not_routed()
        } else {
            ApiError::path_not_found()
        });
    }
    Ok(())
}

async fn serve_inner(
    call: ResourceCall,
    resource: Arc<Resource>,
) -> Result<Response<Body>, ApiError> {
    let req = call.request;
    // Objects a virtual workspace does not show do not exist there.
    let forced_selector = call.visibility.as_ref().and_then(|v| v.selector(&resource));
    if let Some(n) = &req.name {
        let problems = crate::meta::names::validate_path_segment_name(n, false);
        if !problems.is_empty() {
            return Err(ApiError::bad_request(format!(
                "invalid resource name {n:?}: {}",
                problems.join(", ")
            )));
        }
    }
    if call.cluster == ClusterTarget::Wildcard && !matches!(req.verb, Verb::List | Verb::Watch) {
        return Err(ApiError::method_not_allowed(
            req.verb.as_str(),
            &resource.gr,
        ));
    }
    let accept = call
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let negotiated = negotiate_resource(accept)?;
    if let ClusterTarget::Name(c) = &call.cluster {
        call.scope.namespaces.ensure_cluster(c).await?;
    }
    // A named object the visibility does not select is not there.
    if let (Some(selector), Some(name), ClusterTarget::Name(c)) =
        (&forced_selector, &req.name, &call.cluster)
    {
        if !matches!(req.verb, Verb::Create) {
            let selector = crate::meta::selectors::LabelSelector::parse(selector)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            match call
                .scope
                .objects
                .get(&resource, c, req.namespace.as_deref(), name)
                .await
            {
                Ok(kv) => {
                    let obj = crate::registry::objects::decode_stored(&kv.value)?;
                    if !selector.matches_object(&obj) {
                        return Err(ApiError::not_found(&resource.gr, name));
                    }
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    let mut ctx = Ctx {
        objects: call.scope.objects,
        admission: call.scope.admission,
        budgets: call.scope.budgets,
        resource,
        cluster: call.cluster,
        req,
        query: call.query,
        headers: call.headers,
        body: call.body,
        negotiated,
        warnings: Vec::new(),
        forced_selector,
        identity: call.identity,
        extra_work: 0,
    };
    match ctx.req.verb {
        Verb::Get => get::get(&ctx).await,
        Verb::List => list::list(&ctx).await,
        Verb::Watch => watch::watch(&ctx).await,
        Verb::Create => create::create(&mut ctx).await,
        Verb::Update => update::update(&mut ctx).await,
        Verb::Patch => patch::patch(&mut ctx).await,
        Verb::Delete => delete::delete(&ctx).await,
        Verb::DeleteCollection => delete::delete_collection(&ctx).await,
    }
}
