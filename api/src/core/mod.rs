//! The `core.platform-mesh.io/v1alpha1` API group.
//! Contains PlatformMesh (operator) and Account / AccountInfo (account operator).

pub mod account;
pub mod platform_mesh;

pub use account::*;
pub use platform_mesh::*;
