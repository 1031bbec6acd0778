//! What operators see of the processes, through the binary: `serve`'s `/metrics` with the
//! co-located controllers' metrics (`controller_runtime_*`, `workqueue_*`); `broker` with `--metrics-bind-address`,
//! `--health-probe-bind-address` and `--leader-elect` (two replicas, one leads, the other takes
//! over when it stops); `--version`, `completion`, `--log-format json`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Server;
use http::Method;
use serde_json::json;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
}

/// Waits for `check` to give `Some`, failing with `what` after `secs` seconds.
async fn wait_for<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "waited {secs} s for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_metrics_show_the_controllers() {
    let server = Server::start();
    // Something to reconcile.
    let mut conn = server.client().connect().await.expect("connect");
    let pm = conn
        .post_json(
            "/apis/core.platform-mesh.io/v1alpha1/namespaces/default/platformmeshes",
            &json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
                "metadata": {"name": "metrics"}, "spec": {}}),
        )
        .await
        .expect("create");
    assert_eq!(pm.status.as_u16(), 201);
    let text = wait_for(60, "controller metrics on /metrics", || {
        let client = server.client();
        async move {
            let mut conn = client.connect().await.expect("connect");
            let r = conn.get("/metrics").await.expect("metrics");
            assert_eq!(r.status.as_u16(), 200);
            let text = String::from_utf8_lossy(&r.body).into_owned();
            (text.contains("controller_runtime_reconcile_total{")
                && text.contains("workqueue_adds_total{"))
            .then_some(text)
        }
    })
    .await;
    // (`leader_election_master_status` appears with leader election, as controller-runtime's:
    // `tests/replicas.rs` reads it from two replicas on one etcd.)
    assert!(text.contains("apiserver_request_total"), "{text}");
}

/// A `broker` process whose stderr is followed for the addresses it reports.
struct Broker {
    child: Child,
    metrics: String,
    probes: String,
}

impl Broker {
    fn start(args: &[&str]) -> Broker {
        let mut child = bin()
            .arg("broker")
            .args(args)
            .args([
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--health-probe-bind-address",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the broker");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut metrics, mut probes) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while metrics.is_none() || probes.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the broker did not report its endpoints within 30 s"));
            if let Some(a) = line.strip_prefix("platform-mesh broker serves its metrics on ") {
                metrics = Some(a.trim().to_string());
            }
            if let Some(a) = line.strip_prefix("platform-mesh broker serves its health probes on ")
            {
                probes = Some(a.trim().to_string());
            }
        }
        // Keep draining stderr, into the test's (shown when it fails).
        std::thread::spawn(move || {
            while let Ok(line) = rx.recv() {
                eprintln!("[broker] {line}");
            }
        });
        Broker {
            child,
            metrics: metrics.expect("metrics"),
            probes: probes.expect("probes"),
        }
    }

    fn terminate(&mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "the broker did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `url` over plain HTTP: `(status, body)`.
async fn get(url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", host)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `1`, `0` or `None` (not reported yet): whether this broker leads.
async fn leads(b: &Broker) -> Option<bool> {
    let (code, text) = get(&format!("{}/metrics", b.metrics)).await;
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find(|l| l.starts_with("leader_election_master_status{"))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v == "1")
}

/// Workspaces `names` under root, each Ready, and for each a kubeconfig file (in `dir`) of a
/// `system:masters` user in it: the files' paths, in order.
async fn broker_workspaces(
    server: &Server,
    dir: &std::path::Path,
    names: &[String],
) -> Vec<String> {
    let mut conn = server.client().connect().await.expect("connect");
    for ws in names {
        let r = conn
            .send(
                Method::POST,
                "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces",
                Some("application/json"),
                json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": ws}})
                    .to_string()
                    .into_bytes(),
            )
            .await
            .expect("workspace");
        assert_eq!(r.status.as_u16(), 201);
    }
    let mut files = Vec::new();
    for ws in names {
        let out = dir.join(format!("{ws}.kubeconfig"));
        common::stdout_of(
            bin()
                .args([
                    "certs",
                    "kubeconfig",
                    "--user",
                    "broker",
                    "--group",
                    "system:masters",
                ])
                .args(["--workspace", &format!("root:{ws}"), "--out"])
                .arg(&out)
                .arg("--data-dir")
                .arg(&server.data_dir),
            "certs kubeconfig",
        );
        files.push(out.to_string_lossy().into_owned());
        wait_for(30, &format!("root:{ws} Ready"), || {
            let client = server.client();
            async move {
                let mut c = client.connect().await.expect("connect");
                let r = c
                    .get(&format!("/clusters/root:{ws}/api/v1/namespaces/default"))
                    .await
                    .expect("get");
                (r.status.as_u16() == 200).then_some(())
            }
        })
        .await;
    }
    files
}

/// An AcceptAPI in `root:provider` accepting every ConfigMap.
async fn accept_configmaps(server: &Server) {
    let mut conn = server.client().connect().await.expect("connect");
    let accept = conn
        .send(
            Method::POST,
            "/clusters/root:provider/apis/broker.platform-mesh.io/v1alpha1/namespaces/default/acceptapis",
            Some("application/json"),
            json!({"apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "AcceptAPI",
                "metadata": {"name": "configmaps"},
                "spec": {"gvr": {"group": "", "version": "v1", "resource": "configmaps"}, "filters": []}})
            .to_string()
            .into_bytes(),
        )
        .await
        .expect("acceptapi");
    assert_eq!(accept.status.as_u16(), 201, "{}", accept.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_elect_one_leader_and_the_other_takes_over() {
    let server = Server::start_with(&["--no-controllers"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let names = ["consumer", "provider", "coordination"].map(String::from);
    let files = broker_workspaces(&server, dir.path(), &names).await;
    let (consumer, provider, coordination) = (&files[0], &files[1], &files[2]);
    let args = [
        "--watch-kind",
        "ConfigMap.v1.core",
        "--consumer-kubeconfig",
        consumer,
        "--provider-kubeconfig",
        provider,
        "--coordination-kubeconfig",
        coordination,
        "--leader-elect",
    ];
    let mut a = Broker::start(&args);
    let mut b = Broker::start(&args);
    for broker in [&a, &b] {
        for probe in ["healthz", "readyz"] {
            let (code, body) = get(&format!("{}/{probe}", broker.probes)).await;
            assert_eq!((code, body.as_str()), (200, "ok"), "/{probe}");
        }
        let (code, _) = get(&format!("{}/nothing", broker.probes)).await;
        assert_eq!(code, 404);
    }
    // Exactly one leads.
    let a_leads = wait_for(60, "a leader", || async {
        match (leads(&a).await, leads(&b).await) {
            (Some(x), Some(y)) if x != y => Some(x),
            _ => None,
        }
    })
    .await;
    let (leader, follower) = if a_leads {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    // The leader's managers report: an AcceptAPI in the provider is reconciled.
    accept_configmaps(&server).await;
    let metrics = leader.metrics.clone();
    wait_for(60, "controller-runtime metrics of the leader", || {
        let metrics = metrics.clone();
        async move {
            let (_, text) = get(&format!("{metrics}/metrics")).await;
            (text.contains("controller_runtime_reconcile_total{")
                && text.contains("workqueue_adds_total{"))
            .then_some(())
        }
    })
    .await;
    // The leader stops (giving the Lease up): the other takes over.
    leader.terminate();
    wait_for(60, "the other broker leading", || async {
        (leads(follower).await == Some(true)).then_some(())
    })
    .await;
}

/// Lists `path` of the server as the admin: the items.
async fn items(server: &Server, path: &str) -> Vec<serde_json::Value> {
    let mut c = server.client().connect().await.expect("connect");
    let r = c.get(path).await.expect("list");
    assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.json());
    r.json()["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_brokers_split_the_consumers_and_the_survivor_takes_over() {
    const CONSUMERS: usize = 12;
    let server = Server::start_with(&["--no-controllers"]);
    let consumers: Vec<String> = (0..CONSUMERS).map(|i| format!("consumer-{i:02}")).collect();
    let mut names = consumers.clone();
    names.extend(["provider".to_string(), "coordination".to_string()]);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = broker_workspaces(&server, dir.path(), &names).await;
    accept_configmaps(&server).await;
    let (consumer_files, provider, coordination) = (
        &files[..CONSUMERS],
        &files[CONSUMERS],
        &files[CONSUMERS + 1],
    );
    let consumer_list = consumer_files.join(",");
    let brokers: Vec<Broker> = ["shard-a", "shard-b"]
        .iter()
        .map(|identity| {
            Broker::start(&[
                "--watch-kind",
                "ConfigMap.v1.core",
                "--consumer-kubeconfig",
                &consumer_list,
                "--provider-kubeconfig",
                provider,
                "--coordination-kubeconfig",
                coordination,
                "--shard-replicas",
                "2",
                "--shard-identity",
                identity,
            ])
        })
        .collect();
    let create_everywhere = |round: usize| {
        let client = server.client();
        let consumers = consumers.clone();
        async move {
            let mut c = client.connect().await.expect("connect");
            for ws in &consumers {
                let r = c
                    .send(
                        Method::POST,
                        &format!("/clusters/root:{ws}/api/v1/namespaces/default/configmaps"),
                        Some("application/json"),
                        json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": format!("order-{round}")}, "data": {"a": "b"}})
                        .to_string()
                        .into_bytes(),
                    )
                    .await
                    .expect("configmap");
                assert_eq!(r.status.as_u16(), 201, "{}", r.json());
            }
        }
    };
    // Copies in the provider of the test's orders (each consumer's kube-root-ca.crt is copied
    // too), by the consumer object they belong to.
    let copies = || async {
        items(&server, "/clusters/root:provider/api/v1/configmaps")
            .await
            .iter()
            .filter_map(|o| {
                let a = &o["metadata"]["annotations"];
                let name = a["broker.platform-mesh.io/consumer-name"].as_str()?;
                name.starts_with("order-").then_some(())?;
                Some(format!(
                    "{} {name}",
                    a["broker.platform-mesh.io/consumer-cluster"].as_str()?,
                ))
            })
            .collect::<std::collections::BTreeSet<String>>()
    };
    // The fence Leases of the consumer clusters, by holder.
    let holders = || async {
        let mut by_holder = std::collections::BTreeMap::<String, usize>::new();
        for lease in items(
            &server,
            "/clusters/root:coordination/apis/coordination.k8s.io/v1/namespaces/default/leases",
        )
        .await
        {
            let name = lease["metadata"]["name"].as_str().unwrap_or_default();
            if name.starts_with("c8c3e66c.platform-mesh.io-consumers-shard-") {
                let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
                *by_holder.entry(holder.to_string()).or_default() += 1;
            }
        }
        by_holder
    };
    create_everywhere(0).await;
    wait_for(90, "a copy of every consumer's first object", || async {
        (copies().await.len() == CONSUMERS).then_some(())
    })
    .await;
    // Both replicas hold a share, together every consumer cluster (12 clusters over 2 replicas:
    // all on one by chance has a probability of 2 in 4,096).
    let shares = wait_for(
        60,
        "the consumer clusters split between both replicas",
        || async {
            let h = holders().await;
            (h.values().sum::<usize>() == CONSUMERS && h.len() == 2).then_some(h)
        },
    )
    .await;
    assert!(
        shares.keys().all(|h| h == "shard-a" || h == "shard-b"),
        "{shares:?}"
    );
    // Exactly one runs the Migration controller.
    let leading = wait_for(60, "one leader among the replicas", || async {
        let mut flags = Vec::new();
        for b in &brokers {
            flags.push(leads(b).await?);
        }
        (flags.iter().filter(|l| **l).count() == 1).then_some(flags)
    })
    .await;
    assert_eq!(leading.len(), 2);
    // One replica dies without giving anything up; the other takes its consumers over.
    let mut brokers = brokers;
    drop(brokers.remove(0));
    create_everywhere(1).await;
    wait_for(120, "a copy of every consumer's second object", || async {
        (copies().await.len() == 2 * CONSUMERS).then_some(())
    })
    .await;
    wait_for(
        60,
        "every consumer cluster held by the survivor",
        || async {
            let h = holders().await;
            (h.get("shard-b") == Some(&CONSUMERS)).then_some(())
        },
    )
    .await;
}

#[test]
fn version_completion_and_json_logs() {
    let version = common::stdout_of(bin().arg("--version"), "--version");
    assert!(
        version.starts_with("platform-mesh ") && version.contains("(commit "),
        "{version}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let script = common::stdout_of(bin().args(["completion", shell]), "completion");
        assert!(script.contains("platform-mesh"), "{shell}: {script}");
        assert!(script.contains("serve"), "{shell} completes subcommands");
    }
}

/// A `serve` process whose stderr lines are collected as they come.
struct Logged {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    address: String,
    _dir: tempfile::TempDir,
}

impl Logged {
    /// Starts `platform-mesh <args> serve <serve_args>` with no RUST_LOG, as a user would, and
    /// waits for its banner (a text line, or a JSON line with the address in its fields).
    fn start(global: &[&str], serve: &[&str]) -> Logged {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = bin()
            .args(global)
            .arg("serve")
            .args(serve)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve");
        let stderr = child.stderr.take().expect("stderr");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (tx, rx) = mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let address = match line.strip_prefix("platform-mesh is serving on https://") {
                        Some(a) => Some(a.trim().to_string()),
                        None => serde_json::from_str::<serde_json::Value>(&line)
                            .ok()
                            .and_then(|v| v["fields"]["address"].as_str().map(String::from)),
                    };
                    lines.lock().expect("lines").push(line);
                    if let Some(a) = address {
                        let _ = tx.send(a);
                    }
                }
            });
        }
        let address = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "no banner within 60 s:\n{}",
                    lines.lock().expect("lines").join("\n")
                )
            });
        Logged {
            child,
            lines,
            address,
            _dir: dir,
        }
    }

    fn client(&self) -> https_client::ClientConfig {
        let pki =
            |f: &str| std::fs::read_to_string(self._dir.path().join("pki").join(f)).expect("pki");
        https_client::ClientConfig::new(
            self.address.parse().expect("address"),
            &pki("ca.crt"),
            Some((&pki("admin.crt"), &pki("admin.key"))),
        )
        .expect("client")
    }

    /// `n` GETs of the ConfigMaps of `default` in root, over one connection, as the admin.
    fn get(&self, n: usize) {
        let client = self.client();
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let mut c = client.connect().await.expect("connect");
            for _ in 0..n {
                let reply = c
                    .get("/api/v1/namespaces/default/configmaps")
                    .await
                    .expect("list");
                assert_eq!(reply.status, 200);
            }
        });
    }

    /// The lines once `done` holds of them (and of the server), failing after `secs` seconds.
    fn lines_when(&self, secs: u64, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let lines = self.lines.lock().expect("lines").clone();
            if done(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "waited {secs} s for {what}:\n{}",
                lines.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The log users get with no flags: startup and what changes, not every request, and a cause
/// said once. (It wrote a line per request at info, and "this kind is not served" for each
/// optional kind every 0.8 s: about 10 lines a second at idle.)
#[test]
fn the_default_log_is_quiet_at_idle_and_under_load() {
    let server = Logged::start(&[], &[]);
    server.get(400);
    // The controllers watch optional kinds (Flux's HelmRelease among them) that are not served
    // here; once their lists have been refused four times, a repeated report would show. The
    // first refusal is said; the runtime's watch back-off (0.8 s, doubling) lists again 0.8,
    // 2.4 and 5.6 s after it. (Requests for a type that is not served are not in the request
    // metrics, as kube-apiserver's, so they cannot be counted there.)
    server.lines_when(60, "the first refused list of helmreleases", |lines| {
        lines
            .iter()
            .any(|l| l.contains("not served") && l.contains("helmreleases"))
    });
    std::thread::sleep(Duration::from_secs(7));
    let lines = server.lines_when(1, "the log", |_| true);
    let requests: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("apiserver::requests"))
        .collect();
    assert_eq!(
        requests.len(),
        0,
        "request lines at the default verbosity: {requests:#?}"
    );
    // Each line without its timestamp: a repeated one is a cause said twice.
    let mut seen = std::collections::HashSet::new();
    for l in &lines {
        let text = l
            .split_once(' ')
            .map_or(l.as_str(), |(_, rest)| rest.trim_start());
        assert!(
            seen.insert(text.to_string()),
            "said twice: {text}\n{}",
            lines.join("\n")
        );
    }
    assert!(
        lines.len() <= 40,
        "{} lines after 400 requests and 8 s at idle:\n{}",
        lines.len(),
        lines.join("\n")
    );
    // The control: at -v 3 each request has its line.
    let verbose = Logged::start(&["-v", "3"], &["--no-controllers"]);
    verbose.get(50);
    verbose.lines_when(30, "a line for each of 50 requests at -v 3", |lines| {
        lines.iter().filter(|l| l.contains("configmaps")).count() >= 50
    });
}

/// `--log-format json` writes only JSON lines, the banner too; at `-v 3` a request's line has
/// its span's fields.
#[test]
fn json_logs_are_only_json_lines_with_the_requests_fields() {
    let server = Logged::start(&["--log-format", "json", "-v", "3"], &["--no-controllers"]);
    server.get(1);
    let lines = server.lines_when(30, "the request's line", |lines| {
        lines.iter().any(|l| l.contains("configmaps"))
    });
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let banner = parsed
        .iter()
        .find(|v| v["fields"]["kubeconfig"].is_string())
        .expect("a banner line with the kubeconfig");
    assert_eq!(
        banner["fields"]["address"],
        server.address.as_str(),
        "{banner}"
    );
    let served = parsed
        .iter()
        .find(|v| v["span"]["resource"] == "configmaps")
        .unwrap_or_else(|| panic!("no request line:\n{}", lines.join("\n")));
    assert_eq!(served["level"], "INFO", "{served}");
    assert_eq!(served["span"]["verb"], "list", "{served}");
    assert_eq!(served["span"]["code"], 200, "{served}");
    assert_eq!(served["span"]["user"], "admin", "{served}");
    assert_eq!(served["span"]["cluster"], "root", "{served}");
    assert!(
        served["span"]["id"]
            .as_str()
            .is_some_and(|id| id.len() >= 32),
        "{served}"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a log that is not a terminal"
    );
}

/// The kubeconfig `serve` writes has two contexts that reach root (`platform-mesh`, the base
/// URL, and `root`): given as the consumers' kubeconfig, root is brokered once, and a copy an
/// earlier broker made under the other context's name is removed. (Each context was a
/// consumer of its own: every object had two copies, and one stayed after a move.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_contexts_reaching_one_workspace_are_one_consumer() {
    use controllers::broker::{provider_name, CONSUMER_CLUSTER, CONSUMER_NAME, GENERIC_FINALIZER};
    let server = Server::start_with(&["--no-controllers"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = broker_workspaces(&server, dir.path(), &["provider".to_string()]).await;
    accept_configmaps(&server).await;
    let kubeconfig = server.kubeconfig.to_string_lossy().into_owned();
    // The current context (`root`) names the cluster; `platform-mesh` is the alias.
    let consumer = format!("consumer#{kubeconfig}+root");
    let alias = format!("consumer#{kubeconfig}+platform-mesh");
    let mut c = server.client().connect().await.expect("connect");
    let stale = provider_name(&alias, "orders");
    let r = c
        .post_json(
            "/clusters/root:provider/api/v1/namespaces/default/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": stale, "finalizers": [GENERIC_FINALIZER],
                    "annotations": {CONSUMER_CLUSTER: alias, CONSUMER_NAME: "orders"}},
                "data": {"size": "1"}}),
        )
        .await
        .expect("stale copy");
    assert_eq!(r.status.as_u16(), 201, "{}", r.json());
    let r = c
        .post_json(
            "/clusters/root/api/v1/namespaces/default/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "orders"}, "data": {"size": "1"}}),
        )
        .await
        .expect("consumer object");
    assert_eq!(r.status.as_u16(), 201, "{}", r.json());
    let _broker = Broker::start(&[
        "--watch-kind",
        "ConfigMap.v1.core",
        "--consumer-kubeconfig",
        &kubeconfig,
        "--provider-kubeconfig",
        &files[0],
    ]);
    let copies = || async {
        let mut names: Vec<String> = items(
            &server,
            "/clusters/root:provider/api/v1/namespaces/default/configmaps",
        )
        .await
        .iter()
        .filter(|o| o["metadata"]["annotations"][CONSUMER_NAME] == "orders")
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect();
        names.sort();
        names
    };
    let placed = provider_name(&consumer, "orders");
    wait_for(60, "one copy of orders, the stale one gone", || async {
        (copies().await == [placed.clone()]).then_some(())
    })
    .await;
    // Brokered under root's name only: the consumer object names one provider.
    let orders = items(
        &server,
        "/clusters/root/api/v1/namespaces/default/configmaps",
    )
    .await
    .into_iter()
    .find(|o| o["metadata"]["name"] == "orders")
    .expect("orders");
    assert!(
        orders["metadata"]["annotations"]["broker.platform-mesh.io/provider-cluster"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("provider#{}+", files[0]))),
        "{orders}"
    );
}
