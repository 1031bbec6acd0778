//! [`ApplyConflicts`]: the 409 an apply gets when it would change fields owned by other
//! managers, with kube-apiserver's exact message and `details.causes`.

use serde_json::{json, Value};

/// `details.causes[].reason` of an apply conflict.
pub const CAUSE_FIELD_MANAGER_CONFLICT: &str = "FieldManagerConflict";

/// Fields an apply would have changed although other managers own them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApplyConflicts {
    /// `(manager name, field path)` per conflict, e.g.
    /// `("kubectl-client-side-apply", ".spec.replicas")`; ordered by manager identity,
    /// then by path in structured-merge-diff order.
    pub conflicts: Vec<(String, String)>,
    /// Per conflict (same index), the manager as kube-apiserver describes it:
    /// `"kubectl-client-side-apply" using v1`, `"other-applier"`,
    /// `"ctrl" with subresource "status" using v1`.
    pub managers: Vec<String>,
}

impl ApplyConflicts {
    /// Number of conflicting fields.
    pub fn len(&self) -> usize {
        self.conflicts.len()
    }

    /// True when there is no conflict.
    pub fn is_empty(&self) -> bool {
        self.conflicts.is_empty()
    }

    fn describe(&self, index: usize) -> String {
        match self.managers.get(index) {
            Some(described) => described.clone(),
            None => self
                .conflicts
                .get(index)
                .map(|(m, _)| super::path::go_quote(m))
                .unwrap_or_default(),
        }
    }

    /// The Status message, exactly as kube-apiserver words it:
    /// `Apply failed with 1 conflict: conflict with "m" using v1: .spec.replicas`, or for
    /// several `Apply failed with 2 conflicts: conflicts with "m" using v1:\n- .spec.a\n- .spec.b`
    /// (one `conflicts with …:` header per manager, each followed by its `- path` lines,
    /// all joined by newlines).
    pub fn message(&self) -> String {
        if self.conflicts.len() == 1 {
            return format!(
                "Apply failed with 1 conflict: conflict with {}: {}",
                self.describe(0),
                self.conflicts[0].1
            );
        }
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        for (i, (_, path)) in self.conflicts.iter().enumerate() {
            let described = self.describe(i);
            match groups.iter_mut().find(|(d, _)| *d == described) {
                Some((_, paths)) => paths.push(path),
                None => groups.push((described, vec![path])),
            }
        }
        let mut lines = Vec::new();
        for (described, paths) in groups {
            lines.push(format!("conflicts with {described}:"));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            self.conflicts.len(),
            lines.join("\n")
        )
    }

    /// `details.causes` entries as `(reason, message, field)`:
    /// `("FieldManagerConflict", "conflict with \"m\" using v1", ".spec.replicas")`.
    pub fn causes(&self) -> Vec<(String, String, String)> {
        self.conflicts
            .iter()
            .enumerate()
            .map(|(i, (_, path))| {
                (
                    CAUSE_FIELD_MANAGER_CONFLICT.to_string(),
                    format!("conflict with {}", self.describe(i)),
                    path.clone(),
                )
            })
            .collect()
    }

    /// The complete `metav1.Status` body (409 Conflict) kube-apiserver returns.
    pub fn status(&self) -> Value {
        let causes: Vec<Value> = self
            .causes()
            .into_iter()
            .map(|(reason, message, field)| {
                json!({"reason": reason, "message": message, "field": field})
            })
            .collect();
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message(),
            "reason": "Conflict",
            "details": {"causes": causes},
            "code": 409
        })
    }
}

impl std::fmt::Display for ApplyConflicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ApplyConflicts {}
