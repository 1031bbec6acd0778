//! The kcp-style built-in types: workspaces and logical clusters, CRDs, and the APIs that
//! export and bind them. Their content is checked by the tenancy hooks, so the schemas keep
//! `spec`/`status` open.

use api::serving::PrinterColumn;
use serde_json::{json, Value};

use crate::registry::TypeInfo;

fn open_schema(description: &str) -> Value {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": open,
            "status": open,
        },
    })
}

#[allow(clippy::too_many_arguments)]
fn cluster_scoped(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    short_names: &[&str],
    status: bool,
    columns: Vec<PrinterColumn>,
    description: &str,
) -> TypeInfo {
    TypeInfo {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec!["kcp".into()],
        namespaced: false,
        status_subresource: status,
        strategic_merge_patch: false,
        printer_columns: columns,
        schema: open_schema(description),
    }
}

/// The kcp-style types every logical cluster serves.
pub fn kcp_types() -> Vec<TypeInfo> {
    let col = |name: &str, ty: &str, path: &str| PrinterColumn::json_path(name, ty, path, "");
    vec![
        cluster_scoped(
            "tenancy.kcp.io",
            "v1alpha1",
            "Workspace",
            "workspaces",
            &["ws"],
            true,
            vec![
                col("Type", "string", ".spec.type.name"),
                col("Phase", "string", ".status.phase"),
                col("URL", "string", ".spec.URL"),
                PrinterColumn::age(),
            ],
            "A workspace: a logical cluster below its parent, with its own API surface.",
        ),
        cluster_scoped(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
            &[],
            true,
            vec![PrinterColumn::age()],
            "A kind of workspace: which parents and children it allows and which APIs it binds.",
        ),
        cluster_scoped(
            "core.kcp.io",
            "v1alpha1",
            "LogicalCluster",
            "logicalclusters",
            &[],
            true,
            vec![
                col("Phase", "string", ".status.phase"),
                col("URL", "string", ".status.URL"),
                PrinterColumn::age(),
            ],
            "The logical cluster behind a workspace; the one named `cluster` carries its path.",
        ),
        cluster_scoped(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            &["crd", "crds"],
            true,
            vec![col("Created At", "date", ".metadata.creationTimestamp")],
            "A custom resource type served in this logical cluster.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
            &[],
            false,
            vec![PrinterColumn::age()],
            "An immutable schema of one resource, exported by APIExports.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIExport",
            "apiexports",
            &[],
            true,
            vec![PrinterColumn::age()],
            "A set of resource schemas offered for binding into other workspaces.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIBinding",
            "apibindings",
            &[],
            true,
            vec![
                col("Export", "string", ".spec.reference.export.name"),
                col("Phase", "string", ".status.phase"),
                PrinterColumn::age(),
            ],
            "Binds an APIExport's resources into this workspace.",
        ),
        cluster_scoped(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
            &[],
            true,
            vec![PrinterColumn::age()],
            "Where the virtual workspace of an APIExport is served.",
        ),
    ]
}
