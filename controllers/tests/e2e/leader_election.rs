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

    let b_task = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            LeaderElector::new(client, fast("candidate-b"))
                .acquire(&stop)
                .await
        }
    });
    // While a renews, b waits (well past one lease duration).
    tokio::time::sleep(Duration::from_secs(3)).await;
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
    let released_at = tokio::time::Instant::now();
    leading_b.release().await.unwrap();
    let leading_c = tokio::time::timeout(Duration::from_secs(3), c_task)
        .await
        .unwrap()
        .unwrap()
        .expect("c leads");
    assert!(
        released_at.elapsed() < Duration::from_millis(1500),
        "took over without waiting for expiry"
    );
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
    use controllers::providers::FixedClusters;
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
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(since_b.lock().unwrap().is_none(), "the standby waits");
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(who, _)| *who == "manager-a"),
        "only the leader reconciles"
    );

    // The leader is killed; the standby leads within the lease duration (plus one retry
    // period and scheduling slack), far inside the 15 s.
    let killed_at = tokio::time::Instant::now();
    kill_a.cancel();
    a.await.unwrap();
    let cfg = fast("x");
    let bound = cfg.lease_duration + cfg.retry_period * 2 + Duration::from_millis(500);
    super::eventually(bound, "standby leads", || {
        let ok = since_b.lock().unwrap().is_some();
        async move { ok }
    })
    .await;
    let handover = since_b.lock().unwrap().expect("b leads") - killed_at;
    assert!(
        handover < Duration::from_secs(15),
        "handover took {handover:?}"
    );
    assert!(handover <= bound, "handover took {handover:?}");
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
