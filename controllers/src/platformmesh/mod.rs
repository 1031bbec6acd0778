//! The PlatformMesh reconciler: from a PlatformMesh object and its profile to the objects of the
//! infra, runtime and kcp clusters. `vars` builds the template data in the documented order.

pub mod controller;
pub mod deploy;
pub mod deployment;
pub mod features;
pub mod kcp;
pub mod manifests;
pub mod providersecret;
pub mod render;
pub mod review;
pub mod vars;
pub mod wait;
