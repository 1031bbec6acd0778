//! Manager behaviour without an API server: requests for gone clusters, replacement of a
//! re-engaged cluster, and graceful shutdown with and without a missed deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{Action, ClusterContext, Controller, ReconcileError, Reconciler, Request};

/// A provider driven by the test through a channel.
struct Scripted {
    events: Mutex<Option<mpsc::Receiver<ClusterEvent>>>,
}

#[async_trait::async_trait]
impl ClusterProvider for Scripted {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        let Some(mut rx) = self.events.lock().unwrap().take() else {
            return Err(ProviderError::Config("run twice".into()));
        };
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                e = rx.recv() => e,
            };
            match event {
                Some(ClusterEvent::Engage(c)) => sink.engage(c).await?,
                Some(ClusterEvent::Disengage(n, ack)) => {
                    sink.disengage(&n).await?;
                    ack.done();
                }
                None => return Ok(()),
            }
        }
    }

    fn get(&self, _name: &str) -> Option<Arc<Cluster>> {
        None
    }
}

fn offline_cluster(name: &str) -> Arc<Cluster> {
    // Nothing listens there: watches fail and retry quietly, requests are never sent.
    let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    Arc::new(Cluster::new(name, kube::Client::try_from(config).unwrap()))
}

/// The test reconcilers' error: transient or fatal as the test says.
#[derive(Debug, thiserror::Error)]
#[error("always")]
struct Always {
    transient: bool,
}

impl ReconcileError for Always {
    fn is_transient(&self) -> bool {
        self.transient
    }
}

/// Fails every time, counting calls per cluster; sleeps `delay` first.
struct Failing {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    delay: Duration,
    finished: Arc<AtomicUsize>,
    transient: bool,
}

impl Reconciler for Failing {
    type Error = Always;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, Always> {
        assert_eq!(ctx.cluster_name(), &req.cluster);
        *self
            .calls
            .lock()
            .unwrap()
            .entry(req.cluster.to_string())
            .or_default() += 1;
        tokio::time::sleep(self.delay).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Err(Always {
            transient: self.transient,
        })
    }
}

struct Setup {
    manager: Manager,
    events: mpsc::Sender<ClusterEvent>,
    calls: Arc<Mutex<HashMap<String, usize>>>,
    finished: Arc<AtomicUsize>,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), ManagerError>>,
}

/// Runs `manager` with a [`Scripted`] provider: the sender of its events, the stop token and
/// the run.
fn run_scripted(
    manager: &Manager,
) -> (
    mpsc::Sender<ClusterEvent>,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), ManagerError>>,
) {
    let (tx, rx) = mpsc::channel(8);
    let provider = Arc::new(Scripted {
        events: Mutex::new(Some(rx)),
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop) = (manager.clone(), stop.clone());
        async move { m.run(provider, async move { stop.cancelled().await }).await }
    });
    (tx, stop, run)
}

fn setup(delay: Duration, options: ManagerOptions) -> Setup {
    setup_failing(delay, options, true)
}

fn setup_failing(delay: Duration, options: ManagerOptions, transient: bool) -> Setup {
    let manager = Manager::new(options);
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let finished = Arc::new(AtomicUsize::new(0));
    let reconciler = Failing {
        calls: calls.clone(),
        delay,
        finished: finished.clone(),
        transient,
    };
    manager
        .add(
            Controller::new("failing", reconciler)
                .for_::<ConfigMap>()
                .workers(2),
        )
        .unwrap();
    let (tx, stop, run) = run_scripted(&manager);
    Setup {
        manager,
        events: tx,
        calls,
        finished,
        stop,
        run,
    }
}

async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn requests_for_a_gone_cluster_are_dropped_not_retried_forever() {
    let s = setup(Duration::ZERO, ManagerOptions::default());
    s.events
        .send(ClusterEvent::Engage(offline_cluster("gone")))
        .await
        .unwrap();
    until("engaged", || s.manager.engaged_clusters().len() == 1).await;
    assert!(s
        .manager
        .enqueue("failing", Request::namespaced("gone", "default", "x")));
    assert!(!s
        .manager
        .enqueue("nope", Request::namespaced("gone", "default", "x")));
    // Failing reconciles retry with growing backoff.
    until("retries", || {
        s.calls.lock().unwrap().get("gone").copied().unwrap_or(0) >= 3
    })
    .await;

    let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
    let name = ClusterName::from("gone");
    let (sink, mut rx) = ClusterSink::channel(1);
    tokio::spawn(async move {
        let _ = sink.disengage(&name).await;
        let _ = ack_tx.send(());
    });
    let Some(event) = rx.recv().await else {
        panic!("no event")
    };
    s.events.send(event).await.unwrap();
    ack_rx.await.unwrap();
    assert!(s.manager.engaged_clusters().is_empty());
    assert_eq!(s.manager.metrics().engaged_clusters(), 0);

    // The pending retry is dropped when it comes up, and nothing runs after that. What ran
    // until the disengagement settled is counted; then a request for a cluster that was never
    // engaged is queued, and a cluster engaged now gets a failing request of its own: once that
    // one has been retried as often as the gone cluster's was (its backoff grew as long), the
    // gone cluster's retry has come up and been dropped, and the request for the never-engaged
    // cluster has had its turn.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = s.calls.lock().unwrap().get("gone").copied().unwrap_or(0);
    s.manager
        .enqueue("failing", Request::namespaced("never", "default", "x"));
    s.events
        .send(ClusterEvent::Engage(offline_cluster("probe")))
        .await
        .unwrap();
    until("probe engaged", || {
        s.manager
            .engaged_clusters()
            .contains(&ClusterName::from("probe"))
    })
    .await;
    assert!(s
        .manager
        .enqueue("failing", Request::namespaced("probe", "default", "x")));
    until("the probe's request retried", || {
        s.calls.lock().unwrap().get("probe").copied().unwrap_or(0) > after
    })
    .await;
    assert_eq!(
        s.calls.lock().unwrap().get("gone").copied().unwrap_or(0),
        after,
        "a request of a disengaged cluster ran again"
    );
    assert!(
        !s.calls.lock().unwrap().contains_key("never"),
        "a request of a cluster never engaged reached the reconciler"
    );
    s.stop.cancel();
    s.run.await.unwrap().unwrap();
}

#[tokio::test]
async fn fatal_errors_are_not_retried() {
    let s = setup_failing(Duration::ZERO, ManagerOptions::default(), false);
    s.events
        .send(ClusterEvent::Engage(offline_cluster("c")))
        .await
        .unwrap();
    until("engaged", || s.manager.engaged_clusters().len() == 1).await;
    assert!(s
        .manager
        .enqueue("failing", Request::namespaced("c", "default", "x")));
    until("the first reconcile", || {
        s.calls.lock().unwrap().get("c").copied().unwrap_or(0) == 1
    })
    .await;
    // A transient error would be retried within milliseconds (5 ms, 10 ms, ...).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.calls.lock().unwrap().get("c").copied(), Some(1));
    // A new event runs it again.
    assert!(s
        .manager
        .enqueue("failing", Request::namespaced("c", "default", "x")));
    until("the second reconcile", || {
        s.calls.lock().unwrap().get("c").copied().unwrap_or(0) == 2
    })
    .await;
    s.stop.cancel();
    s.run.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_re_engaged_cluster_replaces_the_old_one() {
    let s = setup(Duration::ZERO, ManagerOptions::default());
    let first = offline_cluster("c");
    let second = offline_cluster("c");
    s.events
        .send(ClusterEvent::Engage(first.clone()))
        .await
        .unwrap();
    until("first", || {
        s.manager
            .engaged(&"c".into())
            .is_some_and(|c| Arc::ptr_eq(&c, &first))
    })
    .await;
    s.events
        .send(ClusterEvent::Engage(second.clone()))
        .await
        .unwrap();
    until("second", || {
        s.manager
            .engaged(&"c".into())
            .is_some_and(|c| Arc::ptr_eq(&c, &second))
    })
    .await;
    assert_eq!(s.manager.engaged_clusters(), vec![ClusterName::from("c")]);
    assert_eq!(
        s.manager.cluster("c").map(|c| c.instance()),
        Some(second.instance())
    );
    s.stop.cancel();
    s.run.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_waits_for_in_flight_reconciles() {
    let s = setup(Duration::from_millis(300), ManagerOptions::default());
    s.events
        .send(ClusterEvent::Engage(offline_cluster("a")))
        .await
        .unwrap();
    until("engaged", || !s.manager.engaged_clusters().is_empty()).await;
    s.manager
        .enqueue("failing", Request::namespaced("a", "default", "x"));
    until("reconcile started", || {
        s.calls.lock().unwrap().contains_key("a")
    })
    .await;
    s.stop.cancel();
    s.run.await.unwrap().unwrap();
    assert_eq!(
        s.finished.load(Ordering::SeqCst),
        1,
        "the in-flight reconcile finished"
    );
    assert_eq!(
        s.calls.lock().unwrap()["a"],
        1,
        "no new work after shutdown began"
    );
    assert!(s.manager.engaged_clusters().is_empty());
}

#[tokio::test]
async fn shutdown_reports_reconciles_that_miss_the_deadline() {
    let options = ManagerOptions {
        graceful_shutdown_timeout: Duration::from_millis(100),
        ..ManagerOptions::default()
    };
    let s = setup(Duration::from_secs(30), options);
    s.events
        .send(ClusterEvent::Engage(offline_cluster("a")))
        .await
        .unwrap();
    until("engaged", || !s.manager.engaged_clusters().is_empty()).await;
    s.manager
        .enqueue("failing", Request::namespaced("a", "default", "x"));
    until("reconcile started", || {
        s.calls.lock().unwrap().contains_key("a")
    })
    .await;
    s.stop.cancel();
    // The reconcile takes 30 s: a manager that waited for it would miss this deadline, and
    // would report it finished rather than a shutdown timeout.
    let result = tokio::time::timeout(Duration::from_secs(20), s.run)
        .await
        .expect("the manager returns at its shutdown deadline, not when the reconcile ends")
        .unwrap();
    assert!(
        matches!(result, Err(ManagerError::ShutdownTimeout(_))),
        "{result:?}"
    );
    assert_eq!(s.finished.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn controllers_need_a_primary_type_and_unique_names() {
    let m = Manager::new(ManagerOptions::default());
    let flag = Arc::new(AtomicBool::new(false));
    struct Noop(Arc<AtomicBool>);
    impl Reconciler for Noop {
        type Error = std::convert::Infallible;
        async fn reconcile(&self, _: Request, _: ClusterContext) -> Result<Action, Self::Error> {
            self.0.store(true, Ordering::SeqCst);
            Ok(Action::await_change())
        }
    }
    assert!(matches!(
        m.add(Controller::new("x", Noop(flag.clone()))),
        Err(ManagerError::Controller(ControllerError::NoPrimary(_)))
    ));
    m.add(Controller::new("x", Noop(flag.clone())).for_::<ConfigMap>())
        .unwrap();
    assert!(matches!(
        m.add(Controller::new("x", Noop(flag)).for_::<ConfigMap>()),
        Err(ManagerError::Controller(ControllerError::Duplicate(_)))
    ));
}

/// Records what [`ClusterContext::engaged_cluster`] answers from inside a reconcile.
struct LooksAround {
    seen: Arc<Mutex<Vec<Vec<Option<String>>>>>,
}

impl Reconciler for LooksAround {
    type Error = Always;

    async fn reconcile(&self, _: Request, ctx: ClusterContext) -> Result<Action, Always> {
        let found = ["a", "b", "c"]
            .iter()
            .map(|n| ctx.engaged_cluster(n).map(|c| c.name().to_string()))
            .collect();
        self.seen.lock().unwrap().push(found);
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn a_reconcile_reaches_the_other_engaged_clusters_and_only_those() {
    let manager = Manager::new(ManagerOptions::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    manager
        .add(Controller::new("looks", LooksAround { seen: seen.clone() }).for_::<ConfigMap>())
        .unwrap();
    let (tx, stop, run) = run_scripted(&manager);
    tx.send(ClusterEvent::Engage(offline_cluster("a")))
        .await
        .unwrap();
    until("a engaged", || manager.engaged(&"a".into()).is_some()).await;
    manager.enqueue("looks", Request::cluster_scoped("a", "x"));
    until("first reconcile", || seen.lock().unwrap().len() == 1).await;
    tx.send(ClusterEvent::Engage(offline_cluster("b")))
        .await
        .unwrap();
    until("b engaged", || manager.engaged(&"b".into()).is_some()).await;
    manager.enqueue("looks", Request::cluster_scoped("a", "y"));
    until("second reconcile", || seen.lock().unwrap().len() == 2).await;
    let seen = seen.lock().unwrap().clone();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(seen[0], vec![some("a"), None, None], "b is not engaged yet");
    assert_eq!(seen[1], vec![some("a"), some("b"), None]);
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn no_reconcile_starts_in_a_cluster_whose_fence_renewal_is_overdue() {
    /// Records the cluster of every reconcile.
    struct Clusters(Arc<Mutex<Vec<String>>>);
    impl Reconciler for Clusters {
        type Error = Always;
        async fn reconcile(&self, req: Request, _: ClusterContext) -> Result<Action, Always> {
            self.0.lock().unwrap().push(req.cluster.to_string());
            Ok(Action::await_change())
        }
    }
    let manager = Manager::new(ManagerOptions::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    // One worker: requests are taken in the order they were queued.
    manager
        .add(
            Controller::new("clusters", Clusters(seen.clone()))
                .for_::<ConfigMap>()
                .workers(1),
        )
        .unwrap();
    let (tx, stop, run) = run_scripted(&manager);
    let a = offline_cluster("a");
    // a's fence renewal is overdue; b has no fence.
    a.hold_fence_until(Some(tokio::time::Instant::now()));
    tx.send(ClusterEvent::Engage(a.clone())).await.unwrap();
    tx.send(ClusterEvent::Engage(offline_cluster("b")))
        .await
        .unwrap();
    until("a and b engaged", || {
        manager.engaged(&"a".into()).is_some() && manager.engaged(&"b".into()).is_some()
    })
    .await;
    manager.enqueue("clusters", Request::cluster_scoped("a", "x"));
    manager.enqueue("clusters", Request::cluster_scoped("b", "y"));
    // b's request, queued after a's, ran; a's was taken first and did not.
    until("b's request reconciled", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), vec!["b".to_string()]);
    // Renewed: a's waiting request runs (it is retried within a second).
    a.hold_fence_until(Some(tokio::time::Instant::now() + Duration::from_secs(60)));
    until("a's request reconciled once the fence holds", || {
        seen.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["b".to_string(), "a".to_string()]
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_reconcile_reaches_a_cluster_the_provider_knows_but_another_replica_engages() {
    struct Knows(Arc<Cluster>);
    #[async_trait::async_trait]
    impl ClusterProvider for Knows {
        async fn run(&self, _: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
            stop.cancelled().await;
            Ok(())
        }
        fn get(&self, name: &str) -> Option<Arc<Cluster>> {
            (self.0.name().as_str() == name).then(|| self.0.clone())
        }
    }
    let manager = Manager::new(ManagerOptions::default());
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (manager, stop) = (manager.clone(), stop.clone());
        async move {
            manager
                .run(
                    Arc::new(Knows(offline_cluster("b"))),
                    stop.cancelled_owned(),
                )
                .await
        }
    });
    until("running", || manager.reachable("b").is_some()).await;
    assert!(manager.cluster("b").is_none(), "b is not engaged here");
    assert!(manager.engaged(&"b".into()).is_none());
    stop.cancel();
    run.await.unwrap().unwrap();
}
