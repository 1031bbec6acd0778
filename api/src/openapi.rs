//! OpenAPI definitions as kube-apiserver publishes them: the apimachinery types every document
//! shares (ObjectMeta, ListMeta, Status, DeleteOptions, ...) and the built-in kinds served, each
//! a named schema whose references point at other named schemas.
//!
//! The schemas come from k8s-openapi (generated from the same Go types as kube's). k8s-openapi
//! leaves out how kube merges the values of some fields (the `x-kubernetes-list-type`,
//! `x-kubernetes-map-type` and `x-kubernetes-patch-*` extensions); [`FIELD_MERGES`] and
//! [`ATOMIC_OBJECTS`] state them, and clients need them: `kubectl apply` computes its strategic
//! merge patch from these extensions, and fails on a `metadata` it cannot look into.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, DeleteOptions, ListMeta, ObjectMeta, Patch, Status, WatchEvent,
};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{json, Value};

/// Where OpenAPI v3 documents keep their named schemas.
pub const SCHEMA_PREFIX: &str = "#/components/schemas/";

/// The metadata of every object.
pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
/// The metadata of every list.
pub const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
/// The result of a request that returns no object (deletes, errors).
pub const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
/// The body of a delete.
pub const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
/// The body of a patch, whatever its type.
pub const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
/// One event of a watch.
pub const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
/// The resources of one group version (`GET /apis/<group>/<version>`).
pub const API_RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";

const OWNER_REFERENCE: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference";
const LABEL_SELECTOR: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector";
const LABEL_SELECTOR_REQUIREMENT: &str =
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement";
const API_RESOURCE: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResource";
const STATUS_DETAILS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.StatusDetails";

/// Named schemas, OpenAPI v3 style: references are `#/components/schemas/<name>`.
pub type Definitions = BTreeMap<String, Value>;

/// How kube merges the value of one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldMerge {
    /// Replaced as a whole (`x-kubernetes-list-type: atomic`).
    Atomic,
    /// A set of scalars (`x-kubernetes-list-type: set`) that strategic merge patches merge
    /// (`x-kubernetes-patch-strategy: merge`).
    MergedSet,
    /// A list of objects identified by the value of one key (`x-kubernetes-list-type: map`,
    /// `x-kubernetes-list-map-keys`), merged by it in strategic merge patches
    /// (`x-kubernetes-patch-strategy: merge`, `x-kubernetes-patch-merge-key`).
    MergedByKey(&'static str),
}

impl FieldMerge {
    /// The extensions kube publishes on the field for this behaviour.
    pub fn extensions(self) -> Vec<(&'static str, Value)> {
        match self {
            FieldMerge::Atomic => vec![("x-kubernetes-list-type", json!("atomic"))],
            FieldMerge::MergedSet => vec![
                ("x-kubernetes-list-type", json!("set")),
                ("x-kubernetes-patch-strategy", json!("merge")),
            ],
            FieldMerge::MergedByKey(key) => vec![
                ("x-kubernetes-list-map-keys", json!([key])),
                ("x-kubernetes-list-type", json!("map")),
                ("x-kubernetes-patch-merge-key", json!(key)),
                ("x-kubernetes-patch-strategy", json!("merge")),
            ],
        }
    }
}

/// The fields of the shared types and the served built-in kinds whose values kube does not merge
/// the default way (objects merge key by key, lists are replaced): definition, field, behaviour.
pub const FIELD_MERGES: &[(&str, &str, FieldMerge)] = &[
    (OBJECT_META, "finalizers", FieldMerge::MergedSet),
    (OBJECT_META, "managedFields", FieldMerge::Atomic),
    (
        OBJECT_META,
        "ownerReferences",
        FieldMerge::MergedByKey("uid"),
    ),
    (DELETE_OPTIONS, "dryRun", FieldMerge::Atomic),
    // kube marks the (object) details of a Status atomic, with the list-type extension.
    (STATUS, "details", FieldMerge::Atomic),
    (STATUS_DETAILS, "causes", FieldMerge::Atomic),
    (API_RESOURCE_LIST, "resources", FieldMerge::Atomic),
    (API_RESOURCE, "categories", FieldMerge::Atomic),
    (API_RESOURCE, "shortNames", FieldMerge::Atomic),
    (LABEL_SELECTOR, "matchExpressions", FieldMerge::Atomic),
    (LABEL_SELECTOR_REQUIREMENT, "values", FieldMerge::Atomic),
    (
        "io.k8s.api.core.v1.NamespaceSpec",
        "finalizers",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.core.v1.NamespaceStatus",
        "conditions",
        FieldMerge::MergedByKey("type"),
    ),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "imagePullSecrets",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "secrets",
        FieldMerge::MergedByKey("name"),
    ),
    ("io.k8s.api.rbac.v1.Role", "rules", FieldMerge::Atomic),
    (
        "io.k8s.api.rbac.v1.ClusterRole",
        "rules",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.AggregationRule",
        "clusterRoleSelectors",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.RoleBinding",
        "subjects",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.ClusterRoleBinding",
        "subjects",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.PolicyRule",
        "apiGroups",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.PolicyRule",
        "nonResourceURLs",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.PolicyRule",
        "resourceNames",
        FieldMerge::Atomic,
    ),
    (
        "io.k8s.api.rbac.v1.PolicyRule",
        "resources",
        FieldMerge::Atomic,
    ),
    ("io.k8s.api.rbac.v1.PolicyRule", "verbs", FieldMerge::Atomic),
];

/// Objects kube replaces as a whole wherever they appear (`x-kubernetes-map-type: atomic`).
pub const ATOMIC_OBJECTS: &[&str] = &[
    OWNER_REFERENCE,
    LABEL_SELECTOR,
    "io.k8s.api.core.v1.ObjectReference",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.rbac.v1.RoleRef",
    "io.k8s.api.rbac.v1.Subject",
];

/// The built-in kinds k8s-openapi describes here: group, version, kind and the name of the
/// kind's definition.
const BUILTIN_KINDS: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "ConfigMap", "io.k8s.api.core.v1.ConfigMap"),
    ("", "v1", "Secret", "io.k8s.api.core.v1.Secret"),
    ("", "v1", "Namespace", "io.k8s.api.core.v1.Namespace"),
    (
        "",
        "v1",
        "ServiceAccount",
        "io.k8s.api.core.v1.ServiceAccount",
    ),
    ("", "v1", "Event", "io.k8s.api.core.v1.Event"),
    ("events.k8s.io", "v1", "Event", "io.k8s.api.events.v1.Event"),
    (
        "coordination.k8s.io",
        "v1",
        "Lease",
        "io.k8s.api.coordination.v1.Lease",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "io.k8s.api.rbac.v1.Role",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "io.k8s.api.rbac.v1.ClusterRole",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "io.k8s.api.rbac.v1.RoleBinding",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "io.k8s.api.rbac.v1.ClusterRoleBinding",
    ),
];

/// Every definition: the shared types, the built-in kinds of [`builtin_kind`] and what they
/// refer to. Computed once.
pub fn definitions() -> &'static Definitions {
    static DEFINITIONS: OnceLock<Definitions> = OnceLock::new();
    DEFINITIONS.get_or_init(build_definitions)
}

/// The definition name of a built-in kind k8s-openapi describes (`io.k8s.api.rbac.v1.Role`).
pub fn builtin_kind(group: &str, version: &str, kind: &str) -> Option<&'static str> {
    BUILTIN_KINDS
        .iter()
        .find(|(g, v, k, _)| *g == group && *v == version && *k == kind)
        .map(|(_, _, _, name)| *name)
}

/// The `apiVersion` or `kind` property every kind has, with its standard description.
pub fn type_meta_property(field: &str) -> Value {
    definitions()
        .get("io.k8s.api.core.v1.ConfigMap")
        .and_then(|d| d.pointer(&format!("/properties/{field}")))
        .cloned()
        .unwrap_or_else(|| json!({"type": "string"}))
}

/// The `metadata` property of a kind: a reference to ObjectMeta with the standard description.
pub fn object_metadata_property() -> Value {
    reference_property(OBJECT_META, "io.k8s.api.core.v1.ConfigMap")
}

/// The `metadata` property of a list: a reference to ListMeta with the standard description.
pub fn list_metadata_property() -> Value {
    reference_property(LIST_META, STATUS)
}

/// A `metadata` property referring to `target`, described as `metadata` of `described_in` is.
fn reference_property(target: &str, described_in: &str) -> Value {
    let mut property = json!({"allOf": [{"$ref": format!("{SCHEMA_PREFIX}{target}")}]});
    if let Some(description) = definitions()
        .get(described_in)
        .and_then(|d| d.pointer("/properties/metadata/description"))
    {
        property["description"] = description.clone();
    }
    property
}

fn build_definitions() -> Definitions {
    let mut generator: SchemaGenerator = SchemaSettings::openapi3()
        .with(|s| s.meta_schema = None)
        .into_generator();
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<ListMeta>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<Patch>();
    generator.subschema_for::<WatchEvent<()>>();
    generator.subschema_for::<APIResourceList>();
    generator.subschema_for::<ConfigMap>();
    generator.subschema_for::<Secret>();
    generator.subschema_for::<Namespace>();
    generator.subschema_for::<ServiceAccount>();
    generator.subschema_for::<Event>();
    generator.subschema_for::<EventsV1Event>();
    generator.subschema_for::<Lease>();
    generator.subschema_for::<Role>();
    generator.subschema_for::<ClusterRole>();
    generator.subschema_for::<RoleBinding>();
    generator.subschema_for::<ClusterRoleBinding>();
    let mut definitions: Definitions = generator.take_definitions(true).into_iter().collect();
    for (name, definition) in definitions.iter_mut() {
        if !METADATA_REQUIRED.contains(&name.as_str()) {
            optional_metadata(definition);
        }
    }
    for (definition, field, merge) in FIELD_MERGES {
        if let Some(property) = definitions
            .get_mut(*definition)
            .and_then(|d| d.pointer_mut(&format!("/properties/{field}")))
            .and_then(Value::as_object_mut)
        {
            for (key, value) in merge.extensions() {
                property.insert(key.into(), value);
            }
        }
    }
    for name in ATOMIC_OBJECTS {
        if let Some(definition) = definitions.get_mut(*name).and_then(Value::as_object_mut) {
            definition.insert("x-kubernetes-map-type".into(), json!("atomic"));
        }
    }
    definitions
}

/// The only definitions here that kube publishes with `metadata` required. k8s-openapi requires
/// it of every kind (and of Status), as its Rust field is not an `Option`.
const METADATA_REQUIRED: &[&str] = &["io.k8s.api.core.v1.Event"];

/// Drops `metadata` from the required fields of a definition.
fn optional_metadata(kind: &mut Value) {
    let Some(obj) = kind.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(required)) = obj.get_mut("required") {
        required.retain(|r| r != "metadata");
        if required.is_empty() {
            obj.remove("required");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn property<'a>(definition: &str, field: &str) -> &'a Value {
        definitions()
            .get(definition)
            .and_then(|d| d.pointer(&format!("/properties/{field}")))
            .unwrap_or_else(|| panic!("{definition}.{field}"))
    }

    #[test]
    fn object_meta_has_its_fields_and_merge_semantics() {
        let owners = property(OBJECT_META, "ownerReferences");
        assert_eq!(owners["x-kubernetes-patch-merge-key"], "uid");
        assert_eq!(owners["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(owners["x-kubernetes-list-type"], "map");
        assert_eq!(owners["x-kubernetes-list-map-keys"], json!(["uid"]));
        assert_eq!(
            owners["items"]["$ref"],
            format!("{SCHEMA_PREFIX}{OWNER_REFERENCE}")
        );
        let finalizers = property(OBJECT_META, "finalizers");
        assert_eq!(finalizers["x-kubernetes-list-type"], "set");
        assert_eq!(finalizers["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(
            property(OBJECT_META, "annotations")["additionalProperties"]["type"],
            "string"
        );
        // A reference with a description is written kube's way, as a one-element allOf.
        let created = property(OBJECT_META, "creationTimestamp");
        assert_eq!(
            created["allOf"][0]["$ref"],
            format!("{SCHEMA_PREFIX}io.k8s.apimachinery.pkg.apis.meta.v1.Time")
        );
        assert!(created["description"].is_string());
        assert_eq!(
            definitions()[OWNER_REFERENCE]["x-kubernetes-map-type"],
            "atomic"
        );
    }

    #[test]
    fn every_merge_fact_names_an_existing_field_and_every_kind_is_defined() {
        for (definition, field, _) in FIELD_MERGES {
            property(definition, field);
        }
        for name in ATOMIC_OBJECTS {
            assert!(definitions().contains_key(*name), "{name}");
        }
        for (_, _, _, name) in BUILTIN_KINDS {
            let kind = &definitions()[*name];
            assert_eq!(
                kind["properties"]["metadata"]["allOf"][0]["$ref"],
                format!("{SCHEMA_PREFIX}{OBJECT_META}"),
                "{name}"
            );
            let requires_metadata = kind["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("metadata")));
            assert_eq!(
                requires_metadata,
                METADATA_REQUIRED.contains(name),
                "{name}"
            );
        }
    }

    #[test]
    fn every_reference_resolves() {
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        out.push(r.clone());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        definitions().values().for_each(|d| refs(d, &mut all));
        assert!(!all.is_empty());
        for r in all {
            let name = r.strip_prefix(SCHEMA_PREFIX).expect("v3 reference");
            assert!(definitions().contains_key(name), "{r}");
        }
    }

    #[test]
    fn standard_properties_carry_descriptions() {
        assert_eq!(type_meta_property("kind")["type"], "string");
        assert!(type_meta_property("apiVersion")["description"].is_string());
        assert!(object_metadata_property()["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Standard object's metadata")));
        assert!(list_metadata_property()["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Standard list metadata")));
    }
}
