//! Providers that need nothing but Kubernetes: clusters from kubeconfig files and Secrets, and a
//! fixed list; and the watch loop every watch-driven provider follows ([`watched`]). Providers
//! for other control planes live with the code that knows them.

pub mod fixed;
pub mod kubeconfig;
pub mod watched;

pub use fixed::FixedClusters;
pub use kubeconfig::KubeconfigProvider;
pub use watched::{follow, Observed, Watched};
