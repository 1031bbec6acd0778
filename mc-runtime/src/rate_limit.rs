//! Rate limiters of the work queue: per-item exponential backoff, an overall token bucket, and
//! their combination with the client-go controller defaults (5 ms → 1000 s, 10 qps, burst 100).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Decides how long an item waits before it is retried.
///
/// ```
/// use mc_runtime::{ItemExponentialBackoff, RateLimiter};
/// use std::time::Duration;
/// let b = ItemExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(1000));
/// assert_eq!(b.when(&"x"), Duration::from_millis(5));
/// assert_eq!(b.when(&"x"), Duration::from_millis(10));
/// ```
pub trait RateLimiter<T>: Send + Sync {
    /// The delay before `item` may be processed again; counts a failure.
    fn when(&self, item: &T) -> Duration;
    /// Forgets the failures of `item` (it succeeded).
    fn forget(&self, item: &T);
    /// How many failures of `item` are counted.
    fn retries(&self, item: &T) -> u32;
}

impl<T, L: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<L> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item)
    }

    fn retries(&self, item: &T) -> u32 {
        (**self).retries(item)
    }
}

/// Per-item exponential backoff: `base * 2^failures`, capped at `max`.
///
/// ```
/// use mc_runtime::{ItemExponentialBackoff, RateLimiter};
/// use std::time::Duration;
/// let b = ItemExponentialBackoff::new(Duration::from_millis(5), Duration::from_millis(12));
/// b.when(&1); b.when(&1);
/// assert_eq!(b.when(&1), Duration::from_millis(12));
/// ```
#[derive(Debug)]
pub struct ItemExponentialBackoff<T> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<T, u32>>,
}

impl<T> ItemExponentialBackoff<T> {
    /// Backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemExponentialBackoff {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }
}

/// `base * 2^exp` capped at `max`, without overflow.
fn backoff_delay(base: Duration, max: Duration, exp: u32) -> Duration {
    let factor = 2f64.powi(exp.min(64) as i32);
    let secs = base.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(secs)
    }
}

impl<T: Hash + Eq + Clone + Send> RateLimiter<T> for ItemExponentialBackoff<T> {
    fn when(&self, item: &T) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(item.clone()).or_insert(0);
        let exp = *n;
        *n = n.saturating_add(1);
        backoff_delay(self.base, self.max, exp)
    }

    fn forget(&self, item: &T) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(item);
    }

    fn retries(&self, item: &T) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(item)
            .copied()
            .unwrap_or(0)
    }
}

/// An overall token bucket: `burst` tokens, refilled at `qps` per second. Every `when` takes a
/// token, waiting (a negative balance) when none is left, as Go's `rate.Limiter.Reserve` does.
///
/// ```
/// use mc_runtime::{RateLimiter, TokenBucket};
/// let b = TokenBucket::new(10.0, 1);
/// assert!(RateLimiter::<u8>::when(&b, &0).is_zero());
/// ```
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket of `burst` tokens refilled at `qps` (at least one token, qps above zero).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: if qps > 0.0 { qps } else { f64::MIN_POSITIVE },
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token and returns how long to wait for it.
    pub fn reserve(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.qps).min(self.burst);
        state.1 = now;
        state.0 -= 1.0;
        if state.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.0 / self.qps)
        }
    }
}

impl<T> RateLimiter<T> for TokenBucket {
    fn when(&self, _item: &T) -> Duration {
        self.reserve()
    }

    fn forget(&self, _item: &T) {}

    fn retries(&self, _item: &T) -> u32 {
        0
    }
}

/// The longest delay of several limiters (each of them counts the attempt).
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOfRateLimiter<T> {
    /// Combines `limiters`.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        MaxOfRateLimiter { limiters }
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiters
            .iter()
            .map(|l| l.when(item))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, item: &T) {
        for l in &self.limiters {
            l.forget(item);
        }
    }

    fn retries(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.retries(item))
            .max()
            .unwrap_or(0)
    }
}

/// Base delay of the default per-item backoff.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(5);
/// Cap of the default per-item backoff.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(1000);
/// Refill rate of the default overall bucket.
pub const DEFAULT_QPS: f64 = 10.0;
/// Size of the default overall bucket.
pub const DEFAULT_BURST: u32 = 100;

/// client-go's controller default: per-item 5 ms → 1000 s, overall 10 qps with burst 100.
///
/// ```
/// use mc_runtime::{default_controller_rate_limiter, RateLimiter};
/// let l = default_controller_rate_limiter::<String>();
/// assert_eq!(l.when(&"a".to_string()).as_millis(), 5);
/// ```
pub fn default_controller_rate_limiter<T>() -> MaxOfRateLimiter<T>
where
    T: Hash + Eq + Clone + Send + 'static,
{
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialBackoff::new(
            DEFAULT_BACKOFF_BASE,
            DEFAULT_BACKOFF_MAX,
        )),
        Box::new(TokenBucket::new(DEFAULT_QPS, DEFAULT_BURST)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_item_and_caps() {
        let b = ItemExponentialBackoff::new(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX);
        let delays: Vec<_> = (0..5).map(|_| b.when(&"a").as_millis()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80]);
        assert_eq!(
            b.when(&"b"),
            Duration::from_millis(5),
            "items are independent"
        );
        for _ in 0..40 {
            b.when(&"a");
        }
        assert_eq!(b.when(&"a"), DEFAULT_BACKOFF_MAX);
        assert_eq!(b.retries(&"a"), 46);
        b.forget(&"a");
        assert_eq!(b.retries(&"a"), 0);
        assert_eq!(b.when(&"a"), Duration::from_millis(5));
    }

    #[test]
    fn backoff_never_overflows() {
        assert_eq!(
            backoff_delay(Duration::from_secs(1), Duration::from_secs(7), u32::MAX),
            Duration::from_secs(7)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn token_bucket_allows_burst_then_paces_at_qps() {
        let b = TokenBucket::new(10.0, 100);
        for _ in 0..100 {
            assert_eq!(b.reserve(), Duration::ZERO);
        }
        let next = b.reserve();
        assert!((next.as_secs_f64() - 0.1).abs() < 1e-6, "{next:?}");
        let after = b.reserve();
        assert!((after.as_secs_f64() - 0.2).abs() < 1e-6, "{after:?}");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.reserve(), Duration::ZERO, "refilled after waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn default_limiter_takes_the_longer_delay() {
        let l = default_controller_rate_limiter::<u32>();
        // Different items each take a token: after the burst the bucket dominates.
        for i in 0..100 {
            assert_eq!(l.when(&i), DEFAULT_BACKOFF_BASE);
        }
        assert!(l.when(&1000) >= Duration::from_millis(99));
        // The per-item backoff dominates for one item failing many times.
        tokio::time::advance(Duration::from_secs(100)).await;
        for _ in 0..15 {
            l.when(&7);
        }
        assert!(l.when(&7) >= Duration::from_secs(80));
        assert_eq!(l.retries(&7), 17);
        l.forget(&7);
        assert_eq!(l.retries(&7), 0);
    }
}
