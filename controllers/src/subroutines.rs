//! Reconciling an object through an ordered chain of subroutines, with one condition per
//! subroutine, an aggregate `Ready`, finalizers and status written only when it changed — the
//! contract the Go Platform Mesh operators share, so users see the same conditions.
//!
//! - Before anything runs, the union of the subroutines' finalizers is added (and the reconcile
//!   ends there; the write itself triggers the next one).
//! - The chain runs in order; on deletion in reverse, and only subroutines whose finalizers are
//!   still on the object run their `finalize`; after a finalize completes without requeue its
//!   finalizers are removed.
//! - An error stops the chain (condition `False`/`Error`); `Stop` stops it (`False`/`Stopped`);
//!   `Pending` continues (`Unknown`/`Pending`); `Skip` is `True`/`Skipped`; done is
//!   `True`/`Complete`. Conditions of the finalize pass are named `<name>Finalize`.
//! - `Ready` aggregates: an error, else a stop, else a pending step, else complete.
//! - The status (conditions and `observedGeneration`) is patched only when it differs, so an
//!   unchanged object costs no write.

use std::time::Duration;

use api::common::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use crate::runtime::{kube_error_is_transient, ReconcileError};

/// What a subroutine reports when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Done; the chain continues. `requeue` asks for a later reconcile.
    Done {
        /// Condition message.
        message: String,
        /// Reconcile again after this long.
        requeue: Option<Duration>,
    },
    /// Not there yet, but the chain may continue.
    Pending {
        /// What is awaited.
        message: String,
        /// When to look again.
        after: Duration,
    },
    /// The chain stops here, to be retried after `after`.
    Stop {
        /// Why.
        message: String,
        /// When to look again (none: on the next change).
        after: Option<Duration>,
    },
    /// Nothing to do for this object.
    Skip {
        /// Why.
        message: String,
    },
}

impl Step {
    /// Done, with no message and no requeue.
    pub fn done() -> Step {
        Step::Done {
            message: String::new(),
            requeue: None,
        }
    }

    /// The chain stops here, to be retried after `after`.
    pub fn stop(message: impl Into<String>, after: Duration) -> Step {
        Step::Stop {
            message: message.into(),
            after: Some(after),
        }
    }
}

/// One step of a chain over a context `C` (the object and the clients it needs), failing with
/// `E` (the error type of the chain's reconciler).
#[async_trait::async_trait]
pub trait Subroutine<C: Sync, E: Send>: Send + Sync {
    /// The condition type of this step.
    fn name(&self) -> &'static str;
    /// Every finalizer this step may put on an object (none by default); on deletion the step
    /// finalizes when the object carries one of them.
    fn finalizers(&self) -> &'static [&'static str] {
        &[]
    }
    /// The finalizers this object needs from this step (default: all of [`Self::finalizers`]),
    /// for steps whose cleanup only some objects need.
    fn finalizers_for(&self, _ctx: &C) -> &'static [&'static str] {
        self.finalizers()
    }
    /// Brings the world towards the object.
    async fn process(&self, ctx: &C) -> Result<Step, E>;
    /// Cleans up on deletion.
    async fn finalize(&self, _ctx: &C) -> Result<Step, E> {
        Ok(Step::done())
    }
}

/// The result of running a chain once.
#[derive(Debug, Clone, PartialEq)]
pub struct Run<E> {
    /// The conditions after the run (existing ones updated in place).
    pub conditions: Vec<Condition>,
    /// The shortest requeue any step asked for.
    pub requeue: Option<Duration>,
    /// The first error, which stopped the chain.
    pub error: Option<E>,
    /// Finalizers whose finalize completed and which may now be removed.
    pub release: Vec<&'static str>,
}

/// The aggregate condition type.
pub const READY: &str = "Ready";

/// An ordered chain of subroutines over a context `C`, failing with `E`.
pub struct Lifecycle<C, E> {
    steps: Vec<Box<dyn Subroutine<C, E>>>,
}

impl<C: Sync, E: Send> Default for Lifecycle<C, E> {
    fn default() -> Self {
        Lifecycle { steps: Vec::new() }
    }
}

impl<C: Sync, E: std::fmt::Display + Send> Lifecycle<C, E> {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a step.
    pub fn step(mut self, s: impl Subroutine<C, E> + 'static) -> Self {
        self.steps.push(Box::new(s));
        self
    }

    /// Every finalizer of the chain, once, in step order.
    pub fn finalizers(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for f in self.steps.iter().flat_map(|s| s.finalizers().iter()) {
            if !out.contains(f) {
                out.push(f);
            }
        }
        out
    }

    /// The finalizers `ctx`'s object needs, once, in step order.
    pub fn finalizers_for(&self, ctx: &C) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for f in self.steps.iter().flat_map(|s| s.finalizers_for(ctx).iter()) {
            if !out.contains(f) {
                out.push(f);
            }
        }
        out
    }

    /// Runs the chain. `present` are the object's finalizers (deciding which finalizes run).
    pub async fn run(
        &self,
        ctx: &C,
        deleting: bool,
        present: &[String],
        generation: Option<i64>,
        existing: &[Condition],
    ) -> Run<E> {
        let now = Time(Timestamp::now());
        let mut conditions = existing.to_vec();
        let suffix = if deleting { "Finalize" } else { "" };
        let names: Vec<String> = self
            .steps
            .iter()
            .map(|s| format!("{}{suffix}", s.name()))
            .chain([READY.to_string()])
            .collect();
        for n in &names {
            if !conditions.iter().any(|c| &c.type_ == n) {
                let message = format!("awaiting first reconciliation for {n}");
                set(
                    &mut conditions,
                    n,
                    "Unknown",
                    "Unknown",
                    &message,
                    generation,
                    &now,
                );
            }
        }
        let order: Vec<&dyn Subroutine<C, E>> = if deleting {
            self.steps.iter().rev().map(|s| s.as_ref()).collect()
        } else {
            self.steps.iter().map(|s| s.as_ref()).collect()
        };
        let (mut errored, mut stopped, mut pending) = (None, false, false);
        let mut requeue: Option<Duration> = None;
        // Steps whose finalize completed without asking to come back.
        let mut finished: Vec<&'static str> = Vec::new();
        let shorter = |r: &mut Option<Duration>, d: Duration| {
            if !d.is_zero() && r.is_none_or(|x| d < x) {
                *r = Some(d);
            }
        };
        for s in order {
            let name = format!("{}{suffix}", s.name());
            if deleting
                && !s
                    .finalizers()
                    .iter()
                    .any(|f| present.iter().any(|p| p == f))
            {
                continue;
            }
            let result = if deleting {
                s.finalize(ctx).await
            } else {
                s.process(ctx).await
            };
            match result {
                Err(e) => {
                    set(
                        &mut conditions,
                        &name,
                        "False",
                        "Error",
                        &e.to_string(),
                        generation,
                        &now,
                    );
                    errored = Some(e);
                    break;
                }
                Ok(Step::Done {
                    message,
                    requeue: r,
                }) => {
                    set(
                        &mut conditions,
                        &name,
                        "True",
                        "Complete",
                        &message,
                        generation,
                        &now,
                    );
                    match r {
                        Some(d) if !d.is_zero() => shorter(&mut requeue, d),
                        _ => finished.push(s.name()),
                    }
                }
                Ok(Step::Pending { message, after }) => {
                    set(
                        &mut conditions,
                        &name,
                        "Unknown",
                        "Pending",
                        &message,
                        generation,
                        &now,
                    );
                    pending = true;
                    shorter(&mut requeue, after);
                }
                Ok(Step::Stop { message, after }) => {
                    set(
                        &mut conditions,
                        &name,
                        "False",
                        "Stopped",
                        &message,
                        generation,
                        &now,
                    );
                    stopped = true;
                    if let Some(d) = after {
                        shorter(&mut requeue, d);
                    }
                    break;
                }
                Ok(Step::Skip { message }) => {
                    set(
                        &mut conditions,
                        &name,
                        "True",
                        "Skipped",
                        &message,
                        generation,
                        &now,
                    );
                    finished.push(s.name());
                }
            }
        }
        let (status, reason, message) = if errored.is_some() {
            (
                "False",
                "Error",
                "one or more subroutines encountered an error",
            )
        } else if stopped {
            (
                "False",
                "Stopped",
                "one or more subroutines stopped the chain",
            )
        } else if pending {
            ("Unknown", "Pending", "one or more subroutines are pending")
        } else {
            ("True", "Complete", "all subroutines completed successfully")
        };
        set(
            &mut conditions,
            READY,
            status,
            reason,
            message,
            generation,
            &now,
        );
        // A finalizer goes once every step holding it has finished (steps may share one).
        let release = if deleting {
            self.finalizers()
                .into_iter()
                .filter(|f| {
                    self.steps
                        .iter()
                        .filter(|s| s.finalizers().contains(f))
                        .all(|s| finished.contains(&s.name()))
                })
                .collect()
        } else {
            Vec::new()
        };
        Run {
            conditions,
            requeue,
            error: errored,
            release,
        }
    }
}

/// Sets a condition as `meta.SetStatusCondition` does: the transition time changes only when
/// the status does.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.status = status.to_string();
                c.last_transition_time = now.clone();
            }
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            last_transition_time: now.clone(),
            message: message.to_string(),
            observed_generation: generation,
            reason: reason.to_string(),
            status: status.to_string(),
            type_: type_.to_string(),
        }),
    }
}

/// Status fields besides the conditions that steps report (such as `phase`), starting from the
/// stored values; [`drive_with_status`] writes them when they changed.
#[derive(Debug, Default)]
pub struct StatusFields(std::sync::Mutex<serde_json::Map<String, Value>>);

impl StatusFields {
    /// The stored values of `keys` in `obj`'s status.
    pub fn stored(obj: &DynamicObject, keys: &[&str]) -> Self {
        let mut m = serde_json::Map::new();
        for k in keys {
            if let Some(v) = obj.data["status"].get(*k) {
                m.insert(k.to_string(), v.clone());
            }
        }
        StatusFields(std::sync::Mutex::new(m))
    }

    /// Sets a field.
    pub fn set(&self, key: &str, value: Value) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), value);
    }

    /// A field as the steps left it (null when unset).
    pub fn get(&self, key: &str) -> Value {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Sets `phase`.
    pub fn set_phase(&self, phase: &str) {
        self.set("phase", json!(phase));
    }

    /// Sets `phase` to `initial` when it has none yet.
    pub fn start_phase(&self, initial: &str) {
        if self.get("phase").as_str().unwrap_or("").is_empty() {
            self.set_phase(initial);
        }
    }

    /// Every field.
    pub fn snapshot(&self) -> serde_json::Map<String, Value> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Why driving an object failed.
#[derive(Debug, thiserror::Error)]
pub enum DriveError<E> {
    /// A subroutine failed.
    #[error("{0}")]
    Subroutine(E),
    /// Writing the object failed.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Writing the driven object's finalizers or status failed.
#[derive(Debug, thiserror::Error)]
#[error("updating {what}: {source}")]
pub struct WriteError {
    /// `finalizers` or `status`.
    pub what: &'static str,
    /// The client error.
    #[source]
    pub source: Box<kube::Error>,
}

impl ReconcileError for WriteError {
    fn is_transient(&self) -> bool {
        kube_error_is_transient(&self.source)
    }
}

impl<E> DriveError<E> {
    /// Writing the finalizers failed.
    fn finalizers(source: kube::Error) -> Self {
        DriveError::Write(WriteError {
            what: "finalizers",
            source: Box::new(source),
        })
    }

    /// The subroutine's error as it is, a write error as `E`: the error of a reconciler that
    /// drives a chain of subroutines failing with `E`.
    pub fn flatten(self) -> E
    where
        E: From<WriteError>,
    {
        match self {
            DriveError::Subroutine(e) => e,
            DriveError::Write(w) => w.into(),
        }
    }
}

impl<E: ReconcileError> ReconcileError for DriveError<E> {
    /// A subroutine's error as it classifies itself, a failed write as its client error.
    fn is_transient(&self) -> bool {
        match self {
            DriveError::Subroutine(e) => e.is_transient(),
            DriveError::Write(w) => w.is_transient(),
        }
    }
}

/// Runs `lifecycle` for `obj` and writes what changed: finalizers first (and nothing else that
/// time), then the status, then released finalizers. Returns when to reconcile again.
pub async fn drive<C: Sync, E: std::fmt::Display + Send>(
    lifecycle: &Lifecycle<C, E>,
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    ctx: &C,
) -> Result<Option<Duration>, DriveError<E>> {
    drive_with_status(lifecycle, api, obj, ctx, |_| serde_json::Map::new()).await
}

/// [`drive`] for kinds whose steps also report other status fields (such as `phase`): `fields`
/// gives them after the run, and they are written with the conditions when they differ.
pub async fn drive_with_status<C: Sync, E: std::fmt::Display + Send>(
    lifecycle: &Lifecycle<C, E>,
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    ctx: &C,
    fields: impl Fn(&C) -> serde_json::Map<String, Value>,
) -> Result<Option<Duration>, DriveError<E>> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let deleting = obj.metadata.deletion_timestamp.is_some();
    let present = obj.metadata.finalizers.clone().unwrap_or_default();
    // On deletion, every finalizer of the chain the object carries is ours to release.
    let wanted: Vec<&'static str> = if deleting {
        lifecycle
            .finalizers()
            .into_iter()
            .filter(|f| present.iter().any(|p| p == f))
            .collect()
    } else {
        lifecycle.finalizers_for(ctx)
    };
    if !deleting {
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|f| !present.iter().any(|p| p == f))
            .collect();
        if !missing.is_empty() {
            let mut all = present.clone();
            all.extend(missing.iter().map(|m| m.to_string()));
            patch_finalizers(api, &name, obj, all)
                .await
                .map_err(DriveError::finalizers)?;
            return Ok(None);
        }
    } else if wanted.is_empty() {
        return Ok(None);
    }
    let existing: Vec<Condition> = obj
        .data
        .pointer("/status/conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let generation = obj.metadata.generation;
    let run = lifecycle
        .run(ctx, deleting, &present, generation, &existing)
        .await;
    let observed = obj
        .data
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    let extra = fields(ctx);
    let extra_changed = extra
        .iter()
        .any(|(k, v)| obj.data["status"].get(k).unwrap_or(&Value::Null) != v);
    let status_changed =
        !same_conditions(&existing, &run.conditions) || observed != generation || extra_changed;
    let gone = deleting && wanted.iter().all(|w| run.release.contains(w));
    if status_changed && !gone {
        let mut status = extra;
        status.insert("conditions".into(), json!(run.conditions));
        status.insert("observedGeneration".into(), json!(generation));
        let patch = json!({ "status": status });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Some(Duration::from_secs(1))),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(source) => {
                return Err(DriveError::Write(WriteError {
                    what: "status",
                    source: Box::new(source),
                }))
            }
        }
    }
    if deleting && !run.release.is_empty() {
        let keep: Vec<String> = present
            .iter()
            .filter(|p| !run.release.contains(&p.as_str()))
            .cloned()
            .collect();
        patch_finalizers(api, &name, obj, keep)
            .await
            .map_err(DriveError::finalizers)?;
    }
    match run.error {
        Some(e) => Err(DriveError::Subroutine(e)),
        None => Ok(run.requeue),
    }
}

/// Conditions equal but for transition times of unchanged statuses (which `set` keeps).
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                y.type_ == x.type_
                    && y.status == x.status
                    && y.reason == x.reason
                    && y.message == x.message
                    && y.observed_generation == x.observed_generation
            })
        })
}

/// Sets `obj`'s finalizers to `finalizers` as a compare-and-swap on its resourceVersion; an object
/// changed or gone meanwhile is left for the event that follows.
pub async fn patch_finalizers(
    api: &Api<DynamicObject>,
    name: &str,
    obj: &DynamicObject,
    finalizers: Vec<String>,
) -> Result<(), kube::Error> {
    // The resourceVersion makes this a compare-and-swap: a finalizer added meanwhile is not lost.
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.metadata.resource_version,
    }});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(source) => Err(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Fixed {
        name: &'static str,
        finalizers: &'static [&'static str],
        process: Result<Step, String>,
        finalize: Result<Step, String>,
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl Subroutine<Seen, String> for Fixed {
        fn name(&self) -> &'static str {
            self.name
        }
        fn finalizers(&self) -> &'static [&'static str] {
            self.finalizers
        }
        async fn process(&self, ctx: &Seen) -> Result<Step, String> {
            ctx.0.lock().unwrap().push(self.name.to_string());
            self.process.clone()
        }
        async fn finalize(&self, ctx: &Seen) -> Result<Step, String> {
            ctx.0.lock().unwrap().push(format!("-{}", self.name));
            self.finalize.clone()
        }
    }

    fn step(
        name: &'static str,
        fin: &'static [&'static str],
        process: Result<Step, String>,
    ) -> Fixed {
        Fixed {
            name,
            finalizers: fin,
            process,
            finalize: Ok(Step::done()),
        }
    }

    fn cond<'a>(run: &'a Run<String>, t: &str) -> (&'a str, &'a str) {
        let c = run.conditions.iter().find(|c| c.type_ == t).expect(t);
        (c.status.as_str(), c.reason.as_str())
    }

    #[tokio::test]
    async fn steps_run_in_order_and_ready_aggregates() {
        let lc = Lifecycle::new()
            .step(step("Deployment", &[], Ok(Step::done())))
            .step(step(
                "KcpSetup",
                &["a/f"],
                Ok(Step::Pending {
                    message: "wait".into(),
                    after: Duration::from_secs(5),
                }),
            ))
            .step(step(
                "Wait",
                &["a/f"],
                Ok(Step::Done {
                    message: "ok".into(),
                    requeue: Some(Duration::from_secs(30)),
                }),
            ));
        assert_eq!(lc.finalizers(), vec!["a/f"]);
        let seen = Seen::default();
        let run = lc.run(&seen, false, &[], Some(3), &[]).await;
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec!["Deployment", "KcpSetup", "Wait"]
        );
        assert_eq!(cond(&run, "Deployment"), ("True", "Complete"));
        assert_eq!(cond(&run, "KcpSetup"), ("Unknown", "Pending"));
        assert_eq!(cond(&run, "Ready"), ("Unknown", "Pending"));
        assert_eq!(
            run.requeue,
            Some(Duration::from_secs(5)),
            "the shortest requeue"
        );
        assert!(run
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(3)));
    }

    #[tokio::test]
    async fn an_error_or_a_stop_ends_the_chain() {
        let lc = Lifecycle::new()
            .step(step("A", &[], Err("boom".into())))
            .step(step("B", &[], Ok(Step::done())));
        let seen = Seen::default();
        let run = lc.run(&seen, false, &[], None, &[]).await;
        assert_eq!(*seen.0.lock().unwrap(), vec!["A"]);
        assert_eq!(run.error.as_deref(), Some("boom"));
        assert_eq!(cond(&run, "A"), ("False", "Error"));
        assert_eq!(cond(&run, "B"), ("Unknown", "Unknown"), "never ran");
        assert_eq!(cond(&run, "Ready"), ("False", "Error"));

        let lc = Lifecycle::new()
            .step(step(
                "A",
                &[],
                Ok(Step::Stop {
                    message: "not yet".into(),
                    after: Some(Duration::from_secs(5)),
                }),
            ))
            .step(step("B", &[], Ok(Step::done())));
        let run = lc.run(&Seen::default(), false, &[], None, &[]).await;
        assert_eq!(cond(&run, "A"), ("False", "Stopped"));
        assert_eq!(cond(&run, "Ready"), ("False", "Stopped"));
        assert!(run.error.is_none());
    }

    #[tokio::test]
    async fn deletion_runs_finalizers_in_reverse_and_releases_them() {
        let lc = Lifecycle::new()
            .step(step("A", &["x/a"], Ok(Step::done())))
            .step(step("B", &[], Ok(Step::done())))
            .step(step("C", &["x/c"], Ok(Step::done())));
        let seen = Seen::default();
        let present = vec!["x/a".to_string(), "x/c".to_string(), "other".to_string()];
        let run = lc.run(&seen, true, &present, None, &[]).await;
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec!["-C", "-A"],
            "reverse, only with finalizers"
        );
        assert_eq!(run.release, vec!["x/a", "x/c"]);
        assert_eq!(cond(&run, "CFinalize"), ("True", "Complete"));
    }

    #[tokio::test]
    async fn a_shared_finalizer_stays_until_every_step_holding_it_finished() {
        let lc = Lifecycle::new()
            .step(Fixed {
                name: "A",
                finalizers: &["x/f"],
                process: Ok(Step::done()),
                finalize: Err("later".into()),
            })
            .step(step("B", &["x/f"], Ok(Step::done())));
        let run = lc
            .run(&Seen::default(), true, &["x/f".to_string()], None, &[])
            .await;
        assert!(
            run.release.is_empty(),
            "A failed, so x/f stays: {:?}",
            run.release
        );
        assert_eq!(run.error.as_deref(), Some("later"));
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let t0 = Time(Timestamp::from_second(1_000).unwrap());
        let t1 = Time(Timestamp::from_second(2_000).unwrap());
        let mut cs = Vec::new();
        set(&mut cs, "Ready", "True", "Complete", "", Some(1), &t0);
        set(&mut cs, "Ready", "True", "Complete", "again", Some(2), &t1);
        assert_eq!(cs[0].last_transition_time, t0);
        assert_eq!(cs[0].message, "again");
        set(&mut cs, "Ready", "False", "Error", "x", Some(2), &t1);
        assert_eq!(cs[0].last_transition_time, t1);
    }
}
