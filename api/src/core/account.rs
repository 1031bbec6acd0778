//! The `Account` and `AccountInfo` kinds, both cluster-scoped, served per kcp workspace.
//! An Account gets its own child workspace; AccountInfo describes that workspace from inside.

// kube `printcolumn(...)` entries repeat keys such as `type_ = "string"` by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{preserve_unknown_schema, Condition};

/// Desired state of an account (an organization or a nested account).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "core.platform-mesh.io",
    version = "v1alpha1",
    kind = "Account",
    plural = "accounts",
    singular = "account",
    status = "AccountStatus",
    derive = "PartialEq",
    doc = "An organization or account; the account operator gives it its own kcp workspace.",
    printcolumn(
        name = "Display Name",
        type_ = "string",
        json_path = ".spec.displayName"
    ),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AccountSpec {
    /// User that created the account; set on creation by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
    /// Extra data kept with the account (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub data: Option<serde_json::Value>,
    /// Optional free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Human readable name, at most 255 characters.
    #[schemars(length(max = 255))]
    pub display_name: String,
    /// Extension objects to create for the account (stored, not acted on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<AccountExtension>>,
    /// Account type, usually `org` or `account`.
    #[serde(rename = "type")]
    pub type_: String,
}

/// An extension object rendered from Go templates for an account.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountExtension {
    /// API version of the extension object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind of the extension object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Template for the object's metadata (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub metadata_go_template: Option<serde_json::Value>,
    /// Condition type that must be `True` on the extension object for it to count as ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_condition_type: Option<String>,
    /// Template for the object's spec (free-form JSON).
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub spec_go_template: serde_json::Value,
}

/// Observed state of an account.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountStatus {
    /// One condition per reconcile step plus the aggregate `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// When the next periodic reconcile is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_reconcile_time: Option<Time>,
    /// Generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Facts about an account workspace, its parent and its organization.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "core.platform-mesh.io",
    version = "v1alpha1",
    kind = "AccountInfo",
    plural = "accountinfos",
    singular = "accountinfo",
    status = "AccountInfoStatus",
    derive = "PartialEq",
    doc = "Per-workspace singleton describing the account that owns the workspace.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AccountInfoSpec {
    /// The account that owns this workspace.
    pub account: AccountLocation,
    /// How to reach the cluster (CA bundle).
    pub cluster_info: ClusterInfo,
    /// OpenFGA store of the organization.
    pub fga: FgaInfo,
    /// OIDC settings of the organization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcInfo>,
    /// The organization the account belongs to.
    pub organization: AccountLocation,
    /// The parent account, absent for organizations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_account: Option<AccountLocation>,
}

/// Where an account lives and which workspace belongs to it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountLocation {
    /// Logical cluster name of the workspace created for the account.
    pub generated_cluster_id: String,
    /// Account name.
    pub name: String,
    /// Logical cluster name of the workspace that holds the Account object.
    pub origin_cluster_id: String,
    /// Workspace path of the account's workspace.
    pub path: String,
    /// Account type.
    #[serde(rename = "type")]
    pub type_: String,
    /// URL of the account's workspace.
    pub url: String,
}

/// Cluster connection facts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterInfo {
    /// PEM encoded CA bundle of the server.
    pub ca: String,
}

/// OpenFGA information.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FgaInfo {
    /// The OpenFGA store.
    pub store: FgaStore,
}

/// An OpenFGA store.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FgaStore {
    /// Store ID.
    pub id: String,
}

/// OIDC settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcInfo {
    /// OIDC clients by name.
    pub clients: BTreeMap<String, OidcClient>,
    /// Issuer URL.
    pub issuer_url: String,
}

/// One OIDC client.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcClient {
    /// Client ID.
    pub client_id: String,
}

/// Observed state of an AccountInfo; currently empty.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AccountInfoStatus {}
