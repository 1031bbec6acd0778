//! The watch loop every cluster provider runs: follow a list+watch of the objects that say
//! which clusters exist (Secrets with kubeconfigs, a control plane's bindings or endpoints, ...),
//! see each change and, after every (re)list, the complete set, so that what vanished while the
//! watch was down is let go. A provider keeps its own index and engages from it; this only
//! turns the watcher's events into those three observations, keeping of each object only what
//! the provider needs.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// What a followed watch saw.
#[derive(Debug, PartialEq)]
pub enum Observed<T> {
    /// An object was created or changed.
    Applied(T),
    /// An object was deleted.
    Deleted(T),
    /// A list (the first, or one after the watch expired) completed: everything there is now.
    Relisted(Vec<T>),
}

/// A list+watch being followed (see [`follow`]).
pub struct Watched<K, T> {
    events: Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>,
    keep: Box<dyn Fn(K) -> Option<T> + Send + Sync>,
    relist: Option<Vec<T>>,
    what: String,
}

/// Follows `events` (a watcher, with its backoff), keeping of each object what `keep` returns
/// (objects it returns `None` for are not seen at all); `what` names the watch in the log when
/// it fails and retries.
pub fn follow<K, T>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: impl Into<String>,
    keep: impl Fn(K) -> Option<T> + Send + Sync + 'static,
) -> Watched<K, T> {
    Watched {
        events: Box::pin(events),
        keep: Box::new(keep),
        relist: None,
        what: what.into(),
    }
}

impl<K, T> Watched<K, T> {
    /// The next observation; `None` once the watch ended or `stop` was cancelled.
    pub async fn next(&mut self, stop: &CancellationToken) -> Option<Observed<T>> {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return None,
                next = self.events.next() => next?,
            };
            match next {
                Err(e) => warn!(watch = %self.what, error = %e, "watch failed; retrying"),
                Ok(watcher::Event::Init) => self.relist = Some(Vec::new()),
                Ok(watcher::Event::InitApply(obj)) => {
                    if let Some(kept) = (self.keep)(obj) {
                        self.relist.get_or_insert_with(Vec::new).push(kept);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    return Some(Observed::Relisted(self.relist.take().unwrap_or_default()))
                }
                Ok(watcher::Event::Apply(obj)) => {
                    if let Some(kept) = (self.keep)(obj) {
                        return Some(Observed::Applied(kept));
                    }
                }
                Ok(watcher::Event::Delete(obj)) => {
                    if let Some(kept) = (self.keep)(obj) {
                        return Some(Observed::Deleted(kept));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(
        list: Vec<watcher::Event<u32>>,
    ) -> impl Stream<Item = Result<watcher::Event<u32>, watcher::Error>> + Send {
        futures::stream::iter(list.into_iter().map(Ok))
    }

    #[tokio::test]
    async fn a_relist_is_seen_whole_and_changes_one_by_one() {
        use watcher::Event::*;
        let stop = CancellationToken::new();
        // Odd objects are kept (doubled), even ones never seen.
        let mut watched = follow(
            events(vec![
                Init,
                InitApply(1),
                InitApply(2),
                InitApply(3),
                InitDone,
                Apply(4),
                Apply(5),
                Delete(1),
                Init,
                InitDone,
            ]),
            "numbers",
            |n| (n % 2 == 1).then_some(n * 2),
        );
        let mut seen = Vec::new();
        while let Some(o) = watched.next(&stop).await {
            seen.push(o);
        }
        assert_eq!(
            seen,
            vec![
                Observed::Relisted(vec![2, 6]),
                Observed::Applied(10),
                Observed::Deleted(2),
                Observed::Relisted(vec![]),
            ]
        );
    }

    #[tokio::test]
    async fn a_cancelled_follow_ends() {
        let stop = CancellationToken::new();
        stop.cancel();
        let mut watched = follow(futures::stream::pending(), "nothing", |n: u32| Some(n));
        assert_eq!(watched.next(&stop).await, None);
    }
}
