//! The bottom layer: the shared vocabulary of the API machinery. Statuses and field errors,
//! names and selectors, JSONPath and Table output, the protobuf and JSON bodies, strategic merge
//! and server-side apply, the structural schema with CEL, metrics, and the audit event model.
//! Nothing here knows about requests, storage or tenancy.

pub mod apply;
pub mod audit;
pub mod body;
pub mod field_error;
pub mod heavy;
pub mod jsonpath;
pub mod metrics;
pub mod names;
pub mod protobuf;
pub mod response;
pub mod schema;
pub mod selectors;
pub mod status;
pub mod strategic_merge;
pub mod table;
