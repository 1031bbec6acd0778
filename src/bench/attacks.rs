//! The memory attacks of a low-privilege tenant (`bench --only attacks`), each against a fresh
//! `platform-mesh serve` with default flags: alice may do anything in namespace `default` of
//! workspace A and nothing else. While she attacks, bob reads a ConfigMap in workspace B in a
//! closed loop and a prober asks `/readyz` every 100 ms; the server's RSS is sampled every
//! 50 ms. Each row prints the peak RSS beside the ceiling, bob's p99 beside his p99 on the quiet
//! server (measured first, in the same run, the same way), and how many `/readyz` probes were
//! answered.
//!
//! Client and server share this machine's cores, which a real attacker's client does not: so
//! alice's load generator runs at nice 19 and takes only the CPU the server leaves, and bob's
//! client thread runs real-time (`SCHED_FIFO`, when the bench may set it), so his figure is the
//! server's latency and not his client's wait for a core.
//!
//! The attacks:
//! 1. `watches`: watches that never read (HTTP/2 with 64 KiB windows, 250 streams per
//!    connection) while a 512 KiB ConfigMap is updated in a loop, so events pile up for them.
//! 2. `large updates`: a ConfigMap of just under 1 MiB updated in a loop (each event carries the
//!    object twice), as fast as the server takes it.
//! 3. `unread lists`: LISTs of `attack_list_mib` MiB of ConfigMaps, never read.
//! 4. `patch bombs`: JSON patches of 40 `copy` operations, each doubling the object.
//! 5. `many roles`: `attack_roles` (3,000) Roles in A's `default`, then GETs in A from 8
//!    connections (every request in A is authorized against A's policy).
//! 6. `jwks`: a tenant's issuer serving 1 MiB of 8192-bit keys, and tokens of it naming no key
//!    with garbage signatures from 8 connections, sent by anyone ([`crate::bench::attacks_jwks`]).
//! 7. `cel`: alice (given cluster rights in A for this attack) defines a CRD whose CEL rule is
//!    cubic in an integer list (refused while its estimated cost is over kube's limit; she
//!    lowers `maxItems` until it is admitted), then sends dry-run creates with full lists from 4
//!    connections: each evaluation is stopped by the runtime cost limit.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::Full;
use https_client::{ClientConfig, Connection};
use serde_json::json;

use crate::bench::report::{rows, Row};
use crate::bench::{ms, percentile, rss_of, BenchOptions, ChildServer};

mod cel;

const TOKENS: &str = "alice-token,alice,alice-uid,\"tenants\"\nbob-token,bob,bob-uid,\"tenants\"\n";
/// The RSS every attack must stay under, with default flags.
const CEILING_MIB: u64 = 1024;
/// Open watches alice tries.
const WATCHES: usize = 1_500;

/// One tenant's connection, authenticated by bearer token.
struct Tenant {
    conn: Connection,
    token: String,
}

impl Tenant {
    async fn new(config: &ClientConfig, token: &str) -> anyhow::Result<Tenant> {
        Ok(Tenant {
            conn: config.connect().await?,
            token: token.to_string(),
        })
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<StatusCode> {
        let auth = format!("Bearer {}", self.token);
        let r = self
            .conn
            .send_with_headers(
                method,
                path,
                &[("authorization", &auth), ("content-type", content_type)],
                body,
            )
            .await?;
        Ok(r.status)
    }
}

/// The cluster-scoped bits of the setup: workspaces A and B, alice's Role in A's `default`, bob
/// as admin of B with one ConfigMap to read.
async fn setup(admin: &mut Connection) -> anyhow::Result<(String, String)> {
    let mut clusters = Vec::new();
    for name in ["a", "b"] {
        crate::bench::broker::post(
            admin,
            "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces",
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                   "metadata": {"name": name}}),
        )
        .await?;
        let path = format!("/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces/{name}");
        crate::bench::broker::wait_ready(admin, &path, |w| w["status"]["phase"] == "Ready").await?;
        let ws = admin.get(&path).await?.json();
        clusters.push(
            ws["spec"]["cluster"]
                .as_str()
                .ok_or_else(|| anyhow!("workspace {name} has no cluster"))?
                .to_string(),
        );
    }
    let (a, b) = (clusters[0].clone(), clusters[1].clone());
    let rbac = |c: &str| format!("/clusters/{c}/apis/rbac.authorization.k8s.io/v1");
    crate::bench::broker::post(
        admin,
        &format!("{}/namespaces/default/roles", rbac(&a)),
        json!({"metadata": {"name": "all"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("{}/namespaces/default/rolebindings", rbac(&a)),
        json!({"metadata": {"name": "alice"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "all"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("{}/clusterroles", rbac(&b)),
        json!({"metadata": {"name": "everything"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("{}/clusterrolebindings", rbac(&b)),
        json!({"metadata": {"name": "bob"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "everything"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"}]}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("/clusters/{b}/api/v1/namespaces/default/configmaps"),
        json!({"metadata": {"name": "bobs"}, "data": {"k": "v"}}),
    )
    .await?;
    Ok((a, b))
}

/// The runtime alice's load generator runs on: its threads at the lowest CPU priority (nice 19),
/// so that they take only the CPU the server leaves. On this shared machine the kernel would
/// otherwise time-slice the server's workers against the attacker's client, a delay a real
/// attacker, whose client runs on machines of its own, cannot cause; what is measured is then
/// how the server shares itself between tenants.
fn attacker_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(|| {
            // SAFETY: setpriority with who = 0 changes the calling thread's nice value only
            // (Linux keeps one per thread); nothing else is touched.
            let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        })
        .build()?)
}

/// Puts the calling thread, bob's client, ahead of every other thread of the machine
/// (`SCHED_FIFO`, when allowed): it sleeps between requests and works microseconds per request,
/// and without it bob's latency would include his own client's wait for a core the server is
/// busy on, a wait his client on a machine of its own does not have. Says which priority it
/// got, for the report.
fn measuring_thread() -> &'static str {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler with pid 0 changes the calling thread's policy only; `param`
    // lives across the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        "real-time"
    } else {
        "normal"
    }
}

/// What happened to the server and to bob while an attack ran.
struct Watched {
    peak_rss: u64,
    bob_p99: Duration,
    bob_errors: usize,
    /// The priority bob's client thread ran at.
    probe: &'static str,
    readyz_ok: usize,
    readyz_total: usize,
}

/// Runs `attack` for `seconds` while sampling RSS, bob's latency and `/readyz`.
async fn watch_over<F>(
    server: &ChildServer,
    b: &str,
    seconds: u64,
    attack: F,
    armed: Option<Arc<tokio::sync::Notify>>,
) -> anyhow::Result<Watched>
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let pid = server.child_id();
    let client = server.anonymous_client()?;
    let running = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicU64::new(rss_of(pid)));
    let sampler = {
        let (running, peak) = (running.clone(), peak.clone());
        tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                peak.fetch_max(rss_of(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // bob runs on a thread and runtime of his own, so the attack's client work in this process
    // does not delay his requests: what is measured is the server's fairness.
    let bob = {
        let (running, client) = (running.clone(), client.clone());
        let path = format!("/clusters/{b}/api/v1/namespaces/default/configmaps/bobs");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            let probe = measuring_thread();
            runtime.block_on(async move {
                let mut bob = Tenant::new(&client, "bob-token").await?;
                let (mut latencies, mut errors) = (Vec::new(), 0usize);
                while running.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match tokio::time::timeout(
                        Duration::from_secs(10),
                        bob.send(Method::GET, &path, "application/json", Vec::new()),
                    )
                    .await
                    {
                        Ok(Ok(StatusCode::OK)) => latencies.push(t.elapsed()),
                        _ => {
                            errors += 1;
                            latencies.push(t.elapsed());
                            bob = Tenant::new(&client, "bob-token").await?;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                latencies.sort();
                anyhow::Ok((percentile(&latencies, 0.99), errors, probe))
            })
        })
    };
    let prober = {
        let (running, client) = (running.clone(), client.clone());
        tokio::spawn(async move {
            let (mut ok, mut total) = (0usize, 0usize);
            while running.load(Ordering::Relaxed) {
                total += 1;
                let answered = tokio::time::timeout(Duration::from_secs(1), async {
                    client.connect().await?.get("/readyz").await
                })
                .await;
                if matches!(answered, Ok(Ok(r)) if r.status == StatusCode::OK) {
                    ok += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (ok, total)
        })
    };
    let attacker = attacker_runtime()?;
    let mut handle = attacker.spawn(attack);
    // An attack that must first set itself up (open its watches) gets the window after that,
    // however long its low-priority runtime takes on a loaded machine.
    let mut ended = None;
    if let Some(armed) = armed {
        tokio::select! {
            _ = armed.notified() => {}
            r = &mut handle => ended = Some(r),
            _ = tokio::time::sleep(Duration::from_secs(120)) => {}
        }
    }
    let outcome = match ended {
        Some(r) => Ok(r),
        None => tokio::time::timeout(Duration::from_secs(seconds), handle).await,
    };
    attacker.shutdown_background();
    running.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let (bob_p99, bob_errors, probe) =
        bob.join().map_err(|_| anyhow!("bob's thread panicked"))??;
    let (readyz_ok, readyz_total) = prober.await?;
    // The attack runs until stopped (what it managed is in its counters); one that ended by
    // itself must have failed.
    if let Ok(r) = outcome {
        r??;
    }
    Ok(Watched {
        peak_rss: peak.load(Ordering::Relaxed),
        bob_p99,
        bob_errors,
        probe,
        readyz_ok,
        readyz_total,
    })
}

/// The attacks, in the order they run.
pub(crate) const KINDS: [&str; 7] = [
    "watches",
    "large-updates",
    "unread-lists",
    "patch-bombs",
    "many-roles",
    "jwks",
    "cel",
];

/// A ConfigMap of `bytes` bytes of data.
fn config_map(name: &str, bytes: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"k": "x".repeat(bytes)}}))
    .unwrap_or_default()
}

/// Updates one ConfigMap of `bytes` in a loop until stopped; counts the accepted updates.
async fn update_loop(
    client: ClientConfig,
    collection: String,
    bytes: usize,
    count: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut alice = Tenant::new(&client, "alice-token").await?;
    let name = "churn";
    let _ = alice
        .send(
            Method::POST,
            &collection,
            "application/json",
            config_map(name, bytes),
        )
        .await?;
    let mut i = 0usize;
    loop {
        i += 1;
        let body =
            serde_json::to_vec(&json!({"data": {"k": format!("{i}{}", "y".repeat(bytes - 24))}}))?;
        let s = alice
            .send(
                Method::PATCH,
                &format!("{collection}/{name}"),
                "application/merge-patch+json",
                body,
            )
            .await?;
        if s == StatusCode::OK {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends `body` to `path` as alice with `method` in a loop until stopped, counting the requests
/// and those refused 422 (the attacks whose requests the server must refuse cheaply).
pub(super) async fn refused_loop(
    client: ClientConfig,
    method: Method,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    sent: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut alice = Tenant::new(&client, "alice-token").await?;
    loop {
        let s = alice
            .send(method.clone(), &path, content_type, body.clone())
            .await?;
        sent.fetch_add(1, Ordering::Relaxed);
        if s == StatusCode::UNPROCESSABLE_ENTITY {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// GETs `path` as alice in a loop until stopped, counting the answered ones.
async fn get_loop(
    client: ClientConfig,
    path: String,
    served: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut alice = Tenant::new(&client, "alice-token").await?;
    loop {
        let s = alice
            .send(Method::GET, &path, "application/json", Vec::new())
            .await?;
        if s == StatusCode::OK {
            served.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A GET through `sender` with alice's token; the answer's body is left unread.
fn unread_get(path: &str) -> anyhow::Result<http::Request<Full<Bytes>>> {
    Ok(http::Request::get(format!("https://localhost{path}"))
        .header("authorization", "Bearer alice-token")
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))?)
}

pub(crate) async fn attacks(
    opts: &BenchOptions,
    tmp: &std::path::Path,
) -> anyhow::Result<Vec<Row>> {
    let mut figures = Vec::new();
    let mut quiet: Option<Duration> = None;
    for (n, kind) in KINDS.iter().enumerate() {
        if !runs(opts, kind) {
            continue;
        }
        let dir = tmp.join(format!("attacks-{n}"));
        std::fs::create_dir_all(&dir)?;
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, TOKENS)?;
        let tokens = tokens.to_string_lossy().to_string();
        let server = ChildServer::start(
            &["serve", "--no-controllers", "--token-auth-file", &tokens],
            &dir.join("data"),
        )?;
        let mut admin = server.client()?.connect().await?;
        let (a, b) = setup(&mut admin).await?;
        let client = server.anonymous_client()?;
        let collection = format!("/clusters/{a}/api/v1/namespaces/default/configmaps");
        if quiet.is_none() {
            let w = watch_over(
                &server,
                &b,
                opts.seconds,
                async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                },
                None,
            )
            .await?;
            quiet = Some(w.bob_p99);
        }
        let (watched, said) = match *kind {
            "cel" => {
                let p = cel::prepare(&mut admin, &client, &a).await?;
                let w =
                    watch_over(&server, &b, opts.seconds, cel::attack(&client, &p), None).await?;
                (w, cel::said(&p))
            }
            "jwks" => {
                let p = crate::bench::attacks_jwks::prepare(&mut admin, &client, &a, &dir).await?;
                let attack = crate::bench::attacks_jwks::attack(
                    client.clone(),
                    p.path.clone(),
                    p.issuer.url().to_string(),
                    p.refused.clone(),
                );
                let w = watch_over(&server, &b, opts.seconds, attack, None).await?;
                (w, crate::bench::attacks_jwks::said(&p, opts.seconds))
            }
            "watches" => {
                let count = Arc::new(AtomicUsize::new(0));
                let opened = Arc::new(AtomicUsize::new(0));
                let refused = Arc::new(AtomicUsize::new(0));
                let armed = Arc::new(tokio::sync::Notify::new());
                let attack = {
                    let (client, collection) = (client.clone(), collection.clone());
                    let (count, opened, refused) = (count.clone(), opened.clone(), refused.clone());
                    let armed = armed.clone();
                    async move {
                        // 250 streams per connection, opened at once, so that every watch is
                        // asked for early in the window even on a loaded machine.
                        let mut held = Vec::new();
                        for first in (0..WATCHES).step_by(250) {
                            let sender = client.connect_h2_with_window(Some(65_535)).await?;
                            let mut asks = Vec::new();
                            for _ in first..(first + 250).min(WATCHES) {
                                let mut sender = sender.clone();
                                let request = unread_get(&format!("{collection}?watch=true"))?;
                                asks.push(async move { sender.send_request(request).await });
                            }
                            for r in futures::future::join_all(asks).await {
                                let r = r?;
                                if r.status() == StatusCode::OK {
                                    opened.fetch_add(1, Ordering::Relaxed);
                                    held.push(r);
                                } else {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        armed.notify_one();
                        update_loop(client, collection, 512 * 1024, count).await?;
                        drop(held);
                        Ok(())
                    }
                };
                let w = watch_over(&server, &b, opts.seconds, attack, Some(armed)).await?;
                (
                    w,
                    format!(
                        "{} watches open ({} refused 429), {} updates of 512 KiB",
                        opened.load(Ordering::Relaxed),
                        refused.load(Ordering::Relaxed),
                        count.load(Ordering::Relaxed)
                    ),
                )
            }
            "large-updates" => {
                let count = Arc::new(AtomicUsize::new(0));
                let attack = {
                    let (client, collection, count) =
                        (client.clone(), collection.clone(), count.clone());
                    async move { update_loop(client, collection, 1024 * 1024 - 64, count).await }
                };
                let w = watch_over(&server, &b, opts.seconds, attack, None).await?;
                (
                    w,
                    format!(
                        "{} updates of a 1 MiB ConfigMap",
                        count.load(Ordering::Relaxed)
                    ),
                )
            }
            "unread-lists" => {
                let mut alice = Tenant::new(&client, "alice-token").await?;
                for i in 0..opts.attack_list_mib {
                    let s = alice
                        .send(
                            Method::POST,
                            &collection,
                            "application/json",
                            config_map(&format!("big-{i:04}"), 1000 * 1024),
                        )
                        .await?;
                    if s != StatusCode::CREATED {
                        return Err(anyhow!("creating the data to list: {s}"));
                    }
                }
                let (listed, refused) =
                    (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                let attack = {
                    let (client, collection) = (client.clone(), collection.clone());
                    let (listed, refused) = (listed.clone(), refused.clone());
                    async move {
                        let mut held = Vec::new();
                        for _ in 0..10 {
                            let mut sender = client.connect_h2_with_window(Some(65_535)).await?;
                            let r = sender.send_request(unread_get(&collection)?).await?;
                            if r.status() == StatusCode::OK {
                                listed.fetch_add(1, Ordering::Relaxed);
                            } else {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            held.push((sender, r));
                        }
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        drop(held);
                        Ok(())
                    }
                };
                let w = watch_over(&server, &b, opts.seconds, attack, None).await?;
                (
                    w,
                    format!(
                        "10 unread LISTs of {} MiB: {} answered, {} refused 429",
                        opts.attack_list_mib,
                        listed.load(Ordering::Relaxed),
                        refused.load(Ordering::Relaxed)
                    ),
                )
            }
            "many-roles" => {
                let mut alice = Tenant::new(&client, "alice-token").await?;
                let roles = format!(
                    "/clusters/{a}/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"
                );
                for i in 0..opts.attack_roles {
                    let role =
                        serde_json::to_vec(&json!({"metadata": {"name": format!("r{i:04}")},
                        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                   "resourceNames": [format!("c{i}")], "verbs": ["get"]}]}))?;
                    let s = alice
                        .send(Method::POST, &roles, "application/json", role)
                        .await?;
                    if s != StatusCode::CREATED {
                        return Err(anyhow!("creating role {i}: {s}"));
                    }
                }
                alice
                    .send(
                        Method::POST,
                        &collection,
                        "application/json",
                        config_map("read", 100),
                    )
                    .await?;
                let served = Arc::new(AtomicUsize::new(0));
                let attack = {
                    let (client, collection, served) =
                        (client.clone(), collection.clone(), served.clone());
                    async move {
                        let mut tasks = Vec::new();
                        for _ in 0..8 {
                            tasks.push(tokio::spawn(get_loop(
                                client.clone(),
                                format!("{collection}/read"),
                                served.clone(),
                            )));
                        }
                        for t in tasks {
                            t.await??;
                        }
                        Ok(())
                    }
                };
                let w = watch_over(&server, &b, opts.seconds, attack, None).await?;
                (
                    w,
                    format!(
                        "{} Roles in A, {:.0} GETs/s in A from 8 connections",
                        opts.attack_roles,
                        served.load(Ordering::Relaxed) as f64 / opts.seconds as f64
                    ),
                )
            }
            _ => {
                let mut alice = Tenant::new(&client, "alice-token").await?;
                alice
                    .send(
                        Method::POST,
                        &collection,
                        "application/json",
                        config_map("bomb", 1000),
                    )
                    .await?;
                let (sent, refused) =
                    (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                let ops: Vec<_> = (0..40)
                    .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/c{i}")}))
                    .collect();
                let body = serde_json::to_vec(&ops)?;
                // The window opens at the first answer: on a loaded machine a debug build's
                // first patch can take longer than a short window, which then measured none.
                let armed = Arc::new(tokio::sync::Notify::new());
                let attack = {
                    let (client, collection) = (client.clone(), collection.clone());
                    let (sent, refused) = (sent.clone(), refused.clone());
                    let armed = armed.clone();
                    async move {
                        let first = sent.clone();
                        tokio::spawn(async move {
                            while first.load(Ordering::Relaxed) == 0 {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            armed.notify_one();
                        });
                        let mut tasks = Vec::new();
                        for _ in 0..4 {
                            let (client, collection, body) =
                                (client.clone(), collection.clone(), body.clone());
                            let (sent, refused) = (sent.clone(), refused.clone());
                            tasks.push(tokio::spawn(refused_loop(
                                client,
                                Method::PATCH,
                                format!("{collection}/bomb"),
                                "application/json-patch+json",
                                body,
                                sent,
                                refused,
                            )));
                        }
                        for t in tasks {
                            t.await??;
                        }
                        Ok(())
                    }
                };
                let w = watch_over(&server, &b, opts.seconds, attack, Some(armed)).await?;
                (
                    w,
                    format!(
                        "{} patches of 40 doubling copies, {} refused 422",
                        sent.load(Ordering::Relaxed),
                        refused.load(Ordering::Relaxed)
                    ),
                )
            }
        };
        let quiet_p99 = quiet.unwrap_or_default();
        let verdict = if watched.peak_rss <= CEILING_MIB * 1048576 {
            "under"
        } else {
            "OVER"
        };
        figures.push((
            format!(
                "{said}; peak RSS {:.0} MiB ({verdict} the {CEILING_MIB} MiB ceiling); bob's p99 in B {} ({:.1}× quiet, {} errors); /readyz {}/{} answered",
                watched.peak_rss as f64 / 1048576.0,
                ms(watched.bob_p99),
                watched.bob_p99.as_secs_f64() / quiet_p99.as_secs_f64().max(1e-6),
                watched.bob_errors,
                watched.readyz_ok,
                watched.readyz_total,
            ),
            format!(
                "quiet p99 {} (bob's client thread {}, alice's at nice 19); ceiling {CEILING_MIB} MiB, 10× quiet p99",
                ms(quiet_p99),
                watched.probe,
            ),
        ));
    }
    rows(labels(opts), figures)
}

/// Whether the attacks section runs `kind`.
fn runs(opts: &BenchOptions, kind: &str) -> bool {
    opts.attacks.is_empty() || opts.attacks.iter().any(|a| a == kind)
}

/// The rows of the attacks section: one per attack run.
pub(crate) fn labels(opts: &BenchOptions) -> Vec<String> {
    KINDS
        .iter()
        .filter(|kind| runs(opts, kind))
        .map(|kind| match *kind {
            "watches" => "watches that never read, while a 512 KiB ConfigMap is updated in a loop"
                .to_string(),
            "large-updates" => "a 1 MiB ConfigMap updated in a loop".to_string(),
            "unread-lists" => format!("10 unread LISTs of {} MiB", opts.attack_list_mib),
            "many-roles" => format!(
                "{} Roles in A, then GETs in A from 8 connections",
                opts.attack_roles
            ),
            "jwks" => crate::bench::attacks_jwks::label(),
            "cel" => cel::label(),
            _ => "JSON patches of 40 doubling copies from 4 connections".to_string(),
        })
        .map(|what| format!("attack: {what}"))
        .collect()
}
