//! Who may do what where: the workspace tree and logical clusters ([`tenancy`]), authentication
//! (client certificates, tokens, service accounts, per-workspace JWT issuers), RBAC and the
//! authorizers built on it, and the per-tenant budgets.

pub mod authn;
pub mod authz;
pub mod budget;
pub mod rbac;
pub mod serviceaccounts;
pub mod tenancy;
pub mod workspace_authn;
