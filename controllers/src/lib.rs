//! Multi-cluster controller runtime (`runtime`) and the cluster providers it runs over
//! (`providers`: kubeconfig files and Secrets, kcp APIExport endpoint slices, kcp paths).
#![warn(missing_docs)]

pub mod providers;
pub mod runtime;

#[cfg(test)]
pub(crate) mod e2e;
