//! Leader election between two candidates on one Lease: one leads, the other takes over once
//! the leader stops renewing, or at once when the leader releases.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use tokio_util::sync::CancellationToken;

use super::TestServer;
use controllers::runtime::leader::{LeaderElectionConfig, LeaderElector};

fn fast(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        ..LeaderElectionConfig::new("default", "e2e-leader", identity)
    }
}

/// A candidate whose lease, once it leads, expires only after a minute: whoever takes over
/// from it within the test's deadlines did so because it released the lease.
fn long_lease(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(60),
        renew_deadline: Duration::from_secs(50),
        ..fast(identity)
    }
}

async fn lease_json(client: &kube::Client) -> serde_json::Value {
    let ar = ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    api.get("e2e-leader").await.expect("lease").data["spec"].clone()
}

fn is_micro_time(v: &serde_json::Value) -> bool {
    let Some(s) = v.as_str() else { return false };
    let b = s.as_bytes();
    s.len() == 27
        && b[4] == b'-'
        && b[10] == b'T'
        && b[19] == b'.'
        && b[26] == b'Z'
        && b[20..26].iter().all(u8::is_ascii_digit)
}

#[tokio::test]
async fn one_leader_then_failover_when_it_stops_renewing() {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let stop = CancellationToken::new();

    let a = LeaderElector::new(client.clone(), fast("candidate-a"));
    let leading_a = a.acquire(&stop).await.expect("a leads");
    let spec = lease_json(&client).await;
    assert_eq!(spec["holderIdentity"], "candidate-a");
    assert_eq!(spec["leaseDurationSeconds"], 2);
    assert_eq!(spec["leaseTransitions"], 0);
    assert!(
        is_micro_time(&spec["acquireTime"]),
        "{}",
        spec["acquireTime"]
    );
    assert!(is_micro_time(&spec["renewTime"]), "{}", spec["renewTime"]);

    // b takes over from a's two-second lease; once it leads, its own lease lasts a minute.
    let b_task = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            LeaderElector::new(client, long_lease("candidate-b"))
                .acquire(&stop)
                .await
        }
    });
    // While a renews, b waits: watch a renew across more than two lease durations (its
    // renewals are the evidence that time passed in which b could have taken over), then look.
    let first = spec["renewTime"].as_str().map(str::to_string);
    let mut renewals = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // Two lease durations of renewals, one per retry period (200 ms).
    const RENEWALS: usize = 20;
    while renewals.len() < RENEWALS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a renewed only {} times",
            renewals.len()
        );
        if let Some(t) = lease_json(&client).await["renewTime"].as_str() {
            if Some(t) != first.as_deref() {
                renewals.insert(t.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!b_task.is_finished(), "b must not lead while a renews");
    assert!(!leading_a.is_lost());
    let renewed = lease_json(&client).await;
    assert_ne!(renewed["renewTime"], spec["renewTime"], "a keeps renewing");
    assert_eq!(renewed["acquireTime"], spec["acquireTime"]);

    // a crashes: b takes over after the lease expires.
    leading_a.abandon();
    let leading_b = tokio::time::timeout(Duration::from_secs(8), b_task)
        .await
        .expect("b takes over in time")
        .unwrap()
        .expect("b leads");
    let spec = lease_json(&client).await;
    assert_eq!(spec["holderIdentity"], "candidate-b");
    assert_eq!(spec["leaseTransitions"], 1);

    // A graceful release hands over without waiting for expiry.
    let c_task = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            LeaderElector::new(client, fast("candidate-c"))
                .acquire(&stop)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lease_json(&client).await["leaseDurationSeconds"], 60);
    leading_b.release().await.unwrap();
    // b's lease would expire only after a minute: c leading within the deadline means it took
    // over on the release.
    let leading_c = tokio::time::timeout(Duration::from_secs(20), c_task)
        .await
        .expect("c takes over on the release, without waiting for the minute-long expiry")
        .unwrap()
        .expect("c leads");
    assert_eq!(lease_json(&client).await["leaseTransitions"], 2);

    // A candidate that is told to stop gives up waiting.
    let d_stop = CancellationToken::new();
    d_stop.cancel();
    assert!(LeaderElector::new(client.clone(), fast("candidate-d"))
        .acquire(&d_stop)
        .await
        .is_none());
    leading_c.release().await.unwrap();
    stop.cancel();
    ts.stop().await;
}

#[tokio::test]
async fn a_leader_whose_lease_was_taken_notices_the_loss() {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let stop = CancellationToken::new();
    let leading = LeaderElector::new(client.clone(), fast("first"))
        .acquire(&stop)
        .await
        .expect("leads");
    let lost = leading.lost();
    // Someone else writes the lease (e.g. after a network partition healed).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let patch = serde_json::json!({"spec": {"holderIdentity": "intruder",
        "renewTime": controllers::runtime::lease::now_micro()}});
    leases
        .patch(
            "e2e-leader",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
        .await
        .expect("loss noticed");
    assert!(leading.is_lost());
    ts.stop().await;
}

#[tokio::test]
async fn leader_election_master_status_follows_leadership() {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let stop = CancellationToken::new();
    let status = controllers::runtime::leader::LeaderStatus::default();
    let mut registry = prometheus_client::registry::Registry::default();
    status.register(&mut registry);
    let elector = LeaderElector::new(client, fast("only")).with_status(status.clone());
    assert_eq!(status.get("e2e-leader"), 0);
    let leading = elector.acquire(&stop).await.expect("leads");
    assert_eq!(status.get("e2e-leader"), 1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains("leader_election_master_status{name=\"e2e-leader\"} 1"),
        "{text}"
    );
    leading.release().await.expect("release");
    for _ in 0..50 {
        if status.get("e2e-leader") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status.get("e2e-leader"), 0);
    ts.stop().await;
}

/// Records, per candidate, the ConfigMaps it reconciled.
struct RecordAs {
    identity: &'static str,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(&'static str, String)>>>,
}

impl controllers::runtime::Reconciler for RecordAs {
    type Error = std::convert::Infallible;

    async fn reconcile(
        &self,
        req: controllers::runtime::Request,
        _ctx: controllers::runtime::ClusterContext,
    ) -> Result<controllers::runtime::Action, Self::Error> {
        self.seen
            .lock()
            .unwrap()
            .push((self.identity, req.name.clone()));
        Ok(controllers::runtime::Action::await_change())
    }
}

/// A manager that runs only while its candidate leads; `kill` crashes it (no lease release).
fn candidate(
    ts: &TestServer,
    client: kube::Client,
    identity: &'static str,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(&'static str, String)>>>,
    leading_since: std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    kill: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    use controllers::cluster_providers::FixedClusters;
    use controllers::runtime::{Cluster, Controller, Manager, ManagerOptions};
    let provider = std::sync::Arc::new(FixedClusters::new([Cluster::new("root", client.clone())]));
    let _ = ts;
    tokio::spawn(async move {
        let Some(leadership) = LeaderElector::new(client, fast(identity))
            .acquire(&kill)
            .await
        else {
            return;
        };
        *leading_since.lock().unwrap() = Some(tokio::time::Instant::now());
        let manager = Manager::new(ManagerOptions::default());
        manager
            .add(
                Controller::new("record", RecordAs { identity, seen })
                    .for_::<k8s_openapi::api::core::v1::ConfigMap>(),
            )
            .unwrap();
        let lost = leadership.lost();
        let stop = kill.clone();
        let _ = manager
            .run(provider, async move {
                tokio::select! { _ = lost.cancelled() => {}, _ = stop.cancelled() => {} }
            })
            .await;
        // Killed: stop renewing without releasing, as a crashed process would.
        leadership.abandon();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leading_manager_hands_over_to_the_standby_within_the_lease_duration() {
    use std::sync::{Arc, Mutex};
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (since_a, since_b) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let (kill_a, kill_b) = (CancellationToken::new(), CancellationToken::new());
    let a = candidate(
        &ts,
        client.clone(),
        "manager-a",
        seen.clone(),
        since_a.clone(),
        kill_a.clone(),
    );
    super::eventually(Duration::from_secs(5), "a leads", || {
        let ok = since_a.lock().unwrap().is_some();
        async move { ok }
    })
    .await;
    let b = candidate(
        &ts,
        client.clone(),
        "manager-b",
        seen.clone(),
        since_b.clone(),
        kill_b.clone(),
    );
    super::create_config_map(&client, "before", &[]).await;
    super::eventually(Duration::from_secs(10), "leader reconciles", || {
        let ok = seen
            .lock()
            .unwrap()
            .contains(&("manager-a", "before".to_string()));
        async move { ok }
    })
    .await;
    // The standby waits: watch the leader renew across more than a lease duration (its renewals
    // are the evidence that the standby had time to take over), then look.
    let mut renewals = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while renewals.len() < 12 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader renewed only {} times",
            renewals.len()
        );
        if let Some(t) = lease_json(&client).await["renewTime"].as_str() {
            renewals.insert(t.to_string());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(since_b.lock().unwrap().is_none(), "the standby waits");
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(who, _)| *who == "manager-a"),
        "only the leader reconciles"
    );

    // The leader is killed: it stops renewing without releasing. The standby takes over, and
    // only once the leader's lease has expired (never two leaders): its acquireTime is at least
    // a lease duration after the leader's last renewal. (How soon is a figure for benchmarks,
    // not asserted here.)
    kill_a.cancel();
    a.await.unwrap();
    let micros = |v: &serde_json::Value| {
        serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>(
            v.clone(),
        )
        .unwrap_or_else(|e| panic!("{v} is no MicroTime: {e}"))
        .0
        .as_microsecond()
    };
    let last_renewal = micros(&lease_json(&client).await["renewTime"]);
    super::eventually(Duration::from_secs(30), "standby leads", || {
        let ok = since_b.lock().unwrap().is_some();
        async move { ok }
    })
    .await;
    let acquired = micros(&lease_json(&client).await["acquireTime"]);
    let lease = fast("x").lease_duration.as_micros() as i64;
    assert!(
        acquired >= last_renewal + lease,
        "the standby took over {} ms after the leader's last renewal, before its {} ms lease expired",
        (acquired - last_renewal) / 1000,
        lease / 1000
    );
    assert_eq!(lease_json(&client).await["holderIdentity"], "manager-b");

    // The new leader's manager does the work.
    super::create_config_map(&client, "after", &[]).await;
    super::eventually(Duration::from_secs(10), "new leader reconciles", || {
        let ok = seen
            .lock()
            .unwrap()
            .contains(&("manager-b", "after".to_string()));
        async move { ok }
    })
    .await;
    assert!(
        !seen
            .lock()
            .unwrap()
            .contains(&("manager-a", "after".to_string())),
        "the killed leader reconciles nothing more"
    );
    kill_b.cancel();
    b.await.unwrap();
    ts.stop().await;
}
