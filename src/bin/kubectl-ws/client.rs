//! A small HTTPS client for the workspace API of one server, built on the project's
//! `https_client` (client certificates) plus an optional bearer token.

use anyhow::{anyhow, bail, Context as _, Result};
use http::{Method, StatusCode};
use serde_json::Value;

use https_client::{ClientConfig, Connection, Reply};

use crate::kubeconfig::Credentials;
use crate::paths::{parse_endpoint, WsPath};

/// API group/version of workspaces.
pub const TENANCY: &str = "tenancy.kcp.io/v1alpha1";

/// A connection to one server (reconnecting after a failure).
pub struct Api {
    config: ClientConfig,
    prefix: String,
    token: Option<String>,
    conn: Option<Connection>,
}

/// The `message` of a `metav1.Status` body, else the body text.
pub fn error_message(reply: &Reply) -> String {
    let v = reply.json();
    match v.get("message").and_then(Value::as_str) {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => {
            let text = String::from_utf8_lossy(&reply.body).trim().to_string();
            if text.is_empty() {
                reply.status.to_string()
            } else {
                text
            }
        }
    }
}

/// `<prefix>/clusters/<path>/apis/tenancy.kcp.io/v1alpha1/workspaces[/<name>]`.
pub fn workspaces_path(prefix: &str, cluster: &WsPath, name: Option<&str>) -> String {
    let mut p = format!("{prefix}/clusters/{cluster}/apis/{TENANCY}/workspaces");
    if let Some(name) = name {
        p.push('/');
        p.push_str(name);
    }
    p
}

impl Api {
    /// Prepares a client for the server at `base` (`https://host:port[/prefix]`).
    pub async fn new(base: &str, creds: &Credentials) -> Result<Api> {
        let endpoint = parse_endpoint(base)?;
        let address = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port))
            .await
            .with_context(|| format!("resolving {}", endpoint.host))?
            .next()
            .ok_or_else(|| anyhow!("{} has no address", endpoint.host))?;
        let ca = creds.ca_pem.as_deref().ok_or_else(|| {
            anyhow!(
                "the current cluster has no certificate-authority(-data); \
                 a CA is required to verify the server"
            )
        })?;
        let client = creds
            .client_cert
            .as_ref()
            .map(|(c, k)| (c.as_str(), k.as_str()));
        let config = ClientConfig::new(address, ca, client)
            .context("setting up TLS with the kubeconfig's credentials")?;
        Ok(Api {
            config,
            prefix: endpoint.prefix,
            token: creds.token.clone(),
            conn: None,
        })
    }

    async fn send_once(&mut self, method: &Method, path: &str, body: &[u8]) -> Result<Reply> {
        if self.conn.is_none() {
            self.conn = Some(
                self.config
                    .connect()
                    .await
                    .context("connecting to the server")?,
            );
        }
        let conn = self.conn.as_mut().expect("connection");
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![("accept", "application/json")];
        if !body.is_empty() {
            headers.push(("content-type", "application/json"));
        }
        if let Some(b) = &bearer {
            headers.push(("authorization", b.as_str()));
        }
        let result = conn
            .send_with_headers(method.clone(), path, &headers, body.to_vec())
            .await;
        if result.is_err() {
            self.conn = None;
        }
        Ok(result?)
    }

    /// Sends a request; retries once on a fresh connection if the old one broke.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply> {
        let body = match body {
            Some(v) => serde_json::to_vec(v)?,
            None => Vec::new(),
        };
        let reused = self.conn.is_some();
        match self.send_once(&method, path, &body).await {
            Err(_) if reused => self.send_once(&method, path, &body).await,
            r => r,
        }
        .with_context(|| format!("{method} {path}"))
    }

    /// Whether workspace `path` can be addressed (its discovery root answers).
    pub async fn cluster_reachable(&mut self, path: &WsPath) -> Result<StatusCode> {
        let p = format!("{}/clusters/{path}/api", self.prefix);
        Ok(self.send(Method::GET, &p, None).await?.status)
    }

    /// The Workspace `name` in workspace `parent`; `None` when not found.
    pub async fn get_workspace(&mut self, parent: &WsPath, name: &str) -> Result<Option<Value>> {
        let p = workspaces_path(&self.prefix, parent, Some(name));
        let reply = self.send(Method::GET, &p, None).await?;
        match reply.status {
            s if s.is_success() => Ok(Some(reply.json())),
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::FORBIDDEN => bail!(
                "workspace {name:?} not found: access to workspace {:?} is forbidden \
                 (it may not exist): {}",
                parent.as_str(),
                error_message(&reply)
            ),
            s => bail!(
                "getting workspace {name:?} in {:?}: {s}: {}",
                parent.as_str(),
                error_message(&reply)
            ),
        }
    }

    /// The Workspaces in workspace `parent`.
    pub async fn list_workspaces(&mut self, parent: &WsPath) -> Result<Vec<Value>> {
        let p = workspaces_path(&self.prefix, parent, None);
        let reply = self.send(Method::GET, &p, None).await?;
        if !reply.status.is_success() {
            bail!(
                "listing workspaces in {:?}: {}: {}",
                parent.as_str(),
                reply.status,
                error_message(&reply)
            );
        }
        Ok(reply
            .json()
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// POSTs a Workspace into `parent`; returns the reply as is.
    pub async fn create_workspace(&mut self, parent: &WsPath, obj: &Value) -> Result<Reply> {
        let p = workspaces_path(&self.prefix, parent, None);
        self.send(Method::POST, &p, Some(obj)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn paths() {
        let orgs = WsPath::parse("root:orgs").unwrap();
        assert_eq!(
            workspaces_path("", &orgs, Some("acme")),
            "/clusters/root:orgs/apis/tenancy.kcp.io/v1alpha1/workspaces/acme"
        );
        assert_eq!(
            workspaces_path("/p", &orgs, None),
            "/p/clusters/root:orgs/apis/tenancy.kcp.io/v1alpha1/workspaces"
        );
    }

    #[test]
    fn messages() {
        let reply = |status: u16, body: &'static str| Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: http::HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        };
        assert_eq!(
            error_message(&reply(
                409,
                r#"{"kind":"Status","message":"already exists"}"#
            )),
            "already exists"
        );
        assert_eq!(error_message(&reply(500, "boom\n")), "boom");
        assert_eq!(error_message(&reply(403, "")), "403 Forbidden");
    }
}
