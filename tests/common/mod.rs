//! Shared helpers of the whole-binary tests: start `platform-mesh serve` as a child process on a
//! free port with its own data directory, and run kubectl against it.

#![allow(dead_code)]

pub mod kube_apiserver;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `platform-mesh serve` child process.
pub struct Server {
    pub child: Child,
    pub address: SocketAddr,
    pub data_dir: PathBuf,
    pub kubeconfig: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server with a fresh data directory.
    pub fn start() -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let mut s = Server::start_in(&dir, "127.0.0.1:0");
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server with a fresh data directory and extra `serve` flags.
    pub fn start_with(extra: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let mut s = Server::spawn(&dir, "127.0.0.1:0", extra);
        s._tmp = Some(tmp);
        s
    }

    /// Starts another replica of `of` (same flags `extra`, e.g. the same etcd): a fresh data
    /// directory holding a copy of `of`'s certificates and keys, as replicas share their secrets.
    pub fn start_replica(of: &Server, extra: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        of.copy_pki_to(&dir);
        let mut s = Server::spawn(&dir, "127.0.0.1:0", extra);
        s._tmp = Some(tmp);
        s
    }

    /// Copies this server's certificates and keys into the data directory `dir`, as replicas
    /// share their secrets.
    fn copy_pki_to(&self, dir: &Path) {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        for entry in std::fs::read_dir(self.data_dir.join("pki")).expect("read pki") {
            let entry = entry.expect("pki entry");
            std::fs::copy(entry.path(), pki.join(entry.file_name())).expect("copy pki file");
        }
    }

    /// A kube client with the admin kubeconfig.
    /// (At the server's base address: the kubeconfig's current context is the `root`
    /// workspace, and callers name `/clusters/...` paths themselves.)
    pub async fn kube(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("kube config");
        config.cluster_url = self.url().parse().expect("url");
        kube::Client::try_from(config).expect("kube client")
    }

    /// Starts a server on an existing (or new) data directory.
    pub fn start_in(data_dir: &Path, listen: &str) -> Server {
        Server::spawn(data_dir, listen, &[])
    }

    /// Starts a server on an existing (or new) data directory with extra `serve` flags.
    pub fn start_in_with(data_dir: &Path, extra: &[&str]) -> Server {
        Server::spawn(data_dir, "127.0.0.1:0", extra)
    }

    /// Starts a server (a replica of `of` when given, see [`Server::start_replica`]) whose log,
    /// filtered by `rust_log`, goes to the file `log` instead of the test's stderr.
    pub fn start_logged(of: Option<&Server>, extra: &[&str], rust_log: &str, log: &Path) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        if let Some(of) = of {
            of.copy_pki_to(&dir);
        }
        let mut s = Server::spawn_logging(&dir, "127.0.0.1:0", extra, Some(rust_log), Some(log));
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server in `data_dir` as users run it: the default log (no RUST_LOG), written
    /// to the file `log`, and the flags `extra`.
    pub fn start_as_users_run(data_dir: &Path, extra: &[&str], log: &Path) -> Server {
        Server::spawn_logging(data_dir, "127.0.0.1:0", extra, None, Some(log))
    }

    fn spawn(data_dir: &Path, listen: &str, extra: &[&str]) -> Server {
        Server::spawn_logging(data_dir, listen, extra, Some("warn"), None)
    }

    fn spawn_logging(
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
        rust_log: Option<&str>,
        log: Option<&Path>,
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_platform-mesh"));
        command
            .args(["serve", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            .args(extra);
        match rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start platform-mesh");
        let sink = log.map(|p| std::fs::File::create(p).expect("create the server's log file"));
        let addr = reported_address_to(
            &mut child,
            "platform-mesh is serving on https://",
            "server",
            sink,
        );
        Server {
            child,
            address: addr.parse().expect("address"),
            data_dir: data_dir.to_path_buf(),
            kubeconfig: data_dir.join("admin.kubeconfig"),
            _tmp: None,
        }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Starts the server again (after [`Server::kill`]) on the same address and data directory,
    /// with the flags `extra`, as a supervisor would restart a crashed process.
    pub fn restart(&mut self, extra: &[&str]) {
        self.kill();
        let mut again = Server::spawn(&self.data_dir, &self.address.to_string(), extra);
        // `again` now holds the dead process and is dropped with it.
        std::mem::swap(&mut self.child, &mut again.child);
    }

    /// Kills the process with SIGKILL and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the server as an orchestrator does (SIGTERM) and waits until it has exited.
    #[allow(dead_code)]
    pub fn terminate(&mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        // A server that does not stop on SIGTERM fails the test (and is killed) instead of
        // hanging it.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                other => {
                    self.kill();
                    panic!("the server did not exit within 60 s of SIGTERM ({other:?})");
                }
            }
        }
    }

    /// A client with the admin certificate.
    pub fn client(&self) -> https_client::ClientConfig {
        let pki = self.data_dir.join("pki");
        let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("read pki file");
        let (ca, cert, key) = (read("ca.crt"), read("admin.crt"), read("admin.key"));
        https_client::ClientConfig::new(self.address, &ca, Some((&cert, &key)))
            .expect("client config")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` and returns its stdout, failing the test (with both outputs) if it fails.
pub fn stdout_of(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `platform-mesh bench <args>` and returns its report, failing the test if it fails.
pub fn bench(args: &[&str]) -> String {
    stdout_of(
        Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
            .arg("bench")
            .args(args)
            .env("RUST_LOG", "error"),
        "bench",
    )
}

/// Every versioned kubectl of the machine image: `kubectl.1.NN` beside the binary `kubectl` resolves to.
pub fn kubectl_binary(version: &str) -> Option<PathBuf> {
    let which = Command::new("sh")
        .args(["-c", "readlink -f \"$(command -v kubectl)\""])
        .output()
        .ok()?;
    let resolved = PathBuf::from(String::from_utf8_lossy(&which.stdout).trim());
    let candidate = resolved.parent()?.join(format!("kubectl.{version}"));
    candidate.exists().then_some(candidate)
}

/// Runs kubectl with its own HOME and cache so tests never share discovery caches.
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub home: tempfile::TempDir,
}

impl Kubectl {
    pub fn new(bin: PathBuf, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
            home: tempfile::tempdir().expect("home"),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("HOME", self.home.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.home.path().join("cache"))
            .arg("--request-timeout=60s")
            .args(args);
        c
    }

    /// Runs and returns the output, whatever the exit code.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run kubectl")
    }

    /// Runs with stdin.
    pub fn run_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("kubectl output")
    }

    /// Runs and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run_stdin(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Options of an in-process server on a free port, on the memory store, with its files in
/// `dir/data`.
fn memory_options(dir: &Path) -> apiserver::server::ServeOptions {
    let mut opts = apiserver::server::ServeOptions::new(
        "127.0.0.1:0".parse().expect("addr"),
        dir.join("data"),
    );
    opts.store = apiserver::server::StoreKind::Memory;
    opts
}

/// A server started in this process on the memory store, with an admin client; the temporary
/// data directory lives as long as the returned guard.
pub async fn in_process() -> (
    apiserver::server::RunningServer,
    https_client::ClientConfig,
    tempfile::TempDir,
) {
    in_process_with(|_| {}).await
}

/// [`in_process`] with adjusted options.
pub async fn in_process_with(
    adjust: impl FnOnce(&mut apiserver::server::ServeOptions),
) -> (
    apiserver::server::RunningServer,
    https_client::ClientConfig,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = memory_options(dir.path());
    adjust(&mut opts);
    let pki = opts.data_dir.join("pki");
    let running = apiserver::server::start(opts).await.expect("start");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("pki");
    let client = https_client::ClientConfig::new(
        running.address,
        &read("ca.crt"),
        Some((&read("admin.crt"), &read("admin.key"))),
    )
    .expect("client");
    (running, client, dir)
}

/// A server started in this process on the memory store, with kube-rs clients of any workspace
/// or virtual-workspace URL as its admin.
pub struct KubeEnv {
    pub server: apiserver::server::RunningServer,
    pub config: kube::Config,
    pub dir: tempfile::TempDir,
}

impl KubeEnv {
    pub async fn start() -> KubeEnv {
        Self::start_with(|_| {}).await
    }

    /// [`KubeEnv::start`] with adjusted options.
    pub async fn start_with(adjust: impl FnOnce(&mut apiserver::server::ServeOptions)) -> KubeEnv {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = memory_options(dir.path());
        adjust(&mut opts);
        let server = apiserver::server::start(opts).await.expect("start");
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        KubeEnv {
            server,
            config,
            dir,
        }
    }

    /// A client whose base URL is `url` (a workspace or a virtual workspace URL).
    pub fn client_at(&self, url: &str) -> kube::Client {
        let mut c = self.config.clone();
        c.cluster_url = url.parse().expect("url");
        kube::Client::try_from(c).expect("client")
    }

    /// A client of workspace `path`.
    pub fn client(&self, path: &str) -> kube::Client {
        self.client_at(&format!("https://{}/clusters/{path}", self.server.address))
    }

    /// Creates workspace `name` under `parent` with type `ty` (a name in `root`, or
    /// `<path>:<name>`), waits until it is Ready, and returns its logical cluster name.
    pub async fn workspace(&self, parent: &str, name: &str, ty: &str) -> String {
        use kube::api::{Api, DynamicObject, PostParams};
        let ar = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("tenancy.kcp.io", "v1alpha1", "Workspace"),
            "workspaces",
        );
        let api: Api<DynamicObject> = Api::all_with(self.client(parent), &ar);
        let ty = match ty.rsplit_once(':') {
            Some((path, n)) => serde_json::json!({"name": n, "path": path}),
            None => serde_json::json!({"name": ty}),
        };
        let ws: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"type": ty},
        }))
        .expect("workspace");
        api.create(&PostParams::default(), &ws)
            .await
            .unwrap_or_else(|e| panic!("create workspace {parent}:{name}: {e}"));
        for _ in 0..200 {
            let got = api.get(name).await.expect("get workspace");
            if got.data["status"]["phase"] == "Ready" {
                return got.data["spec"]["cluster"]
                    .as_str()
                    .expect("cluster")
                    .to_string();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("workspace {parent}:{name} never became Ready");
    }
}

/// What follows `prefix` on the first stderr line of `child` that starts with it, or whose JSON
/// message does (the address a server reports); every other line is passed on to the test's stderr, marked `tag`.
fn reported_address(child: &mut Child, prefix: &'static str, tag: &'static str) -> String {
    reported_address_to(child, prefix, tag, None)
}

/// [`reported_address`], the other lines going to `sink` when given (else the test's stderr).
fn reported_address_to(
    child: &mut Child,
    prefix: &'static str,
    tag: &'static str,
    mut sink: Option<std::fs::File>,
) -> String {
    use std::io::Write as _;
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent {
                // The banner as a text line, or as the message of a JSON line
                // (`--log-format json`).
                let message = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v["fields"]["message"].as_str().map(String::from));
                if let Some(rest) = message.as_deref().unwrap_or(&line).strip_prefix(prefix) {
                    let _ = tx.send(rest.trim().to_string());
                    sent = true;
                    continue;
                }
            }
            match sink.as_mut() {
                Some(file) => {
                    let _ = writeln!(file, "{line}");
                }
                None => eprintln!("[{tag}] {line}"),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the {tag} did not report its address"))
}

/// A running `platform-mesh virtual-workspaces`, stopped when dropped.
pub struct VirtualWorkspaces {
    child: Child,
    /// `host:port` it serves on.
    pub address: String,
}

impl Drop for VirtualWorkspaces {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `platform-mesh virtual-workspaces` in front of the kcp of `kcp_kubeconfig`, with its
/// files in `data_dir` and `extra` flags, and waits until it serves.
pub fn start_virtual_workspaces(
    kcp_kubeconfig: &Path,
    data_dir: &Path,
    extra: &[&str],
) -> VirtualWorkspaces {
    let mut child = Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
        .args([
            "virtual-workspaces",
            "--listen",
            "127.0.0.1:0",
            "--kcp-kubeconfig",
        ])
        .arg(kcp_kubeconfig)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start platform-mesh virtual-workspaces");
    let reported = reported_address(
        &mut child,
        "platform-mesh virtual workspaces are serving on https://",
        "extension",
    );
    let address = reported.split('/').next().unwrap_or_default().to_string();
    VirtualWorkspaces { child, address }
}

/// `(status, JSON body)` of one request to the server at `address` (whose serving certificate
/// `ca` signs) with `token` as its bearer token and no client certificate; `body` is sent as
/// JSON unless it is null.
pub async fn with_bearer(
    address: std::net::SocketAddr,
    ca: &str,
    token: &str,
    method: http::Method,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let client = https_client::ClientConfig::new(address, ca, None).expect("client");
    let mut conn = client.connect().await.expect("connect");
    let auth = format!("Bearer {token}");
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let reply = conn
        .send_with_headers(
            method,
            path,
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
                ("accept", "application/json"),
            ],
            body,
        )
        .await
        .expect("request");
    (reply.status.as_u16(), reply.json())
}

/// Runs `cmd` (stdout and stderr captured) and waits for it to exit, killing it and failing
/// after `secs` seconds: for commands that must stop by themselves (e.g. refusing flags).
pub fn exits_within(cmd: &mut Command, secs: u64) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    // Drain both pipes on threads so that a chatty child cannot block on a full pipe.
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} was still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}
