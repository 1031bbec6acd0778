//! The PlatformMesh reconciler: from a PlatformMesh object and its profile to the objects of the
//! infra, runtime and kcp clusters. `vars` builds the template data in the documented order.

pub mod apply;
pub mod controller;
pub mod deployment;
pub mod features;
pub mod gates;
pub mod kcp_setup;
pub mod manifests;
pub mod ocm_resources;
pub mod providersecret;
pub mod render;
pub mod render_cli;
pub mod vars;
pub mod wait;
