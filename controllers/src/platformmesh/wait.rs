//! `WaitSubroutine`: a PlatformMesh is Ready only when what it deployed is. The rules are
//! `spec.wait.resourceTypes`, or by default every HelmRelease the operator created in the
//! instance's own namespace must be `Ready=True` (upstream looks in `default`, where its
//! templates put nothing, so its default waits for nothing; this one waits for the releases),
//! and with Argo CD every such Application `Synced` and `Healthy`.

use std::time::Duration;

use api::core::{LabelSelectorRequirement, WaitResourceType};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::controller::PlatformMeshError;
use super::deployment::Context;
use crate::subroutines::{Step, Subroutine};

/// The condition type of the Wait step.
pub const WAIT: &str = "WaitSubroutine";

/// How soon a not-ready instance looks again (a watch on what it waits for usually comes first).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);

/// The rule used when `spec.wait` names none.
pub fn default_rule(namespace: &str) -> WaitResourceType {
    WaitResourceType {
        group: "helm.toolkit.fluxcd.io".into(),
        version: "v2".into(),
        kind: "HelmRelease".into(),
        namespace: Some(namespace.to_string()),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "core.platform-mesh.io/operator-created".into(),
            operator: "In".into(),
            values: Some(vec!["true".into()]),
        }]),
        condition_type: Some("Ready".into()),
        condition_status: Some("True".into()),
        ..Default::default()
    }
}

/// A label selector in the query syntax, or why the rule's selector is invalid.
pub fn selector(rule: &WaitResourceType) -> Result<String, String> {
    let mut parts: Vec<String> = rule
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in rule.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default();
        let part = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "label selector: {} {} needs at least one value",
                    e.key, e.operator
                ))
            }
            "In" => format!("{} in ({})", e.key, values.join(",")),
            "NotIn" => format!("{} notin ({})", e.key, values.join(",")),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => {
                return Err(format!(
                    "label selector: {other:?} is not a valid operator (In, NotIn, Exists, DoesNotExist)"
                ))
            }
        };
        parts.push(part);
    }
    Ok(parts.join(","))
}

/// Whether `obj` has condition `type_` with `status`.
pub fn has_condition(obj: &Value, type_: &str, status: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == status)
        })
}

/// The Wait step.
pub struct Wait;

fn stop(message: String) -> Step {
    Step::stop(message, WAIT_REQUEUE)
}

#[async_trait::async_trait]
impl Subroutine<Context, PlatformMeshError> for Wait {
    fn name(&self) -> &'static str {
        WAIT
    }

    async fn process(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let explicit = ctx
            .spec
            .wait
            .as_ref()
            .and_then(|w| w.resource_types.clone())
            .filter(|r| !r.is_empty());
        let client = &ctx.clusters.infra;
        if explicit.is_none() {
            // The Deployment step before this one fails without the profile, so an unreadable
            // one here only means Flux's default rule.
            let argo = super::deployment::load_profile(ctx).await.is_ok_and(|p| {
                super::vars::DeploymentTechnology::parse(p.infra.get("deploymentTechnology"))
                    == super::vars::DeploymentTechnology::ArgoCd
            });
            if argo {
                return applications_waiting(client, ctx.namespace()).await;
            }
        }
        let rules = explicit
            .clone()
            .unwrap_or_else(|| vec![default_rule(ctx.namespace())]);
        for rule in &rules {
            let gvk = GroupVersionKind::gvk(&rule.group, &rule.version, &rule.kind);
            let resource = match kube::discovery::pinned_kind(client, &gvk).await {
                Ok((resource, _)) => resource,
                // Nothing of a kind the cluster does not serve can be waited for by default.
                Err(_) if explicit.is_none() => continue,
                Err(e) => {
                    return Ok(stop(format!(
                        "{} {}/{} is not served by the infra cluster: {e}",
                        rule.kind, rule.group, rule.version
                    )))
                }
            };
            let api: Api<DynamicObject> = match &rule.namespace {
                Some(ns) if !ns.is_empty() => Api::namespaced_with(client.clone(), ns, &resource),
                _ => Api::all_with(client.clone(), &resource),
            };
            let ctype = rule.condition_type.as_deref().unwrap_or("Ready");
            let cstatus = rule.condition_status.as_deref().unwrap_or("True");
            let items: Vec<DynamicObject> = match &rule.name {
                Some(name) if !name.is_empty() => match api.get_opt(name).await {
                    Ok(Some(o)) => vec![o],
                    Ok(None) => {
                        return Ok(stop(format!(
                            "{} {} does not exist yet",
                            rule.kind,
                            qualified(rule.namespace.as_deref(), name)
                        )))
                    }
                    Err(e) => return Ok(stop(format!("reading {} {name}: {e}", rule.kind))),
                },
                _ => {
                    let labels = match selector(rule) {
                        Ok(s) => s,
                        Err(e) => return Ok(stop(e)),
                    };
                    match api.list(&ListParams::default().labels(&labels)).await {
                        Ok(l) => l.items,
                        Err(e) => return Ok(stop(format!("listing {}: {e}", rule.kind))),
                    }
                }
            };
            let mut waiting: Vec<String> = items
                .iter()
                .filter(|o| {
                    !has_condition(
                        &serde_json::to_value(o).unwrap_or(Value::Null),
                        ctype,
                        cstatus,
                    )
                })
                .map(|o| {
                    qualified(
                        o.metadata.namespace.as_deref(),
                        o.metadata.name.as_deref().unwrap_or(""),
                    )
                })
                .collect();
            if !waiting.is_empty() {
                waiting.sort();
                let shown: Vec<&str> = waiting.iter().take(5).map(String::as_str).collect();
                let more = if waiting.len() > 5 {
                    format!(" and {} more", waiting.len() - 5)
                } else {
                    String::new()
                };
                return Ok(stop(format!(
                    "{} {}{more} not {ctype}={cstatus} yet",
                    rule.kind,
                    shown.join(", ")
                )));
            }
        }
        Ok(Step::done())
    }
}

/// With Argo CD and no `spec.wait`: every Application the operator created in the instance's
/// namespace must be `Synced` and `Healthy`, as the Deployment step's istio gate reads them.
async fn applications_waiting(
    client: &kube::Client,
    namespace: &str,
) -> Result<Step, PlatformMeshError> {
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &super::ocm_resources::applications(),
    );
    let labels = selector(&default_rule(namespace))?;
    let items = match apps.list(&ListParams::default().labels(&labels)).await {
        Ok(l) => l.items,
        // Argo CD not installed (yet): nothing of it to wait for, as with Flux.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Step::done()),
        Err(e) => return Ok(stop(format!("listing Applications: {e}"))),
    };
    let mut waiting: Vec<String> = items
        .iter()
        .filter(|a| {
            a.data["status"]["sync"]["status"] != "Synced"
                || a.data["status"]["health"]["status"] != "Healthy"
        })
        .map(|a| qualified(Some(namespace), a.metadata.name.as_deref().unwrap_or("")))
        .collect();
    if waiting.is_empty() {
        return Ok(Step::done());
    }
    waiting.sort();
    let more = if waiting.len() > 5 {
        format!(" and {} more", waiting.len() - 5)
    } else {
        String::new()
    };
    waiting.truncate(5);
    Ok(stop(format!(
        "Application {}{more} not Synced and Healthy yet",
        waiting.join(", ")
    )))
}

fn qualified(namespace: Option<&str>, name: &str) -> String {
    match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_render_as_the_query_syntax() {
        let mut r = default_rule("pm");
        assert_eq!(
            selector(&r).unwrap(),
            "core.platform-mesh.io/operator-created in (true)"
        );
        r.match_labels = Some([("app".to_string(), "x".to_string())].into());
        r.match_expressions = Some(vec![
            LabelSelectorRequirement {
                key: "a".into(),
                operator: "Exists".into(),
                values: None,
            },
            LabelSelectorRequirement {
                key: "b".into(),
                operator: "DoesNotExist".into(),
                values: None,
            },
            LabelSelectorRequirement {
                key: "c".into(),
                operator: "NotIn".into(),
                values: Some(vec!["1".into(), "2".into()]),
            },
        ]);
        assert_eq!(selector(&r).unwrap(), "app=x,a,!b,c notin (1,2)");
        r.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "Like".into(),
            values: None,
        }]);
        assert!(selector(&r).unwrap_err().contains("not a valid operator"));
        r.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "In".into(),
            values: Some(vec![]),
        }]);
        assert!(selector(&r).unwrap_err().contains("at least one value"));
    }

    #[test]
    fn conditions_are_matched_by_type_and_status() {
        let o = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Released", "status": "True"}]}});
        assert!(!has_condition(&o, "Ready", "True"));
        assert!(has_condition(&o, "Released", "True"));
        assert!(!has_condition(&json!({}), "Ready", "True"));
    }
}
