//! The `kubectl ws` commands: current, use, create and tree.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use http::StatusCode;
use serde_json::{json, Value};

use crate::client::{error_message, Api, TENANCY};
use crate::kubeconfig::{self, Kubeconfig, PREVIOUS};
use crate::paths::{resolve, split_server_url, workspace_url, ServerUrl, Target, WsPath};
use crate::tree::{render, Node};

/// How long `create` waits for a new workspace to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The loaded kubeconfig and where its current context points.
struct Session {
    kubeconfig: Kubeconfig,
    server: ServerUrl,
    raw_server: String,
}

impl Session {
    fn load(flag: Option<&Path>) -> Result<Session> {
        let kubeconfig = Kubeconfig::load(&kubeconfig::locate(flag)?)?;
        let raw_server = kubeconfig.current_server()?;
        let server = split_server_url(&raw_server)?;
        Ok(Session {
            kubeconfig,
            server,
            raw_server,
        })
    }

    /// The current workspace; an error when the server URL does not name one.
    fn current(&self) -> Result<WsPath> {
        self.server.workspace.clone().ok_or_else(|| {
            anyhow!(
                "the current context's server URL has no /clusters/ path: {} \
                 (switch to a workspace first, e.g. \"kubectl ws use root\")",
                self.raw_server
            )
        })
    }

    async fn api(&self) -> Result<Api> {
        Api::new(&self.server.base, &self.kubeconfig.credentials()?).await
    }
}

/// `phase` of a Workspace's status ("" when unset).
pub fn phase(ws: &Value) -> &str {
    ws.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The type of a Workspace as `path:name` (type path `root` when the object leaves it out).
pub fn type_of(ws: &Value) -> Option<String> {
    let t = ws.pointer("/spec/type")?;
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())?;
    let path = t
        .get("path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("root");
    Some(format!("{path}:{name}"))
}

/// ` (type root:organization)`, or nothing when the type is unknown.
fn type_suffix(ws: Option<&Value>) -> String {
    ws.and_then(type_of)
        .map(|t| format!(" (type {t})"))
        .unwrap_or_default()
}

/// The line printed after switching.
pub fn current_line(path: &WsPath, ws: Option<&Value>) -> String {
    format!("Current workspace is \"{path}\"{}.", type_suffix(ws))
}

/// Splits a `--type` value: `organization` → (organization, none), `root:organization` →
/// (organization, root).
pub fn parse_type(t: &str) -> Result<(String, Option<String>)> {
    let full = WsPath::parse(t).map_err(|_| anyhow!("invalid workspace type {t:?}"))?;
    Ok((
        full.name().to_string(),
        full.parent().map(|p| p.to_string()),
    ))
}

/// The Workspace object `create` posts.
pub fn new_workspace(name: &str, ty: Option<&(String, Option<String>)>) -> Value {
    let mut spec = json!({});
    if let Some((type_name, type_path)) = ty {
        spec["type"] = json!({ "name": type_name });
        if let Some(p) = type_path {
            spec["type"]["path"] = json!(p);
        }
    }
    json!({
        "apiVersion": TENANCY,
        "kind": "Workspace",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// Checks that `path` exists and is Ready; returns its Workspace object (none for a workspace
/// without a parent, such as root).
async fn check_workspace(api: &mut Api, path: &WsPath) -> Result<Option<Value>> {
    let Some(parent) = path.parent() else {
        let status = api.cluster_reachable(path).await?;
        return match status {
            s if s.is_success() => Ok(None),
            StatusCode::NOT_FOUND | StatusCode::FORBIDDEN => {
                bail!("workspace \"{path}\" not found")
            }
            s => bail!("workspace \"{path}\" cannot be reached: {s}"),
        };
    };
    let name = path.name();
    let ws = api
        .get_workspace(&parent, name)
        .await?
        .ok_or_else(|| anyhow!("workspace \"{name}\" not found in \"{parent}\""))?;
    match phase(&ws) {
        "Ready" => Ok(Some(ws)),
        "" => bail!("workspace \"{path}\" is not ready yet (no phase reported)"),
        p => bail!("workspace \"{path}\" is not ready (phase {p})"),
    }
}

/// `kubectl ws current`.
pub fn current(flag: Option<&Path>) -> Result<()> {
    let s = Session::load(flag)?;
    println!("Current workspace is \"{}\".", s.current()?);
    Ok(())
}

/// Switches the kubeconfig to `path` (already checked), remembering the previous workspace.
fn enter(s: &mut Session, path: &WsPath, ws: Option<&Value>) -> Result<()> {
    let from = s.kubeconfig.current_context_name()?;
    let url = workspace_url(&s.server.base, path);
    s.kubeconfig.switch(&from, Some(&url))?;
    s.kubeconfig.save()?;
    println!("{}", current_line(path, ws));
    Ok(())
}

/// `kubectl ws use PATH` (also `kubectl ws PATH`).
pub async fn use_workspace(flag: Option<&Path>, arg: &str) -> Result<()> {
    let mut s = Session::load(flag)?;
    match resolve(s.server.workspace.as_ref(), arg)? {
        Target::Path(path) => {
            let mut api = s.api().await?;
            let ws = check_workspace(&mut api, &path).await?;
            enter(&mut s, &path, ws.as_ref())
        }
        Target::Previous => {
            if !s.kubeconfig.has_previous() {
                bail!("no previous workspace to return to");
            }
            let mut k = s.kubeconfig.clone();
            k.switch(PREVIOUS, None)?;
            let url = split_server_url(&k.current_server()?)?;
            let ws = match &url.workspace {
                Some(path) => {
                    let mut api = Api::new(&url.base, &k.credentials()?).await?;
                    check_workspace(&mut api, path).await?
                }
                None => None,
            };
            k.save()?;
            match &url.workspace {
                Some(path) => println!("{}", current_line(path, ws.as_ref())),
                None => println!("Switched back to server {} (no workspace path).", url.base),
            }
            Ok(())
        }
    }
}

/// Options of `kubectl ws create`.
pub struct CreateOptions {
    pub name: String,
    pub ty: Option<String>,
    pub enter: bool,
    pub ignore_existing: bool,
}

/// `kubectl ws create NAME [--type T] [--enter] [--ignore-existing]`.
pub async fn create(flag: Option<&Path>, o: &CreateOptions) -> Result<()> {
    let mut s = Session::load(flag)?;
    let current = s.current()?;
    let path = current.child(&o.name).map_err(|_| {
        anyhow!(
            "invalid workspace name {:?}: use lower-case letters, digits and '-'",
            o.name
        )
    })?;
    let ty = o.ty.as_deref().map(parse_type).transpose()?;
    let mut api = s.api().await?;
    let reply = api
        .create_workspace(&current, &new_workspace(&o.name, ty.as_ref()))
        .await?;
    let mut ws = if reply.status.is_success() {
        let ws = reply.json();
        println!(
            "Workspace \"{}\"{} created. Waiting for it to be ready...",
            o.name,
            type_suffix(Some(&ws))
        );
        ws
    } else if reply.status == StatusCode::CONFLICT && o.ignore_existing {
        let ws = api
            .get_workspace(&current, &o.name)
            .await?
            .ok_or_else(|| anyhow!("workspace \"{}\" not found in \"{current}\"", o.name))?;
        if let Some((type_name, type_path)) = &ty {
            let spec = ws.pointer("/spec/type");
            let got_name = spec.and_then(|t| t.get("name")).and_then(Value::as_str);
            let got_path = spec.and_then(|t| t.get("path")).and_then(Value::as_str);
            let path_differs = type_path
                .as_deref()
                .is_some_and(|p| got_path.is_some_and(|g| g != p));
            if got_name != Some(type_name.as_str()) || path_differs {
                bail!(
                    "workspace \"{}\" already exists with type {}, not {}",
                    o.name,
                    type_of(&ws).unwrap_or_else(|| "<none>".into()),
                    o.ty.as_deref().unwrap_or_default()
                );
            }
        }
        println!(
            "Workspace \"{}\"{} already exists. Waiting for it to be ready...",
            o.name,
            type_suffix(Some(&ws))
        );
        ws
    } else {
        bail!(
            "creating workspace \"{}\" in \"{current}\": {}",
            o.name,
            error_message(&reply)
        );
    };

    let started = Instant::now();
    while phase(&ws) != "Ready" {
        if started.elapsed() >= READY_TIMEOUT {
            bail!(
                "workspace \"{}\" did not become ready within {}s (phase {:?})",
                o.name,
                READY_TIMEOUT.as_secs(),
                phase(&ws)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        ws = api
            .get_workspace(&current, &o.name)
            .await?
            .ok_or_else(|| anyhow!("workspace \"{}\" disappeared while waiting", o.name))?;
    }
    println!(
        "Workspace \"{}\"{} is ready to use.",
        o.name,
        type_suffix(Some(&ws))
    );
    if o.enter {
        enter(&mut s, &path, Some(&ws))?;
    }
    Ok(())
}

/// Names of the Workspaces of a list (sorted) with whether each is Ready.
pub fn children(items: &[Value]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = items
        .iter()
        .filter_map(|ws| {
            let name = ws.pointer("/metadata/name")?.as_str()?;
            Some((name.to_string(), phase(ws) == "Ready"))
        })
        .collect();
    out.sort();
    out
}

type NodeFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Node>>> + 'a>>;

/// The subtree below `path`: every child, descending into those that are Ready.
fn subtree<'a>(api: &'a mut Api, path: WsPath) -> NodeFuture<'a> {
    Box::pin(async move {
        let items = api.list_workspaces(&path).await?;
        let mut nodes = Vec::new();
        for (name, ready) in children(&items) {
            let below = match path.child(&name) {
                // A child that cannot be listed is still shown, without children.
                Ok(child) if ready => subtree(api, child).await.unwrap_or_default(),
                _ => Vec::new(),
            };
            nodes.push(Node::new(name, below));
        }
        Ok(nodes)
    })
}

/// `kubectl ws tree`.
pub async fn tree(flag: Option<&Path>) -> Result<()> {
    let s = Session::load(flag)?;
    let current = s.current()?;
    let mut api = s.api().await?;
    let below = subtree(&mut api, current.clone()).await?;
    print!("{}", render(&Node::new(current.to_string(), below)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        let ws = json!({"spec": {"type": {"name": "organization", "path": "root"}}});
        assert_eq!(type_of(&ws).as_deref(), Some("root:organization"));
        let ws = json!({"spec": {"type": {"name": "team"}}});
        assert_eq!(type_of(&ws).as_deref(), Some("root:team"));
        assert_eq!(type_of(&json!({"spec": {}})), None);
        assert_eq!(type_suffix(Some(&ws)), " (type root:team)");
        assert_eq!(type_suffix(None), "");
        assert_eq!(
            parse_type("organization").unwrap(),
            ("organization".into(), None)
        );
        assert_eq!(
            parse_type("root:orgs:custom").unwrap(),
            ("custom".into(), Some("root:orgs".into()))
        );
        assert!(parse_type("Org").is_err());
    }

    #[test]
    fn workspace_body() {
        let t = ("organization".to_string(), None);
        assert_eq!(
            new_workspace("acme", Some(&t)),
            json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1",
                "kind": "Workspace",
                "metadata": {"name": "acme"},
                "spec": {"type": {"name": "organization"}},
            })
        );
        let t = ("custom".to_string(), Some("root:orgs".to_string()));
        assert_eq!(
            new_workspace("x", Some(&t))["spec"]["type"],
            json!({"name": "custom", "path": "root:orgs"})
        );
        assert_eq!(new_workspace("x", None)["spec"], json!({}));
    }

    #[test]
    fn lines() {
        let path = WsPath::parse("root:orgs:acme").unwrap();
        let ws = json!({"spec": {"type": {"name": "organization", "path": "root"}}});
        assert_eq!(
            current_line(&path, Some(&ws)),
            "Current workspace is \"root:orgs:acme\" (type root:organization)."
        );
        assert_eq!(
            current_line(&WsPath::root(), None),
            "Current workspace is \"root\"."
        );
    }

    #[test]
    fn child_listing() {
        let items = vec![
            json!({"metadata": {"name": "providers"}, "status": {"phase": "Ready"}}),
            json!({"metadata": {"name": "orgs"}, "status": {"phase": "Ready"}}),
            json!({"metadata": {"name": "new"}, "status": {"phase": "Initializing"}}),
            json!({"metadata": {}}),
        ];
        assert_eq!(
            children(&items),
            vec![
                ("new".to_string(), false),
                ("orgs".to_string(), true),
                ("providers".to_string(), true)
            ]
        );
        assert_eq!(phase(&items[2]), "Initializing");
        assert_eq!(phase(&items[3]), "");
    }
}
