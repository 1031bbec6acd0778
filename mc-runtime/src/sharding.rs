//! Sharded engagement: clusters are spread over the live replicas by rendezvous (HRW) hashing,
//! and a replica engages a cluster only while it holds that cluster's fence Lease.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cluster::Cluster;
use super::lease::LeaseLock;
use super::provider::{ClusterEvent, ClusterProvider, ClusterSink, DisengageAck, ProviderError};
use super::request::ClusterName;

/// A stable 64-bit hash (FNV-1a with a final mix): the same on every replica and build.
pub fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in part.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // splitmix64 finaliser spreads FNV's weak low bits.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The replica that owns `cluster` among `peers` by highest random weight (ties by name).
///
/// ```
/// use mc_runtime::sharding::owner_of;
/// let peers = vec!["r1".to_string(), "r2".to_string()];
/// let owner = owner_of("root:orgs:acme", &peers).unwrap();
/// assert_eq!(owner_of("root:orgs:acme", &peers), Some(owner));
/// assert_eq!(owner_of("x", &[]), None);
/// ```
pub fn owner_of<'a>(cluster: &str, peers: &'a [String]) -> Option<&'a str> {
    peers
        .iter()
        .max_by(|a, b| {
            stable_hash(&[a, cluster])
                .cmp(&stable_hash(&[b, cluster]))
                .then_with(|| b.cmp(a))
        })
        .map(String::as_str)
}

/// A Lease name for a cluster's fence: `<prefix>-shard-<cluster>` made DNS-safe; names that had
/// to change (e.g. `root:orgs`, or a kubeconfig path) or are too long get a hash suffix so they
/// stay unique. Dots become dashes too: a dot beside a dash would end a DNS label badly.
///
/// ```
/// use mc_runtime::sharding::fence_lease_name;
/// assert_eq!(fence_lease_name("pm", "abc"), "pm-shard-abc");
/// assert!(fence_lease_name("pm", "root:orgs").starts_with("pm-shard-root-orgs-"));
/// let path = fence_lease_name("pm", "/tmp/.x/a.kubeconfig+ctx");
/// assert!(path.starts_with("pm-shard--tmp--x-a-kubeconfig-ctx-"), "{path}");
/// ```
pub fn fence_lease_name(prefix: &str, cluster: &str) -> String {
    let cleaned: String = cluster
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let base = format!("{prefix}-shard-{cleaned}");
    if cleaned == cluster && base.len() <= 253 {
        return base;
    }
    let suffix = format!("{:016x}", stable_hash(&[cluster]));
    let keep = 253usize.saturating_sub(suffix.len() + 1);
    let head: String = base.chars().take(keep).collect();
    format!("{}-{suffix}", head.trim_end_matches(['-', '.']))
}

/// Settings of sharded engagement.
#[derive(Clone, Debug)]
pub struct ShardingConfig {
    /// Namespace of the peer and fence Leases (in the home cluster).
    pub namespace: String,
    /// This replica's unique identity.
    pub identity: String,
    /// Prefix of Lease names (`<prefix>-peer-<identity>`, `<prefix>-shard-<cluster>`).
    pub lease_prefix: String,
    /// Label every peer Lease of this group carries: `(key, value)`.
    pub peer_label: (String, String),
    /// How long a peer or fence Lease stays valid without renewal (default 20 s).
    pub lease_duration: Duration,
    /// How long an engaged cluster may go without a fence renewal before it is dropped
    /// (default 10 s; less than the lease duration, so a replica stops before others start).
    pub renew_deadline: Duration,
    /// How often peers are listed and Leases renewed (default 5 s).
    pub probe_period: Duration,
    /// How many replicas the group is meant to have: a starting replica takes no cluster until
    /// it sees that many live peers or one lease duration has passed, so that the first one up
    /// does not engage every cluster only to hand most of them off moments later (default 1).
    pub expected_peers: usize,
}

/// Label of every fence Lease, valued with the group's Lease prefix: replicas list the fences
/// they do not hold with it, so that the expiry of a dead replica's fences is clocked from
/// their last renewal rather than from the moment a survivor first wants them.
pub const FENCE_LABEL: &str = "platform-mesh.io/shard-fence";

impl ShardingConfig {
    /// multicluster-runtime's sharded-coordinator timing (20 s lease, 10 s renew, 5 s probe).
    pub fn new(namespace: &str, identity: &str, group: &str) -> Self {
        ShardingConfig {
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            lease_prefix: group.to_string(),
            peer_label: (
                "platform-mesh.io/shard-group".to_string(),
                group.to_string(),
            ),
            lease_duration: Duration::from_secs(20),
            renew_deadline: Duration::from_secs(10),
            probe_period: Duration::from_secs(5),
            expected_peers: 1,
        }
    }
}

struct Fenced {
    cluster: Arc<Cluster>,
    lock: LeaseLock,
    /// When the last successful renewal was sent (the Lease was written after that).
    last_renewal: Instant,
    /// Set when a renewal found the Lease held by another replica.
    lost: bool,
}

impl Fenced {
    /// Records a renewal (or the acquisition) sent at `sent`: reconciles may start in the
    /// cluster until `sent + deadline`.
    fn renewed(&mut self, sent: Instant, deadline: Duration) {
        self.last_renewal = sent;
        self.cluster.hold_fence_until(Some(sent + deadline));
    }
}

/// Fence Leases read or written at once in one round.
const FENCE_CONCURRENCY: usize = 32;

#[derive(Default)]
struct ShardState {
    /// Every cluster the wrapped provider reports.
    known: HashMap<ClusterName, Arc<Cluster>>,
    /// Clusters this replica engaged, with their fence.
    engaged: HashMap<ClusterName, Fenced>,
    /// Fence locks of the clusters this replica has not engaged, observed every round (from one
    /// list) so that a fence whose holder stopped renewing is judged expired one lease duration
    /// after its last renewal was seen (expiry is observed locally, as client-go's).
    waiting: HashMap<ClusterName, LeaseLock>,
    /// When this replica started taking part (for [`ShardingConfig::expected_peers`]).
    started: Option<Instant>,
    /// Last seen renewTime of each peer Lease and when it changed (local clock).
    peers_seen: HashMap<String, (Option<String>, Instant)>,
    /// Clusters being handed off: not taken again until their fence is released.
    releasing: Arc<Mutex<HashSet<ClusterName>>>,
    /// Hand-off tasks still running.
    handoffs: Vec<tokio::task::JoinHandle<()>>,
}

/// Wraps a provider so that this replica engages only its share of the clusters, fenced by a
/// Lease per cluster (so two replicas never reconcile one cluster at once).
pub struct Sharded<P> {
    inner: Arc<P>,
    home: kube::Client,
    config: ShardingConfig,
    engaged_names: Mutex<Vec<ClusterName>>,
}

impl<P: ClusterProvider> Sharded<P> {
    /// Shards the clusters of `inner`; Leases live in `home`.
    pub fn new(inner: P, home: kube::Client, config: ShardingConfig) -> Self {
        Sharded {
            inner: Arc::new(inner),
            home,
            config,
            engaged_names: Mutex::new(Vec::new()),
        }
    }

    /// Clusters this replica has engaged, sorted.
    pub fn engaged(&self) -> Vec<ClusterName> {
        self.engaged_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn publish(&self, state: &ShardState) {
        let mut names: Vec<_> = state.engaged.keys().cloned().collect();
        names.sort();
        *self.engaged_names.lock().unwrap_or_else(|p| p.into_inner()) = names;
    }

    fn peer_lock(&self) -> LeaseLock {
        let c = &self.config;
        let labels = BTreeMap::from([c.peer_label.clone()]);
        LeaseLock::new(
            self.home.clone(),
            &c.namespace,
            format!("{}-peer-{}", c.lease_prefix, sanitize(&c.identity)),
            c.identity.clone(),
            c.lease_duration,
        )
        .with_labels(labels)
    }

    /// Live peers (this replica included), sorted.
    async fn live_peers(&self, state: &mut ShardState) -> Vec<String> {
        let api: Api<Lease> = Api::namespaced(self.home.clone(), &self.config.namespace);
        let (k, v) = &self.config.peer_label;
        let mut peers = vec![self.config.identity.clone()];
        let listed = tokio::time::timeout(
            self.config.renew_deadline / 2,
            api.list(&ListParams::default().labels(&format!("{k}={v}"))),
        )
        .await;
        let leases = match listed {
            Ok(Ok(l)) => l.items,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                warn!(error = %error, "listing peer leases failed; keeping the previous view");
                let mut peers: Vec<String> = state
                    .peers_seen
                    .iter()
                    .filter(|(_, (_, at))| at.elapsed() < self.config.lease_duration)
                    .map(|(p, _)| p.clone())
                    .chain(std::iter::once(self.config.identity.clone()))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                peers.sort();
                return peers;
            }
        };
        let now_wall = now_seconds();
        for lease in leases {
            let Some(spec) = lease.spec else { continue };
            let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
                continue;
            };
            let renew = spec
                .renew_time
                .as_ref()
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_string));
            let duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
            let entry = state.peers_seen.entry(holder.clone());
            let seen = entry.or_insert_with(|| {
                // First sight: trust the server's renewTime to skip long-dead peers.
                let age = spec
                    .renew_time
                    .as_ref()
                    .map(|t| now_wall - t.0.as_second())
                    .unwrap_or(i64::MAX);
                let at = if age >= 0 && (age as u64) < duration.as_secs() {
                    Instant::now()
                } else {
                    Instant::now()
                        .checked_sub(duration)
                        .unwrap_or_else(Instant::now)
                };
                (renew.clone(), at)
            });
            if seen.0 != renew {
                *seen = (renew, Instant::now());
            }
            if seen.1.elapsed() < duration && holder != self.config.identity {
                peers.push(holder);
            }
        }
        peers.sort();
        peers.dedup();
        peers
    }

    /// One round: heartbeat, peers, ownership, fences.
    async fn rebalance(
        &self,
        state: &mut ShardState,
        peer: &mut LeaseLock,
        sink: &ClusterSink,
    ) -> Result<(), ProviderError> {
        match tokio::time::timeout(self.config.renew_deadline / 2, peer.try_acquire_or_renew())
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "peer lease heartbeat failed"),
            Err(_) => warn!("peer lease heartbeat timed out"),
        }
        let peers = self.live_peers(state).await;
        let me = self.config.identity.as_str();
        // Renew the fences of what stays ours, many at once and within half the renew
        // deadline in all: a round must not outlast the deadline however many clusters it holds.
        let deadline = self.config.renew_deadline;
        let mut not_ours = Vec::new();
        {
            let mut renewals = Vec::new();
            for (name, f) in state.engaged.iter_mut() {
                if state.known.contains_key(name) && owner_of(name.as_str(), &peers) == Some(me) {
                    renewals.push(renew(name, f, deadline));
                } else {
                    not_ours.push(name.clone());
                }
            }
            let all = futures::stream::iter(renewals)
                .buffer_unordered(FENCE_CONCURRENCY)
                .for_each(|()| async {});
            if tokio::time::timeout(deadline / 2, all).await.is_err() {
                warn!("fence renewals did not finish within half the renew deadline");
            }
        }
        // Drop what is no longer ours, was taken, or could not be renewed in time.
        let expired: Vec<ClusterName> = state
            .engaged
            .iter()
            .filter(|(_, f)| f.lost || f.last_renewal.elapsed() >= deadline)
            .map(|(name, _)| name.clone())
            .collect();
        for name in not_ours.into_iter().chain(expired) {
            self.drop_cluster(state, &name, sink, DisengageAck::none());
        }
        self.observe_fences(state).await;
        let started = *state.started.get_or_insert_with(Instant::now);
        if peers.len() < self.config.expected_peers
            && started.elapsed() < self.config.lease_duration
        {
            debug!(
                live = peers.len(),
                expected = self.config.expected_peers,
                "waiting for the other replicas before taking clusters"
            );
            self.publish(state);
            return Ok(());
        }
        // Take what is ours and not yet engaged.
        let wanted: Vec<Arc<Cluster>> = state
            .known
            .values()
            .filter(|c| !state.engaged.contains_key(c.name()))
            .filter(|c| {
                !state
                    .releasing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(c.name())
            })
            .filter(|c| owner_of(c.name().as_str(), &peers) == Some(me))
            .cloned()
            .collect();
        // Try the fences many at once; a try still running after half the renew deadline is
        // given up (if it took the Lease after all, the next round finds it held by this
        // replica and takes it then).
        let mut attempts = Vec::new();
        for cluster in wanted {
            let lock = state
                .waiting
                .remove(cluster.name())
                .unwrap_or_else(|| self.fence_lock(cluster.name()));
            attempts.push(attempt(cluster, lock));
        }
        let tried: Vec<_> = match tokio::time::timeout(
            deadline / 2,
            futures::stream::iter(attempts)
                .buffer_unordered(FENCE_CONCURRENCY)
                .collect::<Vec<_>>(),
        )
        .await
        {
            Ok(tried) => tried,
            Err(_) => {
                warn!("fence acquisitions did not finish within half the renew deadline");
                Vec::new()
            }
        };
        for (cluster, lock, sent, outcome) in tried {
            match outcome {
                Ok(true) if sent.elapsed() < deadline => {
                    info!(cluster = %cluster.name(), identity = %me, "fence acquired; engaging");
                    let mut fenced = Fenced {
                        cluster: cluster.clone(),
                        lock,
                        last_renewal: sent,
                        lost: false,
                    };
                    fenced.renewed(sent, deadline);
                    state.engaged.insert(cluster.name().clone(), fenced);
                    self.publish(state);
                    sink.engage(cluster).await?;
                }
                Ok(true) => {
                    // Taken, but too late to be sure of it: the next round renews or drops it.
                    state.waiting.insert(cluster.name().clone(), lock);
                }
                Ok(false) => {
                    debug!(cluster = %cluster.name(), "fence still held by another replica");
                    state.waiting.insert(cluster.name().clone(), lock);
                }
                Err(e) => {
                    warn!(cluster = %cluster.name(), error = %e, "fence acquisition failed");
                    state.waiting.insert(cluster.name().clone(), lock);
                }
            }
        }
        self.publish(state);
        Ok(())
    }

    fn fence_lock(&self, cluster: &ClusterName) -> LeaseLock {
        LeaseLock::new(
            self.home.clone(),
            &self.config.namespace,
            fence_lease_name(&self.config.lease_prefix, cluster.as_str()),
            self.config.identity.clone(),
            self.config.lease_duration,
        )
        .with_labels(BTreeMap::from([(
            FENCE_LABEL.to_string(),
            self.config.lease_prefix.clone(),
        )]))
    }

    /// Keeps a fence lock for every known cluster this replica has not engaged and feeds it
    /// the group's fence Leases, read in one list (a failed list only delays the clocks).
    async fn observe_fences(&self, state: &mut ShardState) {
        let ShardState {
            known,
            engaged,
            waiting,
            ..
        } = state;
        waiting.retain(|name, _| known.contains_key(name) && !engaged.contains_key(name));
        for name in known.keys() {
            if !engaged.contains_key(name) && !waiting.contains_key(name) {
                waiting.insert(name.clone(), self.fence_lock(name));
            }
        }
        if waiting.is_empty() {
            return;
        }
        let api: Api<Lease> = Api::namespaced(self.home.clone(), &self.config.namespace);
        let selector = format!("{FENCE_LABEL}={}", self.config.lease_prefix);
        let listed = tokio::time::timeout(
            self.config.renew_deadline / 2,
            api.list(&ListParams::default().labels(&selector)),
        )
        .await;
        let Ok(Ok(list)) = listed else {
            debug!("listing fence leases failed; their clocks start at the next round");
            return;
        };
        let by_lease: HashMap<&str, &Lease> = list
            .items
            .iter()
            .filter_map(|l| Some((l.metadata.name.as_deref()?, l)))
            .collect();
        for lock in waiting.values_mut() {
            if let Some(lease) = by_lease.get(lock.name()) {
                lock.observe_listed(lease);
            }
        }
    }

    /// Hands a cluster off in the background: disengage it, wait for its reconciles to end,
    /// then release its fence. The fence is kept (and left to expire) if that takes longer than
    /// the renew deadline, so another replica never starts while this one still reconciles.
    fn drop_cluster(
        &self,
        state: &mut ShardState,
        name: &ClusterName,
        sink: &ClusterSink,
        ack: DisengageAck,
    ) {
        let Some(mut fenced) = state.engaged.remove(name) else {
            ack.done();
            return;
        };
        // No reconcile starts here from now on, whatever the manager has queued.
        fenced.cluster.hold_fence_until(Some(Instant::now()));
        self.publish(state);
        state.handoffs.retain(|t| !t.is_finished());
        let releasing = state.releasing.clone();
        releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone());
        let (sink, name, deadline) = (sink.clone(), name.clone(), self.config.renew_deadline);
        state.handoffs.push(tokio::spawn(async move {
            let disengaged = tokio::time::timeout(deadline, sink.disengage(&name)).await;
            let idle =
                matches!(disengaged, Ok(Ok(()))) && fenced.cluster.wait_idle(Duration::ZERO).await;
            if idle {
                if let Err(e) = fenced.lock.release().await {
                    warn!(cluster = %name, error = %e, "fence release failed; it will expire");
                }
                info!(cluster = %name, "cluster handed off");
            } else {
                warn!(cluster = %name, "cluster not idle in time; its fence is left to expire");
            }
            releasing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
            ack.done();
        }));
    }
}

/// Renews one engaged cluster's fence, moving its reconcile deadline on success.
async fn renew(name: &ClusterName, f: &mut Fenced, deadline: Duration) {
    let sent = Instant::now();
    match f.lock.try_acquire_or_renew().await {
        Ok(true) => f.renewed(sent, deadline),
        Ok(false) => f.lost = true,
        Err(e) => warn!(cluster = %name, error = %e, "fence renewal failed"),
    }
}

/// Tries to take one cluster's fence: the cluster, its lock, when the try was sent, the outcome.
async fn attempt(
    cluster: Arc<Cluster>,
    mut lock: LeaseLock,
) -> (
    Arc<Cluster>,
    LeaseLock,
    Instant,
    Result<bool, super::lease::LeaseError>,
) {
    let sent = Instant::now();
    let outcome = lock.try_acquire_or_renew().await;
    (cluster, lock, sent, outcome)
}

fn sanitize(s: &str) -> String {
    fence_lease_name("x", s)
        .trim_start_matches("x-shard-")
        .to_string()
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(Timestamp::UNIX_EPOCH.as_second())
}

#[async_trait::async_trait]
impl<P: ClusterProvider> ClusterProvider for Sharded<P> {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        let (inner_sink, mut inner_events) = ClusterSink::channel(64);
        let inner_stop = stop.child_token();
        let inner = self.inner.clone();
        let inner_task = tokio::spawn({
            let stop = inner_stop.clone();
            async move { inner.run(inner_sink, stop).await }
        });
        let mut state = ShardState::default();
        let mut peer = self.peer_lock();
        let mut tick = tokio::time::interval(self.config.probe_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut inner_open = true;
        let result = loop {
            tokio::select! {
                _ = stop.cancelled() => break Ok(()),
                event = inner_events.recv(), if inner_open => match event {
                    Some(ClusterEvent::Engage(cluster)) => {
                        let name = cluster.name().clone();
                        if state.known.insert(name.clone(), cluster.clone()).is_none() {
                            // A new cluster: rebalance soon, once a burst of reports settled.
                            tick.reset_after(self.config.probe_period.min(Duration::from_millis(200)));
                        }
                        if let Some(f) = state.engaged.get_mut(&name) {
                            // Same cluster, new configuration: we still hold the fence, and
                            // the new instance keeps its reconcile deadline.
                            f.cluster = cluster.clone();
                            f.renewed(f.last_renewal, self.config.renew_deadline);
                            if let Err(e) = sink.engage(cluster).await { break Err(e); }
                        }
                    }
                    Some(ClusterEvent::Disengage(name, ack)) => {
                        state.known.remove(&name);
                        self.drop_cluster(&mut state, &name, &sink, ack);
                    }
                    None => inner_open = false,
                },
                _ = tick.tick() => {
                    if let Err(e) = self.rebalance(&mut state, &mut peer, &sink).await { break Err(e); }
                }
            }
        };
        // The manager is shutting down: let reconciles end, then free fences for the others.
        inner_stop.cancel();
        for task in state.handoffs.drain(..) {
            let _ = tokio::time::timeout(self.config.renew_deadline, task).await;
        }
        for (name, mut fenced) in state.engaged.drain() {
            if fenced.cluster.wait_idle(self.config.renew_deadline).await {
                if let Err(e) = fenced.lock.release().await {
                    warn!(cluster = %name, error = %e, "fence release failed; it will expire");
                }
            }
        }
        if let Err(e) = peer.release().await {
            warn!(error = %e, "peer lease release failed; it will expire");
        }
        self.publish(&state);
        match inner_task.await {
            Ok(Err(e)) if result.is_ok() => Err(e),
            _ => result,
        }
    }

    /// Any cluster of the group, engaged here or by another replica: a reconcile may write into
    /// a cluster it does not own (a parent into its child). The manager still reconciles only
    /// the clusters this replica engaged ([`crate::Manager::cluster`] keeps to those).
    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.inner.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn assignment(clusters: &[String], peers: &[String]) -> HashMap<String, String> {
        clusters
            .iter()
            .map(|c| (c.clone(), owner_of(c, peers).unwrap().to_string()))
            .collect()
    }

    #[test]
    fn assignment_is_stable_and_independent_of_peer_order() {
        let clusters = names("cluster-", 500);
        let peers = names("replica-", 4);
        let mut reversed = peers.clone();
        reversed.reverse();
        assert_eq!(
            assignment(&clusters, &peers),
            assignment(&clusters, &reversed)
        );
        assert_eq!(assignment(&clusters, &peers), assignment(&clusters, &peers));
    }

    #[test]
    fn clusters_spread_roughly_evenly() {
        let clusters = names("root:orgs:", 4000);
        let peers = names("replica-", 4);
        let a = assignment(&clusters, &peers);
        for p in &peers {
            let n = a.values().filter(|o| *o == p).count();
            assert!((800..=1200).contains(&n), "{p} got {n} of 4000");
        }
    }

    #[test]
    fn a_joining_replica_takes_only_its_share_from_others() {
        let clusters = names("c", 2000);
        let before = assignment(&clusters, &names("replica-", 4));
        let after = assignment(&clusters, &names("replica-", 5));
        let moved: Vec<_> = clusters
            .iter()
            .filter(|c| before[*c] != after[*c])
            .collect();
        // Everything that moved went to the newcomer; about 1/5 of the clusters moved.
        assert!(moved.iter().all(|c| after[*c] == "replica-4"));
        assert!((300..=500).contains(&moved.len()), "moved {}", moved.len());
    }

    #[test]
    fn a_leaving_replica_hands_over_only_its_own_clusters() {
        let clusters = names("c", 2000);
        let peers = names("replica-", 5);
        let before = assignment(&clusters, &peers);
        let remaining: Vec<String> = peers
            .iter()
            .filter(|p| *p != "replica-2")
            .cloned()
            .collect();
        let after = assignment(&clusters, &remaining);
        for c in &clusters {
            if before[c] != "replica-2" {
                assert_eq!(before[c], after[c], "{c} moved although its owner stayed");
            }
        }
    }

    #[test]
    fn fence_names_are_valid_and_distinct() {
        let a = fence_lease_name("pm", "root:a");
        let b = fence_lease_name("pm", "root-a");
        assert_ne!(a, b);
        assert_eq!(b, "pm-shard-root-a");
        let long = fence_lease_name("pm", &"x".repeat(400));
        assert!(long.len() <= 253, "{}", long.len());
        assert!(long
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
        assert_eq!(
            fence_lease_name("pm", "System:Admin"),
            fence_lease_name("pm", "System:Admin")
        );
        assert!(!fence_lease_name("pm", "Upper").contains('U'));
    }

    #[test]
    fn hashing_is_fixed_across_builds() {
        // Replicas of different builds must agree, so the values are pinned.
        assert_eq!(stable_hash(&["a"]), 0x02c0_bdbf_4814_20f8);
        assert_eq!(stable_hash(&["r1", "root:x"]), 0x3831_0137_9cc3_8598);
        assert_ne!(stable_hash(&["ab", "c"]), stable_hash(&["a", "bc"]));
        let peers = names("r", 3);
        assert_eq!(owner_of("c0", &peers), Some("r1"));
        assert_eq!(owner_of("c1", &peers), Some("r2"));
        assert_eq!(owner_of("root:orgs:acme", &peers), Some("r1"));
    }
}
