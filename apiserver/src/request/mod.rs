//! What is read from the request itself, before anything is looked up: the request's
//! attributes (verb, group, resource, workspace path), its query parameters, content
//! negotiation and the identity the connection presented.

pub mod identity;
pub mod negotiation;
pub mod query;
pub mod request_info;
