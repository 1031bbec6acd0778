//! Multi-cluster controller runtime (`runtime`) and the cluster providers it runs over
//! (`providers`: kubeconfig files and Secrets, kcp APIExport endpoint slices, kcp paths), and the
//! Platform Mesh reconcilers built on them (`platformmesh`).

pub mod account;
pub mod broker;
pub mod ensure;
pub mod lifecycle;
pub mod platformmesh;
pub mod provider;
pub mod providers;
pub mod runtime;
pub mod tenants;
