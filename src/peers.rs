//! The real kube-apiserver and the real kcp as peers of the tests and of `platform-mesh bench
//! --only kube`: kube-apiserver at the release pinned in `tests/peers/go/go.mod`, with the etcd
//! it is built and tested with, and kcp at the release pinned in `tests/peers/kcp/go.mod`, built
//! by `scripts/peers` into `target/peers` and started here on free loopback ports (kube-apiserver
//! with certificates from the `certs` crate, kcp with its own). (The tests include this file
//! with `#[path]`.)
//!
//! The peer is set up as a cluster that extends itself with aggregated APIs and webhooks: a
//! front-proxy CA separate from the client CA, `--requestheader-*` naming the proxy's client
//! certificate, `--proxy-client-*` for the certificate it presents to aggregated servers and
//! RBAC authorization. Service references resolve by the Service (ExternalName included), not
//! by its endpoints, so a Service of type ExternalName naming `localhost` reaches a server of the
//! test.

#![allow(dead_code)]

use anyhow::{anyhow, Context};

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Kubernetes release of the peer, as pinned in `tests/peers/go/go.mod`.
pub const KUBERNETES_VERSION: &str = "v1.34.4";

/// The kcp release of the peer, as pinned in `tests/peers/kcp/go.mod`.
pub const KCP_VERSION: &str = "v0.28.1";

/// The common name of the client certificate kube-apiserver presents to aggregated servers.
pub const PROXY_CLIENT_NAME: &str = "front-proxy-client";

/// The path of a Go peer built by `scripts/peers` (in `$PLATFORM_MESH_PEERS`, else the
/// checkout's `target/peers`); an error naming what to run when it is missing.
pub fn peer_binary(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::var_os("PLATFORM_MESH_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/peers"));
    let path = dir.join(name);
    if !path.is_file() {
        return Err(anyhow!(
            "{} is missing: `scripts/peers` builds it from tests/peers (k8s.io/kubernetes {KUBERNETES_VERSION}, \
             kcp {KCP_VERSION}) and `scripts/test` runs that first",
            path.display()
        ));
    }
    Ok(path)
}

/// A free loopback port (bound and released: the peer binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running etcd + kube-apiserver pair.
pub struct KubeApiserver {
    apiserver: Child,
    etcd: Child,
    /// The kube-controller-manager beside it, once started.
    controller_manager: Option<Child>,
    /// The secure address of kube-apiserver.
    pub address: SocketAddr,
    /// kube-apiserver's client CA, serving certificate and an admin (`system:masters`) client.
    pub pki: certs::Pki,
    /// The front-proxy CA: it signs the client certificate kube-apiserver proxies with.
    pub front_proxy: certs::Pki,
    /// A kubeconfig of the admin.
    pub admin_kubeconfig: PathBuf,
    /// The etcd client URL.
    pub etcd_url: String,
    dir: PathBuf,
}

/// Why etcd and kube-apiserver did not come up: one of them exited (perhaps a port taken in
/// between, worth another attempt), or anything else.
enum StartFailure {
    Exited(anyhow::Error),
    Other(anyhow::Error),
}

impl KubeApiserver {
    /// Starts etcd and kube-apiserver with their files in `dir` and waits until kube-apiserver
    /// is ready.
    pub fn start(dir: &Path) -> anyhow::Result<KubeApiserver> {
        Self::start_with(dir, &[])
    }

    /// [`KubeApiserver::start`] with more flags for kube-apiserver (`--authentication-config`).
    ///
    /// Their ports are found free and then handed to them, so another process may take one in
    /// between; when etcd or kube-apiserver exits before kube-apiserver is ready, both are
    /// started again (with other ports and a fresh etcd), up to three times.
    pub fn start_with(dir: &Path, extra: &[String]) -> anyhow::Result<KubeApiserver> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(dir, extra) {
                Err(StartFailure::Exited(e)) if attempt < 3 => {
                    eprintln!("[peers] {e:#}; starting again with other ports");
                    for d in ["etcd", "cert-dir"] {
                        match std::fs::remove_dir_all(dir.join(d)) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e).context("removing a failed attempt's files"),
                        }
                    }
                }
                Err(StartFailure::Exited(e) | StartFailure::Other(e)) => return Err(e),
                Ok(peer) => return Ok(peer),
            }
        }
    }

    fn start_once(dir: &Path, extra: &[String]) -> Result<KubeApiserver, StartFailure> {
        let setup = |e: anyhow::Error| StartFailure::Other(e);
        let mut peer = Self::spawn(dir, extra).map_err(setup)?;
        peer.wait_ready()?;
        Ok(peer)
    }

    /// Starts etcd and kube-apiserver (not waiting for them).
    fn spawn(dir: &Path, extra: &[String]) -> anyhow::Result<KubeApiserver> {
        let pki = certs::Pki::load_or_create(&dir.join("pki"), &[])?;
        let front_proxy = certs::Pki::load_or_create(&dir.join("front-proxy"), &[])?;
        let (proxy_cert, proxy_key) =
            front_proxy.issue_client_certificate(PROXY_CLIENT_NAME, &[], 1)?;
        let fp = dir.join("front-proxy");
        std::fs::write(fp.join("proxy-client.crt"), proxy_cert)?;
        std::fs::write(fp.join("proxy-client.key"), proxy_key)?;

        let (etcd_port, etcd_peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd = Command::new(peer_binary("etcd")?)
            .args(["--name", "peer", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &etcd_url])
            .args(["--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("peer={peer_url}")])
            .args(["--log-level", "error", "--unsafe-no-fsync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting etcd")?;

        let port = free_port()?;
        let p = dir.join("pki");
        let path = |d: &Path, f: &str| d.join(f).display().to_string();
        let mut apiserver = Command::new(peer_binary("kube-apiserver")?)
            .args(["--etcd-servers", &etcd_url])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .args(["--secure-port", &port.to_string()])
            .args(["--cert-dir", &path(dir, "cert-dir")])
            .args(["--tls-cert-file", &path(&p, "serving.crt")])
            .args(["--tls-private-key-file", &path(&p, "serving.key")])
            .args(["--client-ca-file", &path(&p, "ca.crt")])
            // The public half, as a certificate (kube reads public keys from certificates too).
            .args(["--service-account-key-file", &path(&fp, "serving.crt")])
            .args([
                "--service-account-signing-key-file",
                &path(&fp, "serving.key"),
            ])
            .args(["--service-account-issuer", "https://kubernetes.default.svc"])
            .args(["--service-cluster-ip-range", "10.96.0.0/16"])
            .args(["--authorization-mode", "RBAC"])
            .args(["--endpoint-reconciler-type", "none"])
            .args(["--requestheader-client-ca-file", &path(&fp, "ca.crt")])
            .args(["--requestheader-allowed-names", PROXY_CLIENT_NAME])
            .args(["--requestheader-username-headers", "X-Remote-User"])
            .args(["--requestheader-group-headers", "X-Remote-Group"])
            .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
            .args(["--proxy-client-cert-file", &path(&fp, "proxy-client.crt")])
            .args(["--proxy-client-key-file", &path(&fp, "proxy-client.key")])
            .args(["--enable-priority-and-fairness=false", "--v=1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kube-apiserver")?;
        // Its log goes to stderr (a test shows it when it fails), errors only.
        if let Some(stderr) = apiserver.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.starts_with('E') || line.starts_with('F') {
                        eprintln!("[kube-apiserver] {line}");
                    }
                }
            });
        }

        let address: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let mut opts = pki.admin_kubeconfig_options(&format!("https://{address}"));
        opts.cluster_name = "kube".into();
        opts.context_name = "kube".into();
        certs::write_kubeconfig(&admin_kubeconfig, &opts)?;
        Ok(KubeApiserver {
            apiserver,
            etcd,
            controller_manager: None,
            address,
            pki,
            front_proxy,
            admin_kubeconfig,
            etcd_url,
            dir: dir.to_path_buf(),
        })
    }

    /// Polls `/readyz` (from a thread of its own, so that async tests may start a peer too);
    /// fails at once when etcd or kube-apiserver exits.
    fn wait_ready(&mut self) -> Result<(), StartFailure> {
        let client = self.client().map_err(StartFailure::Other)?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            loop {
                let ready = rt.block_on(async {
                    let mut c = client.connect().await.ok()?;
                    let r = c.get("/readyz").await.ok()?;
                    Some(r.status.is_success())
                });
                if ready == Some(true) || tx.send(false).is_err() {
                    let _ = tx.send(true);
                    return;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(true) = rx.recv_timeout(Duration::from_millis(500)) {
                return Ok(());
            }
            for (name, child) in [
                ("etcd", &mut self.etcd),
                ("kube-apiserver", &mut self.apiserver),
            ] {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(StartFailure::Exited(anyhow!(
                        "{name} exited ({status}) before kube-apiserver was ready; its errors are above"
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(StartFailure::Other(anyhow!(
                    "kube-apiserver {KUBERNETES_VERSION} did not become ready in 120 s"
                )));
            }
        }
    }

    /// The process id of kube-apiserver.
    pub fn pid(&self) -> u32 {
        self.apiserver.id()
    }

    /// `https://<address>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// A client with the admin certificate.
    pub fn client(&self) -> anyhow::Result<https_client::ClientConfig> {
        Ok(https_client::ClientConfig::new(
            self.address,
            self.pki.ca_cert_pem(),
            Some((self.pki.admin_cert_pem(), self.pki.admin_key_pem())),
        )?)
    }

    /// Starts the kube-controller-manager of the same release against this kube-apiserver, with
    /// every default controller (namespace deletion, garbage collection, service-account tokens
    /// and the root CA ConfigMaps are its work in a cluster), its log in `kcm.log`. It stops
    /// with kube-apiserver.
    pub fn start_controller_manager(&mut self) -> anyhow::Result<()> {
        let p = self.dir.join("pki");
        let child = Command::new(peer_binary("kube-controller-manager")?)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .arg("--authentication-kubeconfig")
            .arg(&self.admin_kubeconfig)
            .arg("--authorization-kubeconfig")
            .arg(&self.admin_kubeconfig)
            // kube-apiserver verifies tokens with the serving certificate's public key.
            .arg("--service-account-private-key-file")
            .arg(self.dir.join("front-proxy").join(certs::SERVING_KEY_FILE))
            .arg("--root-ca-file")
            .arg(p.join(certs::CA_CERT_FILE))
            .args(["--use-service-account-credentials", "--leader-elect=false"])
            .args(["--secure-port", "0", "--v", "1"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("kcm.log"))?)
            .spawn()
            .context("starting kube-controller-manager")?;
        self.controller_manager = Some(child);
        Ok(())
    }

    /// Writes a kubeconfig for `user` in `groups` (a client certificate of kube-apiserver's CA).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let (cert, key) = self.pki.issue_client_certificate(user, &groups, 1)?;
        let path = self.dir.join(format!("{user}.kubeconfig"));
        let mut opts = self.pki.admin_kubeconfig_options(&self.url());
        opts.cluster_name = "kube".into();
        opts.context_name = "kube".into();
        opts.user_name = user.into();
        opts.client_cert_pem = Some(cert);
        opts.client_key_pem = Some(key);
        certs::write_kubeconfig(&path, &opts)?;
        Ok(path)
    }

    /// The directory of this peer's files (a test or benchmark may add its own).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for KubeApiserver {
    fn drop(&mut self) {
        if let Some(mut kcm) = self.controller_manager.take() {
            let _ = kcm.kill();
            let _ = kcm.wait();
        }
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

/// A running kcp: one root shard with its embedded etcd, its own certificates and an admin
/// kubeconfig (a token of kcp's admin) it writes at start.
pub struct Kcp {
    child: Child,
    /// The shard's secure address.
    pub address: SocketAddr,
    /// kcp's `admin.kubeconfig` (current context: `root`).
    pub admin_kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kcp {
    /// Starts kcp with its files in `dir`; [`Kcp::wait_ready`] waits for it.
    pub fn start(dir: &Path) -> anyhow::Result<Kcp> {
        Self::start_with(dir, &[])
    }

    /// [`Kcp::start`] with more flags for kcp (`--token-auth-file`, `--client-ca-file`).
    pub fn start_with(dir: &Path, extra: &[String]) -> anyhow::Result<Kcp> {
        let bin = peer_binary("kcp")?;
        let root = dir.join("kcp");
        std::fs::create_dir_all(&root)?;
        let port = free_port()?;
        let address: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        // kcp serves with a certificate of a CA it is told about, as an installation's does
        // (kcp-operator gives it its CA): ServiceAccount token Secrets then carry that CA in
        // `ca.crt`, so kubeconfigs made from them (the Provider controller's) reach kcp. On its
        // own, kcp puts its loopback client CA there.
        let pki_dir = dir.join("pki");
        certs::load_or_create(&pki_dir, &[]).context("kcp's certificates")?;
        let chain = dir.join("serving-chain.crt");
        std::fs::write(
            &chain,
            format!(
                "{}{}",
                std::fs::read_to_string(pki_dir.join(certs::SERVING_CERT_FILE))?,
                std::fs::read_to_string(pki_dir.join(certs::CA_CERT_FILE))?
            ),
        )?;
        let child = Command::new(bin)
            .arg("start")
            .arg("--tls-cert-file")
            .arg(&chain)
            .arg("--tls-private-key-file")
            .arg(pki_dir.join(certs::SERVING_KEY_FILE))
            .arg("--root-ca-file")
            .arg(pki_dir.join(certs::CA_CERT_FILE))
            .arg("--root-directory")
            .arg(&root)
            .args(["--bind-address", "127.0.0.1"])
            .args(["--secure-port", &port.to_string()])
            .args(["--shard-external-url", &format!("https://{address}")])
            .args(["--external-hostname", "127.0.0.1"])
            .args(["--embedded-etcd-client-port", &free_port()?.to_string()])
            .args(["--embedded-etcd-peer-port", &free_port()?.to_string()])
            // A non-admin user ("user") in admin.kubeconfig beside the admin.
            .arg("--batteries-included=+user")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("kcp.log"))?)
            .spawn()
            .context("starting kcp")?;
        Ok(Kcp {
            child,
            address,
            admin_kubeconfig: root.join("admin.kubeconfig"),
            dir: dir.to_path_buf(),
        })
    }

    /// Starts kcp and waits until it is ready. Its ports are found free and then handed to kcp,
    /// so another process may take one in between: kcp then exits with "address already in
    /// use", and is started again (with other ports, in a fresh directory), up to three times.
    pub async fn start_ready(dir: &Path) -> anyhow::Result<Kcp> {
        Self::start_ready_with(dir, &[]).await
    }

    /// [`Kcp::start_ready`] with more flags for kcp.
    pub async fn start_ready_with(dir: &Path, extra: &[String]) -> anyhow::Result<Kcp> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut kcp = Kcp::start_with(dir, extra)?;
            match kcp.wait_ready().await {
                Ok(()) => return Ok(kcp),
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    drop(kcp);
                    std::fs::remove_dir_all(dir.join("kcp"))
                        .context("removing the directory of kcp's first attempt")?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until kcp wrote its admin kubeconfig and answers `/readyz` through it; fails at
    /// once when kcp exits, with the end of its log.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(anyhow!(
                    "kcp {KCP_VERSION} exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                ));
            }
            if self.ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "kcp {KCP_VERSION} was not ready in 180 s:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn ready(&self) -> bool {
        let Ok(client) = self.client().await else {
            return false;
        };
        let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
            return false;
        };
        client.request_text(request).await.is_ok()
    }

    /// A client of kcp's admin, at the kubeconfig's server (`/clusters/root`).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.config("root").await?)?)
    }

    /// The client configuration of a context of kcp's admin.kubeconfig (`root`, `base`,
    /// `user`: a token of a user without permissions).
    pub async fn config(&self, context: &str) -> anyhow::Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let options = kube::config::KubeConfigOptions {
            context: Some(context.to_string()),
            ..Default::default()
        };
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?)
    }

    /// The last lines of kcp's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("kcp.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `https://<address>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The serving certificate (with its CA after it) and key kcp was started with.
    pub fn serving_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join("serving-chain.crt"),
            self.dir.join("pki").join(certs::SERVING_KEY_FILE),
        )
    }

    /// The process id of kcp.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Kcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
