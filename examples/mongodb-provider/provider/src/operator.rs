//! A strict stand-in of the MongoDB community operator, for the downstream cluster of the
//! example: it validates each MongoDBCommunity as the operator's API types do and walks it
//! through the operator's phases (`Pending`, then `Running`; `Failed` for an invalid spec),
//! writing the status subresource. It deploys nothing.
//!
//! The rules and transitions are pure functions ([`validate`], [`next_step`]); [`run`] polls the
//! cluster every 50 ms and applies them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::model::{api_resource, RUNNING};

/// The only deployment type the community operator supports.
pub const REPLICA_SET: &str = "ReplicaSet";
/// The phase of an object being deployed.
pub const PENDING: &str = "Pending";
/// The phase of an object whose spec the operator refuses.
pub const FAILED: &str = "Failed";
/// The fewest members of a replica set.
pub const MIN_MEMBERS: i64 = 1;
/// The most members of a replica set (MongoDB's limit).
pub const MAX_MEMBERS: i64 = 50;
/// The oldest major version the operator deploys.
pub const MIN_MAJOR: u64 = 4;
/// How long an object stays `Pending` before it is `Running`.
pub const PENDING_FOR: Duration = Duration::from_millis(200);
/// How often the stand-in looks at the cluster.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// Why the stand-in stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The cluster could not be reached or answered with an error.
    #[error("downstream cluster: {0}")]
    Kube(#[from] kube::Error),
}

/// Checks a spec as the community operator does; the error lists every problem, `; `-separated.
///
/// - `type` must be `ReplicaSet`;
/// - `members` an integer from 1 to 50;
/// - `version` `MAJOR.MINOR.PATCH` of digits with MAJOR at least 4.
pub fn validate(spec: Option<&Value>) -> Result<ValidSpec, String> {
    let Some(spec) = spec.and_then(Value::as_object) else {
        return Err("spec is missing".to_string());
    };
    let mut problems = Vec::new();
    match spec.get("type") {
        Some(Value::String(t)) if t == REPLICA_SET => {}
        Some(Value::String(t)) => problems.push(format!(
            "spec.type {t:?} is not supported: the only supported type is {REPLICA_SET}"
        )),
        Some(other) => problems.push(format!(
            "spec.type must be the string {REPLICA_SET}, got {other}"
        )),
        None => problems.push(format!(
            "spec.type is required: the only supported type is {REPLICA_SET}"
        )),
    }
    let members = match spec.get("members") {
        None => {
            problems.push(format!(
                "spec.members is required: an integer from {MIN_MEMBERS} to {MAX_MEMBERS}"
            ));
            None
        }
        Some(m) => match m.as_i64() {
            Some(n) if (MIN_MEMBERS..=MAX_MEMBERS).contains(&n) => Some(n),
            _ => {
                problems.push(format!(
                    "spec.members must be an integer from {MIN_MEMBERS} to {MAX_MEMBERS}, got {m}"
                ));
                None
            }
        },
    };
    let version = match spec.get("version") {
        Some(Value::String(v)) => match check_version(v) {
            Ok(()) => Some(v.clone()),
            Err(problem) => {
                problems.push(problem);
                None
            }
        },
        Some(other) => {
            problems.push(format!(
                "spec.version must be a string MAJOR.MINOR.PATCH, got {other}"
            ));
            None
        }
        None => {
            problems.push("spec.version is required: a version MAJOR.MINOR.PATCH".to_string());
            None
        }
    };
    match (members, version) {
        (Some(members), Some(version)) if problems.is_empty() => Ok(ValidSpec { members, version }),
        _ => Err(problems.join("; ")),
    }
}

/// Checks `MAJOR.MINOR.PATCH` (digits only) with a supported major version.
fn check_version(v: &str) -> Result<(), String> {
    let parts: Vec<&str> = v.split('.').collect();
    let numeric = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let major = parts.first().and_then(|m| m.parse::<u64>().ok());
    match major {
        Some(major) if numeric && major >= MIN_MAJOR => Ok(()),
        Some(_) if numeric => Err(format!(
            "spec.version {v:?} is not supported: MongoDB {MIN_MAJOR}.0 or later is required"
        )),
        _ => Err(format!(
            "spec.version {v:?} is not a version MAJOR.MINOR.PATCH"
        )),
    }
}

/// A spec the operator accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSpec {
    /// The number of replica-set members.
    pub members: i64,
    /// The MongoDB version.
    pub version: String,
}

/// The message of an object being deployed.
pub fn pending_message(members: i64) -> String {
    format!("deploying {members} members")
}

/// What the stand-in does next with one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: its current generation is done (`status.observedGeneration` equals it).
    Done,
    /// Write `Failed` with this message (and the generation as observed, so it is done).
    Fail {
        /// What is wrong with the spec.
        message: String,
        /// The generation refused.
        generation: Option<i64>,
    },
    /// Write `Pending` with this message; the generation is not observed yet.
    Pending {
        /// `deploying <members> members`.
        message: String,
    },
    /// It is `Pending` for this generation and has not been for [`PENDING_FOR`] yet: wait.
    Wait,
    /// Write `Running` with the spec's version and the generation as observed.
    Running {
        /// The version now running.
        version: String,
        /// The generation deployed.
        generation: Option<i64>,
    },
}

impl Step {
    /// The JSON merge patch of the status subresource this step writes, if any.
    pub fn status_patch(&self) -> Option<Value> {
        match self {
            Step::Done | Step::Wait => None,
            Step::Fail {
                message,
                generation,
            } => Some(json!({"status": {
                "phase": FAILED, "message": message, "version": null,
                "observedGeneration": generation,
            }})),
            Step::Pending { message } => Some(json!({"status": {
                "phase": PENDING, "message": message, "version": null,
            }})),
            Step::Running {
                version,
                generation,
            } => Some(json!({"status": {
                "phase": RUNNING, "version": version, "message": null,
                "observedGeneration": generation,
            }})),
        }
    }
}

/// The next step for `obj` (a MongoDBCommunity as JSON), given how long ago this process wrote
/// `Pending` for its current generation (`None`: it did not).
///
/// A generation not yet observed is validated: invalid → [`Step::Fail`]; valid → `Pending`
/// first, then, [`PENDING_FOR`] after the `Pending` write, [`Step::Running`]. A spec change (a
/// new generation) goes through `Pending` again, as does a `Pending` object this process did
/// not write (its timer starts when it first sees it).
pub fn next_step(obj: &Value, pending_for: Option<Duration>) -> Step {
    let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = obj
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if generation == observed {
        return Step::Done;
    }
    let spec = match validate(obj.get("spec")) {
        Ok(spec) => spec,
        Err(message) => {
            return Step::Fail {
                message,
                generation,
            }
        }
    };
    let message = pending_message(spec.members);
    let phase = obj.pointer("/status/phase").and_then(Value::as_str);
    let current_message = obj.pointer("/status/message").and_then(Value::as_str);
    let has_version = obj.pointer("/status/version").is_some_and(|v| !v.is_null());
    let is_pending = phase == Some(PENDING) && current_message == Some(&message) && !has_version;
    match pending_for {
        Some(elapsed) if is_pending && elapsed >= PENDING_FOR => Step::Running {
            version: spec.version,
            generation,
        },
        _ if is_pending => Step::Wait,
        _ => Step::Pending { message },
    }
}

/// Which object and generation a `Pending` timer belongs to.
type TimerKey = (String, String, String, Option<i64>);

fn timer_key(obj: &Value) -> TimerKey {
    let text = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (
        text("/metadata/namespace"),
        text("/metadata/name"),
        text("/metadata/uid"),
        obj.pointer("/metadata/generation").and_then(Value::as_i64),
    )
}

/// Runs the stand-in against the cluster of `client` until `stop` is cancelled: every
/// [`POLL_EVERY`] it lists the MongoDBCommunity objects and writes the status of each whose
/// [`next_step`] says so. A failed list or write is logged and tried again on the next round.
pub async fn run(client: kube::Client, stop: CancellationToken) -> Result<(), OperatorError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    // When this process wrote `Pending` for an object's generation.
    let mut pending_since: HashMap<TimerKey, Instant> = HashMap::new();
    info!("MongoDB operator stand-in watching MongoDBCommunity objects");
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                warn!(error = %e, "listing MongoDBCommunity objects failed");
                continue;
            }
        };
        let now = Instant::now();
        let mut live = Vec::new();
        for obj in list.items {
            let (namespace, name) = (
                obj.metadata.namespace.clone().unwrap_or_default(),
                obj.metadata.name.clone().unwrap_or_default(),
            );
            let value = serde_json::to_value(&obj).unwrap_or_default();
            let key = timer_key(&value);
            let step = next_step(
                &value,
                pending_since.get(&key).map(|t| now.duration_since(*t)),
            );
            if step == Step::Wait {
                // A Pending object this process did not write: its timer starts now.
                pending_since.entry(key.clone()).or_insert(now);
            }
            live.push(key.clone());
            let Some(patch) = step.status_patch() else {
                continue;
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &api_resource());
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    match &step {
                        Step::Pending { .. } => {
                            pending_since.insert(key, Instant::now());
                        }
                        _ => {
                            pending_since.remove(&key);
                        }
                    }
                    info!(namespace, name, step = ?step, "status written");
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    debug!(namespace, name, "gone before its status was written");
                }
                Err(e) => warn!(namespace, name, error = %e, "writing status failed"),
            }
        }
        pending_since.retain(|k, _| live.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(spec: Value, generation: i64, status: Value) -> Value {
        json!({"metadata": {"name": "default.orders", "namespace": "consumer-c", "uid": "u",
            "generation": generation}, "spec": spec, "status": status})
    }

    fn good() -> Value {
        json!({"members": 3, "type": "ReplicaSet", "version": "6.0.5"})
    }

    #[test]
    fn a_valid_spec_is_accepted() {
        assert_eq!(
            validate(Some(&good())),
            Ok(ValidSpec {
                members: 3,
                version: "6.0.5".into()
            })
        );
        for members in [1, 50] {
            let spec = json!({"members": members, "type": "ReplicaSet", "version": "4.0.0"});
            assert!(validate(Some(&spec)).is_ok(), "{spec}");
        }
    }

    #[test]
    fn only_replica_sets_are_supported() {
        let spec = json!({"members": 3, "type": "ShardedCluster", "version": "6.0.5"});
        assert_eq!(
            validate(Some(&spec)).unwrap_err(),
            "spec.type \"ShardedCluster\" is not supported: the only supported type is ReplicaSet"
        );
        let spec = json!({"members": 3, "version": "6.0.5"});
        assert!(validate(Some(&spec))
            .unwrap_err()
            .starts_with("spec.type is required"));
        let spec = json!({"members": 3, "type": 1, "version": "6.0.5"});
        assert!(validate(Some(&spec))
            .unwrap_err()
            .starts_with("spec.type must be the string"));
    }

    #[test]
    fn members_must_be_an_integer_from_1_to_50() {
        for bad in [
            json!(0),
            json!(51),
            json!(-1),
            json!(2.5),
            json!("3"),
            json!(3.0),
        ] {
            let spec = json!({"members": bad, "type": "ReplicaSet", "version": "6.0.5"});
            let err = validate(Some(&spec)).unwrap_err();
            assert_eq!(
                err,
                format!("spec.members must be an integer from 1 to 50, got {bad}")
            );
        }
        let spec = json!({"type": "ReplicaSet", "version": "6.0.5"});
        assert!(validate(Some(&spec))
            .unwrap_err()
            .starts_with("spec.members is required"));
    }

    #[test]
    fn versions_are_major_minor_patch_from_4_on() {
        for bad in ["6.0", "6.0.5.1", "v6.0.5", "6.0.x", "6..5", "", "6.0.5-rc1"] {
            let spec = json!({"members": 3, "type": "ReplicaSet", "version": bad});
            assert_eq!(
                validate(Some(&spec)).unwrap_err(),
                format!("spec.version {bad:?} is not a version MAJOR.MINOR.PATCH")
            );
        }
        let spec = json!({"members": 3, "type": "ReplicaSet", "version": "3.6.23"});
        assert_eq!(
            validate(Some(&spec)).unwrap_err(),
            "spec.version \"3.6.23\" is not supported: MongoDB 4.0 or later is required"
        );
        let spec = json!({"members": 3, "type": "ReplicaSet", "version": 6});
        assert!(validate(Some(&spec))
            .unwrap_err()
            .starts_with("spec.version must be a string"));
        let spec = json!({"members": 3, "type": "ReplicaSet"});
        assert!(validate(Some(&spec))
            .unwrap_err()
            .starts_with("spec.version is required"));
        let spec = json!({"members": 3, "type": "ReplicaSet", "version": "10.0.0"});
        assert!(validate(Some(&spec)).is_ok());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let spec = json!({"members": 0, "type": "Standalone", "version": "3.0.0"});
        let err = validate(Some(&spec)).unwrap_err();
        assert_eq!(err.split("; ").count(), 3, "{err}");
        assert_eq!(validate(None).unwrap_err(), "spec is missing");
        assert_eq!(validate(Some(&json!("x"))).unwrap_err(), "spec is missing");
    }

    #[test]
    fn a_new_generation_goes_pending_then_running() {
        let fresh = object(good(), 1, json!(null));
        let pending = Step::Pending {
            message: "deploying 3 members".into(),
        };
        assert_eq!(next_step(&fresh, None), pending);
        assert_eq!(
            pending.status_patch(),
            Some(
                json!({"status": {"phase": "Pending", "message": "deploying 3 members",
                "version": null}})
            )
        );
        let is_pending = object(
            good(),
            1,
            json!({"phase": "Pending", "message": "deploying 3 members"}),
        );
        assert_eq!(next_step(&is_pending, None), Step::Wait);
        assert_eq!(
            next_step(&is_pending, Some(Duration::from_millis(100))),
            Step::Wait
        );
        let running = next_step(&is_pending, Some(PENDING_FOR));
        assert_eq!(
            running,
            Step::Running {
                version: "6.0.5".into(),
                generation: Some(1)
            }
        );
        assert_eq!(
            running.status_patch(),
            Some(
                json!({"status": {"phase": "Running", "version": "6.0.5", "message": null,
                "observedGeneration": 1}})
            )
        );
        let done = object(
            good(),
            1,
            json!({"phase": "Running", "version": "6.0.5", "observedGeneration": 1}),
        );
        assert_eq!(next_step(&done, None), Step::Done);
        assert_eq!(Step::Done.status_patch(), None);
        assert_eq!(Step::Wait.status_patch(), None);
    }

    #[test]
    fn a_spec_change_goes_through_pending_again() {
        let mut spec = good();
        spec["members"] = json!(5);
        let changed = object(
            spec.clone(),
            2,
            json!({"phase": "Running", "version": "6.0.5", "observedGeneration": 1}),
        );
        assert_eq!(
            next_step(&changed, Some(Duration::from_secs(10))),
            Step::Pending {
                message: "deploying 5 members".into()
            }
        );
        // Pending for the old members count is not pending for the new one.
        let stale_pending = object(
            spec,
            3,
            json!({"phase": "Pending", "message": "deploying 3 members", "observedGeneration": 1}),
        );
        assert_eq!(
            next_step(&stale_pending, Some(Duration::from_secs(10))),
            Step::Pending {
                message: "deploying 5 members".into()
            }
        );
    }

    #[test]
    fn an_invalid_spec_fails_with_its_problem_and_no_version() {
        let mut spec = good();
        spec["members"] = json!(51);
        let bad = object(
            spec,
            4,
            json!({"phase": "Running", "version": "6.0.5", "observedGeneration": 3}),
        );
        let step = next_step(&bad, None);
        assert_eq!(
            step,
            Step::Fail {
                message: "spec.members must be an integer from 1 to 50, got 51".into(),
                generation: Some(4)
            }
        );
        assert_eq!(
            step.status_patch(),
            Some(json!({"status": {"phase": "Failed",
                "message": "spec.members must be an integer from 1 to 50, got 51",
                "version": null, "observedGeneration": 4}}))
        );
        let failed = object(
            json!({"members": 51}),
            4,
            json!({"phase": "Failed", "observedGeneration": 4}),
        );
        assert_eq!(
            next_step(&failed, None),
            Step::Done,
            "refused once per generation"
        );
    }

    #[test]
    fn timers_belong_to_one_generation_of_one_object() {
        let a = object(good(), 1, json!(null));
        let b = object(good(), 2, json!(null));
        assert_ne!(timer_key(&a), timer_key(&b));
        assert_eq!(
            timer_key(&a),
            (
                "consumer-c".into(),
                "default.orders".into(),
                "u".into(),
                Some(1)
            )
        );
    }
}
