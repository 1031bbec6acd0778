//! One served type: what the server knows of it ([`TypeInfo`]), its storage keys and printer
//! columns ([`Resource`]), and how its versions convert ([`Conversion`]).

use api::serving::{ColumnSource, PrinterColumn, ResourceType};
use serde_json::Value;

use crate::meta::status::GroupResource;
use crate::meta::table::{ColumnSpec, Source};

/// Verbs every served resource supports.
pub const RESOURCE_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// The same verbs in the order kube-apiserver lists them for custom resources.
pub const CUSTOM_RESOURCE_VERBS: &[&str] = &[
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "create",
    "update",
    "watch",
];
/// Verbs of the status subresource.
pub const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

/// What the server knows about one type it serves: built in, from a CRD, or bound from an
/// APIExport. Owned, because CRDs and bindings add types at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeInfo {
    /// `""` for the core group.
    pub group: String,
    /// The API version served (`v1`, `v1alpha1`).
    pub version: String,
    /// The kind of one object (`ConfigMap`).
    pub kind: String,
    /// The kind of a list of them (`ConfigMapList`).
    pub list_kind: String,
    /// The plural resource name, used in URLs and RBAC rules (`configmaps`).
    pub plural: String,
    /// The singular name (`configmap`), as discovery reports it.
    pub singular: String,
    /// Short names for kubectl (`cm`).
    pub short_names: Vec<String>,
    /// Categories for kubectl (`all`).
    pub categories: Vec<String>,
    /// Whether objects live in a namespace (otherwise they are cluster-scoped).
    pub namespaced: bool,
    /// Whether the type has a `status` subresource; then writes to the main resource keep the
    /// stored status, and only the subresource changes it.
    pub status_subresource: bool,
    /// Only the built-in core kinds accept strategic merge patches.
    pub strategic_merge_patch: bool,
    /// Extra columns of the table output (`kubectl get`).
    pub printer_columns: Vec<PrinterColumn>,
    /// The structural schema of the whole object.
    pub schema: Value,
}

impl From<ResourceType> for TypeInfo {
    fn from(t: ResourceType) -> Self {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        TypeInfo {
            group: t.group.to_string(),
            version: t.version.to_string(),
            kind: t.kind.to_string(),
            list_kind: t.list_kind.to_string(),
            plural: t.plural.to_string(),
            singular: t.singular.to_string(),
            short_names: strings(t.short_names),
            categories: strings(t.categories),
            namespaced: t.namespaced,
            status_subresource: t.status_subresource,
            strategic_merge_patch: t.strategic_merge_patch,
            printer_columns: t.printer_columns,
            schema: t.schema,
        }
    }
}

/// One served resource type.
#[derive(Debug)]
pub struct Resource {
    /// What the server knows about the type: names, scope, columns, schema.
    pub ty: TypeInfo,
    /// Its group and plural resource, as errors name it.
    pub gr: GroupResource,
    /// `v1` for core, `<group>/<version>` otherwise.
    pub api_version: String,
    /// Printer columns, compiled once.
    pub columns: Vec<ColumnSpec>,
    /// Set when objects are stored in another version of the same type.
    pub conversion: Option<Conversion>,
    key_prefix: String,
}

/// How a served version maps to the stored one (both directions work on whole objects).
#[derive(Clone, Copy, Debug)]
pub struct Conversion {
    /// Stored object → this version.
    pub to_served: fn(&mut Value),
    /// This version → stored object.
    pub to_storage: fn(&mut Value),
}

impl Resource {
    /// A resource stored under its own group and plural.
    pub fn new(ty: TypeInfo) -> Self {
        let storage = ty.plural.clone();
        Self::with_storage_name(ty, &storage)
    }

    /// A resource stored under `storage` instead of its plural (bound resources add the
    /// APIExport's identity, so two exports of the same group and resource never mix).
    pub fn with_storage_name(ty: TypeInfo, storage: &str) -> Self {
        let api_version = if ty.group.is_empty() {
            ty.version.clone()
        } else {
            format!("{}/{}", ty.group, ty.version)
        };
        let key_group = if ty.group.is_empty() {
            "core"
        } else {
            ty.group.as_str()
        };
        let columns = compile_columns(&ty.printer_columns);
        Resource {
            gr: GroupResource::new(ty.group.clone(), ty.plural.clone()),
            api_version,
            key_prefix: format!("/{key_group}/{storage}/"),
            conversion: None,
            columns,
            ty,
        }
    }

    /// This resource, serving stored objects through `conversion`.
    pub fn with_conversion(mut self, conversion: Conversion) -> Self {
        self.conversion = Some(conversion);
        self
    }

    /// A stored object as this version serves it.
    pub fn to_served(&self, mut obj: Value) -> Value {
        if let Some(c) = &self.conversion {
            (c.to_served)(&mut obj);
            obj["apiVersion"] = Value::String(self.api_version.clone());
        }
        obj
    }

    /// An object of this version as it is stored.
    pub fn to_storage(&self, mut obj: Value) -> Value {
        if let Some(c) = &self.conversion {
            (c.to_storage)(&mut obj);
        }
        obj
    }

    /// The storage key of one object.
    pub fn key(&self, cluster: &str, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.ty.namespaced => format!("{}{cluster}/{ns}/{name}", self.key_prefix),
            _ => format!("{}{cluster}/{name}", self.key_prefix),
        }
    }

    /// The key prefix of every object of this type in every cluster.
    pub fn all_clusters_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The key prefix of this type in one cluster, optionally one namespace.
    pub fn prefix(&self, cluster: Option<&str>, namespace: Option<&str>) -> String {
        match (cluster, namespace) {
            (None, _) => self.key_prefix.clone(),
            (Some(c), Some(ns)) if self.ty.namespaced => format!("{}{c}/{ns}/", self.key_prefix),
            (Some(c), _) => format!("{}{c}/", self.key_prefix),
        }
    }

    /// The kind of one object of this type.
    pub fn kind(&self) -> &str {
        &self.ty.kind
    }
}

/// Turns the type's printer columns into table column specs. A column whose JSONPath does not
/// parse is left out (the CRD generator and the tests keep that from happening).
fn compile_columns(columns: &[PrinterColumn]) -> Vec<ColumnSpec> {
    columns
        .iter()
        .filter_map(|c| {
            let source = match &c.source {
                ColumnSource::JsonPath(p) => {
                    Source::JsonPath(crate::meta::jsonpath::parse(p).ok()?)
                }
                ColumnSource::Count(paths) => Source::Count(
                    paths
                        .iter()
                        .map(|p| {
                            p.trim_start_matches('.')
                                .split('.')
                                .map(str::to_string)
                                .collect()
                        })
                        .collect(),
                ),
            };
            Some(
                ColumnSpec::new(&c.name, &c.type_, source)
                    .with_format(&c.format)
                    .with_description(&c.description)
                    .with_priority(c.priority),
            )
        })
        .collect()
}
