//! The controller work queue: de-duplicating, with delayed and rate-limited adds, never handing
//! one item to two workers at once, and a shutdown that stops handing out work.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::rate_limit::RateLimiter;

/// Counters a queue reports to (see [`crate::Metrics::queue`]).
#[derive(Clone, Debug, Default)]
pub struct QueueMetrics {
    /// Items waiting to be handed out.
    pub depth: Gauge,
    /// Every add, including duplicates that were merged.
    pub adds: Counter,
    /// Every rate-limited re-add.
    pub retries: Counter,
}

struct QueueState<T> {
    queue: VecDeque<T>,
    /// Items that are queued or must be queued again once processing ends.
    dirty: HashSet<T>,
    processing: HashSet<T>,
    /// Delayed adds, ordered by due time; `waiting_index` de-duplicates them.
    waiting: BTreeMap<(Instant, u64), T>,
    waiting_index: HashMap<T, (Instant, u64)>,
    sequence: u64,
    shutting_down: bool,
}

struct QueueShared<T> {
    state: Mutex<QueueState<T>>,
    /// Wakes a worker waiting in `get`.
    ready: Notify,
    /// Wakes `wait_idle` callers when processing ends.
    idle: Notify,
    limiter: Box<dyn RateLimiter<T>>,
    metrics: QueueMetrics,
}

/// A de-duplicating work queue with per-item rate limiting.
///
/// The contract is client-go's: an item added while it is queued is merged; an item added while
/// a worker processes it is queued again only after [`WorkQueue::done`].
///
/// ```
/// # tokio_test_block(async {
/// use mc_runtime::{default_controller_rate_limiter, WorkQueue};
/// let q = WorkQueue::new(default_controller_rate_limiter::<u32>());
/// q.add(1); q.add(1);
/// assert_eq!(q.len(), 1);
/// let item = q.get().await.unwrap();
/// q.done(&item);
/// # });
/// # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
/// # }
/// ```
pub struct WorkQueue<T> {
    shared: Arc<QueueShared<T>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<T> WorkQueue<T>
where
    T: Hash + Eq + Clone + Send + 'static,
{
    /// A queue using `limiter` for [`WorkQueue::add_rate_limited`].
    pub fn new(limiter: impl RateLimiter<T> + 'static) -> Self {
        Self::with_metrics(limiter, QueueMetrics::default())
    }

    /// A queue reporting to `metrics`.
    pub fn with_metrics(limiter: impl RateLimiter<T> + 'static, metrics: QueueMetrics) -> Self {
        WorkQueue {
            shared: Arc::new(QueueShared {
                state: Mutex::new(QueueState {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    waiting: BTreeMap::new(),
                    waiting_index: HashMap::new(),
                    sequence: 0,
                    shutting_down: false,
                }),
                ready: Notify::new(),
                idle: Notify::new(),
                limiter: Box::new(limiter),
                metrics,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item` unless it is already queued; ignored after shutdown.
    pub fn add(&self, item: T) {
        let mut state = self.lock();
        if self.add_locked(&mut state, item) {
            self.shared.ready.notify_one();
        }
    }

    /// Returns whether a waiting worker should be woken.
    fn add_locked(&self, state: &mut QueueState<T>, item: T) -> bool {
        if state.shutting_down {
            return false;
        }
        self.shared.metrics.adds.inc();
        if !state.dirty.insert(item.clone()) {
            return false;
        }
        if state.processing.contains(&item) {
            return false;
        }
        state.queue.push_back(item);
        self.shared.metrics.depth.set(state.queue.len() as i64);
        true
    }

    /// Queues `item` after `delay`. A pending delayed add of the same item keeps the earlier time.
    pub fn add_after(&self, item: T, delay: Duration) {
        if delay.is_zero() {
            return self.add(item);
        }
        let mut state = self.lock();
        if state.shutting_down {
            return;
        }
        let due = Instant::now() + delay;
        if let Some(existing) = state.waiting_index.get(&item).copied() {
            if existing.0 <= due {
                return;
            }
            state.waiting.remove(&existing);
        }
        state.sequence += 1;
        let key = (due, state.sequence);
        state.waiting.insert(key, item.clone());
        state.waiting_index.insert(item, key);
        // A worker may be sleeping until a later deadline.
        self.shared.ready.notify_waiters();
    }

    /// Queues `item` after the rate limiter's delay (a failure is counted).
    pub fn add_rate_limited(&self, item: T) {
        self.shared.metrics.retries.inc();
        let delay = self.shared.limiter.when(&item);
        self.add_after(item, delay);
    }

    /// Clears the failure count of `item`.
    pub fn forget(&self, item: &T) {
        self.shared.limiter.forget(item);
    }

    /// How many failures of `item` the rate limiter counts.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.shared.limiter.retries(item)
    }

    /// Items ready to be handed out (delayed adds not included).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no item is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items currently handed out and not yet `done`.
    pub fn in_flight(&self) -> usize {
        self.lock().processing.len()
    }

    /// Moves delayed items that are due into the queue.
    fn promote_due(&self, state: &mut QueueState<T>, now: Instant) {
        while let Some((&key, _)) = state.waiting.first_key_value() {
            if key.0 > now {
                break;
            }
            if let Some(item) = state.waiting.remove(&key) {
                state.waiting_index.remove(&item);
                self.add_locked(state, item);
            }
        }
    }

    /// Waits for the next item; `None` once the queue is shut down. The caller must call
    /// [`WorkQueue::done`] with the item when finished with it.
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut state = self.lock();
                if state.shutting_down {
                    return None;
                }
                self.promote_due(&mut state, Instant::now());
                if let Some(item) = state.queue.pop_front() {
                    state.dirty.remove(&item);
                    state.processing.insert(item.clone());
                    self.shared.metrics.depth.set(state.queue.len() as i64);
                    if !state.queue.is_empty() {
                        // Let another worker pick the next one.
                        self.shared.ready.notify_one();
                    }
                    return Some(item);
                }
                state.waiting.first_key_value().map(|(k, _)| k.0)
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `item` as processed; if it was added meanwhile, it is queued again now.
    pub fn done(&self, item: &T) {
        let mut state = self.lock();
        state.processing.remove(item);
        if state.dirty.contains(item) && !state.shutting_down {
            state.queue.push_back(item.clone());
            self.shared.metrics.depth.set(state.queue.len() as i64);
            self.shared.ready.notify_one();
        }
        if state.processing.is_empty() {
            self.shared.idle.notify_waiters();
        }
    }

    /// Stops handing out work: `get` returns `None` from now on; items being processed may
    /// still be marked `done`.
    pub fn shut_down(&self) {
        let mut state = self.lock();
        state.shutting_down = true;
        state.queue.clear();
        state.dirty.clear();
        state.waiting.clear();
        state.waiting_index.clear();
        self.shared.metrics.depth.set(0);
        self.shared.ready.notify_waiters();
    }

    /// Whether [`WorkQueue::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    /// Waits until no item is being processed, or `deadline` passes; returns whether idle.
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().processing.is_empty() {
                return true;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => return self.lock().processing.is_empty(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limit::{default_controller_rate_limiter, ItemExponentialBackoff};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(default_controller_rate_limiter())
    }

    #[tokio::test]
    async fn duplicates_are_merged() {
        let q = queue();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn readd_during_processing_is_queued_after_done() {
        let q = queue();
        q.add("a");
        let item = q.get().await.unwrap();
        q.add("a");
        q.add("a");
        assert_eq!(q.len(), 0, "not handed out while being processed");
        q.done(&item);
        assert_eq!(q.len(), 1, "queued once after done");
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_key_is_never_processed_by_two_workers() {
        let q: WorkQueue<u32> = WorkQueue::new(default_controller_rate_limiter());
        let busy: Arc<Mutex<HashSet<u32>>> = Arc::default();
        let overlaps = Arc::new(AtomicUsize::new(0));
        let processed = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..8 {
            let (q, busy, overlaps, processed) =
                (q.clone(), busy.clone(), overlaps.clone(), processed.clone());
            workers.push(tokio::spawn(async move {
                while let Some(item) = q.get().await {
                    if !busy.lock().unwrap().insert(item) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    busy.lock().unwrap().remove(&item);
                    processed.fetch_add(1, Ordering::SeqCst);
                    q.done(&item);
                }
            }));
        }
        for round in 0..200u32 {
            q.add(round % 3);
            if round % 10 == 0 {
                tokio::task::yield_now().await;
            }
        }
        // Let the queue drain.
        for _ in 0..500 {
            if q.is_empty() && q.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        q.shut_down();
        for w in workers {
            w.await.unwrap();
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
        let n = processed.load(Ordering::SeqCst);
        assert!((3..=200).contains(&n), "processed {n}");
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_waits_and_keeps_the_earliest_time() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(2));
        q.add_after("a", Duration::from_secs(30));
        let start = Instant::now();
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        q.done(&"a");
        let waited = tokio::time::timeout(Duration::from_secs(60), q.get()).await;
        assert!(waited.is_err(), "the later delayed adds were merged");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially() {
        let q: WorkQueue<&str> = WorkQueue::new(ItemExponentialBackoff::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        ));
        let mut waits = Vec::new();
        for _ in 0..4 {
            let start = Instant::now();
            q.add_rate_limited("a");
            let item = q.get().await.unwrap();
            waits.push(start.elapsed().as_millis());
            q.done(&item);
        }
        assert_eq!(waits, vec![5, 10, 20, 40]);
        assert_eq!(q.num_requeues(&"a"), 4);
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn overall_bucket_paces_many_failing_items() {
        let q: WorkQueue<u32> = WorkQueue::new(default_controller_rate_limiter());
        for i in 0..150 {
            q.add_rate_limited(i);
        }
        let start = Instant::now();
        for _ in 0..150 {
            let item = q.get().await.unwrap();
            q.done(&item);
        }
        // 100 come out at once (burst), the last 50 at 10 per second.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(4900) && elapsed <= Duration::from_millis(5100),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_handing_out_work_and_waits_for_in_flight() {
        let q = queue();
        q.add("a");
        q.add("b");
        let a = q.get().await.unwrap();
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        // b is still queued, but a blocked `get` must not hand it out after shutdown.
        q.shut_down();
        assert_eq!(q.get().await, None);
        assert_eq!(waiter.await.unwrap(), None);
        q.add("c");
        assert_eq!(q.get().await, None, "adds are ignored after shutdown");
        assert!(!q.wait_idle(Duration::from_millis(50)).await, "a in flight");
        let done = {
            let q = q.clone();
            tokio::spawn(async move { q.wait_idle(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.done(&a);
        assert!(done.await.unwrap());
    }

    #[tokio::test]
    async fn blocked_get_wakes_on_add() {
        let q = queue();
        let getter = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        tokio::task::yield_now().await;
        q.add("x");
        assert_eq!(getter.await.unwrap(), Some("x"));
    }

    #[test]
    fn metrics_count_adds_depth_and_retries() {
        let m = QueueMetrics::default();
        let q: WorkQueue<u8> =
            WorkQueue::with_metrics(default_controller_rate_limiter(), m.clone());
        q.add(1);
        q.add(1);
        q.add(2);
        q.add_rate_limited(3);
        assert_eq!(m.adds.get(), 3);
        assert_eq!(m.depth.get(), 2);
        assert_eq!(m.retries.get(), 1);
    }
}
