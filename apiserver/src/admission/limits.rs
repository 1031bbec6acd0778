//! Per-workspace object limit (`--max-objects-per-workspace`, as kcp's per-workspace quota of
//! total objects): a create beyond it is answered 403.
//!
//! Each workspace keeps an upper bound of its object count, raised on every create and never
//! lowered; only when the bound reaches the limit is the workspace counted exactly, so deletes need
//! no bookkeeping and the cost of counting falls only on workspaces at their limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::admission::{Admission, Attributes, Operation, WriteValidation};
use crate::meta::status::{ApiError, GroupResource};
use crate::registry::catalog::{ApiView, Catalog};
use crate::storage::{ListOptions, Store};

/// The object limit of every workspace, with an upper bound of each one's object count.
#[derive(Debug, Default)]
pub struct ObjectLimit {
    /// Objects one workspace may hold; 0 is no limit.
    max: usize,
    bounds: Mutex<HashMap<String, usize>>,
}

impl ObjectLimit {
    /// A limit of `max` objects per workspace (0: none).
    pub fn new(max: usize) -> Self {
        ObjectLimit {
            max,
            bounds: Mutex::default(),
        }
    }

    fn bound(&self, cluster: &str) -> Option<usize> {
        self.bounds.lock().ok()?.get(cluster).copied()
    }

    fn set(&self, cluster: &str, n: usize) {
        if let Ok(mut m) = self.bounds.lock() {
            m.insert(cluster.to_string(), n);
        }
    }

    /// Records one more object in `cluster`.
    pub fn created(&self, cluster: &str) {
        if let Ok(mut m) = self.bounds.lock() {
            if let Some(n) = m.get_mut(cluster) {
                *n += 1;
            }
        }
    }
}

/// Counts the objects of `cluster` (of the types `view` serves), stopping once `stop_at` are
/// found.
async fn count(
    store: &dyn Store,
    view: &ApiView,
    cluster: &str,
    stop_at: usize,
) -> Result<usize, ApiError> {
    let mut prefixes: Vec<String> = view
        .registry
        .resources()
        .iter()
        .map(|r| r.prefix(Some(cluster), None))
        .collect();
    prefixes.sort();
    prefixes.dedup();
    let mut total = 0;
    for prefix in prefixes {
        let mut after: Option<String> = None;
        loop {
            let page = store
                .list(ListOptions {
                    prefix: &prefix,
                    start_after: after.as_deref(),
                    limit: 1000,
                    revision: None,
                })
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            total += page.items.len();
            if total >= stop_at || !page.more {
                break;
            }
            after = page.items.last().map(|kv| kv.key.to_string());
        }
        if total >= stop_at {
            break;
        }
    }
    Ok(total)
}

impl ObjectLimit {
    /// Refuses a create in `cluster` (whose types `view` describes) when the workspace already
    /// holds the most objects allowed.
    pub async fn check_create(
        &self,
        store: &dyn Store,
        view: &ApiView,
        cluster: &str,
        gr: &GroupResource,
        name: &str,
    ) -> Result<(), ApiError> {
        let max = self.max;
        if max == 0 {
            return Ok(());
        }
        let n = match self.bound(cluster) {
            Some(n) if n < max => n,
            _ => {
                let n = count(store, view, cluster, max).await?;
                self.set(cluster, n);
                n
            }
        };
        if n >= max {
            return Err(ApiError::forbidden(format!(
                "{gr} \"{name}\" is forbidden: the workspace holds {n} objects and \
                 --max-objects-per-workspace allows {max}"
            )));
        }
        Ok(())
    }
}

/// The admission plugin of the object limit: a create that is stored (not a dry run) is checked
/// against the limit and raises the workspace's bound, so the bound stays an upper bound even
/// when the create then fails.
pub struct ObjectCountLimit {
    limit: ObjectLimit,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
}

impl ObjectCountLimit {
    /// The limit `limit` over the objects of `store`, whose types `catalog` describes.
    pub fn new(limit: ObjectLimit, store: Arc<dyn Store>, catalog: Arc<Catalog>) -> Self {
        ObjectCountLimit {
            limit,
            store,
            catalog,
        }
    }
}

#[async_trait::async_trait]
impl WriteValidation for ObjectCountLimit {
    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        _obj: &Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if attrs.operation != Operation::Create || attrs.dry_run {
            return Ok(());
        }
        self.limit
            .check_create(
                self.store.as_ref(),
                &self.catalog.view(attrs.cluster),
                attrs.cluster,
                &attrs.resource.gr,
                attrs.name,
            )
            .await?;
        self.limit.created(attrs.cluster);
        Ok(())
    }
}

impl Admission for ObjectCountLimit {}
