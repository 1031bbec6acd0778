//! The real kube-apiserver as a test peer (`src/peers.rs`, shared with `platform-mesh bench`),
//! each in a temporary directory of its own. A missing peer fails the test, naming what builds
//! it: nothing is skipped silently.

#[path = "../../src/peers.rs"]
mod peers;

use std::path::PathBuf;

#[allow(unused_imports)]
pub use peers::KUBERNETES_VERSION;

/// The path of a Go peer built by `scripts/peers`.
pub fn peer_binary(name: &str) -> PathBuf {
    peers::peer_binary(name).unwrap_or_else(|e| panic!("{e}"))
}

/// A running etcd + kube-apiserver pair and its directory.
pub struct KubeApiserver {
    peer: peers::KubeApiserver,
    // Dropped after the peer (fields drop in order): the processes stop before their files go.
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for KubeApiserver {
    type Target = peers::KubeApiserver;
    fn deref(&self) -> &Self::Target {
        &self.peer
    }
}

impl std::ops::DerefMut for KubeApiserver {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.peer
    }
}

impl KubeApiserver {
    /// Starts etcd and kube-apiserver and waits until kube-apiserver is ready.
    pub fn start() -> KubeApiserver {
        Self::start_with(&[])
    }

    /// [`KubeApiserver::start`] with more kube-apiserver flags.
    #[allow(dead_code)]
    pub fn start_with(extra: &[String]) -> KubeApiserver {
        let dir = tempfile::tempdir().expect("tempdir");
        let peer =
            peers::KubeApiserver::start_with(dir.path(), extra).unwrap_or_else(|e| panic!("{e:#}"));
        KubeApiserver { peer, _dir: dir }
    }

    /// A client with the admin certificate.
    pub fn client(&self) -> https_client::ClientConfig {
        self.peer.client().expect("client config")
    }

    /// Writes a kubeconfig for `user` in `groups` (a client certificate of kube-apiserver's CA).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        self.peer
            .user_kubeconfig(user, groups)
            .expect("user kubeconfig")
    }
}

#[allow(unused_imports)]
pub use peers::KCP_VERSION;

/// A running kcp (one root shard) and its directory.
pub struct Kcp {
    peer: peers::Kcp,
    // Dropped after the peer: the process stops before its files go.
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Kcp {
    type Target = peers::Kcp;
    fn deref(&self) -> &Self::Target {
        &self.peer
    }
}

impl Kcp {
    /// Starts kcp and waits until it is ready.
    pub async fn start() -> Kcp {
        Self::start_with(&[]).await
    }

    /// [`Kcp::start`] with more flags for kcp.
    #[allow(dead_code)]
    pub async fn start_with(extra: &[String]) -> Kcp {
        let dir = tempfile::tempdir().expect("tempdir");
        let peer = peers::Kcp::start_ready_with(dir.path(), extra)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        Kcp { peer, _dir: dir }
    }

    /// The bearer token of `user` (`kcp-admin`, or the non-admin `user`) in kcp's
    /// admin.kubeconfig.
    #[allow(dead_code)]
    pub fn token(&self, user: &str) -> String {
        let text = std::fs::read_to_string(&self.admin_kubeconfig).expect("kcp admin.kubeconfig");
        let kubeconfig: serde_json::Value = serde_saphyr::from_str(&text).expect("kubeconfig");
        kubeconfig["users"]
            .as_array()
            .and_then(|users| users.iter().find(|u| u["name"] == user))
            .and_then(|u| u["user"]["token"].as_str())
            .unwrap_or_else(|| panic!("no token of {user} in kcp's admin.kubeconfig"))
            .to_string()
    }
}
