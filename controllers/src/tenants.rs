//! The controllers of the workspace tree, run over every engaged workspace: Account,
//! AccountInfo and Provider.

use std::sync::Arc;

use crate::platformmesh::kcp::Kcp;
use crate::runtime::{Manager, ManagerError};
use crate::{account, provider};

/// Adds the Account, AccountInfo and Provider controllers to `manager`, each with `workers`
/// concurrent reconciles, reaching workspaces other than a request's through `kcp`.
pub fn add(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    manager.add(account::controller(kcp.clone(), workers))?;
    manager.add(account::info_controller(workers))?;
    manager.add(provider::controller(kcp, workers))?;
    Ok(())
}
