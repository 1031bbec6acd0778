//! Response compression: large answers go gzipped to clients that accept it, as
//! kube-apiserver's `APIResponseCompression`.

use http::Response;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;

/// Responses of at least this many bytes are compressed for clients that accept gzip:
/// kube-apiserver's threshold.
pub const GZIP_MIN_BYTES: usize = 128 * 1024;

/// Gzips whole answers of [`GZIP_MIN_BYTES`] or more; streams (watches) go as they are.
pub struct Compression<N> {
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for Compression<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        let gzip = !x.long_running && accepts_gzip(&x.parts.headers);
        let response = self.next.handle(x).await;
        if gzip {
            Box::pin(compress(response)).await
        } else {
            response
        }
    }
}

/// Whether the request's `Accept-Encoding` lists gzip (with a non-zero quality).
fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !zero
        })
}

/// `response` gzipped when its whole body is [`GZIP_MIN_BYTES`] or more (the fastest level;
/// the work runs off the async threads). Streams and smaller bodies go as they are.
async fn compress(mut response: Response<Body>) -> Response<Body> {
    let Some(bytes) = response.body().full_bytes().cloned() else {
        return response;
    };
    if bytes.len() < GZIP_MIN_BYTES
        || response
            .headers()
            .contains_key(http::header::CONTENT_ENCODING)
    {
        return response;
    }
    let gzipped = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(
            Vec::with_capacity(bytes.len() / 4),
            flate2::Compression::fast(),
        );
        encoder.write_all(&bytes)?;
        encoder.finish()
    })
    .await;
    let Ok(Ok(gzipped)) = gzipped else {
        // Compression into memory does not fail; if it did, the plain body still serves.
        return response;
    };
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_ENCODING,
        http::HeaderValue::from_static("gzip"),
    );
    headers.append(
        http::header::VARY,
        http::HeaderValue::from_static("Accept-Encoding"),
    );
    headers.remove(http::header::CONTENT_LENGTH);
    response.body_mut().replace_full(gzipped.into());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_taken_unless_its_quality_is_zero() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::ACCEPT_ENCODING, v.parse().expect("header"));
            accepts_gzip(&h)
        };
        assert!(with("gzip"));
        assert!(with("deflate, GZIP;q=0.5"));
        assert!(!with("gzip;q=0"));
        assert!(!with("deflate, br"));
        assert!(!accepts_gzip(&http::HeaderMap::new()));
    }
}
