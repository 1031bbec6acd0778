//! The issuers' key sets and the signature checks, bounded so that one tenant's issuer cannot
//! make authentication expensive for the others:
//! - key sets are kept per (issuer, discovery URL, CA) in a cache of [`MAX_SETS`] that drops the
//!   least recently used set when full, never the whole cache;
//! - a set is fetched on first use, kept for [`KEYS_TTL`], fetched again (at most every
//!   [`RETRY_AFTER`]) when a token's signature verifies with none of its keys and the token
//!   names no key of the set; the check is then repeated only against keys the new set has and
//!   the old one had not, so an unchanged set costs no second round of verifications;
//! - what a set keeps and what one token is checked against is bounded by [`jwt::read_key_set`]
//!   and [`jwt::candidates`];
//! - RSA verifications run on the blocking pool (`spawn_blocking`), never on a request's async
//!   worker, each batch holding a permit of its issuer (one: an issuer's tokens are checked one
//!   at a time) and a permit of the server (one per core but one, at least one): however many
//!   tokens arrive for one issuer, its checks take at most one core. A token that waits longer
//!   than [`PERMIT_WAIT`] for its permits is refused as any other bad token (401).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::config::{Issuer, JwtAuthenticator};
use super::jwt::{self, KeySetRead, RsaKey, Token, TokenError};
use super::WorkspaceAuthnError;

/// How long a key set is used before it is fetched again.
pub const KEYS_TTL: Duration = Duration::from_secs(3600);
/// How long a failed fetch is remembered, and the least time between two fetches of one set.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The most key sets kept.
pub const MAX_SETS: usize = 1024;
/// The longest a token waits for the permits to check its signature before it is refused.
pub const PERMIT_WAIT: Duration = Duration::from_secs(1);

/// A map of at most `capacity` entries that drops its least recently used entry to make room.
/// Eviction scans the entries (the caches here hold about a thousand, and evict only when a
/// new issuer or type shows up while full).
pub struct Lru<K, V> {
    capacity: usize,
    clock: u64,
    entries: HashMap<K, (V, u64)>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An empty map of at most `capacity` (at least one) entries.
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            clock: 0,
            entries: HashMap::new(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let now = self.tick();
        self.entries.get_mut(key).map(|(v, used)| {
            *used = now;
            &*v
        })
    }

    /// Sets `key` to `value`, dropping the least recently used entry when a new key finds the
    /// map full.
    pub fn insert(&mut self, key: K, value: V) {
        let now = self.tick();
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, now));
    }

    /// The value of `key` (made by `make` when missing), now the most recently used.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &V {
        if !self.entries.contains_key(&key) {
            self.insert(key.clone(), make());
        }
        let now = self.tick();
        let (v, used) = self
            .entries
            .get_mut(&key)
            .expect("the entry was just inserted");
        *used = now;
        v
    }

    /// Whether `key` is kept.
    pub fn contains_key(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What fetching a key set gives: its usable keys, or why it failed.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<KeySetRead, String>> + Send>>;
/// Fetches the key set of an issuer, given the issuer and its discovery URL.
pub type Fetcher = Arc<dyn Fn(Issuer, String) -> FetchFuture + Send + Sync>;

#[derive(Default)]
struct KeySet {
    keys: Arc<Vec<RsaKey>>,
    fetched: Option<Instant>,
    failed: Option<(Instant, String)>,
}

/// One issuer: its key set (fetched by one request at a time) and its verification permit.
struct Slot {
    set: tokio::sync::Mutex<KeySet>,
    verifying: Arc<Semaphore>,
}

/// The key sets of the issuers of a server, and the permits of its signature checks.
pub struct IssuerKeys {
    slots: Mutex<Lru<(String, String), Arc<Slot>>>,
    cpu: Arc<Semaphore>,
    verifications: Arc<AtomicU64>,
    fetch: Fetcher,
    permit_wait: Duration,
}

/// The discovery URL of an issuer.
pub fn discovery_of(issuer: &Issuer) -> String {
    if issuer.discovery_url.is_empty() {
        format!(
            "{}/.well-known/openid-configuration",
            issuer.url.trim_end_matches('/')
        )
    } else {
        issuer.discovery_url.clone()
    }
}

/// What an issuer's key set is kept under: its URL and discovery URL, and its CA.
pub fn set_key(issuer: &Issuer) -> (String, String) {
    (
        format!("{}\n{}", issuer.url, discovery_of(issuer)),
        issuer.certificate_authority.clone(),
    )
}

/// Permits of the server's signature checks: one per core but one (the rest of the server keeps
/// a core), at least one.
pub fn default_cpu_permits() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1)
}

impl IssuerKeys {
    /// Key sets fetched with `fetch`, checks bounded by [`default_cpu_permits`].
    pub fn new(fetch: Fetcher) -> Self {
        Self::with_limits(fetch, default_cpu_permits(), PERMIT_WAIT)
    }

    /// Key sets fetched with `fetch`, `cpu_permits` checks at a time, `permit_wait` the longest
    /// a token waits for its permits.
    pub fn with_limits(fetch: Fetcher, cpu_permits: usize, permit_wait: Duration) -> Self {
        IssuerKeys {
            slots: Mutex::new(Lru::new(MAX_SETS)),
            cpu: Arc::new(Semaphore::new(cpu_permits.max(1))),
            verifications: Arc::new(AtomicU64::new(0)),
            fetch,
            permit_wait,
        }
    }

    /// RSA verifications done so far.
    pub fn verifications(&self) -> u64 {
        self.verifications.load(Ordering::Relaxed)
    }

    /// How many key sets are kept.
    pub fn sets_kept(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn slot(&self, issuer: &Issuer) -> Result<Arc<Slot>, WorkspaceAuthnError> {
        let mut slots = self
            .slots
            .lock()
            .map_err(|_| WorkspaceAuthnError::Keys(issuer.url.clone(), "poisoned".into()))?;
        Ok(slots
            .get_or_insert_with(set_key(issuer), || {
                Arc::new(Slot {
                    set: tokio::sync::Mutex::new(KeySet::default()),
                    verifying: Arc::new(Semaphore::new(1)),
                })
            })
            .clone())
    }

    /// The keys of `slot`; `refresh` asks for a new fetch (granted at most every
    /// [`RETRY_AFTER`]). The same `Arc` comes back as long as the set was not fetched again.
    async fn keys(
        &self,
        issuer: &Issuer,
        slot: &Slot,
        discovery: &str,
        refresh: bool,
    ) -> Result<Arc<Vec<RsaKey>>, WorkspaceAuthnError> {
        let mut set = slot.set.lock().await;
        let now = Instant::now();
        if let Some(fetched) = set.fetched {
            let age = now.duration_since(fetched);
            if age < KEYS_TTL && (!refresh || age < RETRY_AFTER) {
                return Ok(set.keys.clone());
            }
        }
        if let Some((at, why)) = &set.failed {
            if now.duration_since(*at) < RETRY_AFTER {
                return Err(WorkspaceAuthnError::Keys(issuer.url.clone(), why.clone()));
            }
        }
        match (self.fetch)(issuer.clone(), discovery.to_string()).await {
            Ok(read) => {
                if read.refused > 0 || read.beyond > 0 {
                    tracing::info!(
                        issuer = %issuer.url,
                        kept = read.keys.len(),
                        refused = read.refused,
                        beyond_limit = read.beyond,
                        "workspace authentication: issuer key set bounded (unusable keys and \
                         keys past the first {} dropped)",
                        jwt::MAX_KEYS
                    );
                }
                set.keys = Arc::new(read.keys);
                set.fetched = Some(Instant::now());
                set.failed = None;
                Ok(set.keys.clone())
            }
            Err(why) => {
                tracing::info!(issuer = %issuer.url, error = %why, "workspace authentication: issuer keys");
                set.failed = Some((Instant::now(), why.clone()));
                Err(WorkspaceAuthnError::Keys(issuer.url.clone(), why))
            }
        }
    }

    /// `Ok` when a key of the issuer of `a` signed `token` with RS256.
    pub async fn verify(
        &self,
        a: &JwtAuthenticator,
        token: &Token,
    ) -> Result<(), WorkspaceAuthnError> {
        jwt::check_algorithm(token)?;
        let issuer = &a.issuer;
        let discovery = discovery_of(issuer);
        let slot = self.slot(issuer)?;
        let keys = self.keys(issuer, &slot, &discovery, false).await?;
        if self
            .check(issuer, &slot, token, jwt::candidates(token, keys.iter()))
            .await?
        {
            return Ok(());
        }
        let named_key_known = token.kid.is_some() && keys.iter().any(|k| k.kid == token.kid);
        if !named_key_known {
            // The issuer may have rotated: only keys the set did not have are worth a check.
            let fresh = self.keys(issuer, &slot, &discovery, true).await?;
            if !Arc::ptr_eq(&keys, &fresh) {
                let new = jwt::candidates(token, fresh.iter().filter(|k| !keys.contains(k)));
                if self.check(issuer, &slot, token, new).await? {
                    return Ok(());
                }
            }
        }
        Err(TokenError::Signature.into())
    }

    /// Whether one of `keys` signed `token`, checked on the blocking pool under the issuer's
    /// and the server's permits.
    async fn check(
        &self,
        issuer: &Issuer,
        slot: &Slot,
        token: &Token,
        keys: Vec<RsaKey>,
    ) -> Result<bool, WorkspaceAuthnError> {
        if keys.is_empty() {
            return Ok(false);
        }
        let busy = || WorkspaceAuthnError::Busy(issuer.url.clone());
        let permits = tokio::time::timeout(self.permit_wait, async {
            let own = slot.verifying.clone().acquire_owned().await.ok()?;
            let cpu = self.cpu.clone().acquire_owned().await.ok()?;
            Some((own, cpu))
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(busy)?;
        let (signed, signature) = jwt::signed_parts(token);
        let counter = self.verifications.clone();
        // The permits go with the work: a request given up on still holds them until its
        // verifications end, so the bound holds whatever clients do.
        tokio::task::spawn_blocking(move || {
            let _permits = permits;
            keys.iter().any(|k| {
                counter.fetch_add(1, Ordering::Relaxed);
                jwt::verify_one(k, &signed, &signature)
            })
        })
        .await
        .map_err(|_| busy())
    }

    /// Sets the keys of `issuer` as if just fetched (tests).
    #[cfg(test)]
    pub(crate) async fn seed(&self, issuer: &Issuer, keys: Vec<RsaKey>, age: Duration) {
        let slot = self.slot(issuer).expect("slot");
        let mut set = slot.set.lock().await;
        set.keys = Arc::new(keys);
        set.fetched = Instant::now().checked_sub(age);
        set.failed = None;
    }

    /// Whether the set of `issuer` is kept (tests).
    #[cfg(test)]
    pub(crate) fn keeps(&self, issuer: &Issuer) -> bool {
        self.slots
            .lock()
            .map(|s| s.contains_key(&set_key(issuer)))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::workspace_authn::issuer::Signer;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use ring::rand::{SecureRandom, SystemRandom};
    use serde_json::{json, Value};
    use std::sync::atomic::AtomicUsize;

    const KEY: &str = include_str!("testdata/issuer-key.pem");

    /// An odd modulus of `bits` bits (top bit set): not a product of two primes, but a
    /// verification against it costs what one against a real key of its size costs.
    fn modulus(bits: usize) -> Vec<u8> {
        let mut n = vec![0u8; bits / 8];
        SystemRandom::new().fill(&mut n).expect("random");
        n[0] |= 0x80;
        *n.last_mut().expect("bytes") |= 1;
        n
    }

    fn jwk(kid: &str, n: &[u8], e: &[u8]) -> Value {
        json!({"kty": "RSA", "use": "sig", "kid": kid,
               "n": URL_SAFE_NO_PAD.encode(n), "e": URL_SAFE_NO_PAD.encode(e)})
    }

    /// `count` usable 8192-bit keys of the largest exponent kube takes, named `k<i>` (or all
    /// `kid` when given).
    fn hostile_keys(count: usize, kid: Option<&str>) -> Vec<Value> {
        let e = MAX_EXPONENT_BYTES;
        (0..count)
            .map(|i| {
                let name = kid.map_or_else(|| format!("k{i}"), str::to_string);
                jwk(&name, &modulus(8192), &e)
            })
            .collect()
    }

    const MAX_EXPONENT_BYTES: [u8; 4] = [0x7f, 0xff, 0xff, 0xff];

    fn authenticator(url: &str) -> JwtAuthenticator {
        JwtAuthenticator {
            issuer: Issuer {
                url: url.to_string(),
                audiences: vec!["x".into()],
                ..Issuer::default()
            },
            ..JwtAuthenticator::default()
        }
    }

    /// A token of `iss` with header `header` and a garbage 8192-bit signature.
    fn garbage(iss: &str, header: Value) -> Token {
        let mut sig = vec![0u8; 1024];
        SystemRandom::new().fill(&mut sig).expect("random");
        sig[0] = 1;
        jwt::parse(&format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(json!({"iss": iss}).to_string()),
            URL_SAFE_NO_PAD.encode(sig)
        ))
        .expect("token")
    }

    /// Key sets served by a fake issuer: `sets` in turn (the last one again and again), with the
    /// number of fetches.
    fn fetcher(sets: Vec<Value>) -> (Fetcher, Arc<AtomicUsize>) {
        let fetches = Arc::new(AtomicUsize::new(0));
        let counter = fetches.clone();
        let fetch: Fetcher = Arc::new(move |_issuer, _discovery| {
            let i = counter.fetch_add(1, Ordering::Relaxed);
            let set = sets[i.min(sets.len() - 1)].clone();
            Box::pin(async move { Ok(jwt::read_key_set(&set)) })
        });
        (fetch, fetches)
    }

    #[test]
    fn a_hostile_key_set_keeps_its_first_usable_keys_and_drops_the_unusable() {
        let mut entries = hostile_keys(745, None);
        let bad = vec![
            jwk("huge-e", &modulus(8192), &[0xff; 1024]),
            jwk("e-2^31", &modulus(2048), &[0x80, 0, 0, 0]),
            jwk("e-even", &modulus(2048), &[1, 0, 0]),
            jwk("e-1", &modulus(2048), &[1]),
            jwk("n-1024", &modulus(1024), &[1, 0, 1]),
            jwk("n-16384", &modulus(16384), &[1, 0, 1]),
            jwk("n-even", &[0x80; 256], &[1, 0, 1]),
            json!({"kty": "RSA", "kid": "no-n", "e": "AQAB"}),
        ];
        let refused = bad.len();
        entries.splice(0..0, bad);
        // Not RSA signing keys: skipped, not counted.
        entries.push(json!({"kty": "EC", "crv": "P-256", "x": "", "y": ""}));
        entries.push(json!({"kty": "RSA", "use": "enc", "n": "", "e": ""}));
        let read = jwt::read_key_set(&json!({ "keys": entries }));
        assert_eq!(read.keys.len(), jwt::MAX_KEYS);
        assert_eq!(read.refused, refused);
        assert_eq!(read.beyond, 745 - jwt::MAX_KEYS);
        assert_eq!(read.keys[0].kid.as_deref(), Some("k0"));
        assert!(read.keys.iter().all(|k| k.bits() == 8192));
        // Leading zero bytes are not bits; the largest exponent Go takes is kept.
        let padded = [&[0u8, 0][..], &modulus(2048)].concat();
        let k = RsaKey::new(None, &padded, &[0, 0x7f, 0xff, 0xff, 0xff]).expect("usable");
        assert_eq!(k.bits(), 2048);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_garbage_token_costs_at_most_the_bounded_verifications() {
        let url = "https://hostile.example";
        let a = authenticator(url);
        let set = json!({ "keys": hostile_keys(745, None) });
        let rotated = json!({ "keys": hostile_keys(745, None) });
        let (fetch, fetches) = fetcher(vec![set.clone(), set.clone(), rotated]);
        let keys = IssuerKeys::new(fetch);

        // First use: one fetch; a token naming no key is checked against the first four keys
        // only, and the set just fetched is not fetched again.
        let kidless = garbage(url, json!({"alg": "RS256"}));
        let started = Instant::now();
        let refused = keys.verify(&a, &kidless).await;
        assert!(
            matches!(
                refused,
                Err(WorkspaceAuthnError::Token(TokenError::Signature))
            ),
            "{refused:?}"
        );
        assert_eq!(keys.verifications(), jwt::MAX_TRIED as u64);
        assert_eq!(fetches.load(Ordering::Relaxed), 1);
        eprintln!(
            "a kid-less garbage token against 8192-bit keys: {:?}",
            started.elapsed()
        );

        // A kid no key has: checked against none (and the set is not fetched again within ten
        // seconds).
        let unknown = garbage(url, json!({"alg": "RS256", "kid": "nope"}));
        assert!(keys.verify(&a, &unknown).await.is_err());
        assert_eq!(keys.verifications(), jwt::MAX_TRIED as u64);
        assert_eq!(fetches.load(Ordering::Relaxed), 1);

        // Once the set may be fetched again: a set that did not change costs no second check.
        keys.seed(
            &a.issuer,
            jwt::read_key_set(&set).keys,
            RETRY_AFTER + Duration::from_secs(1),
        )
        .await;
        assert!(keys.verify(&a, &kidless).await.is_err());
        assert_eq!(fetches.load(Ordering::Relaxed), 2);
        assert_eq!(keys.verifications(), 2 * jwt::MAX_TRIED as u64);

        // A rotated set (new keys): a second check, against new keys only, bounded again.
        keys.seed(
            &a.issuer,
            jwt::read_key_set(&set).keys,
            RETRY_AFTER + Duration::from_secs(1),
        )
        .await;
        assert!(keys.verify(&a, &kidless).await.is_err());
        assert_eq!(fetches.load(Ordering::Relaxed), 3);
        assert_eq!(keys.verifications(), 4 * jwt::MAX_TRIED as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_sharing_a_kid_are_checked_at_most_four_times() {
        let url = "https://hostile.example";
        let a = authenticator(url);
        let (fetch, _) = fetcher(vec![json!({ "keys": hostile_keys(100, Some("same")) })]);
        let keys = IssuerKeys::new(fetch);
        let named = garbage(url, json!({"alg": "RS256", "kid": "same"}));
        assert!(keys.verify(&a, &named).await.is_err());
        assert_eq!(keys.verifications(), jwt::MAX_TRIED as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_valid_token_verifies_among_hostile_keys() {
        let signer = Signer::new("https://idp.example", KEY).expect("signer");
        let a = authenticator(&signer.url);
        let mut entries = signer.jwks()["keys"].as_array().expect("keys").clone();
        entries.extend(hostile_keys(100, None));
        let (fetch, _) = fetcher(vec![json!({ "keys": entries })]);
        let keys = IssuerKeys::new(fetch);
        // Named by its kid: one verification.
        let token = jwt::parse(&signer.token(&json!({"aud": "x"})).expect("token")).expect("parse");
        keys.verify(&a, &token).await.expect("verified");
        assert_eq!(keys.verifications(), 1);
        // Not named: found among the first keys (it is the first).
        let kidless = signer
            .token_without_kid(&json!({"aud": "x"}))
            .expect("token");
        let token = jwt::parse(&kidless).expect("parse");
        assert!(token.kid.is_none());
        keys.verify(&a, &token).await.expect("verified");
        assert_eq!(keys.verifications(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_token_waiting_too_long_for_its_turn_is_refused_not_held() {
        let url = "https://busy.example";
        let a = authenticator(url);
        let (fetch, _) = fetcher(vec![json!({ "keys": hostile_keys(4, None) })]);
        let keys = IssuerKeys::with_limits(fetch, 1, Duration::from_millis(100));
        let held = keys.cpu.clone().acquire_owned().await.expect("permit");
        // Refused once its wait is over, while the permit is still held: the deadline is far
        // beyond the 100 ms wait, so only a token held for good fails it.
        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            keys.verify(&a, &garbage(url, json!({"alg": "RS256"}))),
        )
        .await
        .expect("a waiting token is refused within its wait, not held while the permit is");
        assert!(
            matches!(refused, Err(WorkspaceAuthnError::Busy(_))),
            "{refused:?}"
        );
        assert_eq!(keys.verifications(), 0);
        drop(held);
        assert!(matches!(
            keys.verify(&a, &garbage(url, json!({"alg": "RS256"})))
                .await,
            Err(WorkspaceAuthnError::Token(TokenError::Signature))
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_issuers_evict_the_least_recently_used_set_not_every_set() {
        let (fetch, _) = fetcher(vec![json!({"keys": []})]);
        let keys = IssuerKeys::new(fetch);
        let victim = authenticator("https://victim.example").issuer;
        keys.seed(&victim, Vec::new(), Duration::ZERO).await;
        for i in 0..=MAX_SETS {
            let other = authenticator(&format!("https://tenant-{i}.example")).issuer;
            keys.seed(&other, Vec::new(), Duration::ZERO).await;
            // The victim's tenant keeps using its issuer meanwhile.
            if i % 100 == 0 {
                let _ = keys.slot(&victim).expect("slot");
            }
        }
        assert_eq!(keys.sets_kept(), MAX_SETS);
        assert!(keys.keeps(&victim), "the victim's set was evicted");
        assert!(!keys.keeps(&authenticator("https://tenant-1.example").issuer));
        assert!(keys.keeps(&authenticator(&format!("https://tenant-{MAX_SETS}.example")).issuer));
    }

    #[test]
    fn the_lru_drops_the_least_recently_used_entry() {
        let mut lru = Lru::new(3);
        lru.insert("a", 1);
        lru.insert("b", 2);
        lru.insert("c", 3);
        assert_eq!(lru.get(&"a"), Some(&1));
        lru.insert("d", 4);
        assert!(lru.contains_key(&"a") && !lru.contains_key(&"b"));
        lru.insert("a", 5);
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.get(&"a"), Some(&5));
    }
}
