//! Watching a collection through the generic store: the store's events under the
//! collection's prefix, as one watcher's selection sees them (an object that stops matching is
//! DELETED for it, one that starts matching is ADDED), as kube-apiserver's watch cache filters
//! them per watcher.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::Value;

use super::list::{Collection, Selection};
use super::GenericStore;
use crate::meta::status::{ApiError, GroupResource};
use crate::registry::storage_status;
use crate::storage::{Event, EventType, Revision, StorageError};

/// The events one watcher sees, each with its watch type (`ADDED`, `MODIFIED`, `DELETED`).
pub struct SelectedEvents {
    events: BoxStream<'static, Result<Event, StorageError>>,
    selection: Selection,
    type_prefix_len: usize,
    gr: GroupResource,
    last_revision: Revision,
}

impl SelectedEvents {
    /// The revision of the last event read, selected or not (what a bookmark says).
    pub fn last_revision(&self) -> Revision {
        self.last_revision
    }
}

impl GenericStore {
    /// The changes to `collection` after revision `from` that `selection` sees.
    pub async fn watch(
        &self,
        collection: Collection<'_>,
        selection: Selection,
        from: Revision,
    ) -> Result<SelectedEvents, ApiError> {
        let events = self
            .store
            .watch(&collection.prefix(), from)
            .await
            .map_err(|e| collection.status(e))?;
        Ok(SelectedEvents {
            events,
            selection,
            type_prefix_len: collection.resource.all_clusters_prefix().len(),
            gr: collection.resource.gr.clone(),
            last_revision: from,
        })
    }
}

impl Stream for SelectedEvents {
    type Item = Result<(&'static str, Event), ApiError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let event = match this.events.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(storage_status(&this.gr, "", e))))
                }
                Poll::Ready(Some(Ok(event))) => event,
            };
            this.last_revision = event.revision;
            if !this.selection.matches_key(this.type_prefix_len, &event.key) {
                continue;
            }
            if let Some(kind) = classify(&this.selection, &event) {
                return Poll::Ready(Some(Ok((kind, event))));
            }
        }
    }
}

/// The watch event type of a change for a selecting watcher: an object that stops matching is
/// DELETED, one that starts matching is ADDED. The objects are decoded once per event (in its
/// memo), not once per watcher.
fn classify(selection: &Selection, event: &Event) -> Option<&'static str> {
    if !selection.needs_object() {
        return Some(match event.kind {
            EventType::Create => "ADDED",
            EventType::Update => "MODIFIED",
            EventType::Delete => "DELETED",
        });
    }
    let matches =
        |v: Option<std::sync::Arc<Value>>| v.is_some_and(|v| selection.matches_object(&v));
    let now = matches(event.memo.value(&event.value));
    let before = || {
        event
            .prev_value
            .as_ref()
            .is_some_and(|p| matches(event.memo.prev(p)))
    };
    match event.kind {
        EventType::Create => now.then_some("ADDED"),
        EventType::Delete => (now || before()).then_some("DELETED"),
        EventType::Update => match (before(), now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}
