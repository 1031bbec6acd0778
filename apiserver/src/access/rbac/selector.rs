//! Minimal `metav1.LabelSelector` matching used by ClusterRole aggregation
//! (`aggregationRule.clusterRoleSelectors`).

use std::collections::BTreeMap;

use serde_json::Value;

/// Extracts `metadata.labels` of an object as a string map (non-string
/// values are ignored).
pub(crate) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the label selector `selector` (JSON `metav1.LabelSelector`)
/// matches `labels`.
///
/// An empty selector (`{}`) matches everything, a non-object selector
/// (e.g. `null`) matches nothing, and an invalid selector (unknown operator,
/// `In`/`NotIn` without values, `Exists` with values) matches nothing, as
/// kube's `LabelSelectorAsSelector` would fail on it.
pub(crate) fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    if let Some(ml) = sel.get("matchLabels") {
        let Some(ml) = ml.as_object() else {
            return ml.is_null();
        };
        for (k, v) in ml {
            let Some(v) = v.as_str() else {
                return false;
            };
            if labels.get(k).map(String::as_str) != Some(v) {
                return false;
            }
        }
    }
    if let Some(exprs) = sel.get("matchExpressions") {
        if exprs.is_null() {
            return true;
        }
        let Some(exprs) = exprs.as_array() else {
            return false;
        };
        for expr in exprs {
            if !expression_matches(expr, labels) {
                return false;
            }
        }
    }
    true
}

/// Evaluates one `matchExpressions` entry; invalid entries never match.
fn expression_matches(expr: &Value, labels: &BTreeMap<String, String>) -> bool {
    let Some(key) = expr.get("key").and_then(Value::as_str) else {
        return false;
    };
    let op = expr.get("operator").and_then(Value::as_str).unwrap_or("");
    let values: Vec<&str> = expr
        .get("values")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let current = labels.get(key).map(String::as_str);
    match op {
        "In" if !values.is_empty() => current.is_some_and(|c| values.contains(&c)),
        "NotIn" if !values.is_empty() => current.is_none_or(|c| !values.contains(&c)),
        "Exists" if values.is_empty() => current.is_some(),
        "DoesNotExist" if values.is_empty() => current.is_none(),
        _ => false,
    }
}
