//! What the API server serves: identity, scope, printer columns and schema of every type.
//! Platform Mesh kinds are described from their generated CRDs, built-in kinds from k8s-openapi.

use std::borrow::Cow;
use std::sync::OnceLock;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};
use kube::core::crd::CustomResourceExt;
use kube::core::Resource;
use serde_json::Value;

use crate::broker::{AcceptAPI, Migration, MigrationConfiguration};
use crate::core::{Account, AccountInfo, PlatformMesh};
use crate::providers::{ManagedProvider, Provider};
use crate::schema::structural_schema_for;

/// One served resource type (one group/version/kind).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceType {
    /// API group; `""` for the core group.
    pub group: &'static str,
    /// API version, e.g. `v1alpha1`.
    pub version: &'static str,
    /// Kind, e.g. `ConfigMap`.
    pub kind: &'static str,
    /// Kind of the list type, e.g. `ConfigMapList`.
    pub list_kind: &'static str,
    /// Lower-case plural used in URLs, e.g. `configmaps`.
    pub plural: &'static str,
    /// Lower-case singular name, e.g. `configmap`.
    pub singular: &'static str,
    /// Short names accepted by kubectl, e.g. `cm`.
    pub short_names: &'static [&'static str],
    /// Categories the type belongs to (e.g. `all`).
    pub categories: &'static [&'static str],
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether `/status` is a separate subresource (spec and status written separately).
    pub status_subresource: bool,
    /// Whether `application/strategic-merge-patch+json` is accepted (built-in core kinds only).
    pub strategic_merge_patch: bool,
    /// Table columns after the implicit `Name` column, in display order.
    pub printer_columns: Vec<PrinterColumn>,
    /// Structural openAPIV3Schema of the whole object. `metadata` is `{type: object}`: the
    /// server validates metadata itself (see [`crate::schema::object_meta_schema`] for docs).
    pub schema: Value,
}

impl ResourceType {
    /// `apiVersion` of objects of this type: `v1` for core, otherwise `<group>/<version>`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// One server-side printing (Table) column.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    /// Column header, e.g. `Age`.
    pub name: String,
    /// Cell type: `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// Optional format hint (e.g. `int32`); empty when none.
    pub format: String,
    /// Human readable description of the column.
    pub description: String,
    /// `0` for the default view, higher values only in `-o wide`.
    pub priority: i32,
    /// Where the cell value comes from.
    pub source: ColumnSource,
}

/// Source of a printer column value.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnSource {
    /// A CRD-style JSONPath such as `.spec.x` or
    /// `.status.conditions[?(@.type=="Ready")].status`.
    JsonPath(String),
    /// The summed number of entries of the maps or lists at these dot paths (relative to the
    /// object root, no leading dot; a missing field counts 0), e.g. `data` + `binaryData`.
    Count(Vec<String>),
}

impl PrinterColumn {
    /// A column filled from a JSONPath.
    pub fn json_path(name: &str, type_: &str, path: &str, description: &str) -> Self {
        PrinterColumn {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: description.into(),
            priority: 0,
            source: ColumnSource::JsonPath(path.into()),
        }
    }

    /// An integer column counting the entries at the given dot paths.
    pub fn count(name: &str, paths: &[&str], description: &str) -> Self {
        PrinterColumn {
            source: ColumnSource::Count(paths.iter().map(|p| p.to_string()).collect()),
            ..Self::json_path(name, "integer", "", description)
        }
    }

    /// The standard `Age` column (`date` of `.metadata.creationTimestamp`).
    pub fn age() -> Self {
        Self::json_path(
            "Age",
            "date",
            ".metadata.creationTimestamp",
            "Time since the object was created.",
        )
    }

    /// The same column shown only in wide output.
    pub fn wide(self) -> Self {
        PrinterColumn {
            priority: 1,
            ..self
        }
    }

    /// Builds a column from a CRD `additionalPrinterColumns` entry.
    pub fn from_crd_column(column: &CustomResourceColumnDefinition) -> Self {
        PrinterColumn {
            name: column.name.clone(),
            type_: column.type_.clone(),
            format: column.format.clone().unwrap_or_default(),
            description: column.description.clone().unwrap_or_else(|| {
                format!(
                    "Custom resource definition column (in JSONPath format): {}",
                    column.json_path
                )
            }),
            priority: column.priority.unwrap_or(0),
            source: ColumnSource::JsonPath(column.json_path.clone()),
        }
    }
}

/// Every type the server serves: the built-in kinds first, then the Platform Mesh kinds.
///
/// The result is computed once and cloned on each call.
pub fn served_types() -> Vec<ResourceType> {
    static TYPES: OnceLock<Vec<ResourceType>> = OnceLock::new();
    TYPES.get_or_init(build_served_types).clone()
}

fn build_served_types() -> Vec<ResourceType> {
    let crds = crate::crds();
    vec![
        namespace(),
        config_map(),
        secret(),
        service_account(),
        core_event(),
        events_event(),
        lease(),
        rbac(
            "Role",
            "roles",
            "role",
            true,
            structural_schema_for::<Role>(),
        ),
        rbac(
            "ClusterRole",
            "clusterroles",
            "clusterrole",
            false,
            structural_schema_for::<ClusterRole>(),
        ),
        rbac(
            "RoleBinding",
            "rolebindings",
            "rolebinding",
            true,
            structural_schema_for::<RoleBinding>(),
        ),
        rbac(
            "ClusterRoleBinding",
            "clusterrolebindings",
            "clusterrolebinding",
            false,
            structural_schema_for::<ClusterRoleBinding>(),
        ),
        custom::<PlatformMesh>(&crds, "platformmesh"),
        custom::<Account>(&crds, "account"),
        custom::<AccountInfo>(&crds, "accountinfo"),
        custom::<Provider>(&crds, "provider"),
        custom::<ManagedProvider>(&crds, "managedprovider"),
        custom::<AcceptAPI>(&crds, "acceptapi"),
        custom::<Migration>(&crds, "migration"),
        custom::<MigrationConfiguration>(&crds, "migrationconfiguration"),
    ]
}

/// Identity of a built-in kind.
struct BuiltIn {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    list_kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    status_subresource: bool,
}

impl BuiltIn {
    fn serve(self, printer_columns: Vec<PrinterColumn>, schema: Value) -> ResourceType {
        ResourceType {
            group: self.group,
            version: self.version,
            kind: self.kind,
            list_kind: self.list_kind,
            plural: self.plural,
            singular: self.singular,
            short_names: self.short_names,
            categories: &[],
            namespaced: self.namespaced,
            status_subresource: self.status_subresource,
            strategic_merge_patch: true,
            printer_columns,
            schema,
        }
    }
}

fn namespace() -> ResourceType {
    BuiltIn {
        group: "",
        version: "v1",
        kind: "Namespace",
        list_kind: "NamespaceList",
        plural: "namespaces",
        singular: "namespace",
        short_names: &["ns"],
        namespaced: false,
        status_subresource: true,
    }
    .serve(
        vec![
            PrinterColumn::json_path(
                "Status",
                "string",
                ".status.phase",
                "Lifecycle phase of the namespace (Active or Terminating).",
            ),
            PrinterColumn::age(),
        ],
        structural_schema_for::<Namespace>(),
    )
}

fn config_map() -> ResourceType {
    BuiltIn {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        list_kind: "ConfigMapList",
        plural: "configmaps",
        singular: "configmap",
        short_names: &["cm"],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::count(
                "Data",
                &["data", "binaryData"],
                "Number of keys in data and binaryData.",
            ),
            PrinterColumn::age(),
        ],
        structural_schema_for::<ConfigMap>(),
    )
}

fn secret() -> ResourceType {
    BuiltIn {
        group: "",
        version: "v1",
        kind: "Secret",
        list_kind: "SecretList",
        plural: "secrets",
        singular: "secret",
        short_names: &[],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::json_path("Type", "string", ".type", "Type of the secret data."),
            PrinterColumn::count("Data", &["data"], "Number of keys in data."),
            PrinterColumn::age(),
        ],
        structural_schema_for::<Secret>(),
    )
}

fn service_account() -> ResourceType {
    BuiltIn {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        list_kind: "ServiceAccountList",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        short_names: &["sa"],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::count("Secrets", &["secrets"], "Number of referenced secrets."),
            PrinterColumn::age(),
        ],
        structural_schema_for::<ServiceAccount>(),
    )
}

fn core_event() -> ResourceType {
    BuiltIn {
        group: "",
        version: "v1",
        kind: "Event",
        list_kind: "EventList",
        plural: "events",
        singular: "event",
        short_names: &["ev"],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::json_path(
                "Last Seen",
                "date",
                ".lastTimestamp",
                "When the event was last seen.",
            ),
            PrinterColumn::json_path("Type", "string", ".type", "Normal or Warning."),
            PrinterColumn::json_path("Reason", "string", ".reason", "Short reason code."),
            PrinterColumn::json_path(
                "Object",
                "string",
                ".involvedObject.name",
                "Name of the object the event is about.",
            ),
            PrinterColumn::json_path(
                "Subobject",
                "string",
                ".involvedObject.fieldPath",
                "Part of the object the event is about.",
            )
            .wide(),
            PrinterColumn::json_path(
                "Source",
                "string",
                ".source.component",
                "Component that reported the event.",
            )
            .wide(),
            PrinterColumn::json_path("Message", "string", ".message", "Event message."),
            PrinterColumn::json_path(
                "First Seen",
                "date",
                ".firstTimestamp",
                "When the event was first seen.",
            )
            .wide(),
            PrinterColumn::json_path("Count", "integer", ".count", "How often it occurred.").wide(),
            PrinterColumn::json_path("Name", "string", ".metadata.name", "Event name.").wide(),
        ],
        atomic_structs(
            structural_schema_for::<Event>(),
            &["/properties/involvedObject", "/properties/related"],
        ),
    )
}

fn events_event() -> ResourceType {
    BuiltIn {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        list_kind: "EventList",
        plural: "events",
        singular: "event",
        short_names: &["ev"],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::json_path(
                "Last Seen",
                "date",
                ".eventTime",
                "When the event was observed.",
            ),
            PrinterColumn::json_path("Type", "string", ".type", "Normal or Warning."),
            PrinterColumn::json_path("Reason", "string", ".reason", "Short reason code."),
            PrinterColumn::json_path(
                "Object",
                "string",
                ".regarding.name",
                "Name of the object the event is about.",
            ),
            PrinterColumn::json_path(
                "Subobject",
                "string",
                ".regarding.fieldPath",
                "Part of the object the event is about.",
            )
            .wide(),
            PrinterColumn::json_path(
                "Source",
                "string",
                ".reportingController",
                "Controller that reported the event.",
            )
            .wide(),
            PrinterColumn::json_path("Message", "string", ".note", "Event message."),
            PrinterColumn::json_path("Name", "string", ".metadata.name", "Event name.").wide(),
        ],
        atomic_structs(
            structural_schema_for::<EventsV1Event>(),
            &["/properties/regarding", "/properties/related"],
        ),
    )
}

fn lease() -> ResourceType {
    BuiltIn {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        list_kind: "LeaseList",
        plural: "leases",
        singular: "lease",
        short_names: &[],
        namespaced: true,
        status_subresource: false,
    }
    .serve(
        vec![
            PrinterColumn::json_path(
                "Holder",
                "string",
                ".spec.holderIdentity",
                "Identity of the current holder.",
            ),
            PrinterColumn::age(),
        ],
        structural_schema_for::<Lease>(),
    )
}

/// `schema` with the structs at `pointers` atomic, as Kubernetes declares them
/// (`+structType=atomic`: RoleRef, Subject, LabelSelector, ObjectReference): a write sets such a
/// struct as a whole, and owns it as a whole in managedFields.
fn atomic_structs(mut schema: Value, pointers: &[&str]) -> Value {
    for at in pointers {
        if let Some(Value::Object(node)) = schema.pointer_mut(at) {
            node.insert("x-kubernetes-map-type".into(), "atomic".into());
        }
    }
    schema
}

/// An `rbac.authorization.k8s.io/v1` kind; each logical cluster has its own.
fn rbac(
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    schema: Value,
) -> ResourceType {
    let list_kind: &'static str = match kind {
        "Role" => "RoleList",
        "ClusterRole" => "ClusterRoleList",
        "RoleBinding" => "RoleBindingList",
        _ => "ClusterRoleBindingList",
    };
    let mut columns = Vec::new();
    if kind.ends_with("Binding") {
        columns.push(PrinterColumn::json_path(
            "Role",
            "string",
            ".roleRef.name",
            "The role the binding grants.",
        ));
    }
    columns.push(PrinterColumn::age());
    let schema = atomic_structs(
        schema,
        &[
            "/properties/roleRef",
            "/properties/subjects/items",
            "/properties/aggregationRule/properties/clusterRoleSelectors/items",
        ],
    );
    BuiltIn {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind,
        list_kind,
        plural,
        singular,
        short_names: &[],
        namespaced,
        status_subresource: false,
    }
    .serve(columns, schema)
}

/// Describes a Platform Mesh kind from its generated CRD (names, scope, columns, schema).
///
/// Static names come from the kube-derive `Resource` impl; `singular` is passed in and checked
/// against the CRD, as is everything else, so a mismatch fails loudly.
fn custom<K>(crds: &[CustomResourceDefinition], singular: &'static str) -> ResourceType
where
    K: Resource<DynamicType = ()> + CustomResourceExt,
{
    let crd = crds
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(K::crd_name()))
        .unwrap_or_else(|| panic!("no generated CRD {}", K::crd_name()));
    let names = &crd.spec.names;
    let version = &crd.spec.versions[0];
    let (group, kind, plural) = (
        static_name(K::group(&())),
        static_name(K::kind(&())),
        static_name(K::plural(&())),
    );
    assert_eq!(names.singular.as_deref(), Some(singular), "{kind} singular");
    assert_eq!(names.kind, kind);
    assert_eq!(names.plural, plural);
    assert_eq!(crd.spec.group, group);
    let list_kind = LIST_KINDS
        .iter()
        .find(|l| l.strip_suffix("List") == Some(kind))
        .unwrap_or_else(|| panic!("no list kind for {kind}"));
    assert_eq!(names.list_kind.as_deref(), Some(*list_kind));
    assert_eq!(names.categories.clone().unwrap_or_default().len(), 0);
    let mut schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).expect("schema serializes"))
        .expect("generated CRDs carry a schema");
    crate::crds::integral_floats_to_integers(&mut schema);
    ResourceType {
        group,
        version: static_name(K::version(&())),
        kind,
        list_kind,
        plural,
        singular,
        short_names: K::shortnames(),
        categories: &[],
        namespaced: crd.spec.scope == "Namespaced",
        status_subresource: version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some()),
        strategic_merge_patch: false,
        printer_columns: version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(PrinterColumn::from_crd_column)
            .collect(),
        schema,
    }
}

/// List kinds of the Platform Mesh kinds.
const LIST_KINDS: &[&str] = &[
    "PlatformMeshList",
    "AccountList",
    "AccountInfoList",
    "ProviderList",
    "ManagedProviderList",
    "AcceptAPIList",
    "MigrationList",
    "MigrationConfigurationList",
];

/// kube-derive returns its names as borrowed static strings; keep them as such.
fn static_name(name: Cow<'static, str>) -> &'static str {
    match name {
        Cow::Borrowed(s) => s,
        Cow::Owned(s) => panic!("expected a static name, got {s}"),
    }
}

#[cfg(test)]
mod tests;
