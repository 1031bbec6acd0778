//! The `providers.platform-mesh.io/v1alpha1` API group: Provider, ManagedProvider and
//! ProviderPermissions. A Provider bootstraps a provider workspace in kcp; a ManagedProvider also
//! deploys its components; ProviderPermissions tunes authorization of an exported API.

// kube `printcolumn(...)` entries repeat keys such as `type_ = "string"` by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{preserve_unknown_schema, Condition, SecretReference};

/// Desired state of a provider: where to store its kubeconfig and which host to put in it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "providers.platform-mesh.io",
    version = "v1alpha1",
    kind = "Provider",
    plural = "providers",
    singular = "provider",
    status = "ProviderStatus",
    derive = "PartialEq",
    doc = "A provider known to kcp; bootstraps the provider workspace, RBAC and credentials.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Bootstrap phase"
    ),
    printcolumn(
        name = "KubeconfigSecret",
        type_ = "string",
        json_path = ".status.kubeconfigSecretRef.name",
        description = "Name of the generated kubeconfig Secret"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status",
        description = "Whether the provider is ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// Replaces the kcp front-proxy host written into the kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_override: Option<String>,
    /// Where to store the provider's admin kubeconfig; defaults to
    /// `default/<name>-provider-kubeconfig`, key `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_kubeconfig_secret: Option<KubeconfigSecretSpec>,
}

/// A Secret location (name, namespace and data key) for a kubeconfig.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KubeconfigSecretSpec {
    /// Data key that holds the kubeconfig YAML.
    pub key: String,
    /// Secret name.
    pub name: String,
    /// Secret namespace.
    pub namespace: String,
}

/// Observed state of a provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// Current state of the provider, one condition per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Bootstrap phase, e.g. `Pending` or `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Secret with the scoped kubeconfig for the provider workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_kubeconfig_secret_ref: Option<SecretReference>,
}

/// Desired state of a managed provider: the Provider to ensure and the components to deploy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "providers.platform-mesh.io",
    version = "v1alpha1",
    kind = "ManagedProvider",
    plural = "managedproviders",
    singular = "managedprovider",
    namespaced,
    status = "ManagedProviderStatus",
    derive = "PartialEq",
    doc = "A provider whose whole lifecycle is run from the runtime cluster.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status",
        description = "Whether the provider is ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ManagedProviderSpec {
    /// Delete the kcp side when the ManagedProvider is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_on_delete: Option<bool>,
    /// The PlatformMesh (same namespace) this provider belongs to.
    pub platform_mesh_ref: PlatformMeshReference,
    /// The Provider to use or create; defaults to `root:providers:system` and this object's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderReference>,
    /// Copied to the Provider's `hostOverride`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_host_override: Option<String>,
    /// Where to put the provider kubeconfig in the runtime namespace; defaults to
    /// `<name>-provider-kubeconfig`, key `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_kubeconfig_secret: Option<LocalKubeconfigSecretSpec>,
    /// Components to deploy into the runtime cluster.
    pub runtime_deployments: Vec<ProviderComponentSpec>,
    /// Secret (key `kubeconfig`) for a different runtime cluster; defaults to the hosting cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_kubeconfig_secret_name: Option<String>,
}

/// Reference to a PlatformMesh by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PlatformMeshReference {
    /// PlatformMesh name.
    pub name: String,
}

/// Reference to a Provider in a kcp workspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProviderReference {
    /// Provider name.
    pub name: String,
    /// Logical cluster path that holds the Provider, e.g. `root:providers:system`.
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(:[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub path: String,
}

/// A Secret location (name and data key) in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LocalKubeconfigSecretSpec {
    /// Data key that holds the kubeconfig YAML.
    pub key: String,
    /// Secret name.
    pub name: String,
}

/// One component to deploy; set exactly one of `flux` or `ocm`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProviderComponentSpec {
    /// Deploy a Helm chart directly through Flux.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flux: Option<FluxComponent>,
    /// Deploy a chart resolved from an OCM component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocm: Option<OcmComponent>,
}

/// How a Flux chart is fetched.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChartSourceType {
    /// The chart is an OCI artifact.
    #[default]
    Oci,
    /// The chart comes from a classic HTTP(S) Helm repository.
    Helm,
}

/// A Helm chart deployed through Flux.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FluxComponent {
    /// Chart name (OCI: path under the registry; Helm: chart name in the repository).
    pub chart: String,
    /// Allow plain HTTP to the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// Chart location (OCI: registry host and base path; Helm: repository URL).
    pub registry: String,
    /// Chart source type; the server defaults it to `oci`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "oci"))]
    pub type_: Option<ChartSourceType>,
    /// Helm values for the chart (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub values: Option<serde_json::Value>,
    /// Chart version (OCI tag or Helm chart version).
    pub version: String,
}

/// A chart resolved from an OCM component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OcmComponent {
    /// Fully qualified OCM component name.
    pub component: String,
    /// Allow plain HTTP to the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// Name for the generated objects; derived from the resource or component when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Component references to follow to reach the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_path: Option<Vec<OcmReferencePathElement>>,
    /// OCM/OCI registry root that holds the component.
    pub registry: String,
    /// Resource name inside the component; `chart` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// Helm values for the resolved chart (free-form JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_schema")]
    pub values: Option<serde_json::Value>,
    /// Component version (semver).
    pub version: String,
}

/// One step in an OCM component reference path.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct OcmReferencePathElement {
    /// Name of the component reference to follow.
    pub name: String,
}

/// Observed state of a managed provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedProviderStatus {
    /// Current state of the managed provider, one condition per type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle phase, e.g. `Deploying` or `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Secret in the runtime namespace with the copied scoped kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_kubeconfig_secret_ref: Option<SecretReference>,
}

/// Desired state of a provider's permission settings: the APIExport they apply to, per-resource
/// permission expressions and custom roles.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "providers.platform-mesh.io",
    version = "v1alpha1",
    kind = "ProviderPermissions",
    plural = "providerpermissions",
    singular = "providerpermissions",
    status = "ProviderPermissionsStatus",
    derive = "PartialEq",
    doc = "How an API provider customizes authorization of the resources it exports."
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderPermissionsSpec {
    /// The APIExport these settings belong to.
    pub api_export: ApiExportReference,
    /// Permission settings per resource, keyed `<group>.<resource>`
    /// (e.g. `orchestrate.platform-mesh.io.httpbin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<BTreeMap<String, ResourcePermissions>>,
    /// Custom roles, grouped by resource type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<ResourceRoles>>,
}

/// Points at an APIExport.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ApiExportReference {
    /// The APIExport, by name.
    #[serde(rename = "ref")]
    pub ref_: ApiExportName,
}

/// The name of an APIExport.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ApiExportName {
    /// APIExport name.
    pub name: String,
}

/// Permission settings of one resource type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePermissions {
    /// Custom permissions and roles: name to permission expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_permissions: Option<BTreeMap<String, String>>,
    /// Replacements of the standard verb permissions; an empty expression keeps the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_permissions: Option<DefaultPermissions>,
}

/// Permission expressions of the standard verbs; empty or unset keeps the system default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DefaultPermissions {
    /// Expression of the `delete` permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<String>,
    /// Expression of the `get` permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get: Option<String>,
    /// Expression of the `patch` permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Expression of the `update` permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<String>,
    /// Expression of the `watch` permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<String>,
}

/// The custom roles of one resource type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRoles {
    /// The resource type, `<group>.<resource>` (e.g. `orchestrate.platform-mesh.io.httpbin`).
    pub group_resource: String,
    /// The roles of that resource type.
    pub roles: Vec<RoleDefinition>,
}

/// A custom role as shown in user interfaces, with an optional relation definition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleDefinition {
    /// OpenFGA relation definition of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
    /// What the role is for.
    pub description: String,
    /// Role name shown to people.
    pub display_name: String,
    /// Role identifier; the relation name permissions refer to.
    pub id: String,
}

/// Observed state of a provider's permission settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderPermissionsStatus {
    /// Latest observations of the object's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
