//! What one user can make the server hold at once, beyond a request's own lifetime: bytes of
//! list answers the client has not read yet, and open watches. A user past a budget is answered
//! `429 TooManyRequests` with `Retry-After`, as for any other overload, and nothing already held
//! for other users is touched. The unscoped `system:masters` (the platform's own controllers,
//! [`Identity::is_unscoped_admin`]) are exempt; a `system:masters` confined to a workspace is
//! counted like anyone.
//!
//! Budgets are semaphores: a permit travels with the response body and returns when the body is
//! dropped, whether it was sent or the connection went away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::meta::status::ApiError;
use crate::request::identity::Identity;

/// Default `--max-list-bytes-per-user`.
pub const DEFAULT_LIST_BYTES_PER_USER: usize = 256 * 1024 * 1024;
/// Default `--max-list-bytes`: all users together.
pub const DEFAULT_LIST_BYTES: usize = 768 * 1024 * 1024;
/// Default `--max-watches-per-user`.
pub const DEFAULT_WATCHES_PER_USER: usize = 500;

/// List answers are counted in KiB, so a budget of many GiB fits a semaphore.
const UNIT: usize = 1024;
/// Smaller answers are not counted: their cost is the request's own.
const UNCOUNTED_BYTES: usize = 64 * 1024;
/// Users whose budgets are all returned are forgotten once the map grows beyond this.
const KEEP_IDLE_USERS: usize = 1024;

/// Limits of [`Budgets`]; 0 turns a limit off.
#[derive(Clone, Copy, Debug)]
pub struct BudgetLimits {
    /// Bytes of unsent list answers one user may hold.
    pub list_bytes_per_user: usize,
    /// Bytes of unsent list answers all users together may hold.
    pub list_bytes: usize,
    /// Watches one user may have open.
    pub watches_per_user: usize,
}

impl Default for BudgetLimits {
    fn default() -> Self {
        BudgetLimits {
            list_bytes_per_user: DEFAULT_LIST_BYTES_PER_USER,
            list_bytes: DEFAULT_LIST_BYTES,
            watches_per_user: DEFAULT_WATCHES_PER_USER,
        }
    }
}

/// The per-user budgets of one server.
pub struct Budgets {
    limits: BudgetLimits,
    list_total: Arc<Semaphore>,
    users: Mutex<HashMap<String, UserBudget>>,
}

#[derive(Clone)]
struct UserBudget {
    list: Arc<Semaphore>,
    watches: Arc<Semaphore>,
}

/// Permits held by a response until its body is dropped.
pub type Held = Vec<OwnedSemaphorePermit>;

impl Budgets {
    /// Budgets with these limits.
    pub fn new(limits: BudgetLimits) -> Self {
        Budgets {
            limits,
            list_total: Arc::new(Semaphore::new(units(limits.list_bytes))),
            users: Mutex::new(HashMap::new()),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    fn user(&self, who: &Identity) -> UserBudget {
        // An impersonated user's holdings are its impersonator's (see `Identity::budget_key`
        // for who is one user).
        let key = who.charged_to.clone().unwrap_or_else(|| who.budget_key());
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        if users.len() >= KEEP_IDLE_USERS && !users.contains_key(&key) {
            let (list, watches) = (
                units(self.limits.list_bytes_per_user),
                self.limits.watches_per_user,
            );
            users.retain(|_, b| {
                b.list.available_permits() < list || b.watches.available_permits() < watches
            });
        }
        users
            .entry(key)
            .or_insert_with(|| UserBudget {
                list: Arc::new(Semaphore::new(units(self.limits.list_bytes_per_user))),
                watches: Arc::new(Semaphore::new(self.limits.watches_per_user)),
            })
            .clone()
    }

    /// Takes room for a list answer of `bytes` for `who`, or refuses with 429.
    pub fn hold_list(&self, who: Option<&Identity>, bytes: usize) -> Result<Held, ApiError> {
        let Some(who) = who.filter(|w| !w.is_unscoped_admin()) else {
            return Ok(Vec::new());
        };
        if bytes <= UNCOUNTED_BYTES || self.limits.list_bytes_per_user == 0 {
            return Ok(Vec::new());
        }
        let n = u32::try_from(units(bytes)).unwrap_or(u32::MAX);
        let refused = || {
            ApiError::too_many_requests(1).with_message(format!(
                "too many bytes of list answers are waiting to be read: this answer of {bytes} bytes would exceed the limit of {} bytes per user and {} in all; read or close the earlier ones",
                self.limits.list_bytes_per_user, self.limits.list_bytes
            ))
        };
        let mine = self
            .user(who)
            .list
            .try_acquire_many_owned(n)
            .map_err(|_| refused())?;
        let mut held = vec![mine];
        if self.limits.list_bytes > 0 {
            held.push(
                self.list_total
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| refused())?,
            );
        }
        Ok(held)
    }

    /// Takes a watch slot for `who`, or refuses with 429.
    pub fn hold_watch(&self, who: Option<&Identity>) -> Result<Held, ApiError> {
        let Some(who) = who.filter(|w| !w.is_unscoped_admin()) else {
            return Ok(Vec::new());
        };
        if self.limits.watches_per_user == 0 {
            return Ok(Vec::new());
        }
        let permit = self.user(who).watches.try_acquire_owned().map_err(|_| {
            ApiError::too_many_requests(1).with_message(format!(
                "too many open watches: at most {} per user; close some before opening more",
                self.limits.watches_per_user
            ))
        })?;
        Ok(vec![permit])
    }
}

/// Bytes as semaphore permits (KiB, rounded up; at least 1 for a non-zero limit).
fn units(bytes: usize) -> usize {
    bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Identity {
        Identity::new(name, vec!["system:authenticated".into()])
    }

    #[test]
    fn list_answers_are_held_per_user_and_in_all_until_dropped() {
        let b = Budgets::new(BudgetLimits {
            list_bytes_per_user: 1024 * 1024,
            list_bytes: 1536 * 1024,
            watches_per_user: 2,
        });
        let (alice, bob) = (user("alice"), user("bob"));
        let a1 = b.hold_list(Some(&alice), 600 * 1024).expect("first fits");
        let e = b
            .hold_list(Some(&alice), 600 * 1024)
            .expect_err("alice is over");
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        // bob has his own budget, but all together is capped too.
        let b1 = b.hold_list(Some(&bob), 600 * 1024).expect("bob fits");
        assert!(
            b.hold_list(Some(&bob), 400 * 1024).is_err(),
            "over the total"
        );
        // Small answers are not counted; masters are exempt.
        assert!(b.hold_list(Some(&alice), 1000).unwrap().is_empty());
        let admin = Identity::new("admin", vec!["system:masters".into()]);
        assert!(b.hold_list(Some(&admin), 100 << 20).unwrap().is_empty());
        // A `system:masters` confined to one workspace (kcp's scope) is not exempt.
        let mut scoped = Identity::new("alice", vec!["system:masters".into()]);
        scoped.extra.insert(
            crate::request::identity::SCOPES_EXTRA.into(),
            vec!["cluster:a".into()],
        );
        assert_eq!(b.hold_list(Some(&scoped), 100 << 20).unwrap_err().code, 429);
        drop((a1, b1));
        assert!(b.hold_list(Some(&alice), 900 * 1024).is_ok());
    }

    #[test]
    fn watches_are_counted_per_user_and_service_accounts_per_workspace() {
        let b = Budgets::new(BudgetLimits {
            watches_per_user: 2,
            ..BudgetLimits::default()
        });
        let alice = user("alice");
        let w1 = b.hold_watch(Some(&alice)).unwrap();
        let _w2 = b.hold_watch(Some(&alice)).unwrap();
        assert_eq!(b.hold_watch(Some(&alice)).unwrap_err().code, 429);
        drop(w1);
        assert!(b.hold_watch(Some(&alice)).is_ok());
        let mut sa_a = user("system:serviceaccount:default:bot");
        sa_a.home_cluster = Some("a".into());
        let mut sa_b = sa_a.clone();
        sa_b.home_cluster = Some("b".into());
        let _x = (
            b.hold_watch(Some(&sa_a)).unwrap(),
            b.hold_watch(Some(&sa_a)).unwrap(),
        );
        assert!(b.hold_watch(Some(&sa_a)).is_err());
        assert!(
            b.hold_watch(Some(&sa_b)).is_ok(),
            "another workspace's account"
        );
    }
}
