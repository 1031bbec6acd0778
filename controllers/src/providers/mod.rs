//! Cluster providers: where the clusters a manager engages come from (kubeconfig files and
//! Secrets, kcp APIExport virtual workspaces, kcp workspace paths, a fixed list).

pub mod fixed;
pub mod kcp;
pub mod kubeconfig;

pub use fixed::FixedClusters;
pub use kubeconfig::KubeconfigProvider;
