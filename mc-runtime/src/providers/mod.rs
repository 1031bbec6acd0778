//! Providers that need nothing but Kubernetes: clusters from kubeconfig files and Secrets, and a
//! fixed list. Providers for other control planes live with the code that knows them.

pub mod fixed;
pub mod kubeconfig;

pub use fixed::FixedClusters;
pub use kubeconfig::KubeconfigProvider;
