//! The response body type: either whole bytes or a stream of chunks (watch), flushed as produced.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::BoxStream;
use http_body::{Body as HttpBody, Frame, SizeHint};

/// The largest piece of a whole body handed to the connection at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// A response body.
pub struct Body {
    content: Content,
    /// Held until the body is dropped (sent or abandoned): a request's slot among the requests
    /// in flight, and the budgets its answer takes, cover writing it, not just computing it.
    _held: Vec<tokio::sync::OwnedSemaphorePermit>,
    /// Run when the body is dropped: what happens when a response (a watch) ends.
    on_drop: Vec<Box<dyn FnOnce() + Send>>,
}

impl Drop for Body {
    fn drop(&mut self) {
        for f in self.on_drop.drain(..) {
            f();
        }
    }
}

enum Content {
    Full(Option<Bytes>),
    Stream(BoxStream<'static, Bytes>),
}

impl Body {
    /// A body with no bytes.
    pub fn empty() -> Self {
        Body::new(Content::Full(None))
    }

    /// A body of these bytes, sent in pieces of at most 64 KiB.
    pub fn from_bytes(b: impl Into<Bytes>) -> Self {
        Body::new(Content::Full(Some(b.into())))
    }

    /// A streaming body: each chunk is produced when the connection polls for it (so the
    /// peer's flow control paces the producer) and sent as it comes; the body ends with the
    /// stream. Dropping the body (the peer went away) drops the stream.
    pub fn stream(chunks: BoxStream<'static, Bytes>) -> Self {
        Body::new(Content::Stream(chunks))
    }

    fn new(content: Content) -> Self {
        Body {
            content,
            _held: Vec::new(),
            on_drop: Vec::new(),
        }
    }

    /// The same body, holding `slot` until it is dropped.
    pub fn holding(mut self, slot: tokio::sync::OwnedSemaphorePermit) -> Self {
        self._held.push(slot);
        self
    }

    /// The whole bytes of a body that is not a stream (`None` for a stream).
    pub fn full_bytes(&self) -> Option<&Bytes> {
        match &self.content {
            Content::Full(Some(b)) => Some(b),
            Content::Full(None) => None,
            Content::Stream(_) => None,
        }
    }

    /// Replaces the bytes of a whole body (a stream stays as it is), keeping what it holds.
    pub fn replace_full(&mut self, b: Bytes) {
        if let Content::Full(bytes) = &mut self.content {
            *bytes = Some(b);
        }
    }

    /// The same body, running `f` when it is dropped (sent to the end, or abandoned).
    pub fn on_drop(mut self, f: impl FnOnce() + Send + 'static) -> Self {
        self.on_drop.push(Box::new(f));
        self
    }

    /// The same body, holding every permit of `held` until it is dropped.
    pub fn holding_all(mut self, held: Vec<tokio::sync::OwnedSemaphorePermit>) -> Self {
        self._held.extend(held);
        self
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().content {
            // Large answers go out in pieces as the connection drains (no copy), so what a slow
            // reader has not taken yet stays in this body and keeps its budget taken.
            Content::Full(Some(b)) if b.len() > CHUNK_BYTES => {
                Poll::Ready(Some(Ok(Frame::data(b.split_to(CHUNK_BYTES)))))
            }
            Content::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Content::Stream(s) => s
                .as_mut()
                .poll_next(cx)
                .map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.content, Content::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Content::Full(None) => SizeHint::with_exact(0),
            Content::Stream(_) => SizeHint::default(),
        }
    }
}
