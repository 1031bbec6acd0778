//! What answers a request once it is authenticated and authorized: the request router
//! ([`dispatch`]), the handlers of each verb, the access and token reviews, the admission
//! webhooks, and the virtual workspaces (the Platform Mesh views and the lifecycle views).

pub mod dispatch;
pub mod handlers;
pub mod lifecycle_vw;
pub mod reviews;
pub mod views;
pub mod webhook;
