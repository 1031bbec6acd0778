//! The watch stream shared by every backend: replay from the backend's event log, then follow the
//! live broadcast of committed events, falling back to the log whenever the broadcast skips
//! revisions (a lagging receiver) so that no event is ever lost or delivered twice.
//!
//! Every committed revision produces exactly one event and the broadcast carries all of them, in
//! revision order, unfiltered. A watcher therefore knows the last revision it has seen (`last`) and
//! detects any gap exactly: an event with revision `last + 1` is delivered (if its key matches),
//! anything at or below `last` is a duplicate and skipped, and anything above `last + 1` (or a
//! `Lagged` error) means the missed range must be re-read from the log.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::broadcast::{self, error::RecvError};

use super::{Event, Result, Revision};

/// How many revisions one log read may scan; bounds the time a replay chunk holds a snapshot.
pub(crate) const LOG_CHUNK: usize = 1024;

/// Default capacity of the live event broadcast.
pub(crate) const DEFAULT_EVENT_CAPACITY: usize = 4096;

/// One read of a backend's event log.
pub(crate) struct LogChunk {
    /// Events under the prefix, in revision order.
    pub events: Vec<Event>,
    /// The highest revision covered by this read (matching or not); `after` if nothing was newer.
    pub scanned_to: Revision,
    /// True if the read reached the end of the log (fewer than `limit` revisions were newer).
    pub complete: bool,
}

/// A backend's retained history of committed events.
#[async_trait::async_trait]
pub(crate) trait EventLog: Send + Sync + 'static {
    /// Events under `prefix` with revision > `after`, scanning at most `limit` revisions.
    /// Fails with `Compacted` if `after` is below the compacted revision.
    async fn read_log(&self, prefix: &str, after: Revision, limit: usize) -> Result<LogChunk>;
}

struct State<L> {
    log: Arc<L>,
    rx: broadcast::Receiver<Event>,
    prefix: Arc<str>,
    /// The last revision this watcher has accounted for (delivered or filtered out).
    last: Revision,
    /// Events read from the log, waiting to be yielded.
    buffered: VecDeque<Event>,
    /// Whether the log must be read before following the broadcast again.
    catch_up: bool,
    done: bool,
}

/// Builds a watch stream. `rx` must have been subscribed before this call's caller looked at
/// anything in the store, so that every event committed after the log read is in the broadcast.
pub(crate) fn watch_stream<L: EventLog>(
    log: Arc<L>,
    rx: broadcast::Receiver<Event>,
    prefix: &str,
    after: Revision,
) -> BoxStream<'static, Result<Event>> {
    let state = State {
        log,
        rx,
        prefix: Arc::from(prefix),
        last: after,
        buffered: VecDeque::new(),
        catch_up: true,
        done: false,
    };
    stream::unfold(state, next_event).boxed()
}

async fn next_event<L: EventLog>(mut st: State<L>) -> Option<(Result<Event>, State<L>)> {
    loop {
        if st.done {
            return None;
        }
        if let Some(event) = st.buffered.pop_front() {
            return Some((Ok(event), st));
        }
        if st.catch_up {
            match st.log.read_log(&st.prefix, st.last, LOG_CHUNK).await {
                Ok(chunk) => {
                    st.last = st.last.max(chunk.scanned_to);
                    st.buffered.extend(chunk.events);
                    st.catch_up = !chunk.complete;
                }
                Err(err) => {
                    st.done = true;
                    return Some((Err(err), st));
                }
            }
            continue;
        }
        match st.rx.recv().await {
            Ok(event) if event.revision <= st.last => {}
            Ok(event) if event.revision == st.last + 1 => {
                st.last = event.revision;
                if event.key.starts_with(&*st.prefix) {
                    return Some((Ok(event), st));
                }
            }
            // A gap: the missed revisions (and this one) are committed, so the log has them.
            Ok(_) | Err(RecvError::Lagged(_)) => st.catch_up = true,
            Err(RecvError::Closed) => return None,
        }
    }
}
