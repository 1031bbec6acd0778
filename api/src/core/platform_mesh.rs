//! The `PlatformMesh` kind: one installation of the Platform Mesh control plane.
//! Its spec drives kcp setup, provider kubeconfig Secrets, OCM-based deployment and readiness waits.

// kube `printcolumn(...)` entries repeat keys such as `type_ = "string"` by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{plain_integer_schema, preserve_unknown_schema, Condition};

/// Desired state of a Platform Mesh installation. Every field is optional.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "core.platform-mesh.io",
    version = "v1alpha1",
    kind = "PlatformMesh",
    plural = "platformmeshes",
    singular = "platformmesh",
    namespaced,
    status = "PlatformMeshStatus",
    derive = "PartialEq",
    doc = "A Platform Mesh installation, reconciled by the platform-mesh operator.",
    printcolumn(
        name = "KCP",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='KcpsetupSubroutine')].status",
        description = "Status of the kcp setup step"
    ),
    printcolumn(
        name = "KCP_REASON",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='KcpsetupSubroutine')].reason",
        description = "Reason reported by the kcp setup step",
        priority = 1
    ),
    printcolumn(
        name = "SECRET",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='ProvidersecretSubroutine')].status",
        description = "Status of the provider Secret step"
    ),
    printcolumn(
        name = "SECRET_REASON",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='ProvidersecretSubroutine')].reason",
        description = "Reason reported by the provider Secret step",
        priority = 1
    ),
    printcolumn(
        name = "DEPLOYMENT",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='DeploymentSubroutine')].status",
        description = "Status of the deployment step"
    ),
    printcolumn(
        name = "DEPLOYMENT_REASON",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='DeploymentSubroutine')].reason",
        description = "Reason reported by the deployment step",
        priority = 1
    ),
    printcolumn(
        name = "WAIT",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='WaitSubroutine')].status",
        description = "Status of the readiness wait step"
    ),
    printcolumn(
        name = "WAIT_REASON",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='WaitSubroutine')].reason",
        description = "Reason reported by the readiness wait step",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status",
        description = "Whether the installation is ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PlatformMeshSpec {
    /// How the installation is reached from outside (domain, port, protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<ExposureConfig>,
    /// Named feature switches with optional string parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_toggles: Option<Vec<FeatureToggle>>,
    /// Extra values for the infrastructure components (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub infra_values: Option<serde_json::Value>,
    /// kcp related settings: provider connections, extra bindings and workspaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kcp: Option<KcpConfig>,
    /// Where the OCM component with the deployable charts lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocm: Option<OcmConfig>,
    /// ConfigMap holding the deployment profile; defaults to `<name>-profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_config_map: Option<ConfigMapReference>,
    /// Per-installation value overrides for the component deployments (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub values: Option<serde_json::Value>,
    /// Resources to wait for before the installation counts as ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitConfig>,
}

/// External exposure of the installation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExposureConfig {
    /// Base DNS domain, e.g. `portal.localhost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_domain: Option<String>,
    /// External port, e.g. `8443`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer_schema")]
    pub port: Option<i64>,
    /// URL scheme, e.g. `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// A named feature switch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FeatureToggle {
    /// Feature name, e.g. `feature-enable-getting-started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// String parameters for the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// kcp settings of an installation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KcpConfig {
    /// APIBindings added to every workspace of a given workspace type.
    #[serde(
        default,
        rename = "extraDefaultAPIBindings",
        skip_serializing_if = "Option::is_none"
    )]
    pub extra_default_api_bindings: Option<Vec<DefaultApiBinding>>,
    /// Provider connections appended to `providerConnections` (or to the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_provider_connections: Option<Vec<ProviderConnection>>,
    /// Additional workspaces to create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_workspaces: Option<Vec<WorkspaceDeclaration>>,
    /// Kubeconfig Secrets to write for providers; replaces the built-in default list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_connections: Option<Vec<ProviderConnection>>,
}

/// An APIBinding to add by default to workspaces of one workspace type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultApiBinding {
    /// Name of the APIExport to bind.
    pub export: String,
    /// Workspace path of the APIExport.
    pub path: String,
    /// Workspace type as `<workspace path>:<type name>`, e.g. `root:account`.
    pub workspace_type_path: String,
}

/// A kubeconfig Secret the operator writes so that a provider can reach kcp.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConnection {
    /// `true` writes admin certificate material; otherwise a scoped token kubeconfig is written,
    /// which needs exactly one of `endpointSliceName` or `apiExportName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_auth: Option<bool>,
    /// APIExport in `path` whose permissions scope the kubeconfig (scoped mode without a slice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_export_name: Option<String>,
    /// APIExportEndpointSlice in `path` that provides the server URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice_name: Option<String>,
    /// Use the external kcp URL instead of the in-cluster front proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<bool>,
    /// Namespace of the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// kcp workspace path, e.g. `root:platform-mesh-system`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Literal URL path that overrides `path` (admin mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_path: Option<String>,
    /// Name of the Secret to write (key `kubeconfig`).
    pub secret: String,
}

/// A workspace to create in kcp.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkspaceDeclaration {
    /// Full workspace path, e.g. `root:orgs:my-ws`.
    pub path: String,
    /// Workspace type of the new workspace.
    #[serde(rename = "type")]
    pub type_: WorkspaceTypeReference,
}

/// Reference to a kcp WorkspaceType.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkspaceTypeReference {
    /// WorkspaceType name.
    pub name: String,
    /// Workspace path that holds the WorkspaceType.
    pub path: String,
}

/// Location of the OCM component that describes what to deploy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OcmConfig {
    /// The OCM component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<OcmName>,
    /// Chain of component references to follow from the root component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_path: Option<Vec<OcmReferencePathElement>>,
    /// The OCM repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<OcmName>,
}

/// A named OCM object whose name defaults to `platform-mesh`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct OcmName {
    /// Object name; the server defaults it to `platform-mesh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "platform-mesh"))]
    pub name: Option<String>,
}

/// One step in an OCM component reference path.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct OcmReferencePathElement {
    /// Name of the component reference to follow.
    pub name: String,
}

/// Reference to a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigMapReference {
    /// ConfigMap name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// ConfigMap namespace; defaults to the namespace of the referring object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Readiness waits of an installation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitConfig {
    /// Resource kinds (optionally narrowed by name, namespace or labels) that must be ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_types: Option<Vec<WaitResourceType>>,
}

/// A set of resources to wait for, and the condition they must reach.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct WaitResourceType {
    /// Required condition status, e.g. `True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_status: Option<String>,
    /// Condition type to check, e.g. `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_type: Option<String>,
    /// API group of the resources.
    pub group: String,
    /// Kind of the resources.
    pub kind: String,
    /// Label selector requirements, all of which must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
    /// Labels that must all match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Name of a single resource to wait for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace of the resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// API version of the resources.
    pub version: String,
}

/// One label selector requirement (`key`, `operator`, `values`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// One of `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// Values for `In`/`NotIn`; empty for `Exists`/`DoesNotExist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub values: Option<Vec<String>>,
}

/// Observed state of a Platform Mesh installation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformMeshStatus {
    /// One condition per reconcile step plus the aggregate `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Phases of the kcp workspaces created for the installation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kcp_workspaces: Option<Vec<KcpWorkspaceStatus>>,
    /// When the next periodic reconcile is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_reconcile_time: Option<Time>,
    /// Generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Phase of one kcp workspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KcpWorkspaceStatus {
    /// Workspace path.
    pub name: String,
    /// Workspace phase, e.g. `Ready`.
    pub phase: String,
}
