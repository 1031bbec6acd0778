//! What answers a request: the exchange a request becomes ([`exchange`]), the filters it
//! passes ([`filters`]), the router ([`router`]), and what it routes to: a workspace's own API
//! ([`workspaces`]) with the handlers of each verb, the non-resource paths, the access and token
//! reviews, the admission webhooks, and the virtual workspaces ([`virtual_workspaces`]) with
//! Platform Mesh's computed views ([`views`]).

pub mod exchange;
pub mod filters;
pub mod handlers;
pub mod nonresource;
pub mod reviews;
pub mod router;
pub mod views;
pub mod virtual_workspaces;
pub mod webhook;
pub mod workspaces;
