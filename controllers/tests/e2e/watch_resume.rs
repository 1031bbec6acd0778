//! Watches survive disconnects. The controller reaches the server through a TCP proxy that the
//! test can cut (every open connection dropped) and close (new connections refused):
//!
//! - after a plain cut, the shared watch resumes from its last resourceVersion: changes made
//!   while it was away are reconciled exactly once and nothing is listed again;
//! - when the server compacts its history past that resourceVersion while the watch is away,
//!   the resumed watch gets 410 Gone, the cache lists again, and the changes (a deletion among
//!   them) still reach the controller exactly once.
//!
//! While the proxy refuses connections the watch's retries fail; the runtime backs off and
//! recovers without a restart.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use kube::config::KubeConfigOptions;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::sample_controller::{
    bind_widgets, copy_controller, copy_for, copy_of, create_widget, export_widgets, set_color,
    widgets, Log, ObjectKey,
};
use super::{eventually, TestServer};
use controllers::cluster_providers::FixedClusters;
use controllers::runtime::{Cluster, Manager, ManagerOptions};

/// A TCP proxy in front of the server.
struct Proxy {
    address: SocketAddr,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let address = listener.local_addr().expect("proxy address");
        let open = Arc::new(AtomicBool::new(true));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, connections) = (open.clone(), connections.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    connections.lock().unwrap().push(task.abort_handle());
                }
            }
        });
        Proxy {
            address,
            open,
            connections,
            _accept: accept,
        }
    }

    /// Drops every open connection and refuses new ones until [`Proxy::reopen`].
    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn reopen(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// `apiserver_request_total` of `verb` (kube's: `LIST`, `WATCH`) on widgets with code 200, in
/// every scope, from the server's own metrics.
fn requests(ts: &TestServer, verb: &str) -> u64 {
    let (verb, resource) = (format!("verb=\"{verb}\""), "resource=\"widgets\"");
    ts.server
        .state
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{code=\"200\""))
        .filter(|l| l.contains(&verb) && l.contains(resource))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
        .sum()
}

const WIDGETS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_after_a_cut_and_list_again_after_410() {
    let ts = TestServer::start().await;
    ts.workspace("provider").await;
    export_widgets(&ts, "root:provider").await;
    ts.workspace("app").await;
    bind_widgets(&ts, "root:app", "root:provider").await;
    let direct = ts.client("root:app").await;
    let mut changes: HashMap<ObjectKey, Vec<String>> = HashMap::new();
    let key = |i: usize| ("app".to_string(), format!("default/w{i}"));
    for i in 0..WIDGETS {
        let rv = create_widget(&direct, &format!("w{i}"), "red").await;
        changes.insert(key(i), vec![rv]);
    }

    // The controller's only way to the server is the proxy.
    let proxy = Proxy::start(ts.server.address).await;
    let mut kc = ts.kubeconfig_for("root:app");
    for named in kc.clusters.iter_mut() {
        if let Some(c) = named.cluster.as_mut() {
            let server = c.server.clone().unwrap_or_default();
            c.server =
                Some(server.replace(&ts.server.address.to_string(), &proxy.address.to_string()));
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let log = Arc::new(Mutex::new(Log::default()));
    let manager = Manager::new(ManagerOptions::default());
    manager.add(copy_controller(&log)).expect("controller");
    let provider = Arc::new(FixedClusters::new([Cluster::new("app", client)]));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop) = (manager.clone(), stop.clone());
        async move { m.run(provider, async move { stop.cancelled().await }).await }
    });
    let settled = |changes: &HashMap<ObjectKey, Vec<String>>| {
        let l = log.lock().unwrap();
        changes.iter().all(|(k, rvs)| l.settled(k, rvs))
    };
    eventually(Duration::from_secs(20), "first sync settled", || {
        let ok = settled(&changes);
        async move { ok }
    })
    .await;
    let lists_before = requests(&ts, "LIST");
    assert!(lists_before >= 1, "the cache listed once to start");

    // 1. A plain cut: writes happen while the controller is away; the watch resumes.
    proxy.cut();
    for i in 0..2 {
        let rv = set_color(&direct, &format!("w{i}"), "blue").await;
        changes.get_mut(&key(i)).expect("key").push(rv);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.reopen();
    eventually(
        Duration::from_secs(30),
        "changes made during the cut reconciled",
        || {
            let ok = settled(&changes);
            async move { ok }
        },
    )
    .await;
    assert_eq!(
        requests(&ts, "LIST"),
        lists_before,
        "a resumed watch does not list again"
    );
    for i in 0..2 {
        assert_eq!(
            copy_of(&direct, &format!("w{i}")).await,
            Some(copy_for("blue"))
        );
    }

    // 2. A cut during which history is compacted past the watch's resourceVersion.
    proxy.cut();
    let rv = set_color(&direct, "w2", "green").await;
    changes.get_mut(&key(2)).expect("key").push(rv);
    let gone = widgets();
    Api::<DynamicObject>::namespaced_with(direct.clone(), "default", &gone)
        .delete("w4", &DeleteParams::default())
        .await
        .expect("delete w4");
    changes.remove(&key(4));
    let store = ts.server.state.store.clone();
    store
        .compact(store.current_revision())
        .await
        .expect("compact");
    proxy.reopen();
    eventually(
        Duration::from_secs(30),
        "changes made during the compacted cut reconciled",
        || {
            let ok = settled(&changes) && log.lock().unwrap().missing.contains_key(&key(4));
            async move { ok }
        },
    )
    .await;
    assert!(
        requests(&ts, "LIST") > lists_before,
        "after 410 Gone the cache lists again"
    );
    assert_eq!(copy_of(&direct, "w2").await, Some(copy_for("green")));

    // Nothing was reconciled twice: not the objects untouched by the cuts, not the changed ones.
    {
        let l = log.lock().unwrap();
        for (k, rvs) in &changes {
            l.assert_exactly_once(k, rvs);
        }
        assert_eq!(l.missing.get(&key(4)), Some(&1), "the deletion seen once");
        assert!(
            l.missing.keys().all(|k| *k == key(4)),
            "only w4 went missing: {:?}",
            l.missing
        );
    }
    stop.cancel();
    run.await.expect("join").expect("manager");
    ts.stop().await;
}
