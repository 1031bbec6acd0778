//! MigrationConfigurations (how to move objects of one kind between providers, in stages) and
//! the Migration state machine that runs them, in the coordination cluster.
//!
//! A Migration runs the stages of the configuration for its `from`/`to` kinds in order. For each
//! stage it creates the stage's templates (as `<id>-<key>`, labelled with the stage and the
//! migration id, in the template's namespace or else the Migration's), then evaluates the
//! stage's CEL `successConditions`. The variables are the stage's objects as they are now (by
//! template key) and `from` and `to`, the two provider copies (`null` while absent). When every
//! condition holds, the stage's objects are deleted and the next stage starts.
//!
//! States: `Pending` (nothing deployed) → `InitialInProgress` → (a stage with `progress: true`
//! succeeds) `InitialCompleted` → (the next stage is deployed) `CutoverInProgress` → (the last
//! stage succeeds) `CutoverCompleted`. From `InitialCompleted` on, the consumer reads related
//! resources from the new provider; at `CutoverCompleted` the old copy is deleted. `Failed`
//! (with condition `Ready` saying why) when a condition can never hold: it does not compile,
//! gives something other than a bool, or a template cannot be created. `status.stage` names
//! the stage running.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::broker::{Migration, MigrationConfiguration, MigrationConfigurationSpec, MigrationStage};
use api::common::GroupVersionKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use kube_cel::cel::{self, objects::Key, Context, Program};
use rand::Rng;
use serde_json::{json, Value};

use super::generic::Discovery;
use super::{set_finalizer, BrokerError};
use crate::runtime::{Action, ClusterContext, Manager, Reconciler, Request};
use crate::subroutines;

/// Finalizer keeping a MigrationConfiguration registered until the broker saw its deletion.
pub const CONFIGURATION_FINALIZER: &str =
    "broker.platform-mesh.io/migrationconfiguration-finalizer";
/// Finalizer letting the broker delete a Migration's stage objects.
pub const MIGRATION_FINALIZER: &str = "broker.platform-mesh.io/migration-finalizer";
/// Label on stage objects: the stage's name.
pub const STAGE_LABEL: &str = "broker.platform-mesh.io/migration-stage";
/// Label on stage objects: the migration's id.
pub const ID_LABEL: &str = "broker.platform-mesh.io/migration-id";

/// Migration states.
pub mod state {
    /// Created, nothing deployed yet.
    pub const PENDING: &str = "Pending";
    /// Running stages before (and including) the first `progress` stage.
    pub const INITIAL_IN_PROGRESS: &str = "InitialInProgress";
    /// A `progress` stage succeeded: the consumer now reads from the new provider.
    pub const INITIAL_COMPLETED: &str = "InitialCompleted";
    /// Running the stages after the `progress` stage.
    pub const CUTOVER_IN_PROGRESS: &str = "CutoverInProgress";
    /// Every stage succeeded: the old copy goes.
    pub const CUTOVER_COMPLETED: &str = "CutoverCompleted";
    /// A stage can never succeed; condition `Ready` says why.
    pub const FAILED: &str = "Failed";
}

/// Whether a Migration in `state` has the consumer reading from the new provider.
pub fn serves_from_new(state: &str) -> bool {
    matches!(
        state,
        state::INITIAL_COMPLETED | state::CUTOVER_IN_PROGRESS | state::CUTOVER_COMPLETED
    )
}

type Pair = (GroupVersionKind, GroupVersionKind);
/// Configurations of one pair, by namespace and name.
type ByName = BTreeMap<(String, String), MigrationConfigurationSpec>;

/// The registered MigrationConfigurations by `(from, to)` kinds. When several exist for one
/// pair, the one first in namespace/name order is used.
#[derive(Clone, Default)]
pub struct Configurations {
    inner: Arc<RwLock<HashMap<Pair, ByName>>>,
}

impl Configurations {
    /// Registers (or updates) configuration `namespace/name`.
    pub fn set(&self, namespace: &str, name: &str, spec: MigrationConfigurationSpec) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        for configs in inner.values_mut() {
            configs.remove(&(namespace.to_string(), name.to_string()));
        }
        inner
            .entry((spec.from.clone(), spec.to.clone()))
            .or_default()
            .insert((namespace.into(), name.into()), spec);
        inner.retain(|_, c| !c.is_empty());
    }

    /// Forgets configuration `namespace/name`.
    pub fn remove(&self, namespace: &str, name: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        for configs in inner.values_mut() {
            configs.remove(&(namespace.to_string(), name.to_string()));
        }
        inner.retain(|_, c| !c.is_empty());
    }

    /// The configuration for moving `from` objects to `to` objects.
    pub fn get(
        &self,
        from: &GroupVersionKind,
        to: &GroupVersionKind,
    ) -> Option<MigrationConfigurationSpec> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .get(&(from.clone(), to.clone()))
            .and_then(|c| c.values().next().cloned())
    }
}

/// Keeps [`Configurations`] in step with the MigrationConfigurations of the coordination
/// cluster, and wakes the Migrations when one changes.
pub struct ConfigurationReconciler {
    /// The registry to keep.
    pub configurations: Configurations,
    /// The coordination manager (to wake the Migration controller).
    pub coordination: Manager,
}

/// Name of the Migration controller.
pub const MIGRATION_CONTROLLER: &str = "broker-migration";

impl Reconciler for ConfigurationReconciler {
    type Error = BrokerError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, BrokerError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        let api: Api<MigrationConfiguration> = ctx.namespaced(&namespace);
        // The object as the controller's watch cache holds it: no request to the API server.
        let obj = ctx.requested::<MigrationConfiguration>(&req).await?;
        match obj {
            None => self.configurations.remove(&namespace, &req.name),
            Some(obj) if obj.metadata.deletion_timestamp.is_some() => {
                self.configurations.remove(&namespace, &req.name);
                set_finalizer(&api, &obj, CONFIGURATION_FINALIZER, false).await?;
            }
            Some(obj) => {
                set_finalizer(&api, &obj, CONFIGURATION_FINALIZER, true).await?;
                self.configurations
                    .set(&namespace, &req.name, obj.spec.clone());
            }
        }
        // Migrations waiting for a configuration may now go on.
        let migrations: Api<Migration> = ctx.all();
        if let Ok(list) = migrations.list(&Default::default()).await {
            for m in list {
                self.coordination.enqueue(
                    MIGRATION_CONTROLLER,
                    Request::namespaced(
                        ctx.cluster_name().clone(),
                        m.namespace().unwrap_or_default(),
                        m.name_any(),
                    ),
                );
            }
        }
        Ok(Action::await_change())
    }
}

/// Runs Migrations: deploys stage objects, checks success conditions, advances stages.
pub struct MigrationReconciler {
    /// The registered configurations.
    pub configurations: Configurations,
    /// The provider clusters (for the `from` and `to` copies).
    pub providers: Manager,
    /// Where stage objects go (the coordination cluster unless a compute cluster is given).
    pub compute: Option<kube::Client>,
    /// Resolves kinds of stage objects.
    pub discovery: Discovery,
}

/// What the Migration status should become.
struct Outcome {
    state: String,
    stage: Option<String>,
    reason: &'static str,
    message: String,
    /// Poll again after this long (stage objects are of any kind and not watched).
    poll: Option<Duration>,
}

impl Reconciler for MigrationReconciler {
    type Error = BrokerError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, BrokerError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        let api: Api<Migration> = ctx.namespaced(&namespace);
        // Read from the API server, not the watch cache: a migration is a state machine whose
        // next step depends on the stage its last reconcile wrote, which the cache may not
        // have yet when a requeue comes.
        let Some(m) = api.get_opt(&req.name).await.map_err(BrokerError::Read)? else {
            return Ok(Action::await_change());
        };
        let compute = self.compute.clone().unwrap_or_else(|| ctx.client());
        let status = m.status.clone().unwrap_or_default();
        let current = status.state.clone().unwrap_or_default();
        let config = self.configurations.get(&m.spec.from.gvk, &m.spec.to.gvk);
        let stages = config
            .as_ref()
            .and_then(|c| c.stages.clone())
            .unwrap_or_default();
        let stage_index = status
            .stage
            .as_deref()
            .and_then(|s| stages.iter().position(|x| x.name == s));
        if m.metadata.deletion_timestamp.is_some() {
            if let (Some(id), Some(i)) = (status.id.as_deref(), stage_index) {
                self.delete_stage(&compute, &m, id, &stages[i]).await?;
            }
            set_finalizer(&api, &m, MIGRATION_FINALIZER, false).await?;
            return Ok(Action::await_change());
        }
        if current == state::CUTOVER_COMPLETED || current == state::FAILED {
            set_finalizer(&api, &m, MIGRATION_FINALIZER, false).await?;
            return Ok(Action::await_change());
        }
        set_finalizer(&api, &m, MIGRATION_FINALIZER, true).await?;
        let id = match status.id.clone() {
            Some(id) => id,
            None => new_id(),
        };
        let outcome = match config {
            None => Outcome {
                state: state::PENDING.into(),
                stage: None,
                reason: "NoConfiguration",
                message: format!(
                    "no MigrationConfiguration from {} to {}",
                    gvk_text(&m.spec.from.gvk),
                    gvk_text(&m.spec.to.gvk)
                ),
                poll: None,
            },
            Some(_) if stages.is_empty() => done("the configuration has no stages"),
            Some(_) => match (status.stage.as_deref(), stage_index) {
                (Some(name), None) => failed(
                    Some(name.to_string()),
                    "UnknownStage",
                    format!("the configuration has no stage {name:?} any more"),
                ),
                (_, index) => {
                    self.run_stage(&compute, &m, &id, &current, &stages, index.unwrap_or(0))
                        .await?
                }
            },
        };
        self.write(&api, &m, &id, outcome).await
    }
}

fn done(message: &str) -> Outcome {
    Outcome {
        state: state::CUTOVER_COMPLETED.into(),
        stage: None,
        reason: "Completed",
        message: message.into(),
        poll: None,
    }
}

fn failed(stage: Option<String>, reason: &'static str, message: String) -> Outcome {
    Outcome {
        state: state::FAILED.into(),
        stage,
        reason,
        message,
        poll: None,
    }
}

fn gvk_text(gvk: &GroupVersionKind) -> String {
    if gvk.group.is_empty() {
        format!("{}/{}", gvk.version, gvk.kind)
    } else {
        format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind)
    }
}

/// 26 random characters of `[a-z2-7]`.
fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut rng = rand::rng();
    (0..26)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Why a success condition does not hold (yet, or ever).
enum Unmet {
    /// Not yet: it evaluated to false or could not be evaluated on the objects as they are.
    Waiting(String),
    /// Never: it does not compile or gives something other than a bool.
    Invalid(String),
}

/// Evaluates `conditions` with `vars` bound; the first unmet one says why.
fn check_conditions(conditions: &[String], vars: &[(String, Value)]) -> Result<(), Unmet> {
    for expr in conditions {
        let program = match std::panic::catch_unwind(AssertUnwindSafe(|| Program::compile(expr))) {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                return Err(Unmet::Invalid(format!(
                    "success condition {expr:?} does not compile: {e}"
                )))
            }
            Err(_) => {
                return Err(Unmet::Invalid(format!(
                    "success condition {expr:?} does not compile"
                )))
            }
        };
        let mut ctx = Context::default();
        for (name, value) in vars {
            ctx.add_variable_from_value(name.clone(), to_cel(value));
        }
        match std::panic::catch_unwind(AssertUnwindSafe(|| program.execute(&ctx))) {
            Ok(Ok(cel::Value::Bool(true))) => {}
            Ok(Ok(cel::Value::Bool(false))) => {
                return Err(Unmet::Waiting(format!("waiting for {expr}")))
            }
            Ok(Ok(other)) => {
                return Err(Unmet::Invalid(format!(
                    "success condition {expr:?} gives {:?}, not a bool",
                    other.type_of()
                )))
            }
            Ok(Err(e)) => return Err(Unmet::Waiting(format!("waiting for {expr}: {e}"))),
            Err(_) => {
                return Err(Unmet::Waiting(format!(
                    "waiting for {expr}: the CEL interpreter failed"
                )))
            }
        }
    }
    Ok(())
}

/// A JSON value as CEL sees it.
fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<Key, cel::Value> = m
                .iter()
                .map(|(k, v)| (Key::from(k.as_str()), to_cel(v)))
                .collect();
            cel::Value::from(map)
        }
    }
}

impl MigrationReconciler {
    /// The API of a stage object and whether it is namespaced.
    async fn stage_api(
        &self,
        compute: &kube::Client,
        template: &Value,
        namespace: &str,
    ) -> Result<(Api<DynamicObject>, ApiResource), BrokerError> {
        let api_version = template["apiVersion"].as_str().unwrap_or_default();
        let kind = template["kind"].as_str().unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            return Err(BrokerError::Template);
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        };
        let (ar, namespaced) = self.discovery.resolve(compute, &gvk).await?;
        let ns = template["metadata"]["namespace"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(namespace);
        let api = if namespaced {
            Api::namespaced_with(compute.clone(), ns, &ar)
        } else {
            Api::all_with(compute.clone(), &ar)
        };
        Ok((api, ar))
    }

    async fn run_stage(
        &self,
        compute: &kube::Client,
        m: &Migration,
        id: &str,
        current: &str,
        stages: &[MigrationStage],
        index: usize,
    ) -> Result<Outcome, BrokerError> {
        let stage = &stages[index];
        let namespace = m.namespace().unwrap_or_default();
        let mut vars: Vec<(String, Value)> = Vec::new();
        for (key, template) in stage.templates.iter().flatten() {
            let (api, _) = match self.stage_api(compute, template, &namespace).await {
                Ok(x) => x,
                Err(e) => {
                    return Ok(failed(
                        Some(stage.name.clone()),
                        "InvalidTemplate",
                        format!("stage {}: template {key}: {e}", stage.name),
                    ))
                }
            };
            let name = format!("{id}-{key}");
            let live = match api.get_opt(&name).await.map_err(BrokerError::Read)? {
                Some(o) => o,
                None => {
                    let mut obj = template.clone();
                    obj["metadata"]["name"] = json!(name);
                    obj["metadata"]["labels"][STAGE_LABEL] = json!(stage.name);
                    obj["metadata"]["labels"][ID_LABEL] = json!(id);
                    let obj: DynamicObject = match serde_json::from_value(obj) {
                        Ok(o) => o,
                        Err(e) => {
                            return Ok(failed(
                                Some(stage.name.clone()),
                                "InvalidTemplate",
                                format!("stage {}: template {key}: {e}", stage.name),
                            ))
                        }
                    };
                    match api.create(&PostParams::default(), &obj).await {
                        Ok(o) => o,
                        Err(kube::Error::Api(s))
                            if (400..500).contains(&s.code) && s.code != 409 && s.code != 429 =>
                        {
                            return Ok(failed(
                                Some(stage.name.clone()),
                                "InvalidTemplate",
                                format!(
                                    "stage {}: template {key} was refused: {}",
                                    stage.name, s.message
                                ),
                            ))
                        }
                        Err(e) => {
                            return Err(BrokerError::kube(
                                format!("creating stage object {name}"),
                                e,
                            ))
                        }
                    }
                }
            };
            vars.push((key.clone(), serde_json::to_value(&live).unwrap_or_default()));
        }
        vars.push(("from".into(), self.provider_object(&m.spec.from).await));
        vars.push(("to".into(), self.provider_object(&m.spec.to).await));
        // Before the first `progress` stage succeeded the migration is in its initial phase.
        let initial = matches!(current, "" | state::PENDING | state::INITIAL_IN_PROGRESS);
        let running = if initial {
            state::INITIAL_IN_PROGRESS
        } else {
            state::CUTOVER_IN_PROGRESS
        };
        let conditions = stage.success_conditions.clone().unwrap_or_default();
        match check_conditions(&conditions, &vars) {
            Err(Unmet::Invalid(message)) => Ok(failed(
                Some(stage.name.clone()),
                "InvalidCondition",
                format!("stage {}: {message}", stage.name),
            )),
            Err(Unmet::Waiting(message)) => Ok(Outcome {
                state: running.into(),
                stage: Some(stage.name.clone()),
                reason: "StageRunning",
                message: format!("stage {}: {message}", stage.name),
                poll: Some(Duration::from_secs(1)),
            }),
            Ok(()) => {
                self.delete_stage(compute, m, id, stage).await?;
                let Some(next) = stages.get(index + 1) else {
                    return Ok(done(&format!("stage {} succeeded, the last", stage.name)));
                };
                let state = if stage.progress == Some(true) && initial {
                    state::INITIAL_COMPLETED
                } else {
                    running
                };
                Ok(Outcome {
                    state: state.into(),
                    stage: Some(next.name.clone()),
                    reason: "StageSucceeded",
                    message: format!("stage {} succeeded; next: {}", stage.name, next.name),
                    poll: Some(Duration::ZERO),
                })
            }
        }
    }

    /// A provider copy as JSON (`null` when absent or unreachable).
    async fn provider_object(&self, r: &api::broker::MigrationRef) -> Value {
        let cluster = r
            .cluster_name
            .strip_prefix(super::PROVIDER_PREFIX)
            .unwrap_or(&r.cluster_name);
        let Some(cluster) = self.providers.cluster(cluster) else {
            return Value::Null;
        };
        let Ok((ar, namespaced)) = self.discovery.resolve(&cluster.client(), &r.gvk).await else {
            return Value::Null;
        };
        let api = cluster.dynamic_api(
            &ar,
            namespaced.then(|| r.namespace.as_deref().unwrap_or("default")),
        );
        match api.get_opt(&r.name).await {
            Ok(Some(o)) => serde_json::to_value(o).unwrap_or_default(),
            _ => Value::Null,
        }
    }

    async fn delete_stage(
        &self,
        compute: &kube::Client,
        m: &Migration,
        id: &str,
        stage: &MigrationStage,
    ) -> Result<(), BrokerError> {
        let namespace = m.namespace().unwrap_or_default();
        for (key, template) in stage.templates.iter().flatten() {
            let Ok((api, _)) = self.stage_api(compute, template, &namespace).await else {
                continue;
            };
            match api
                .delete(&format!("{id}-{key}"), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(BrokerError::kube(
                        format!("deleting stage object {id}-{key}"),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    async fn write(
        &self,
        api: &Api<Migration>,
        m: &Migration,
        id: &str,
        outcome: Outcome,
    ) -> Result<Action, BrokerError> {
        let mut status = m.status.clone().unwrap_or_default();
        let before = status.clone();
        status.id = Some(id.to_string());
        status.state = Some(outcome.state.clone());
        status.stage = outcome.stage.clone();
        let mut conditions = status.conditions.clone().unwrap_or_default();
        let ready = if outcome.state == state::CUTOVER_COMPLETED {
            "True"
        } else {
            "False"
        };
        subroutines::set(
            &mut conditions,
            "Ready",
            ready,
            outcome.reason,
            &outcome.message,
            m.metadata.generation,
            &Time(Timestamp::now()),
        );
        status.conditions = Some(conditions);
        if status != before {
            let patch = json!({"status": status});
            api.patch_status(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| BrokerError::kube("writing Migration status", e))?;
        }
        Ok(match outcome.poll {
            Some(d) => Action::requeue_after(d),
            None => Action::await_change(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_see_objects_as_maps() {
        let vars = vec![
            (
                "disk".to_string(),
                json!({"data": {"phase": "copied"}, "status": {"n": 3}}),
            ),
            ("to".to_string(), Value::Null),
        ];
        assert!(check_conditions(
            &[
                "disk.data.phase == 'copied'".into(),
                "disk.status.n > 2".into()
            ],
            &vars
        )
        .is_ok());
        assert!(matches!(
            check_conditions(&["disk.data.phase == 'done'".into()], &vars),
            Err(Unmet::Waiting(_))
        ));
        // A field that is not there yet is waited for, not a failure.
        assert!(matches!(
            check_conditions(&["disk.status.ready == true".into()], &vars),
            Err(Unmet::Waiting(_))
        ));
        assert!(matches!(
            check_conditions(&["disk.data.phase".into()], &vars),
            Err(Unmet::Invalid(m)) if m.contains("not a bool")
        ));
        assert!(matches!(
            check_conditions(&["disk.data.phase ==".into()], &vars),
            Err(Unmet::Invalid(m)) if m.contains("does not compile")
        ));
        assert!(check_conditions(&[], &vars).is_ok());
    }

    #[test]
    fn configurations_pick_the_first_by_name_and_move_on_edit() {
        let gvk = |k: &str| GroupVersionKind {
            group: "g".into(),
            version: "v1".into(),
            kind: k.into(),
        };
        let spec = |from: &str, stages: usize| MigrationConfigurationSpec {
            from: gvk(from),
            to: gvk(from),
            stages: Some(
                (0..stages)
                    .map(|i| MigrationStage {
                        name: format!("s{i}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
        };
        let c = Configurations::default();
        c.set("ns", "b", spec("VM", 2));
        c.set("ns", "a", spec("VM", 1));
        assert_eq!(
            c.get(&gvk("VM"), &gvk("VM")).unwrap().stages.unwrap().len(),
            1
        );
        c.set("ns", "a", spec("Disk", 1));
        assert_eq!(
            c.get(&gvk("VM"), &gvk("VM")).unwrap().stages.unwrap().len(),
            2
        );
        c.remove("ns", "b");
        assert!(c.get(&gvk("VM"), &gvk("VM")).is_none());
        assert!(new_id()
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ('2'..='7').contains(&ch)));
    }
}
