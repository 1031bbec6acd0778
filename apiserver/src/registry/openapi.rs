//! OpenAPI documents: `/openapi/v3` (root and one document per group version) and `/openapi/v2`
//! (one document of everything, in JSON and in the protobuf form client-go decodes).
//!
//! Both describe the same operations and schemas, as kube-apiserver does: each operation carries
//! `x-kubernetes-action` and `x-kubernetes-group-version-kind` (kubectl finds a kind's patch
//! types by them) and each kind refers to the shared definitions of [`api::openapi`]: ObjectMeta
//! with the merge keys of its lists (`kubectl apply` computes its patches from them), ListMeta,
//! Status, DeleteOptions, Patch, WatchEvent and APIResourceList. Built-in kinds are described by
//! their own definitions; custom resources by their schema, with kube's additions (`apiVersion`,
//! `kind` and an ObjectMeta `metadata`, also inside embedded resources).

mod v2;

use std::collections::{BTreeMap, BTreeSet};

use api::openapi::{self as defs, Definitions, SCHEMA_PREFIX};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};

use crate::registry::{Registry, Resource};

/// The precomputed OpenAPI documents of one registry.
#[derive(Debug)]
pub struct OpenApi {
    root: Bytes,
    documents: BTreeMap<String, (Bytes, String)>,
    v2_json: Bytes,
    v2_protobuf: Bytes,
}

/// The server's reported Kubernetes-compatible version (for `/version` and OpenAPI `info`).
pub const KUBE_VERSION: &str = "v1.33.0";

/// The `info.title` of every document.
const TITLE: &str = "platform-mesh";

impl OpenApi {
    /// Builds every document for the resources of `registry`: one OpenAPI v3 document per group
    /// version, the v3 root listing them, and the v2 document.
    pub fn build(registry: &Registry) -> Self {
        let mut gvs: Vec<(String, String)> = Vec::new();
        for r in registry.resources() {
            let gv = (r.ty.group.to_string(), r.ty.version.to_string());
            if !gvs.contains(&gv) {
                gvs.push(gv);
            }
        }
        let mut documents = BTreeMap::new();
        let mut paths = Map::new();
        let mut all = v2::Document::default();
        for (g, v) in &gvs {
            let spec = Spec::group_version(registry, &gvs, g, v);
            let bytes = Bytes::from(serde_json::to_vec(&spec.v3()).unwrap_or_default());
            let hash = hex_upper(&Sha512::digest(&bytes));
            let key = gv_path(g, v);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
            documents.insert(key, (bytes, hash));
            all.add(&spec);
        }
        let root = Bytes::from(serde_json::to_vec(&json!({"paths": paths})).unwrap_or_default());
        let v2 = all.to_json();
        OpenApi {
            root,
            documents,
            v2_protobuf: Bytes::from(v2::protobuf(&v2)),
            v2_json: Bytes::from(serde_json::to_vec(&v2).unwrap_or_default()),
        }
    }

    /// The `/openapi/v3` root: the path of each group-version document, with its hash.
    pub fn root(&self) -> Bytes {
        self.root.clone()
    }

    /// The document of one group version and its hash.
    pub fn document(&self, group: &str, version: &str) -> Option<(Bytes, &str)> {
        self.documents
            .get(&gv_path(group, version))
            .map(|(b, h)| (b.clone(), h.as_str()))
    }

    /// The `/openapi/v2` document as JSON.
    pub fn v2_json(&self) -> Bytes {
        self.v2_json.clone()
    }

    /// The `/openapi/v2` document in the protobuf encoding client-go decodes.
    pub fn v2_protobuf(&self) -> Bytes {
        self.v2_protobuf.clone()
    }
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The schema component name of a kind that has no built-in definition: the group reversed, as
/// Kubernetes names the definitions of custom resources.
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    if group.is_empty() {
        return format!("io.k8s.api.core.{version}.{kind}");
    }
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// Where a parameter goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum In {
    Path,
    Query,
}

/// One parameter of an operation or a path.
#[derive(Clone, Copy, Debug)]
struct Param {
    name: &'static str,
    location: In,
    /// `string`, `integer` or `boolean`.
    ty: &'static str,
    description: &'static str,
}

const fn query(name: &'static str, ty: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: In::Query,
        ty,
        description,
    }
}

const fn path(name: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: In::Path,
        ty: "string",
        description,
    }
}

const NAME: Param = path("name", "The name of the object.");
const NAMESPACE: Param = path("namespace", "The namespace of the objects.");
const PRETTY: Param = query("pretty", "string", "If 'true', the output is indented.");

const WRITE: &[Param] = &[
    query(
        "dryRun",
        "string",
        "When present, indicates that modifications should not be persisted. Valid value: All",
    ),
    query(
        "fieldManager",
        "string",
        "A name associated with the actor or entity that is making these changes.",
    ),
    query(
        "fieldValidation",
        "string",
        "How the server treats unknown or duplicate fields in the body: Ignore, Warn (default) or Strict.",
    ),
];

const FORCE: Param = query(
    "force",
    "boolean",
    "Force is going to force Apply requests.",
);

const DELETE: &[Param] = &[
    query(
        "dryRun",
        "string",
        "When present, indicates that modifications should not be persisted. Valid value: All",
    ),
    query(
        "gracePeriodSeconds",
        "integer",
        "The duration in seconds before the object should be deleted.",
    ),
    query(
        "orphanDependents",
        "boolean",
        "Deprecated: whether the dependent objects should be orphaned; use propagationPolicy.",
    ),
    query(
        "propagationPolicy",
        "string",
        "Whether and how garbage collection is performed: Orphan, Background or Foreground.",
    ),
];

const LIST: &[Param] = &[
    query(
        "allowWatchBookmarks",
        "boolean",
        "Requests watch events of type BOOKMARK.",
    ),
    query(
        "continue",
        "string",
        "The continue token of the previous page of a chunked list.",
    ),
    query(
        "fieldSelector",
        "string",
        "Restricts the objects by their fields.",
    ),
    query(
        "labelSelector",
        "string",
        "Restricts the objects by their labels.",
    ),
    query(
        "limit",
        "integer",
        "The most objects one page of a list holds.",
    ),
    query(
        "resourceVersion",
        "string",
        "The resource version the list or watch starts from.",
    ),
    query(
        "resourceVersionMatch",
        "string",
        "How resourceVersion applies to a list.",
    ),
    query(
        "sendInitialEvents",
        "boolean",
        "Whether a watch begins with the objects that exist.",
    ),
    query(
        "timeoutSeconds",
        "integer",
        "Ends the list or watch after this many seconds.",
    ),
    query(
        "watch",
        "boolean",
        "Watch for changes instead of listing the objects.",
    ),
];

/// The patch types every resource accepts; built-in kinds also take strategic merge patches.
const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];
const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";

/// What an operation reads from its body.
#[derive(Clone, Debug)]
struct Body {
    /// The definition of the body.
    schema: String,
    /// Its media types; `*/*` for any encoding of the object.
    content_types: Vec<&'static str>,
    required: bool,
}

/// One operation of a path, in neither OpenAPI version's syntax.
#[derive(Clone, Debug)]
struct Operation {
    /// `get`, `put`, `post`, `delete` or `patch`.
    method: &'static str,
    /// `x-kubernetes-action`.
    action: &'static str,
    operation_id: String,
    /// `x-kubernetes-group-version-kind`: group, version, kind.
    gvk: Option<(String, String, String)>,
    parameters: Vec<Param>,
    body: Option<Body>,
    /// Status codes and the definition each one answers with.
    responses: Vec<(&'static str, String)>,
}

/// One path: its operations and the parameters they share.
#[derive(Clone, Debug, Default)]
struct PathItem {
    operations: Vec<Operation>,
    parameters: Vec<Param>,
}

/// The operations and schemas of one group version, from which both OpenAPI versions are written.
#[derive(Debug, Default)]
struct Spec {
    paths: BTreeMap<String, PathItem>,
    /// Every definition the paths and the kinds refer to.
    schemas: Definitions,
}

impl Spec {
    /// The group version `group`/`version` of `registry`; `served` are all its group versions
    /// (the kinds of DeleteOptions and WatchEvent, as kube lists them).
    fn group_version(
        registry: &Registry,
        served: &[(String, String)],
        group: &str,
        version: &str,
    ) -> Spec {
        let mut spec = Spec::default();
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        spec.paths.insert(
            format!("{base}/"),
            PathItem {
                operations: vec![Operation {
                    method: "get",
                    action: "get",
                    operation_id: "getAPIResources".into(),
                    gvk: None,
                    parameters: vec![],
                    body: None,
                    responses: vec![("200", defs::API_RESOURCE_LIST.into())],
                }],
                parameters: vec![],
            },
        );
        for r in registry.group_version(group, version) {
            spec.add_resource(r, &base);
        }
        spec.complete(served);
        spec
    }

    /// The definitions, paths and (for built-in kinds) watch paths of one resource.
    fn add_resource(&mut self, r: &Resource, base: &str) {
        let t = &r.ty;
        // Built-in kinds (only they take strategic merge patches) have their own definitions.
        let builtin = defs::builtin_kind(&t.group, &t.version, &t.kind)
            .filter(|_| t.strategic_merge_patch)
            .and_then(|name| Some((name, defs::definitions().get(name)?)));
        let (kind_def, mut kind_schema) = match builtin {
            Some((name, schema)) => (name.to_string(), schema.clone()),
            None => (
                definition_name(&t.group, &t.version, &t.kind),
                kube_native(&t.schema),
            ),
        };
        if let Value::Object(m) = &mut kind_schema {
            m.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": t.group, "version": t.version, "kind": t.kind}]),
            );
        }
        let prefix = kind_def
            .strip_suffix(t.kind.as_str())
            .unwrap_or(&kind_def)
            .to_string();
        let list_def = format!("{prefix}{}", t.list_kind);
        let list_schema = list_schema(r, &kind_def);
        self.schemas.insert(kind_def.clone(), kind_schema);
        self.schemas.insert(list_def.clone(), list_schema);

        let gvk = Some((t.group.clone(), t.version.clone(), t.kind.clone()));
        let op = |method,
                  action,
                  id: &str,
                  parameters: &[Param],
                  responses: &[&'static str],
                  def: &str| {
            Operation {
                method,
                action,
                operation_id: format!("{action}{}{id}", t.kind),
                gvk: gvk.clone(),
                parameters: parameters.to_vec(),
                body: None,
                responses: responses.iter().map(|c| (*c, def.to_string())).collect(),
            }
        };
        let with_body =
            |mut o: Operation, schema: &str, content_types: Vec<&'static str>, required| {
                o.body = Some(Body {
                    schema: schema.into(),
                    content_types,
                    required,
                });
                o
            };
        let mut patch_types = PATCH_TYPES.to_vec();
        if t.strategic_merge_patch {
            patch_types.push(STRATEGIC_MERGE_PATCH);
        }
        let mut patch_params = WRITE.to_vec();
        patch_params.push(FORCE);
        let mut deletecollection_params = LIST.to_vec();
        deletecollection_params.extend_from_slice(DELETE);
        let (scope, scope_params) = if t.namespaced {
            ("namespaces/{namespace}/", vec![NAMESPACE, PRETTY])
        } else {
            ("", vec![PRETTY])
        };
        let collection = format!("{base}/{scope}{}", t.plural);
        self.paths.insert(
            collection.clone(),
            PathItem {
                operations: vec![
                    op("get", "list", "", LIST, &["200"], &list_def),
                    with_body(
                        op("post", "post", "", WRITE, &["200", "201", "202"], &kind_def),
                        &kind_def,
                        vec!["*/*"],
                        true,
                    ),
                    with_body(
                        op(
                            "delete",
                            "deletecollection",
                            "Collection",
                            &deletecollection_params,
                            &["200"],
                            defs::STATUS,
                        ),
                        defs::DELETE_OPTIONS,
                        vec!["*/*"],
                        false,
                    ),
                ],
                parameters: scope_params.clone(),
            },
        );
        let mut item_params = vec![NAME];
        item_params.extend_from_slice(&scope_params);
        let main_and_status: &[(&str, &str)] = if t.status_subresource {
            &[("", ""), ("/status", "Status")]
        } else {
            &[("", "")]
        };
        for (suffix, id) in main_and_status {
            let mut operations = vec![
                op("get", "get", id, &[], &["200"], &kind_def),
                with_body(
                    op("put", "put", id, WRITE, &["200", "201"], &kind_def),
                    &kind_def,
                    vec!["*/*"],
                    true,
                ),
                with_body(
                    op(
                        "patch",
                        "patch",
                        id,
                        &patch_params,
                        &["200", "201"],
                        &kind_def,
                    ),
                    defs::PATCH,
                    patch_types.clone(),
                    true,
                ),
            ];
            if suffix.is_empty() {
                operations.push(with_body(
                    op(
                        "delete",
                        "delete",
                        id,
                        DELETE,
                        &["200", "202"],
                        defs::STATUS,
                    ),
                    defs::DELETE_OPTIONS,
                    vec!["*/*"],
                    false,
                ));
            }
            self.paths.insert(
                format!("{collection}/{{name}}{suffix}"),
                PathItem {
                    operations,
                    parameters: item_params.clone(),
                },
            );
        }
        if t.namespaced {
            self.paths.insert(
                format!("{base}/{}", t.plural),
                PathItem {
                    operations: vec![op(
                        "get",
                        "list",
                        "ForAllNamespaces",
                        LIST,
                        &["200"],
                        &list_def,
                    )],
                    parameters: vec![PRETTY],
                },
            );
        }
        // kube documents the deprecated `/watch/` paths of its built-in kinds (not of custom
        // resources); they are served for every kind.
        if builtin.is_some() {
            let watch_collection = format!("{base}/watch/{scope}{}", t.plural);
            let mut watches = vec![
                (
                    watch_collection.clone(),
                    "watchlist",
                    "List",
                    scope_params.clone(),
                ),
                (
                    format!("{watch_collection}/{{name}}"),
                    "watch",
                    "",
                    item_params,
                ),
            ];
            if t.namespaced {
                watches.push((
                    format!("{base}/watch/{}", t.plural),
                    "watchlist",
                    "ListForAllNamespaces",
                    vec![PRETTY],
                ));
            }
            for (path, action, id, parameters) in watches {
                self.paths.insert(
                    path,
                    PathItem {
                        operations: vec![op("get", action, id, LIST, &["200"], defs::WATCH_EVENT)],
                        parameters,
                    },
                );
            }
        }
    }

    /// Adds every shared definition the paths and kinds refer to (and what those refer to),
    /// with the kinds kube lists on them.
    fn complete(&mut self, served: &[(String, String)]) {
        let mut wanted: Vec<String> = Vec::new();
        for item in self.paths.values() {
            for op in &item.operations {
                wanted.extend(op.body.iter().map(|b| b.schema.clone()));
                wanted.extend(op.responses.iter().map(|(_, s)| s.clone()));
            }
        }
        for schema in self.schemas.values() {
            references(schema, &mut wanted);
        }
        while let Some(name) = wanted.pop() {
            if self.schemas.contains_key(&name) {
                continue;
            }
            let Some(schema) = defs::definitions().get(&name) else {
                continue;
            };
            let mut schema = schema.clone();
            references(&schema, &mut wanted);
            let kinds = shared_kinds(&name, served);
            if let (false, Value::Object(m)) = (kinds.is_empty(), &mut schema) {
                m.insert(
                    "x-kubernetes-group-version-kind".into(),
                    Value::Array(kinds),
                );
            }
            self.schemas.insert(name, schema);
        }
    }

    /// The OpenAPI v3 document.
    fn v3(&self) -> Value {
        let mut paths = Map::new();
        for (path, item) in &self.paths {
            let mut out = Map::new();
            for op in &item.operations {
                out.insert(op.method.into(), v3_operation(op));
            }
            if !item.parameters.is_empty() {
                out.insert(
                    "parameters".into(),
                    item.parameters.iter().map(v3_parameter).collect(),
                );
            }
            paths.insert(path.clone(), Value::Object(out));
        }
        json!({
            "openapi": "3.0.0",
            "info": {"title": TITLE, "version": KUBE_VERSION},
            "paths": paths,
            "components": {"schemas": self.schemas},
        })
    }
}

/// The group-version-kinds kube lists on a shared definition: Status and APIResourceList are
/// core `v1` kinds, DeleteOptions and WatchEvent are kinds of every group version.
fn shared_kinds(name: &str, served: &[(String, String)]) -> Vec<Value> {
    let kind = name.rsplit('.').next().unwrap_or_default();
    let gvk = |g: &str, v: &str| json!({"group": g, "version": v, "kind": kind});
    match name {
        defs::STATUS | defs::API_RESOURCE_LIST => vec![gvk("", "v1")],
        defs::DELETE_OPTIONS | defs::WATCH_EVENT => {
            let mut gvs: BTreeSet<(&str, &str)> = served
                .iter()
                .map(|(g, v)| (g.as_str(), v.as_str()))
                .collect();
            gvs.insert(("", "v1"));
            gvs.into_iter().map(|(g, v)| gvk(g, v)).collect()
        }
        _ => vec![],
    }
}

/// Adds the definition names `schema` refers to onto `out`.
fn references(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(m) => {
            if let Some(name) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(SCHEMA_PREFIX))
            {
                out.push(name.to_string());
            }
            m.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
        _ => {}
    }
}

/// A kind's schema as kube publishes a custom resource's: `apiVersion` and `kind` described,
/// `metadata` an ObjectMeta, and the same for every embedded resource inside.
fn kube_native(schema: &Value) -> Value {
    let mut out = schema.clone();
    let Value::Object(root) = &mut out else {
        return json!({"type": "object"});
    };
    embedded_in_children(root);
    with_type_meta(root);
    out
}

/// [`embedded_resources`] over the properties, items and additional properties of `obj`.
fn embedded_in_children(obj: &mut Map<String, Value>) {
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        props.values_mut().for_each(embedded_resources);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = obj.get_mut(key) {
            embedded_resources(sub);
        }
    }
}

/// Describes `apiVersion`, `kind` and an ObjectMeta `metadata` among the properties of `obj`.
fn with_type_meta(obj: &mut Map<String, Value>) {
    let props = obj
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(props) = props {
        props.insert("apiVersion".into(), defs::type_meta_property("apiVersion"));
        props.insert("kind".into(), defs::type_meta_property("kind"));
        props.insert("metadata".into(), defs::object_metadata_property());
    }
}

/// Gives every `x-kubernetes-embedded-resource` object in `schema` the `apiVersion`, `kind` and
/// ObjectMeta `metadata` of a kind, as kube does.
fn embedded_resources(schema: &mut Value) {
    let Value::Object(obj) = schema else {
        return;
    };
    embedded_in_children(obj);
    if obj.get("x-kubernetes-embedded-resource") != Some(&Value::Bool(true)) {
        return;
    }
    with_type_meta(obj);
    let required = obj
        .entry("required")
        .or_insert_with(|| Value::Array(vec![]));
    if let Value::Array(required) = required {
        for field in ["apiVersion", "kind"] {
            if !required.iter().any(|r| r == field) {
                required.push(json!(field));
            }
        }
    }
}

/// The schema of a list of `r`'s objects, `kind_def` the definition of one.
fn list_schema(r: &Resource, kind_def: &str) -> Value {
    let t = &r.ty;
    json!({
        "description": format!("{} is a list of {}", t.list_kind, t.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": defs::type_meta_property("apiVersion"),
            "kind": defs::type_meta_property("kind"),
            "metadata": defs::list_metadata_property(),
            "items": {
                "description": format!(
                    "List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md",
                    t.plural
                ),
                "type": "array",
                "items": {"$ref": format!("{SCHEMA_PREFIX}{kind_def}")},
            },
        },
        "x-kubernetes-group-version-kind": [{"group": t.group, "version": t.version, "kind": t.list_kind}],
    })
}

fn v3_parameter(p: &Param) -> Value {
    let mut out = json!({
        "name": p.name,
        "in": match p.location { In::Path => "path", In::Query => "query" },
        "description": p.description,
        "schema": {"type": p.ty, "uniqueItems": true},
    });
    if p.location == In::Path {
        out["required"] = json!(true);
    }
    out
}

/// The media types of every answer.
const PRODUCES: &[&str] = &["application/json", "application/yaml"];

fn v3_operation(op: &Operation) -> Value {
    let mut responses = Map::new();
    for (code, def) in &op.responses {
        let schema = json!({"$ref": format!("{SCHEMA_PREFIX}{def}")});
        let content: Map<String, Value> = PRODUCES
            .iter()
            .map(|t| (t.to_string(), json!({"schema": schema})))
            .collect();
        responses.insert(
            code.to_string(),
            json!({"description": status_text(code), "content": content}),
        );
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));
    let mut out = json!({
        "operationId": op.operation_id,
        "x-kubernetes-action": op.action,
        "responses": responses,
    });
    if let Some((group, version, kind)) = &op.gvk {
        out["x-kubernetes-group-version-kind"] =
            json!({"group": group, "version": version, "kind": kind});
    }
    if !op.parameters.is_empty() {
        out["parameters"] = op.parameters.iter().map(v3_parameter).collect();
    }
    if let Some(body) = &op.body {
        let schema = json!({"$ref": format!("{SCHEMA_PREFIX}{}", body.schema)});
        let content: Map<String, Value> = body
            .content_types
            .iter()
            .map(|t| (t.to_string(), json!({"schema": schema})))
            .collect();
        out["requestBody"] = json!({"content": content, "required": body.required});
    }
    out
}

fn status_text(code: &str) -> &'static str {
    match code {
        "201" => "Created",
        "202" => "Accepted",
        _ => "OK",
    }
}

#[cfg(test)]
mod tests;
