//! The controllers of the workspace tree, run over every engaged workspace: Account,
//! AccountInfo and Provider.

use std::sync::Arc;

use crate::platformmesh::kcp::Kcp;
use crate::runtime::{Manager, ManagerError};
use crate::{account, provider};

/// Adds the Account, AccountInfo and Provider controllers to `manager`, each with `workers`
/// concurrent reconciles, reaching workspaces other than a request's through `kcp`.
pub fn add(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    add_accounts(manager, kcp.clone(), workers)?;
    add_providers(manager, kcp, workers)
}

/// Adds the Account and AccountInfo controllers (the kinds of the `core.platform-mesh.io`
/// export).
pub fn add_accounts(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    manager.add(account::controller(kcp, workers))?;
    manager.add(account::info_controller(workers))
}

/// Adds the Provider controller (the kind of the `providers.platform-mesh.io` export).
pub fn add_providers(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    manager.add(provider::controller(kcp, workers))
}
