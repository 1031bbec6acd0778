//! Cluster providers: where the clusters a manager engages come from (kubeconfig files and
//! Secrets, kcp APIExport virtual workspaces, kcp workspace paths, a fixed list).

pub mod kcp;

pub use mc_runtime::providers::{fixed, kubeconfig, FixedClusters, KubeconfigProvider};
