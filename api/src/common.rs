//! Building blocks shared by several Platform Mesh API groups.
//! Holds the standard condition type, small reference structs and schema helpers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// Pattern of a condition `reason`: CamelCase, may contain `_`, `,` and `:` inside.
pub const CONDITION_REASON_PATTERN: &str = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// Pattern of a condition `type`: an optional DNS-style prefix with `/`, then a qualified name.
pub const CONDITION_TYPE_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

/// One observation about an aspect of an object's state, in the standard Kubernetes
/// `metav1.Condition` shape (same JSON names, same validation as upstream CRDs).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// When the status of this condition last changed.
    pub last_transition_time: Time,
    /// Human readable details about the last transition; may be empty.
    #[schemars(length(max = 32768))]
    pub message: String,
    /// The `metadata.generation` the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// Machine readable CamelCase reason for the last transition.
    #[schemars(length(min = 1, max = 1024), regex(pattern = CONDITION_REASON_PATTERN))]
    pub reason: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// Condition type, CamelCase or `domain/CamelCase`.
    #[serde(rename = "type")]
    #[schemars(length(max = 316), regex(pattern = CONDITION_TYPE_PATTERN))]
    pub type_: String,
}

impl Condition {
    /// Whether the condition's status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// Finds the condition of the given type in a condition list.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A group/version/kind triple with all three parts required (`metav1.GroupVersionKind` shape).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind name.
    pub kind: String,
    /// API version.
    pub version: String,
}

/// Name and namespace of a Secret (`corev1.SecretReference` shape), replaced as a whole on apply.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct SecretReference {
    /// Secret name, unique within its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace that holds the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Schema for a field that accepts arbitrary JSON: no `type`, unknown fields preserved.
pub fn preserve_unknown_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// Schema for a free-form JSON object whose content is kept as-is.
pub fn preserve_unknown_object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// Schema for a Go `int` field: `type: integer` without a `format`.
pub fn plain_integer_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "integer" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_round_trips_and_finds() {
        let json = serde_json::json!({
            "type": "Ready", "status": "True", "reason": "Complete", "message": "",
            "lastTransitionTime": "2024-01-02T03:04:05Z", "observedGeneration": 3
        });
        let c: Condition = serde_json::from_value(json.clone()).unwrap();
        assert!(c.is_true());
        assert_eq!(serde_json::to_value(&c).unwrap(), json);
        let list = vec![c];
        assert!(find_condition(&list, "Ready").is_some());
        assert!(find_condition(&list, "Other").is_none());
    }
}
