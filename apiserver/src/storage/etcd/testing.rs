//! A real etcd for tests and benchmarks: one `etcd` process on loopback ports with its own data
//! directory, which can be killed (SIGKILL) and restarted on the same data and ports.
//!
//! The binary is `$ETCD_BIN`, else `etcd` on the `PATH` (Debian's `etcd-server`).
//!
//! [`EtcdProcess::start_tls`] starts one that serves HTTPS only and asks every client for a
//! certificate signed by its own CA (the files are in [`EtcdProcess::pki_dir`]).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{EtcdOptions, EtcdStore, EtcdTls};

/// Why an etcd for tests could not be had.
#[derive(Debug, thiserror::Error)]
pub enum EtcdProcessError {
    /// Its directory, ports or log file could not be had.
    #[error("preparing etcd: {0}")]
    Io(#[from] std::io::Error),
    /// Its certificates could not be made.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// The binary could not be run.
    #[error("cannot run {bin:?} ({source}): install etcd (Debian: apt-get install etcd-server) or set ETCD_BIN")]
    Spawn {
        /// The binary tried.
        bin: String,
        /// Why it did not run.
        #[source]
        source: std::io::Error,
    },
    /// It exited while starting.
    #[error("etcd exited with {status} during start-up; its log:\n{log}")]
    Exited {
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its log.
        log: String,
    },
    /// It did not answer a read in time.
    #[error("etcd did not become ready within 30s ({last_error}); its log:\n{log}")]
    NotReady {
        /// The last failure of the readiness read.
        last_error: String,
        /// Its log.
        log: String,
    },
    /// A store could not connect to it.
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

/// A running (or killed) etcd.
pub struct EtcdProcess {
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    tls: Option<certs::Pki>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdProcess {
    /// Starts a fresh, empty etcd and waits until it serves requests.
    pub async fn start() -> Result<Self, EtcdProcessError> {
        Self::start_with(false).await
    }

    /// Starts a fresh etcd serving HTTPS with client-certificate authentication.
    pub async fn start_tls() -> Result<Self, EtcdProcessError> {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> Result<Self, EtcdProcessError> {
        let dir = tempfile::tempdir()?;
        let tls = match tls {
            true => Some(certs::Pki::load_or_create(&dir.path().join("pki"), &[])?),
            false => None,
        };
        let mut etcd = EtcdProcess {
            dir,
            client_port: free_port()?,
            peer_port: free_port()?,
            child: None,
            tls,
        };
        etcd.restart().await?;
        Ok(etcd)
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// With TLS: the directory holding `ca.crt` (signs etcd's certificate and accepted client
    /// certificates), `serving.crt`/`serving.key` (etcd's) and `admin.crt`/`admin.key` (a client's).
    pub fn pki_dir(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|p| p.dir().to_path_buf())
    }

    /// Store options for this etcd with the given key prefix.
    pub fn options(&self, prefix: &str) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.endpoint()],
            prefix: prefix.to_string(),
            request_timeout: Duration::from_secs(5),
            tls: self.tls.as_ref().map(|p| EtcdTls {
                ca_pem: p.ca_cert_pem().as_bytes().to_vec(),
                client: Some((
                    p.admin_cert_pem().as_bytes().to_vec(),
                    p.admin_key_pem().as_bytes().to_vec(),
                )),
            }),
            ..EtcdOptions::default()
        }
    }

    /// Connects a store under `prefix`.
    pub async fn store(&self, prefix: &str) -> Result<EtcdStore, EtcdProcessError> {
        Ok(EtcdStore::connect(self.options(prefix)).await?)
    }

    /// The process id while etcd runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Kills etcd with SIGKILL (no clean shutdown) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd (again) on the same data directory and ports, and waits until it answers.
    pub async fn restart(&mut self) -> Result<(), EtcdProcessError> {
        self.kill();
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(&bin);
        if let Some(dir) = self.pki_dir() {
            command
                .arg(format!("--cert-file={}", dir.join("serving.crt").display()))
                .arg(format!("--key-file={}", dir.join("serving.key").display()))
                .arg(format!(
                    "--trusted-ca-file={}",
                    dir.join("ca.crt").display()
                ))
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--log-level=error")
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| EtcdProcessError::Spawn {
                bin: bin.clone(),
                source,
            })?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), EtcdProcessError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("127.0.0.1:{}", self.client_port);
        let mut last_error = String::from("not listening");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    return Err(EtcdProcessError::Exited {
                        status,
                        log: read_log(&self.log_path()),
                    });
                }
            }
            if TcpStream::connect(&addr).is_ok() {
                // Listening; now wait until it has a leader and answers reads.
                use crate::storage::Store;
                match EtcdStore::connect(self.options("")).await {
                    Ok(store) => match store.get("/ready-probe").await {
                        Ok(_) => return Ok(()),
                        Err(e) => last_error = e.to_string(),
                    },
                    Err(e) => last_error = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                return Err(EtcdProcessError::NotReady {
                    last_error,
                    log: read_log(&self.log_path()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
