//! The Platform Mesh reconcilers (`platformmesh`, `account`, `provider`, `broker`, ...) and the kcp
//! cluster providers they run over (`cluster_providers::kcp`: APIExport endpoint slices, workspace paths),
//! on the multi-cluster runtime of the `mc-runtime` crate (re-exported as `runtime`, with its
//! plain-Kubernetes providers under `providers`).

pub mod account;
pub mod broker;
pub mod cluster_providers;
pub mod ensure;
pub mod kcp;
pub mod kubeconfigs;
pub mod objects;
pub mod oci;
pub mod platformmesh;
pub mod provider;
pub mod security;
pub mod subroutines;
pub use mc_runtime as runtime;
pub mod tenants;
