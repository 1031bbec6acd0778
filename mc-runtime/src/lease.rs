//! A lock on a `coordination.k8s.io/v1` Lease, as client-go's resource lock: take it when free
//! or expired, renew it while held, release it; expiry is judged by local observation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use tokio::time::Instant;

/// Failures talking to the Lease API.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server refused or failed.
    #[error("lease {name}: {source}")]
    Kube {
        /// The Lease.
        name: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
}

/// The current time, truncated to microseconds (what a MicroTime keeps).
pub fn now_micro() -> MicroTime {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let micros = since.subsec_micros() as i32;
    let ts = Timestamp::new(since.as_secs() as i64, micros * 1000).unwrap_or(Timestamp::UNIX_EPOCH);
    MicroTime(ts)
}

/// The Lease spec `identity` should write, or `None` when another holder's lease is still
/// valid. `expired` tells whether the current holder's lease is judged expired.
///
/// ```
/// use mc_runtime::lease::{next_spec, now_micro};
/// use std::time::Duration;
/// let first = next_spec(None, "a", now_micro(), Duration::from_secs(15), false).unwrap();
/// assert_eq!(first.holder_identity.as_deref(), Some("a"));
/// assert_eq!(first.lease_transitions, Some(0));
/// assert!(next_spec(Some(&first), "b", now_micro(), Duration::from_secs(15), false).is_none());
/// ```
pub fn next_spec(
    current: Option<&LeaseSpec>,
    identity: &str,
    now: MicroTime,
    lease_duration: Duration,
    expired: bool,
) -> Option<LeaseSpec> {
    let seconds = i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(current) = current else {
        return Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        });
    };
    let holder = current.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        return Some(LeaseSpec {
            lease_duration_seconds: Some(seconds),
            renew_time: Some(now.clone()),
            acquire_time: current.acquire_time.clone().or(Some(now)),
            ..current.clone()
        });
    }
    if !holder.is_empty() && !expired {
        return None;
    }
    Some(LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..current.clone()
    })
}

/// The spec that gives a held lease up: no holder, and a one-second duration so that others
/// take it at once.
pub fn released_spec(current: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(now),
        ..current.clone()
    }
}

/// The last lease record seen and when it was first seen in that state (local clock).
#[derive(Clone, Debug)]
struct Observation {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration: Duration,
    at: Instant,
}

/// One Lease held (or wanted) by one identity.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    labels: BTreeMap<String, String>,
    observed: Option<Observation>,
}

impl LeaseLock {
    /// A lock on Lease `namespace/name` for `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: impl Into<String>,
        identity: impl Into<String>,
        lease_duration: Duration,
    ) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            lease_duration,
            labels: BTreeMap::new(),
            observed: None,
        }
    }

    /// Labels to put on the Lease when this lock creates it.
    pub fn with_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who this lock acts for.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Kube {
            name: self.name.clone(),
            source,
        }
    }

    /// Records what the Lease says now; the expiry clock restarts whenever it changes.
    fn observe(&mut self, spec: &LeaseSpec) {
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let changed = match &self.observed {
            Some(o) => o.holder != spec.holder_identity || o.renew_time != spec.renew_time,
            None => true,
        };
        if changed {
            self.observed = Some(Observation {
                holder: spec.holder_identity.clone(),
                renew_time: spec.renew_time.clone(),
                duration,
                at: Instant::now(),
            });
        }
    }

    /// Records what a Lease read elsewhere (e.g. in a list of many) says, so that its expiry
    /// clock runs from when this replica first saw its current renewal rather than from this
    /// lock's first own read.
    pub fn observe_listed(&mut self, lease: &Lease) {
        if lease.metadata.name.as_deref() == Some(self.name.as_str()) {
            self.observe(&lease.spec.clone().unwrap_or_default());
        }
    }

    fn observed_expired(&self) -> bool {
        match &self.observed {
            Some(o) => o.at + o.duration <= Instant::now(),
            None => true,
        }
    }

    /// Takes the lease when free or expired, renews it when held. Returns whether this
    /// identity holds it afterwards (a lost update race counts as not holding).
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.error(e))?;
        let now = now_micro();
        match current {
            None => {
                let spec = next_spec(None, &self.identity, now, self.lease_duration, true);
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                        ..ObjectMeta::default()
                    },
                    spec,
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.observe(&created.spec.unwrap_or_default());
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(self.error(e)),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                self.observe(&spec);
                let Some(next) = next_spec(
                    Some(&spec),
                    &self.identity,
                    now,
                    self.lease_duration,
                    self.observed_expired(),
                ) else {
                    return Ok(false);
                };
                lease.spec = Some(next);
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(updated) => {
                        self.observe(&updated.spec.unwrap_or_default());
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(self.error(e)),
                }
            }
        }
    }

    /// Gives the lease up if this identity holds it.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.error(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        lease.spec = Some(released_spec(&spec, now_micro()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }
}

/// Whether the server answered 409 (a create or update lost a race).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> MicroTime {
        MicroTime(s.parse().unwrap())
    }

    #[test]
    fn micro_time_serializes_with_six_fraction_digits() {
        let json = serde_json::to_value(at("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(json, "2026-01-01T00:00:00.000000Z");
        let now = serde_json::to_value(now_micro()).unwrap();
        let s = now.as_str().unwrap();
        assert_eq!(s.len(), "2026-01-01T00:00:00.000000Z".len(), "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[19] == b'.', "{s}");
    }

    #[test]
    fn first_holder_creates_with_zero_transitions() {
        let spec = next_spec(
            None,
            "a",
            at("2026-01-01T00:00:00Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(spec.renew_time, Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[test]
    fn renewal_keeps_acquire_time_and_transitions() {
        let first = next_spec(
            None,
            "a",
            at("2026-01-01T00:00:00Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        let renewed = next_spec(
            Some(&first),
            "a",
            at("2026-01-01T00:00:02Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        assert_eq!(renewed.acquire_time, Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(renewed.renew_time, Some(at("2026-01-01T00:00:02Z")));
        assert_eq!(renewed.lease_transitions, Some(0));
    }

    #[test]
    fn others_wait_until_expiry_then_take_over_with_a_transition() {
        let held = next_spec(
            None,
            "a",
            at("2026-01-01T00:00:00Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        assert!(next_spec(
            Some(&held),
            "b",
            at("2026-01-01T00:00:05Z"),
            Duration::from_secs(15),
            false
        )
        .is_none());
        let taken = next_spec(
            Some(&held),
            "b",
            at("2026-01-01T00:00:20Z"),
            Duration::from_secs(15),
            true,
        )
        .unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(at("2026-01-01T00:00:20Z")));
        assert_eq!(taken.lease_transitions, Some(1));
    }

    #[test]
    fn a_released_lease_is_free_at_once() {
        let held = next_spec(
            None,
            "a",
            at("2026-01-01T00:00:00Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        let released = released_spec(&held, at("2026-01-01T00:00:03Z"));
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        let taken = next_spec(
            Some(&released),
            "b",
            at("2026-01-01T00:00:04Z"),
            Duration::from_secs(15),
            false,
        )
        .unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
    }
}
