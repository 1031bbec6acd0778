//! Watch: newline-delimited JSON events flushed one by one, with initial events, bookmarks,
//! `sendInitialEvents`, timeouts, selector transitions and the 410 `ERROR` event.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use super::list::list_options_error;
use super::{partial_metadata, Ctx};
use crate::meta::body::Body;
use crate::meta::status::ApiError;
use crate::meta::table::{self, IncludeObject};
use crate::registry::{objects, Resource, SelectedEvents};
use crate::request::negotiation::Output;
use crate::storage::{Event, Revision};

/// How often an idle watch with bookmarks enabled gets one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);

/// Renders watch events in the negotiated form.
struct EventEncoder {
    output: Output,
    resource: std::sync::Arc<Resource>,
    include: IncludeObject,
    headers_sent: bool,
}

impl EventEncoder {
    fn frame(&mut self, kind: &str, stored: &Bytes) -> Result<Bytes, ApiError> {
        let mut out = BytesMut::with_capacity(stored.len() + 32);
        out.put_slice(b"{\"type\":\"");
        out.put_slice(kind.as_bytes());
        out.put_slice(b"\",\"object\":");
        match &self.output {
            Output::Object if self.resource.conversion.is_none() => out.put_slice(stored),
            Output::Object => {
                let v = self.resource.to_served(objects::decode_stored(stored)?);
                out.put_slice(v.to_string().as_bytes());
            }
            Output::Metadata { version } => {
                let v = objects::decode_stored(stored)?;
                out.put_slice(partial_metadata(&v, version).to_string().as_bytes());
            }
            Output::Table { version } => {
                let v = objects::decode_stored(stored)?;
                let t = table::build_table(
                    &self.resource.columns,
                    &[&v],
                    self.include,
                    &format!("meta.k8s.io/{version}"),
                    json!({"resourceVersion": objects::meta_str(&v, "resourceVersion").unwrap_or("")}),
                    time::OffsetDateTime::now_utc(),
                    self.headers_sent,
                );
                self.headers_sent = true;
                out.put_slice(t.to_string().as_bytes());
            }
        }
        out.put_slice(b"}\n");
        Ok(out.freeze())
    }

    /// The frame of a stored event. Plain object frames are the same for every watcher, so the
    /// first one to need a frame encodes it into the event's memo and the others share it.
    fn event_frame(&mut self, kind: &'static str, event: &Event) -> Result<Bytes, ApiError> {
        let shareable = matches!(self.output, Output::Object) && self.resource.conversion.is_none();
        let slot = match kind {
            "ADDED" => 0,
            "MODIFIED" => 1,
            _ => 2,
        };
        if shareable {
            event.memo.frame(slot, || self.frame(kind, &event.value))
        } else {
            self.frame(kind, &event.value)
        }
    }

    fn bookmark(&self, rev: Revision, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = match &self.output {
            Output::Object => (
                self.resource.kind().to_string(),
                self.resource.api_version.clone(),
            ),
            Output::Metadata { version } => (
                "PartialObjectMetadata".to_string(),
                format!("meta.k8s.io/{version}"),
            ),
            Output::Table { version } => ("Table".to_string(), format!("meta.k8s.io/{version}")),
        };
        let v = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": metadata}});
        Bytes::from(format!("{v}\n"))
    }
}

fn error_frame(e: &ApiError) -> Bytes {
    Bytes::from(format!(
        "{}\n",
        json!({"type": "ERROR", "object": e.to_status()})
    ))
}

/// Where a watch starts.
enum Start {
    /// Send the current state as ADDED events first (optionally closed by the initial-events bookmark).
    Initial { end_bookmark: bool },
    /// Only events after this revision.
    After(Revision),
}

pub(super) async fn watch(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let q = &ctx.query;
    let rv = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rvm = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let send_initial = q.get("sendInitialEvents").filter(|s| !s.is_empty());
    let start = match send_initial {
        Some(v) => {
            let on = matches!(v, "true" | "1");
            if rvm != Some("NotOlderThan") {
                return Err(list_options_error(
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    "sendInitialEvents",
                ));
            }
            if on {
                if let Some(v) = rv.filter(|v| *v != "0") {
                    let want = objects::parse_resource_version(v)?;
                    ctx.objects
                        .wait_for_revision(ctx.collection(), want)
                        .await?;
                }
                // The bookmark that ends the initial events goes only to a client that
                // takes bookmarks, as kube-apiserver sends it.
                Start::Initial {
                    end_bookmark: ctx.query.flag("allowWatchBookmarks"),
                }
            } else {
                match rv {
                    Some(v) if v != "0" => Start::After(objects::parse_resource_version(v)?),
                    _ => Start::After(ctx.objects.current_revision()),
                }
            }
        }
        None => {
            if rvm.is_some() {
                return Err(list_options_error(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    "resourceVersionMatch",
                ));
            }
            match rv {
                None | Some("0") => Start::Initial {
                    end_bookmark: false,
                },
                Some(v) => Start::After(objects::parse_resource_version(v)?),
            }
        }
    };
    let selection = ctx.selection()?;
    // Taken first, so a user at the limit costs the server nothing more.
    let held = ctx.budgets.hold_watch(ctx.identity.as_deref())?;
    let bookmarks = ctx.query.flag("allowWatchBookmarks");
    let timeout = match ctx.query.u64("timeoutSeconds")? {
        Some(s) => Duration::from_secs(s),
        // As kube-apiserver: between 30 and 60 minutes, so reconnects spread out.
        None => Duration::from_secs(1800 + rand::random_range(0..1800)),
    };
    let include = match &ctx.negotiated.output {
        Output::Table { .. } => table::parse_include_object(ctx.query.get("includeObject"))
            .map_err(ApiError::bad_request)?,
        _ => IncludeObject::Metadata,
    };
    let encoder = EventEncoder {
        output: ctx.negotiated.output.clone(),
        resource: ctx.resource.clone(),
        include,
        headers_sent: false,
    };

    // Read the initial state before answering, so a bad request still gets a plain error. Only
    // what the watcher selected is kept, and it counts against the user's budget of unread
    // answers like a list: a watch of a few objects in a large namespace holds only those.
    let mut initial_held = Vec::new();
    let (initial, from) = match start {
        Start::Initial { end_bookmark } => {
            // Read page by page, keeping only the selected objects (as a list does).
            let (items, rev) = ctx.objects.list_all(ctx.collection(), &selection).await?;
            let bytes = items.iter().map(|kv| kv.value.len()).sum();
            initial_held = ctx.budgets.hold_list(ctx.identity.as_deref(), bytes)?;
            (Some((items, end_bookmark)), rev)
        }
        Start::After(rev) => (None, rev),
    };
    // The watch is registered before the answer starts, after the initial list was read, so
    // that no event between the two is missed.
    let (events, failed) = match ctx.objects.watch(ctx.collection(), selection, from).await {
        Ok(events) => (Some(events), None),
        Err(e) => (None, Some(e)),
    };
    let (initial, end_bookmark) = match initial {
        Some((items, end_bookmark)) => (items, end_bookmark.then_some(from)),
        None => (Vec::new(), None),
    };
    let bookmarks = bookmarks.then(|| {
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + BOOKMARK_INTERVAL,
            BOOKMARK_INTERVAL,
        );
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    let body = Body::stream(Box::pin(WatchFrames {
        initial: initial.into_iter(),
        initial_held,
        end_bookmark,
        events,
        failed,
        deadline: Box::pin(tokio::time::sleep(timeout)),
        bookmarks,
        encoder,
        last_rev: from,
    }))
    .holding_all(held);
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

/// A watch answer as frames: the initial objects (if asked for), then each event that passes
/// the filter, bookmarks while nothing happens, and the end at the timeout or with an ERROR
/// frame. Polled by the connection itself: frames are made as the peer takes them, and an event
/// goes from the watch cache to the peer without another task in between.
struct WatchFrames {
    initial: std::vec::IntoIter<crate::storage::KeyValue>,
    /// The list budget the initial objects take until they are handed to the connection.
    initial_held: Vec<tokio::sync::OwnedSemaphorePermit>,
    /// The revision of the bookmark that closes the initial objects, if one was asked for.
    end_bookmark: Option<Revision>,
    /// The events the watcher selected; `None` once the watch ended.
    events: Option<SelectedEvents>,
    /// Why the watch could not start, sent after the initial objects.
    failed: Option<ApiError>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    bookmarks: Option<tokio::time::Interval>,
    encoder: EventEncoder,
    last_rev: Revision,
}

impl WatchFrames {
    fn next_initial(&mut self) -> Option<Bytes> {
        // The initial items were selected when they were read.
        for kv in self.initial.by_ref() {
            if let Ok(frame) = self.encoder.frame("ADDED", &kv.value) {
                return Some(frame);
            }
        }
        self.initial_held.clear();
        self.end_bookmark
            .take()
            .map(|rev| self.encoder.bookmark(rev, true))
    }
}

impl Stream for WatchFrames {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = self.get_mut();
        // Checked without registering for a wake-up; the timer is polled (and so armed) only
        // when the watch is about to wait.
        if this.deadline.is_elapsed() {
            this.events = None;
            return Poll::Ready(None);
        }
        if let Some(frame) = this.next_initial() {
            return Poll::Ready(Some(frame));
        }
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(error_frame(&e)));
        }
        let Some(events) = &mut this.events else {
            return Poll::Ready(None);
        };
        loop {
            let polled = events.poll_next_unpin(cx);
            this.last_rev = events.last_revision();
            let (kind, event) = match polled {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    this.events = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.events = None;
                    return Poll::Ready(Some(error_frame(&e)));
                }
                Poll::Ready(Some(Ok(selected))) => selected,
            };
            if let Ok(frame) = this.encoder.event_frame(kind, &event) {
                return Poll::Ready(Some(frame));
            }
        }
        if let Some(ticker) = &mut this.bookmarks {
            if ticker.poll_tick(cx).is_ready() {
                return Poll::Ready(Some(this.encoder.bookmark(this.last_rev, false)));
            }
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.events = None;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
