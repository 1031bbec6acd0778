//! Clients that share one connection pool: one pooled `kube::Client` per endpoint (a
//! virtual-workspace URL or a shard) and a thin per-cluster handle that puts `/clusters/<name>` in
//! front of every request path.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;

use super::provider::ProviderError;

/// Counts the connection pools (HTTP clients with their own TLS config) built through
/// [`PoolCounter::pooled_client`], so tests and metrics can tell pools from cluster handles.
#[derive(Clone, Debug, Default)]
pub struct PoolCounter(Arc<AtomicUsize>);

impl PoolCounter {
    /// A client with its own connection pool and TLS config for `url`, using the credentials
    /// and TLS settings of `base`; counted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use mc_runtime::client::PoolCounter;
    /// let pools = PoolCounter::default();
    /// let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
    /// let _client = pools.pooled_client(&base, "https://127.0.0.1:6443/services/x").unwrap();
    /// assert_eq!(pools.built(), 1);
    /// # }
    /// ```
    pub fn pooled_client(
        &self,
        base: &kube::Config,
        url: &str,
    ) -> Result<kube::Client, ProviderError> {
        let client = pooled_client(base, url)?;
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(client)
    }

    /// How many pooled clients were built.
    pub fn built(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A client with its own connection pool for `url`, with the credentials and TLS settings of
/// `base` (the URL may carry a path, e.g. a virtual-workspace prefix).
pub fn pooled_client(base: &kube::Config, url: &str) -> Result<kube::Client, ProviderError> {
    let mut config = base.clone();
    config.cluster_url = url
        .parse()
        .map_err(|e| ProviderError::Config(format!("invalid endpoint URL {url}: {e}")))?;
    Ok(kube::Client::try_from(config)?)
}

/// `/clusters/<cluster>`: the path prefix that addresses one logical cluster (or `*`, all of
/// them) below an endpoint.
///
/// ```
/// use mc_runtime::client::cluster_prefix;
/// assert_eq!(cluster_prefix("root:orgs"), "/clusters/root:orgs");
/// ```
pub fn cluster_prefix(cluster: &str) -> String {
    format!("/clusters/{cluster}")
}

/// A client for one cluster below the endpoint of `shared`: every request goes through the
/// shared client's connection pool with `prefix` put in front of its path. Costs a small
/// request queue, not a connection pool or a TLS config.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use mc_runtime::client::{cluster_prefix, pooled_client, scoped_client};
/// let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
/// let shared = pooled_client(&base, "https://127.0.0.1:6443/services/apiexport/r/e").unwrap();
/// // Requests of `one` go to https://127.0.0.1:6443/services/apiexport/r/e/clusters/one/...
/// let one = scoped_client(&shared, &cluster_prefix("one"));
/// # let _ = one;
/// # }
/// ```
pub fn scoped_client(shared: &kube::Client, prefix: &str) -> kube::Client {
    let default_ns = shared.default_namespace().to_string();
    kube::Client::new(
        PathPrefix {
            prefix: Arc::from(prefix.trim_end_matches('/')),
            inner: shared.clone(),
        },
        default_ns,
    )
}

/// The service behind [`scoped_client`]: prefixes the request path and sends it through the
/// shared client.
#[derive(Clone)]
pub struct PathPrefix {
    prefix: Arc<str>,
    inner: kube::Client,
}

impl tower::Service<Request<Body>> for PathPrefix {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The shared client queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let req = prefix_path(&self.prefix, req);
        Box::pin(async move { inner.send(req?).await })
    }
}

/// Puts `prefix` in front of the path of a relative request URI (`/api/v1/...?watch=1`).
fn prefix_path(prefix: &str, req: Request<Body>) -> Result<Request<Body>, kube::Error> {
    let (mut parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let joined = if pq.starts_with('/') {
        format!("{prefix}{pq}")
    } else {
        format!("{prefix}/{pq}")
    };
    let mut uri = http::uri::Builder::new();
    if let Some(scheme) = parts.uri.scheme() {
        uri = uri.scheme(scheme.clone());
    }
    if let Some(authority) = parts.uri.authority() {
        uri = uri.authority(authority.clone());
    }
    parts.uri = uri
        .path_and_query(joined)
        .build()
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::Mutex;

    /// A client whose "server" records request URIs and answers 200 `{}`; `pools` counts how
    /// many such recorders (connection pools) exist.
    fn recording_client(seen: Arc<Mutex<Vec<String>>>) -> kube::Client {
        let service = tower::service_fn(move |req: Request<Body>| {
            seen.lock().unwrap().push(req.uri().to_string());
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .body(Body::from(b"{}".to_vec()))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    #[test]
    fn prefix_goes_in_front_of_path_and_keeps_the_query() {
        let req = Request::builder()
            .uri("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=7")
            .body(Body::empty())
            .unwrap();
        let out = prefix_path("/clusters/abc", req).unwrap();
        assert_eq!(
            out.uri().to_string(),
            "/clusters/abc/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=7"
        );
        let wildcard = prefix_path(
            "/clusters/*",
            Request::builder().uri("/apis").body(Body::empty()).unwrap(),
        )
        .unwrap();
        assert_eq!(wildcard.uri().path(), "/clusters/*/apis");
    }

    #[tokio::test]
    async fn scoped_clients_send_through_the_one_shared_client() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = recording_client(seen.clone());
        let a = scoped_client(&shared, &cluster_prefix("a"));
        let b = scoped_client(&shared, "/clusters/b/");
        for (client, name) in [(&a, "x"), (&b, "y")] {
            let req = Request::builder()
                .uri(format!("/api/v1/namespaces/default/configmaps/{name}"))
                .body(Body::empty())
                .unwrap();
            let res = client.send(req).await.unwrap();
            assert_eq!(res.status(), 200);
        }
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                "/clusters/a/api/v1/namespaces/default/configmaps/x",
                "/clusters/b/api/v1/namespaces/default/configmaps/y",
            ],
            "both handles reach the same underlying client, each with its own prefix"
        );
        assert_eq!(a.default_namespace(), "default");
    }

    #[tokio::test]
    async fn pools_are_counted_per_endpoint_not_per_handle() {
        let pools = PoolCounter::default();
        let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let shared = pools
            .pooled_client(&base, "https://127.0.0.1:6443/services/apiexport/r/e")
            .unwrap();
        let _handles: Vec<_> = (0..100)
            .map(|i| scoped_client(&shared, &cluster_prefix(&format!("c{i}"))))
            .collect();
        assert_eq!(pools.built(), 1);
        assert!(matches!(
            pools.pooled_client(&base, "not a url"),
            Err(ProviderError::Config(_))
        ));
        assert_eq!(pools.built(), 1, "failures are not counted");
    }
}
