//! Workspace paths (`root:orgs:acme`), what a `kubectl ws` argument points at, and the
//! `<base>/clusters/<path>` server URLs that address a workspace.

use std::fmt;

use anyhow::{anyhow, bail, Result};

/// The path of the root workspace.
pub const ROOT: &str = "root";

/// A validated colon-separated workspace path such as `root:orgs:acme`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WsPath(String);

/// Whether `s` is one path segment: lower-case alphanumerics and `-`, at most 63 characters,
/// starting and ending with an alphanumeric.
fn valid_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

impl WsPath {
    /// Parses and validates a path.
    pub fn parse(s: &str) -> Result<WsPath> {
        if s.split(':').all(valid_segment) {
            Ok(WsPath(s.to_string()))
        } else {
            bail!(
                "invalid workspace path {s:?}: each ':'-separated segment must consist of \
                 lower-case letters, digits and '-', start and end with a letter or digit, \
                 and be at most 63 characters long"
            )
        }
    }

    /// The root workspace.
    pub fn root() -> WsPath {
        WsPath(ROOT.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last segment: the workspace's name in its parent.
    pub fn name(&self) -> &str {
        self.0.rsplit(':').next().unwrap_or(&self.0)
    }

    /// The parent workspace; `None` for a single-segment path (root or a logical-cluster name).
    pub fn parent(&self) -> Option<WsPath> {
        self.0
            .rsplit_once(':')
            .map(|(parent, _)| WsPath(parent.to_string()))
    }

    /// The child `name` of this workspace.
    pub fn child(&self, name: &str) -> Result<WsPath> {
        WsPath::parse(&format!("{}:{name}", self.0))
    }
}

impl fmt::Display for WsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a `kubectl ws use` argument leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A workspace path.
    Path(WsPath),
    /// The workspace used before the last switch (`-`).
    Previous,
}

/// Resolves a `kubectl ws use` argument against the current workspace (if known):
/// `-` previous, `~`/`root` the root workspace, `.` the current one, `..` its parent, anything
/// with a `:` an absolute path, and any other single name a child of the current workspace.
pub fn resolve(current: Option<&WsPath>, arg: &str) -> Result<Target> {
    let need_current = || {
        current.ok_or_else(|| {
            anyhow!(
                "cannot resolve {arg:?}: the current workspace is not known (use an absolute path \
                 such as \"root\" or \"root:orgs\")"
            )
        })
    };
    let arg = arg.trim();
    Ok(match arg {
        "" => bail!("a workspace path is required"),
        "-" => Target::Previous,
        "~" | ROOT => Target::Path(WsPath::root()),
        "." => Target::Path(need_current()?.clone()),
        ".." => {
            let current = need_current()?;
            Target::Path(current.parent().ok_or_else(|| {
                anyhow!("workspace {:?} has no parent workspace", current.as_str())
            })?)
        }
        _ if arg.contains(':') => Target::Path(WsPath::parse(arg)?),
        _ => Target::Path(need_current()?.child(arg)?),
    })
}

/// A server URL split at `/clusters/`: the base (scheme, host and any path prefix) and the
/// workspace path it addresses, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerUrl {
    pub base: String,
    pub workspace: Option<WsPath>,
}

/// Splits a kubeconfig server URL such as `https://host:6443/clusters/root:orgs` into its base
/// `https://host:6443` and workspace `root:orgs`. A URL without `/clusters/` is all base.
pub fn split_server_url(url: &str) -> Result<ServerUrl> {
    let url = url.trim();
    let after_scheme = url
        .find("://")
        .map(|i| i + 3)
        .ok_or_else(|| anyhow!("server URL {url:?} has no scheme (expected https://...)"))?;
    match url[after_scheme..].find("/clusters/") {
        None => Ok(ServerUrl {
            base: url.trim_end_matches('/').to_string(),
            workspace: None,
        }),
        Some(i) => {
            let at = after_scheme + i;
            let rest = &url[at + "/clusters/".len()..];
            let path = rest.split(['/', '?', '#']).next().unwrap_or_default();
            if path.is_empty() {
                bail!("server URL {url:?} has an empty workspace path after /clusters/");
            }
            Ok(ServerUrl {
                base: url[..at].to_string(),
                workspace: Some(WsPath::parse(path)?),
            })
        }
    }
}

/// The server URL of workspace `path` below `base`.
pub fn workspace_url(base: &str, path: &WsPath) -> String {
    format!("{}/clusters/{path}", base.trim_end_matches('/'))
}

/// Where to connect: host, port and the path prefix requests start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path before `/clusters/`, without a trailing slash (usually empty).
    pub prefix: String,
}

/// Parses the base of a server URL (`https://host[:port][/prefix]`).
pub fn parse_endpoint(base: &str) -> Result<Endpoint> {
    let rest = match base.split_once("://") {
        Some(("https", rest)) => rest,
        Some((scheme, _)) => bail!("server URL {base:?}: only https is supported, not {scheme}"),
        None => bail!("server URL {base:?} has no scheme (expected https://...)"),
    };
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| anyhow!("server URL {base:?}: unterminated IPv6 address"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        bail!("server URL {base:?} has no host");
    }
    let port = match port {
        Some(p) => p
            .parse()
            .map_err(|_| anyhow!("server URL {base:?} has an invalid port {p:?}"))?,
        None => 443,
    };
    Ok(Endpoint {
        host: host.to_string(),
        port,
        prefix: prefix.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WsPath {
        WsPath::parse(s).unwrap()
    }

    #[test]
    fn path_validation() {
        for ok in [
            "root",
            "root:orgs:acme",
            "a",
            "a-b:c0",
            "2x9c1v8nh4nzl5u9:invoices",
        ] {
            assert!(WsPath::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "Root", "root:", ":root", "root::a", "-a", "a-", "a_b", "a/b", "root:a b",
        ] {
            assert!(WsPath::parse(bad).is_err(), "{bad}");
        }
        assert!(WsPath::parse(&"a".repeat(63)).is_ok());
        assert!(WsPath::parse(&"a".repeat(64)).is_err());
    }

    #[test]
    fn path_parts() {
        let acme = p("root:orgs:acme");
        assert_eq!(acme.name(), "acme");
        assert_eq!(acme.parent(), Some(p("root:orgs")));
        assert_eq!(p("root").parent(), None);
        assert_eq!(p("root").name(), "root");
        assert_eq!(p("root:orgs").child("beta").unwrap(), p("root:orgs:beta"));
        assert!(p("root").child("Bad").is_err());
    }

    #[test]
    fn resolve_arguments() {
        let cur = p("root:orgs");
        let r = |arg: &str| resolve(Some(&cur), arg).unwrap();
        assert_eq!(r("acme"), Target::Path(p("root:orgs:acme")));
        assert_eq!(r(".."), Target::Path(p("root")));
        assert_eq!(r("."), Target::Path(p("root:orgs")));
        assert_eq!(r("-"), Target::Previous);
        assert_eq!(r("~"), Target::Path(p("root")));
        assert_eq!(r("root"), Target::Path(p("root")));
        assert_eq!(r("root:providers"), Target::Path(p("root:providers")));
        assert_eq!(r("other:x"), Target::Path(p("other:x")));
        assert!(resolve(Some(&cur), "Acme").is_err());
        assert!(resolve(Some(&cur), "").is_err());
        let err = resolve(Some(&p("root")), "..").unwrap_err().to_string();
        assert!(err.contains("has no parent"), "{err}");
    }

    #[test]
    fn resolve_without_current() {
        assert_eq!(
            resolve(None, "root:orgs").unwrap(),
            Target::Path(p("root:orgs"))
        );
        assert_eq!(resolve(None, "~").unwrap(), Target::Path(p("root")));
        assert_eq!(resolve(None, "-").unwrap(), Target::Previous);
        for rel in ["acme", "..", "."] {
            let err = resolve(None, rel).unwrap_err().to_string();
            assert!(err.contains("current workspace is not known"), "{err}");
        }
    }

    #[test]
    fn split_urls() {
        let s = split_server_url("https://127.0.0.1:6443/clusters/root:orgs").unwrap();
        assert_eq!(s.base, "https://127.0.0.1:6443");
        assert_eq!(s.workspace, Some(p("root:orgs")));
        let s = split_server_url("https://h/prefix/clusters/root/").unwrap();
        assert_eq!(s.base, "https://h/prefix");
        assert_eq!(s.workspace, Some(p("root")));
        let s = split_server_url("https://127.0.0.1:6443/").unwrap();
        assert_eq!(s.base, "https://127.0.0.1:6443");
        assert_eq!(s.workspace, None);
        assert!(split_server_url("https://h/clusters/").is_err());
        assert!(split_server_url("https://h/clusters/Bad").is_err());
        assert!(split_server_url("127.0.0.1:6443").is_err());
    }

    #[test]
    fn rewrite_urls() {
        let s = split_server_url("https://h:1/clusters/root:orgs").unwrap();
        assert_eq!(
            workspace_url(&s.base, &p("root:orgs:acme")),
            "https://h:1/clusters/root:orgs:acme"
        );
        assert_eq!(
            workspace_url("https://h/", &p("root")),
            "https://h/clusters/root"
        );
    }

    #[test]
    fn endpoints() {
        let e = parse_endpoint("https://127.0.0.1:6443").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 6443, "")
        );
        let e = parse_endpoint("https://kcp.example.com/proxy/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("kcp.example.com", 443, "/proxy")
        );
        let e = parse_endpoint("https://[::1]:8443").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 8443));
        assert!(parse_endpoint("http://h:1").is_err());
        assert!(parse_endpoint("https://h:x").is_err());
        assert!(parse_endpoint("https://:1").is_err());
    }
}
