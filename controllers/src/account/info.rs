//! The AccountInfo controller: every AccountInfo carries a finalizer that holds it until no
//! Account is left in its workspace, so an account's description outlives its children's
//! deletion. No conditions (as upstream).

use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};

use super::{account_infos, accounts, AccountError};
use crate::runtime::{Action, ClusterContext, Controller, Reconciler, Request, ResourceKind};
use crate::subroutines::patch_finalizers;

/// Held by every AccountInfo until its workspace has no Accounts.
pub const INFO_FINALIZER: &str = "account.core.platform-mesh.io/info";

/// Reconciles AccountInfos.
pub struct AccountInfoReconciler;

async fn set_finalizers(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizers: Vec<String>,
) -> Result<(), AccountError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    patch_finalizers(api, name, obj, finalizers)
        .await
        .map_err(|source| AccountError::InfoFinalizers {
            name: name.to_string(),
            source,
        })
}

impl Reconciler for AccountInfoReconciler {
    type Error = AccountError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, AccountError> {
        let api: Api<DynamicObject> = ctx.cluster().dynamic_api(&account_infos(), None);
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(info) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        let mut finalizers = info.metadata.finalizers.clone().unwrap_or_default();
        let held = finalizers.iter().any(|f| f == INFO_FINALIZER);
        if info.metadata.deletion_timestamp.is_none() {
            if !held {
                finalizers.push(INFO_FINALIZER.to_string());
                set_finalizers(&api, &info, finalizers).await?;
            }
            return Ok(Action::await_change());
        }
        if !held {
            return Ok(Action::await_change());
        }
        let children = match ctx
            .cluster()
            .dynamic_api(&accounts(), None)
            .list_metadata(&ListParams::default().limit(1))
            .await
        {
            Ok(list) => list.items.len(),
            Err(kube::Error::Api(s)) if s.code == 404 => 0,
            Err(e) => return Err(AccountError::kube("listing child accounts", e)),
        };
        if children > 0 {
            return Ok(Action::requeue_after(Duration::from_secs(2)));
        }
        finalizers.retain(|f| f != INFO_FINALIZER);
        set_finalizers(&api, &info, finalizers).await?;
        Ok(Action::await_change())
    }
}

/// The AccountInfo controller over every engaged workspace.
pub fn info_controller(workers: usize) -> Controller<AccountInfoReconciler> {
    Controller::new("AccountInfoReconciler", AccountInfoReconciler)
        .for_kind(ResourceKind::dynamic(account_infos(), false))
        .workers(workers)
}
