//! The `broker.platform-mesh.io/v1alpha1` API group of the resource broker.
//! AcceptAPI declares what a provider accepts; Migration(Configuration) moves resources between providers.

// kube `printcolumn(...)` entries repeat keys such as `type_ = "string"` by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    plain_integer_schema, preserve_unknown_object_schema, Condition, GroupVersionKind,
};

/// Which API (group/version/resource) a provider accepts, optionally narrowed by filters.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "broker.platform-mesh.io",
    version = "v1alpha1",
    kind = "AcceptAPI",
    plural = "acceptapis",
    singular = "acceptapi",
    namespaced,
    status = "AcceptAPIStatus",
    derive = "PartialEq",
    doc = "Declares that a provider accepts resources of one API, optionally filtered.",
    printcolumn(
        name = "Group",
        type_ = "string",
        json_path = ".spec.gvr.group",
        description = "API group of the accepted resources"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.gvr.version",
        description = "API version of the accepted resources",
        priority = 1
    ),
    printcolumn(
        name = "Resource",
        type_ = "string",
        json_path = ".spec.gvr.resource",
        description = "Resource (plural) of the accepted resources"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
pub struct AcceptAPISpec {
    /// Filters that select which resources of the API are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<Filter>>,
    /// The accepted API.
    pub gvr: GroupVersionResource,
}

/// A group/version/resource triple; `group` is empty for the core group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub struct GroupVersionResource {
    /// API group.
    pub group: String,
    /// Resource (plural name).
    pub resource: String,
    /// API version.
    pub version: String,
}

/// A condition on one spec key of a brokered resource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    /// Numeric bounds the value must fall into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary: Option<Boundary>,
    /// Spec key to look at, relative to `spec` (so without a `spec.` prefix).
    #[schemars(length(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("!self.startsWith('spec.')")
        .message("Key must not start with 'spec.' as it is implied"))]
    pub key: String,
    /// Required string suffix of the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Allowed values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_in: Option<Vec<String>>,
}

/// Inclusive numeric bounds; either side may be left open.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Boundary {
    /// Upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer_schema")]
    pub max: Option<i64>,
    /// Lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer_schema")]
    pub min: Option<i64>,
}

/// Observed state of an AcceptAPI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct AcceptAPIStatus {
    /// Current state of the AcceptAPI, one condition per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// A request to move one brokered resource from a source to a target.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "broker.platform-mesh.io",
    version = "v1alpha1",
    kind = "Migration",
    plural = "migrations",
    singular = "migration",
    namespaced,
    status = "MigrationStatus",
    derive = "PartialEq",
    doc = "Moves one brokered resource from a source cluster to a target cluster.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Current state of the migration"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
pub struct MigrationSpec {
    /// The resource to migrate.
    pub from: MigrationRef,
    /// The resource to migrate to.
    pub to: MigrationRef,
}

/// One resource in one cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationRef {
    /// Cluster that holds the resource.
    #[schemars(length(min = 1))]
    pub cluster_name: String,
    /// Group, version and kind of the resource.
    pub gvk: GroupVersionKind,
    /// Resource name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Resource namespace, empty for cluster-scoped resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Observed state of a migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct MigrationStatus {
    /// Current state of the migration, one condition per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Random identifier assigned when the migration starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name of the current stage of the matching MigrationConfiguration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Migration state, e.g. `Pending`, `InitialInProgress`, `CutoverCompleted`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// How to migrate resources of one kind to another kind, as ordered stages.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "broker.platform-mesh.io",
    version = "v1alpha1",
    kind = "MigrationConfiguration",
    plural = "migrationconfigurations",
    singular = "migrationconfiguration",
    namespaced,
    derive = "PartialEq",
    doc = "Describes the stages used to migrate resources from one kind to another.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
pub struct MigrationConfigurationSpec {
    /// Source kind.
    pub from: GroupVersionKind,
    /// Stages, applied in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<Vec<MigrationStage>>,
    /// Target kind.
    pub to: GroupVersionKind,
}

/// One stage of a migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStage {
    /// Stage name, shown in logs and conditions.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Move from the initial to the cutover phase once the success conditions hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<bool>,
    /// CEL expressions that must all be true for the stage to succeed; empty means
    /// success right after deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_conditions: Option<Vec<String>>,
    /// Resource templates to deploy, by the name they are known as in CEL expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "templates_schema")]
    pub templates: Option<BTreeMap<String, serde_json::Value>>,
}

/// Schema of `templates`: a map of free-form objects.
fn templates_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let item = preserve_unknown_object_schema(generator);
    schemars::json_schema!({ "type": "object", "additionalProperties": item })
}
