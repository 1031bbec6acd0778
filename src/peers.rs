//! The real kube-apiserver as a peer of the tests and of `platform-mesh bench --only kube`: the
//! release pinned in `tests/peers/go/go.mod`, built by `scripts/peers` into `target/peers`
//! together with the etcd it is built and tested with, and started here on free loopback ports
//! with certificates from the `certs` crate. (The tests include this file with `#[path]`.)
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
            "{} is missing: `scripts/peers` builds it from tests/peers/go (k8s.io/kubernetes {KUBERNETES_VERSION}) \
             and `scripts/test` runs that first",
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

impl KubeApiserver {
    /// Starts etcd and kube-apiserver with their files in `dir` and waits until kube-apiserver
    /// is ready.
    pub fn start(dir: &Path) -> anyhow::Result<KubeApiserver> {
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
        let mut peer = KubeApiserver {
            apiserver,
            etcd,
            address,
            pki,
            front_proxy,
            admin_kubeconfig,
            etcd_url,
            dir: dir.to_path_buf(),
        };
        peer.wait_ready()?;
        Ok(peer)
    }

    /// Polls `/readyz` (from a thread of its own, so that async tests may start a peer too);
    /// fails at once when etcd or kube-apiserver exits.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = self.client()?;
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
                    return Err(anyhow!(
                        "{name} exited ({status}) before kube-apiserver was ready; its errors are above"
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "kube-apiserver {KUBERNETES_VERSION} did not become ready in 120 s"
                ));
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
    pub fn client(&self) -> anyhow::Result<apiserver::client::ClientConfig> {
        Ok(apiserver::client::ClientConfig::new(
            self.address,
            self.pki.ca_cert_pem(),
            Some((self.pki.admin_cert_pem(), self.pki.admin_key_pem())),
        )?)
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
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}
