//! The Platform Mesh reconcilers (`platformmesh`, `account`, `provider`, `broker`, ...) and the kcp
//! cluster providers they run over (`providers::kcp`: APIExport endpoint slices, workspace paths),
//! on the multi-cluster runtime of the `mc-runtime` crate (re-exported as `runtime`, with its
//! plain-Kubernetes providers under `providers`).

pub mod account;
pub mod broker;
pub mod ensure;
pub mod lifecycle;
pub mod platformmesh;
pub mod provider;
pub mod providers;
pub mod security;
pub use mc_runtime as runtime;
pub mod tenants;
