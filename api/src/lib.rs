//! Typed Platform Mesh APIs, their generated CRDs and the serving description of every type.
//! One module per API group; `crds` renders CRD manifests, `schemas` kcp APIResourceSchemas,
//! `serving` feeds the API server, `openapi` names the definitions of its OpenAPI documents.

pub mod broker;
pub mod common;
pub mod core;
pub mod crds;
pub mod openapi;
pub mod providers;
pub mod schema;
pub mod schemas;
pub mod serving;

pub use crds::{check_crds, crds, write_crds};
pub use schemas::{check_schemas, write_schemas, SchemaError};
pub use serving::{served_types, ColumnSource, PrinterColumn, ResourceType};

#[cfg(test)]
mod tests {
    mod upstream;
}
