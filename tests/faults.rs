//! Fault tests: while clients write and watch, servers (and etcd) are killed with SIGKILL and
//! started again. A history checker then confirms that no acknowledged write was lost, that
//! every key changed in order for every watcher, that every watch either went on without a gap
//! or got 410 and listed again, and that a read right after a write, through any replica, saw
//! that write. The same scenario runs on redb (one server, restarted on its data) and on etcd
//! (two replicas, each killed once, and etcd itself killed once).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

/// Keys each writer owns; one writer per key, so a key's writes are sequential.
const KEYS_PER_WRITER: usize = 4;
const WRITERS: usize = 3;

/// A write the server acknowledged.
#[derive(Debug, Clone)]
struct Ack {
    key: String,
    seq: u64,
    rv: u64,
}

/// What the writers did and what the checks found along the way.
#[derive(Default)]
struct History {
    acks: Vec<Ack>,
    /// Writes that failed without an answer: they may or may not have happened.
    in_doubt: Vec<(String, u64)>,
    /// Reads right after a write, through another replica, that saw the write.
    reads_checked: usize,
    violations: Vec<String>,
}

/// One stretch of a watcher's history: from `start` (a list or the revision it resumed from)
/// through the events it got.
#[derive(Debug, Default)]
struct Segment {
    start: u64,
    relisted: bool,
    /// (revision, key, seq) of each event.
    events: Vec<(u64, String, u64)>,
    /// The revision the watcher knew itself complete through (last event or bookmark).
    through: u64,
}

#[derive(Default)]
struct WatchLog {
    segments: Vec<Segment>,
    /// Key → (seq, revision), as the watcher sees the collection.
    state: BTreeMap<String, (u64, u64)>,
    violations: Vec<String>,
}

fn seq_of(cm: &ConfigMap) -> Option<u64> {
    cm.data.as_ref()?.get("seq")?.parse().ok()
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

fn name_of(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

fn configmap(key: &str, seq: u64) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": key}, "data": {"seq": seq.to_string()}}))
        .expect("configmap")
}

/// Writes its keys in rounds through the replicas in turn until `stop`; after each
/// acknowledged write, reads the key back through the next replica.
async fn writer(
    replicas: Vec<kube::Client>,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) {
    let mut next_seq: BTreeMap<String, u64> = keys.iter().map(|k| (k.clone(), 0)).collect();
    let mut created: BTreeMap<String, bool> = keys.iter().map(|k| (k.clone(), false)).collect();
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        for key in &keys {
            let seq = next_seq[key];
            next_seq.insert(key.clone(), seq + 1);
            let at = round % replicas.len();
            let api: Api<ConfigMap> = Api::namespaced(replicas[at].clone(), "default");
            let write = async {
                if created[key] {
                    let patch = json!({"data": {"seq": seq.to_string()}});
                    api.patch(key, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                } else {
                    api.create(&PostParams::default(), &configmap(key, seq))
                        .await
                }
            };
            // A write that neither succeeds nor fails within a minute is a hang: the test fails
            // saying so instead of waiting for ever.
            let result = tokio::time::timeout(Duration::from_secs(60), write)
                .await
                .unwrap_or_else(|_| panic!("the write of {key} seq {seq} hung for 60 s"));
            match result {
                Ok(cm) => {
                    created.insert(key.clone(), true);
                    let rv = rv_of(&cm);
                    history.lock().unwrap().acks.push(Ack {
                        key: key.clone(),
                        seq,
                        rv,
                    });
                    // Read-your-writes, by a get (the store) and by a list (the watch cache,
                    // which first catches up with the store) in turn.
                    let other = (at + 1) % replicas.len();
                    let api: Api<ConfigMap> = Api::namespaced(replicas[other].clone(), "default");
                    let read = if seq.is_multiple_of(2) {
                        api.get(key).await.map(Some)
                    } else {
                        let one = ListParams::default().fields(&format!("metadata.name={key}"));
                        api.list(&one).await.map(|l| l.items.into_iter().next())
                    };
                    // The other replica, or etcd, may be down (being killed is the point): a
                    // read that reaches no server, or that a server answers with its storage
                    // unavailable (5xx), checks nothing. One that a server answers otherwise
                    // must show the write: a 4xx (a 404 above all), or a list without the
                    // object, is a violation.
                    let read = match read {
                        Ok(Some(o)) => Some(o),
                        Ok(None) => {
                            history.lock().unwrap().violations.push(format!(
                                "a list through replica {other} after the write of {key} seq {seq} did not have it"
                            ));
                            None
                        }
                        Err(kube::Error::Api(e)) if e.code < 500 => {
                            history.lock().unwrap().violations.push(format!(
                                "a read of {key} through replica {other} after its write was answered {}: {}",
                                e.code, e.message
                            ));
                            None
                        }
                        Err(_) => None,
                    };
                    if let Some(read) = read {
                        let mut h = history.lock().unwrap();
                        h.reads_checked += 1;
                        if rv_of(&read) < rv || seq_of(&read) < Some(seq) {
                            h.violations.push(format!(
                                "read of {key} through replica {other} after the write of seq {seq} at {rv} returned seq {:?} at {}",
                                seq_of(&read),
                                rv_of(&read)
                            ));
                        }
                    }
                }
                Err(kube::Error::Api(status)) if status.code == 409 && !created[key] => {
                    // An earlier create whose answer was lost did happen.
                    created.insert(key.clone(), true);
                }
                Err(_) => {
                    history.lock().unwrap().in_doubt.push((key.clone(), seq));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        round += 1;
    }
}

/// Lists, then watches from the list's revision; when a watch breaks it resumes from the last
/// revision it got (through the next replica), and lists again only after 410.
async fn watcher(
    replicas: Vec<kube::Client>,
    first: usize,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<WatchLog>>,
) {
    let mut at = first;
    let mut resume: Option<u64> = None;
    while !stop.load(Ordering::Relaxed) {
        let api: Api<ConfigMap> = Api::namespaced(replicas[at % replicas.len()].clone(), "default");
        let from = match resume {
            Some(rv) => {
                log.lock().unwrap().segments.push(Segment {
                    start: rv,
                    through: rv,
                    ..Segment::default()
                });
                rv
            }
            None => match api.list(&ListParams::default()).await {
                Ok(list) => {
                    let rv = list
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or(0);
                    let mut l = log.lock().unwrap();
                    let state: BTreeMap<String, (u64, u64)> = list
                        .items
                        .iter()
                        .map(|cm| (name_of(cm), (seq_of(cm).unwrap_or(0), rv_of(cm))))
                        .collect();
                    let l = &mut *l;
                    for (key, (seq, _)) in &l.state {
                        if state.get(key).is_none_or(|(now, _)| now < seq) {
                            let now = state.get(key).map(|(s, _)| *s);
                            l.violations.push(format!(
                                "a list at {rv} went back in time: {key} had seq {seq}, now {now:?}"
                            ));
                        }
                    }
                    l.state = state;
                    l.segments.push(Segment {
                        start: rv,
                        relisted: true,
                        through: rv,
                        ..Segment::default()
                    });
                    rv
                }
                Err(_) => {
                    at += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        resume = Some(from);
        let params = WatchParams::default().timeout(20);
        let mut events = match api.watch(&params, &from.to_string()).await {
            Ok(s) => s.boxed(),
            Err(_) => {
                at += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if stop.load(Ordering::Relaxed) { return; }
                    continue;
                }
            };
            let mut l = log.lock().unwrap();
            match next {
                Some(Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm))) => {
                    let (key, seq, rv) = (name_of(&cm), seq_of(&cm).unwrap_or(0), rv_of(&cm));
                    let last = resume.unwrap_or(0);
                    if rv <= last {
                        l.violations
                            .push(format!("event of {key} at {rv} after revision {last}"));
                    }
                    if let Some(&(old_seq, _)) = l.state.get(&key) {
                        if old_seq >= seq {
                            l.violations
                                .push(format!("{key} went from seq {old_seq} to {seq} (at {rv})"));
                        }
                    }
                    l.state.insert(key.clone(), (seq, rv));
                    if let Some(segment) = l.segments.last_mut() {
                        segment.events.push((rv, key, seq));
                        segment.through = rv;
                    }
                    resume = Some(rv);
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    if let Ok(rv) = b.metadata.resource_version.parse::<u64>() {
                        if let Some(segment) = l.segments.last_mut() {
                            segment.through = segment.through.max(rv);
                        }
                        resume = Some(rv.max(resume.unwrap_or(0)));
                    }
                }
                Some(Ok(WatchEvent::Deleted(cm))) => {
                    l.violations
                        .push(format!("unexpected delete of {}", name_of(&cm)));
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    resume = None;
                    break;
                }
                // Any other end: the replica went away, or the watch timed out.
                Some(Ok(WatchEvent::Error(_))) | Some(Err(_)) | None => {
                    at += 1;
                    break;
                }
            }
        }
    }
}

/// Runs writers and watchers on `replicas` while `faults` runs, then checks the history.
async fn run_and_check<F, Fut>(replicas: Vec<kube::Client>, faults: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let history = Arc::new(Mutex::new(History::default()));
    let stop_writes = Arc::new(AtomicBool::new(false));
    let stop_watches = Arc::new(AtomicBool::new(false));
    let mut logs = Vec::new();
    let mut watchers = Vec::new();
    for w in 0..2 * replicas.len() {
        let log = Arc::new(Mutex::new(WatchLog::default()));
        logs.push(log.clone());
        watchers.push(tokio::spawn(watcher(
            replicas.clone(),
            w,
            stop_watches.clone(),
            log,
        )));
    }
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let keys = (0..KEYS_PER_WRITER)
            .map(|k| format!("key-{w}-{k}"))
            .collect();
        writers.push(tokio::spawn(writer(
            replicas.clone(),
            keys,
            stop_writes.clone(),
            history.clone(),
        )));
    }
    faults().await;
    stop_writes.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }

    // The final state, through every replica: they agree.
    let mut finals = Vec::new();
    for client in &replicas {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let list = api.list(&ListParams::default()).await.expect("final list");
        let state: BTreeMap<String, u64> = list
            .items
            .iter()
            .filter(|cm| name_of(cm).starts_with("key-"))
            .map(|cm| (name_of(cm), seq_of(cm).unwrap_or(0)))
            .collect();
        finals.push(state);
    }
    for other in &finals[1..] {
        assert_eq!(&finals[0], other, "the replicas disagree");
    }
    let fin = &finals[0];

    // Every watcher catches up with that state.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (i, log) in logs.iter().enumerate() {
        loop {
            let seen: BTreeMap<String, u64> = log
                .lock()
                .unwrap()
                .state
                .iter()
                .filter(|(k, _)| k.starts_with("key-"))
                .map(|(k, (seq, _))| (k.clone(), *seq))
                .collect();
            if &seen == fin {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "watcher {i} never caught up: it sees {seen:?}, the store holds {fin:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop_watches.store(true, Ordering::Relaxed);
    for w in watchers {
        w.await.expect("watcher");
    }

    let h = history.lock().unwrap();
    assert!(h.violations.is_empty(), "{:#?}", h.violations);
    assert!(
        h.acks.len() >= 30,
        "too few acknowledged writes: {}",
        h.acks.len()
    );
    assert!(h.reads_checked > 0, "no read-your-writes check ran");

    // No acknowledged write is lost, and nothing appears that nobody wrote.
    for (key, seq) in fin {
        let last_ack = h.acks.iter().filter(|a| &a.key == key).map(|a| a.seq).max();
        let doubted = h.in_doubt.iter().any(|(k, s)| k == key && s == seq);
        assert!(
            Some(*seq) == last_ack || (doubted && Some(*seq) > last_ack),
            "{key} holds seq {seq}; the last acknowledged write was {last_ack:?}"
        );
    }
    for ack in &h.acks {
        assert!(
            fin.contains_key(&ack.key),
            "{} was acknowledged and is gone",
            ack.key
        );
    }

    // Per watcher: no violation seen live, and no gap: each acknowledged write inside a stretch
    // the watcher covered reached it.
    let mut resumed = 0;
    for (i, log) in logs.iter().enumerate() {
        let l = log.lock().unwrap();
        assert!(l.violations.is_empty(), "watcher {i}: {:#?}", l.violations);
        for (n, segment) in l.segments.iter().enumerate() {
            if n > 0 && !segment.relisted {
                resumed += 1;
            }
            for ack in h
                .acks
                .iter()
                .filter(|a| a.rv > segment.start && a.rv <= segment.through)
            {
                assert!(
                    segment
                        .events
                        .iter()
                        .any(|(rv, key, seq)| *rv == ack.rv && key == &ack.key && *seq == ack.seq),
                    "watcher {i} missed {ack:?} in its stretch from {} through {}",
                    segment.start,
                    segment.through
                );
            }
        }
    }
    let relisted: usize = logs
        .iter()
        .map(|l| {
            l.lock()
                .unwrap()
                .segments
                .iter()
                .filter(|s| s.relisted)
                .count()
        })
        .sum();
    eprintln!(
        "history: {} acknowledged writes, {} in doubt, {} reads through another replica; \
         {} watches resumed, {} lists (first ones and after 410)",
        h.acks.len(),
        h.in_doubt.len(),
        h.reads_checked,
        resumed,
        relisted
    );
    assert!(resumed > 0, "no watch was broken by the faults");
}

fn pause(ms: u64) -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_server_killed_and_restarted_during_writes_and_watches() {
    let server = Server::start();
    let client = server.kube().await;
    let server = Arc::new(Mutex::new(server));
    let s = server.clone();
    run_and_check(vec![client], || async move {
        for _ in 0..2 {
            pause(1500).await;
            s.lock().unwrap().kill();
            pause(300).await;
            tokio::task::block_in_place(|| s.lock().unwrap().restart(&[]));
        }
        pause(1500).await;
    })
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_replicas_and_etcd_killed_during_writes_and_watches() {
    use apiserver::storage::etcd::testing::EtcdProcess;

    let etcd = Arc::new(tokio::sync::Mutex::new(
        EtcdProcess::start().await.expect("etcd"),
    ));
    let endpoint = etcd.lock().await.endpoint();
    let flags = ["--etcd-servers", endpoint.as_str()];
    let a = Server::start_with(&flags);
    let b = Server::start_replica(&a, &flags);
    let clients = vec![a.kube().await, b.kube().await];
    let servers = Arc::new(Mutex::new([a, b]));
    let (s, e) = (servers.clone(), etcd.clone());
    run_and_check(clients, || async move {
        let restart = |i: usize| {
            tokio::task::block_in_place(|| {
                let mut s = s.lock().unwrap();
                s[i].kill();
                std::thread::sleep(Duration::from_millis(300));
                s[i].restart(&flags);
            })
        };
        pause(1500).await;
        restart(0);
        pause(1500).await;
        {
            let mut etcd = e.lock().await;
            etcd.kill();
            pause(300).await;
            etcd.restart().await.expect("etcd restart");
        }
        pause(1500).await;
        restart(1);
        pause(1500).await;
    })
    .await;
}

/// A watcher that stops reading is cut off with 429 once the events it has not taken pass the
/// server's bound; the server's memory stays bounded, and a watcher that reads gets everything.
async fn slow_watcher_is_cut_off(server: &Server) {
    use http_body_util::BodyExt;

    const OBJECTS: usize = 1500;
    const WRITERS: usize = 4;
    let client = server.client();
    let path = "/api/v1/namespaces/default/configmaps";
    let mut slow = client.connect_h2().await.expect("h2 connection");
    let request = http::Request::get(format!("{path}?watch=1"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let response = slow.send_request(request).await.expect("slow watch");
    assert_eq!(response.status(), 200);
    let mut slow_body = response.into_body();

    let api: Api<ConfigMap> = Api::namespaced(server.kube().await, "default");
    let mut events = api
        .watch(&WatchParams::default().timeout(120), "0")
        .await
        .expect("reading watch")
        .boxed();
    let reader = tokio::spawn(async move {
        let mut added = 0;
        while added < OBJECTS {
            match tokio::time::timeout(Duration::from_secs(60), events.next()).await {
                Ok(Some(Ok(WatchEvent::Added(_)))) => added += 1,
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                other => panic!("the reading watcher got {other:?} after {added} events"),
            }
        }
    });
    let rss_before = apiserver::meta::metrics::resident_memory_bytes(server.child.id());

    // 1500 objects of 16 KiB: far more than the h2 window and the server's per-watcher bound.
    let payload = "x".repeat(16 * 1024);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await.expect("connect");
            for i in (w..OBJECTS).step_by(WRITERS) {
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("big-{i:05}")}, "data": {"payload": payload}});
                let r = conn.post_json(path, &body).await.expect("create");
                assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
            }
        }));
    }
    let mut rss_peak = rss_before;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    for t in tasks {
        while !t.is_finished() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the writers did not finish within 300 s"
            );
            rss_peak = rss_peak.max(apiserver::meta::metrics::resident_memory_bytes(
                server.child.id(),
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        t.await.expect("writer");
    }

    reader.await.expect("the reading watcher got every event");

    // The slow watcher now reads what was buffered for it: fewer events than were written, then
    // an ERROR event with 429, then the end.
    let mut text = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(60), slow_body.frame())
        .await
        .expect("the slow watch ends")
    {
        if let Ok(data) = frame.expect("frame").into_data() {
            text.extend_from_slice(&data);
        }
    }
    let lines: Vec<serde_json::Value> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("watch event"))
        .collect();
    let last = lines.last().expect("some events");
    assert_eq!(last["type"], "ERROR", "the slow watch was not cut off");
    assert_eq!(last["object"]["code"], 429, "{last}");
    assert_eq!(last["object"]["reason"], "TooManyRequests", "{last}");
    let delivered = lines.len() - 1;
    assert!(
        delivered < OBJECTS,
        "the slow watcher got all {delivered} events"
    );
    // The server held at most its bound for the slow watcher, not the whole backlog twice over
    // (1500 × 16 KiB = 24 MiB of events; the store and watch cache hold them once).
    let growth = rss_peak.saturating_sub(rss_before);
    assert!(
        growth < 200 << 20,
        "the server grew by {} MiB",
        growth >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_slow_watcher_is_cut_off() {
    slow_watcher_is_cut_off(&Server::start()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_slow_watcher_is_cut_off() {
    let etcd = apiserver::storage::etcd::testing::EtcdProcess::start()
        .await
        .expect("etcd");
    let endpoint = etcd.endpoint();
    slow_watcher_is_cut_off(&Server::start_with(&["--etcd-servers", endpoint.as_str()])).await;
}
