//! `FeatureToggleSubroutine`: the manifests of every toggle in `spec.featureToggles` that has a
//! directory `manifests/features/<toggle>/`, applied as KcpSetup applies `manifests/kcp`; the
//! objects of a toggle that is switched off are removed (upstream leaves them). Toggles without
//! manifests (`feature-disable-email-verification`, `feature-disable-contentconfigurations`,
//! read by KcpSetup and ProviderSecret) are accepted; unknown names are reported in the
//! condition message, not an error.

use std::collections::BTreeSet;

use kube::core::GroupVersionKind;
use serde_json::Value;

use super::apply::{sync, Policy, Target};
use super::controller::PlatformMeshError;
use super::deployment::Context;
use super::kcp_setup::{apply_stages, no_kcp, FINALIZER};
use super::manifests::{
    plan, toggles_with_manifests, Stage, DISABLE_CONTENT_CONFIGURATIONS, DISABLE_EMAIL_VERIFICATION,
};
use super::vars::{template_vars, Render};
use crate::subroutines::{Step, Subroutine};

/// The condition type of the FeatureToggles step.
pub const FEATURE_TOGGLES: &str = "FeatureToggleSubroutine";

/// Toggles read elsewhere, with no manifests of their own.
const WITHOUT_MANIFESTS: &[&str] = &[
    DISABLE_EMAIL_VERIFICATION,
    DISABLE_CONTENT_CONFIGURATIONS,
    // Upstream names these without shipping manifests for them.
    "feature-enable-marketplace-account",
    "feature-enable-marketplace-org",
];

const POLICY: Policy = Policy {
    field_manager: "platform-mesh-operator",
    prune: true,
    create_only: &["tenancy.kcp.io/Workspace"],
};

/// Label value marking what this step applied for the PlatformMesh with `uid`.
pub fn features_owner(uid: &str) -> String {
    format!("features.{uid}")
}

/// Workspaces and the kinds toggles put there.
pub type FeatureScope = Vec<(String, Vec<GroupVersionKind>)>;

/// Every toggle's stages, rendered with `data`: (workspace, kinds) of all toggles (to prune
/// switched-off ones) and the stages of the toggles that are on.
pub fn feature_plan(
    engine: &dyn Render,
    data: &Value,
    ctx_spec: &api::core::PlatformMeshSpec,
    on: &[String],
) -> Result<(Vec<Stage>, FeatureScope), String> {
    let mut stages = Vec::new();
    let mut scope: FeatureScope = Vec::new();
    for toggle in toggles_with_manifests() {
        let planned = plan(engine, &format!("features/{toggle}"), data, ctx_spec)
            .map_err(|e| e.to_string())?;
        for st in &planned {
            let kinds: BTreeSet<(String, String, String)> = st
                .objects
                .iter()
                .filter_map(|p| {
                    let (g, v) = p.object["apiVersion"]
                        .as_str()?
                        .split_once('/')
                        .unwrap_or(("", p.object["apiVersion"].as_str()?));
                    Some((
                        g.to_string(),
                        v.to_string(),
                        p.object["kind"].as_str()?.to_string(),
                    ))
                })
                .collect();
            let gvks = kinds
                .into_iter()
                .map(|(g, v, k)| GroupVersionKind::gvk(&g, &v, &k));
            match scope.iter_mut().find(|(w, _)| *w == st.workspace) {
                Some((_, ks)) => {
                    for g in gvks {
                        if !ks.contains(&g) {
                            ks.push(g);
                        }
                    }
                }
                None => scope.push((st.workspace.clone(), gvks.collect())),
            }
        }
        if on.iter().any(|t| t == toggle) {
            stages.extend(planned);
        }
    }
    Ok((stages, scope))
}

/// The FeatureToggles step.
pub struct FeatureToggles {
    /// The template engine.
    pub engine: std::sync::Arc<dyn Render + Send + Sync>,
}

#[async_trait::async_trait]
impl Subroutine<Context, PlatformMeshError> for FeatureToggles {
    fn name(&self) -> &'static str {
        FEATURE_TOGGLES
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[FINALIZER]
    }

    async fn process(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let Some(kcp) = ctx.clusters.kcp.as_ref() else {
            return Ok(no_kcp());
        };
        let names: Vec<String> = ctx
            .spec
            .feature_toggles
            .iter()
            .flatten()
            .filter_map(|t| t.name.clone())
            .collect();
        let with_manifests = toggles_with_manifests();
        let unknown: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !with_manifests.contains(n) && !WITHOUT_MANIFESTS.contains(n))
            .collect();
        let data = template_vars(ctx.namespace(), &ctx.spec);
        let (stages, scope) = feature_plan(self.engine.as_ref(), &data, &ctx.spec, &names)?;
        let owner = features_owner(ctx.uid());
        // Apply what is on (no pruning per stage: a workspace may get objects from several
        // toggles), then prune each workspace against everything that is on.
        let apply = Policy {
            prune: false,
            ..POLICY
        };
        if let Some(step) = apply_stages(kcp, &stages, &owner, apply).await? {
            return Ok(step);
        }
        prune(ctx, &stages, &scope, &owner).await?;
        let applied: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| with_manifests.contains(n))
            .collect();
        let mut message = if applied.is_empty() {
            "no toggles with manifests".to_string()
        } else {
            format!("applied {}", applied.join(", "))
        };
        if !unknown.is_empty() {
            message.push_str(&format!("; unknown toggles: {}", unknown.join(", ")));
        }
        Ok(Step::Done {
            message,
            requeue: None,
        })
    }

    async fn finalize(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        if ctx.clusters.kcp.is_none() {
            return Ok(Step::done());
        }
        let data = template_vars(ctx.namespace(), &ctx.spec);
        let (_, scope) = feature_plan(self.engine.as_ref(), &data, &ctx.spec, &[])?;
        prune(ctx, &[], &scope, &features_owner(ctx.uid())).await?;
        Ok(Step::done())
    }
}

/// Removes, workspace by workspace, the toggle objects of `owner` that `stages` do not hold
/// (those it holds were just applied, so the sync finds them as rendered and leaves them).
async fn prune(
    ctx: &Context,
    stages: &[Stage],
    scope: &[(String, Vec<GroupVersionKind>)],
    owner: &str,
) -> Result<(), String> {
    let Some(kcp) = ctx.clusters.kcp.as_ref() else {
        return Ok(());
    };
    for (workspace, kinds) in scope {
        let keep: Vec<Value> = stages
            .iter()
            .filter(|s| s.workspace == *workspace)
            .flat_map(|s| s.objects.iter().map(|p| p.object.clone()))
            .collect();
        sync(
            &Target {
                client: &kcp.workspace(workspace),
                owner,
                default_namespace: "default",
                annotations: &[],
                policy: POLICY,
            },
            &keep,
            kinds,
        )
        .await
        .map_err(|e| format!("workspace {workspace}: {e}"))?;
    }
    Ok(())
}
