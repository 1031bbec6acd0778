//! Reading and editing a kubeconfig file: the current context's server and credentials, and
//! switching workspaces the way kcp's plugin does (a `workspace.kcp.io/current` context whose
//! cluster points at the workspace, and `workspace.kcp.io/previous` for `kubectl ws -`).
//!
//! The document is kept as a generic JSON value so that fields this tool does not know about
//! (extensions, preferences, exec plugins, ...) survive a rewrite.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Map, Value};

/// Context and cluster name of the workspace in use.
pub const CURRENT: &str = "workspace.kcp.io/current";
/// Context and cluster name of the workspace used before the last switch.
pub const PREVIOUS: &str = "workspace.kcp.io/previous";

/// Credentials and trust taken from the current context.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// PEM of the CA(s) trusted for the server certificate.
    pub ca_pem: Option<String>,
    /// PEM client certificate and key.
    pub client_cert: Option<(String, String)>,
    /// Bearer token.
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .field("token", &self.token.is_some())
            .finish()
    }
}

/// A loaded kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubeconfig {
    /// The file it was read from (and is written back to).
    pub path: PathBuf,
    pub doc: Value,
}

/// The kubeconfig file to use: `--kubeconfig`, else the first existing file of `$KUBECONFIG`
/// (a `:`-separated list), else `~/.kube/config`.
pub fn locate(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let files: Vec<PathBuf> = std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if let Some(p) = files.iter().find(|p| p.exists()).or(files.first()) {
            return Ok(p.clone());
        }
    }
    let home = std::env::var_os("HOME").ok_or_else(|| {
        anyhow!("no kubeconfig: neither --kubeconfig, KUBECONFIG nor HOME is set")
    })?;
    Ok(PathBuf::from(home).join(".kube").join("config"))
}

/// The inner object of the list entry `name` in `doc[list]` (e.g. the `cluster` of a
/// `clusters` entry).
fn entry<'a>(doc: &'a Value, list: &str, field: &str, name: &str) -> Option<&'a Value> {
    doc.get(list)?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(scalar).as_deref() == Some(name))?
        .get(field)
}

/// Adds or replaces the list entry `name` in `doc[list]`.
fn set_entry(doc: &mut Value, list: &str, field: &str, name: &str, inner: Value) {
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let root = doc.as_object_mut().expect("object");
    let items = root.entry(list).or_insert_with(|| Value::Array(Vec::new()));
    if !items.is_array() {
        *items = Value::Array(Vec::new());
    }
    let items = items.as_array_mut().expect("array");
    let new = json!({"name": name, field: inner});
    match items
        .iter_mut()
        .find(|e| e.get("name").and_then(scalar).as_deref() == Some(name))
    {
        Some(e) => *e = new,
        None => items.push(new),
    }
}

/// A scalar as text: YAML may have read an unquoted name such as `1` as a number.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A non-empty scalar field.
fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(scalar).filter(|s| !s.is_empty())
}

impl Kubeconfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Kubeconfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        Kubeconfig::parse(&text, path)
    }

    /// Parses kubeconfig YAML (or JSON); `path` is where relative file references point from.
    pub fn parse(text: &str, path: &Path) -> Result<Kubeconfig> {
        let doc: Value = if text.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            // YAML 1.2 booleans only, so that a name like `y` or `on` stays a string.
            let options = serde_saphyr::options! {
                strict_booleans: true,
                leading_zero_numbers_as_strings: true,
                underscored_numbers_as_strings: true,
            };
            serde_saphyr::from_str_with_options(text, options)
                .with_context(|| format!("parsing kubeconfig {}", path.display()))?
        };
        let doc = match doc {
            Value::Null => Value::Object(Map::new()),
            Value::Object(_) => doc,
            _ => bail!("kubeconfig {} is not a YAML mapping", path.display()),
        };
        Ok(Kubeconfig {
            path: path.to_path_buf(),
            doc,
        })
    }

    /// The name of the current context.
    pub fn current_context_name(&self) -> Result<String> {
        str_field(&self.doc, "current-context")
            .ok_or_else(|| anyhow!("kubeconfig {} has no current-context", self.path.display()))
    }

    fn context(&self, name: &str) -> Result<&Value> {
        entry(&self.doc, "contexts", "context", name).ok_or_else(|| {
            anyhow!(
                "context {name:?} not found in kubeconfig {}",
                self.path.display()
            )
        })
    }

    fn cluster_of(&self, context: &Value) -> Result<(String, &Value)> {
        let name = str_field(context, "cluster").ok_or_else(|| {
            anyhow!(
                "a context of kubeconfig {} has no cluster",
                self.path.display()
            )
        })?;
        let cluster = entry(&self.doc, "clusters", "cluster", &name).ok_or_else(|| {
            anyhow!(
                "cluster {name:?} not found in kubeconfig {}",
                self.path.display()
            )
        })?;
        Ok((name, cluster))
    }

    /// The server URL of context `name`.
    pub fn server_of(&self, name: &str) -> Result<String> {
        let (cluster_name, cluster) = self.cluster_of(self.context(name)?)?;
        str_field(cluster, "server")
            .ok_or_else(|| anyhow!("cluster {cluster_name:?} has no server URL"))
    }

    /// The server URL of the current context.
    pub fn current_server(&self) -> Result<String> {
        self.server_of(&self.current_context_name()?)
    }

    /// Whether a previous workspace is remembered.
    pub fn has_previous(&self) -> bool {
        entry(&self.doc, "contexts", "context", PREVIOUS).is_some()
    }

    /// A file reference of the kubeconfig, relative to its directory.
    fn read_referenced(&self, file: &str) -> Result<String> {
        let p = Path::new(file);
        let p = if p.is_relative() {
            self.path
                .parent()
                .map(|d| d.join(p))
                .unwrap_or_else(|| p.to_path_buf())
        } else {
            p.to_path_buf()
        };
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    }

    /// `<key>-data` (base64) or `<key>` (a file), whichever is set.
    fn data_or_file(&self, v: &Value, key: &str) -> Result<Option<String>> {
        if let Some(data) = str_field(v, &format!("{key}-data")) {
            let bytes = base64_decode(&data).with_context(|| format!("decoding {key}-data"))?;
            return Ok(Some(
                String::from_utf8(bytes).with_context(|| format!("{key}-data is not PEM text"))?,
            ));
        }
        str_field(v, key)
            .map(|f| self.read_referenced(&f))
            .transpose()
    }

    /// The CA, client certificate and token of the current context.
    pub fn credentials(&self) -> Result<Credentials> {
        let context = self.context(&self.current_context_name()?)?;
        let (_, cluster) = self.cluster_of(context)?;
        let ca_pem = self.data_or_file(cluster, "certificate-authority")?;
        let user = match str_field(context, "user") {
            Some(name) => entry(&self.doc, "users", "user", &name).ok_or_else(|| {
                anyhow!(
                    "user {name:?} not found in kubeconfig {}",
                    self.path.display()
                )
            })?,
            None => &Value::Null,
        };
        let cert = self.data_or_file(user, "client-certificate")?;
        let key = self.data_or_file(user, "client-key")?;
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => bail!("the current user has a client certificate or key, but not both"),
        };
        let token = match (str_field(user, "token"), str_field(user, "tokenFile")) {
            (Some(t), _) => Some(t),
            (None, Some(f)) => Some(self.read_referenced(&f)?.trim().to_string()),
            (None, None) => None,
        };
        Ok(Credentials {
            ca_pem,
            client_cert,
            token,
        })
    }

    /// Makes `workspace.kcp.io/current` the current context: a copy of context `from` (with its
    /// user and namespace) whose cluster is a copy of `from`'s cluster pointing at `server`
    /// (or at its own server when `None`). What was current until now is remembered as
    /// `workspace.kcp.io/previous`.
    pub fn switch(&mut self, from: &str, server: Option<&str>) -> Result<()> {
        let old_name = self.current_context_name()?;
        let old_context = self.context(&old_name)?.clone();
        let (_, old_cluster) = self.cluster_of(&old_context)?;
        let old_cluster = old_cluster.clone();

        let mut new_context = self.context(from)?.clone();
        let (_, new_cluster) = self.cluster_of(&new_context)?;
        let mut new_cluster = new_cluster.clone();
        if let Some(server) = server {
            new_cluster["server"] = Value::String(server.to_string());
        }

        let mut prev_context = old_context;
        prev_context["cluster"] = Value::String(PREVIOUS.to_string());
        set_entry(&mut self.doc, "clusters", "cluster", PREVIOUS, old_cluster);
        set_entry(&mut self.doc, "contexts", "context", PREVIOUS, prev_context);

        new_context["cluster"] = Value::String(CURRENT.to_string());
        set_entry(&mut self.doc, "clusters", "cluster", CURRENT, new_cluster);
        set_entry(&mut self.doc, "contexts", "context", CURRENT, new_context);
        self.doc["current-context"] = Value::String(CURRENT.to_string());
        Ok(())
    }

    /// The document as YAML.
    pub fn to_yaml(&self) -> Result<String> {
        let mut options = serde_saphyr::SerializerOptions::default();
        options.prefer_block_scalars = false;
        serde_saphyr::to_string_with_options(&self.doc, options).context("encoding kubeconfig")
    }

    /// Writes the document back: to a temporary file beside the target (same permissions),
    /// then renamed over it, so readers never see half a file.
    pub fn save(&self) -> Result<()> {
        let yaml = self.to_yaml()?;
        // Replace the file a symlink points to, not the symlink.
        let target = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        let dir = target
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let file_name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kubeconfig".into());
        let tmp = dir.join(format!(
            ".{file_name}.kubectl-ws-{}.tmp",
            std::process::id()
        ));
        let write = || -> Result<()> {
            use std::io::Write as _;
            let mut f = std::fs::File::create(&tmp)?;
            let perms = std::fs::metadata(&target)
                .map(|m| m.permissions())
                .ok()
                .unwrap_or_else(private_permissions);
            f.set_permissions(perms)?;
            f.write_all(yaml.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &target)?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            e.context(format!("writing kubeconfig {}", target.display()))
        })
    }
}

#[cfg(unix)]
fn private_permissions() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::Permissions::from_mode(0o600)
}

#[cfg(not(unix))]
fn private_permissions() -> std::fs::Permissions {
    std::fs::metadata(".")
        .map(|m| m.permissions())
        .expect("permissions")
}

/// Decodes standard base64 (with or without padding; whitespace ignored).
pub fn base64_decode(s: &str) -> Result<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let data = match clean.iter().position(|&c| c == b'=') {
        Some(i) if clean[i..].iter().all(|&c| c == b'=') && clean.len() - i <= 2 => &clean[..i],
        Some(_) => bail!("invalid base64 padding"),
        None => &clean[..],
    };
    if data.len() % 4 == 1 {
        bail!("invalid base64 length");
    }
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = value(c).ok_or_else(|| anyhow!("invalid base64 character {:?}", c as char))?;
            acc |= v << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
apiVersion: v1
kind: Config
clusters:
- name: platform-mesh
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: Q0EgUEVN
contexts:
- name: platform-mesh
  context:
    cluster: platform-mesh
    user: admin
    namespace: team
current-context: platform-mesh
preferences: {}
users:
- name: admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
";

    fn config() -> Kubeconfig {
        Kubeconfig::parse(CONFIG, Path::new("/nonexistent/config")).unwrap()
    }

    #[test]
    fn base64() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64_decode("Zm9v\nYmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        assert!(base64_decode("Zm9v!").is_err());
        assert!(base64_decode("Z").is_err());
        assert!(base64_decode("Zg=a").is_err());
    }

    #[test]
    fn reads_current_context() {
        let k = config();
        assert_eq!(k.current_context_name().unwrap(), "platform-mesh");
        assert_eq!(k.current_server().unwrap(), "https://127.0.0.1:6443");
        let c = k.credentials().unwrap();
        assert_eq!(c.ca_pem.as_deref(), Some("CA PEM"));
        assert_eq!(c.client_cert, Some(("CERT".into(), "KEY".into())));
        assert_eq!(c.token, None);
        assert!(!k.has_previous());
    }

    #[test]
    fn reads_files_and_tokens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "CA FILE").unwrap();
        std::fs::write(dir.path().join("tok"), "file-token\n").unwrap();
        let text = "\
clusters:
- name: c
  cluster: {server: 'https://h:1/clusters/root', certificate-authority: ca.crt}
contexts:
- name: x
  context: {cluster: c, user: u}
- name: y
  context: {cluster: c, user: v}
current-context: x
users:
- name: u
  user: {token: secret}
- name: v
  user: {tokenFile: tok}
";
        let path = dir.path().join("config");
        std::fs::write(&path, text).unwrap();
        let mut k = Kubeconfig::load(&path).unwrap();
        let c = k.credentials().unwrap();
        assert_eq!(c.ca_pem.as_deref(), Some("CA FILE"));
        assert_eq!(c.token.as_deref(), Some("secret"));
        assert_eq!(c.client_cert, None);
        k.doc["current-context"] = json!("y");
        assert_eq!(
            k.credentials().unwrap().token.as_deref(),
            Some("file-token")
        );
    }

    #[test]
    fn unquoted_names_stay_names() {
        let text = "\
clusters:
- name: on
  cluster: {server: 'https://h:1', certificate-authority-data: Q0E=}
- name: 7
  cluster: {server: 'https://h:2'}
contexts:
- name: y
  context: {cluster: on, user: 0123}
- name: n
  context: {cluster: 7}
current-context: y
users:
- name: 0123
  user: {token: t}
";
        let mut k = Kubeconfig::parse(text, Path::new("k")).unwrap();
        assert_eq!(k.current_server().unwrap(), "https://h:1");
        assert_eq!(k.credentials().unwrap().token.as_deref(), Some("t"));
        k.doc["current-context"] = json!("n");
        assert_eq!(k.current_server().unwrap(), "https://h:2");
    }

    #[test]
    fn errors_name_what_is_missing() {
        let k = Kubeconfig::parse("", Path::new("k")).unwrap();
        assert!(k
            .current_server()
            .unwrap_err()
            .to_string()
            .contains("no current-context"));
        let mut k = config();
        k.doc["current-context"] = json!("nope");
        assert!(k
            .current_server()
            .unwrap_err()
            .to_string()
            .contains("context \"nope\" not found"));
        assert!(Kubeconfig::parse("- a\n", Path::new("k")).is_err());
        let mut k = config();
        k.doc["users"][0]["user"]
            .as_object_mut()
            .unwrap()
            .remove("client-key-data");
        assert!(k.credentials().is_err());
    }

    #[test]
    fn switch_keeps_credentials_and_remembers_previous() {
        let mut k = config();
        k.switch(
            "platform-mesh",
            Some("https://127.0.0.1:6443/clusters/root:orgs"),
        )
        .unwrap();
        assert_eq!(k.current_context_name().unwrap(), CURRENT);
        assert_eq!(
            k.current_server().unwrap(),
            "https://127.0.0.1:6443/clusters/root:orgs"
        );
        assert_eq!(k.server_of(PREVIOUS).unwrap(), "https://127.0.0.1:6443");
        assert_eq!(k.credentials().unwrap(), config().credentials().unwrap());
        let ctx = entry(&k.doc, "contexts", "context", CURRENT).unwrap();
        assert_eq!(ctx["user"], "admin");
        assert_eq!(ctx["namespace"], "team");
        // The original entries are untouched.
        assert_eq!(
            k.server_of("platform-mesh").unwrap(),
            "https://127.0.0.1:6443"
        );

        // Switching again from the current context.
        k.switch(
            CURRENT,
            Some("https://127.0.0.1:6443/clusters/root:orgs:acme"),
        )
        .unwrap();
        assert_eq!(
            k.server_of(PREVIOUS).unwrap(),
            "https://127.0.0.1:6443/clusters/root:orgs"
        );
        // `kubectl ws -`: back and forth.
        k.switch(PREVIOUS, None).unwrap();
        assert_eq!(
            k.current_server().unwrap(),
            "https://127.0.0.1:6443/clusters/root:orgs"
        );
        assert_eq!(
            k.server_of(PREVIOUS).unwrap(),
            "https://127.0.0.1:6443/clusters/root:orgs:acme"
        );
        k.switch(PREVIOUS, None).unwrap();
        assert_eq!(
            k.current_server().unwrap(),
            "https://127.0.0.1:6443/clusters/root:orgs:acme"
        );
        let clusters = k.doc["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 3, "{clusters:?}");
    }

    #[test]
    fn yaml_round_trip_keeps_unknown_fields() {
        let mut k = config();
        k.doc["extensions"] = json!([{"name": "x", "extension": {"a": "true", "n": 1}}]);
        k.switch("platform-mesh", Some("https://h/clusters/root"))
            .unwrap();
        let yaml = k.to_yaml().unwrap();
        let back = Kubeconfig::parse(&yaml, Path::new("k")).unwrap();
        assert_eq!(back.doc, k.doc);
        assert_eq!(back.doc["extensions"][0]["extension"]["a"], "true");
        assert_eq!(back.doc["preferences"], json!({}));
    }

    #[test]
    fn save_is_atomic_and_keeps_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, CONFIG).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        let link = dir.path().join("link");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&path, &link).unwrap();
        #[cfg(not(unix))]
        std::fs::copy(&path, &link).unwrap();

        let mut k = Kubeconfig::load(&link).unwrap();
        k.switch("platform-mesh", Some("https://h/clusters/root"))
            .unwrap();
        k.save().unwrap();
        let again = Kubeconfig::load(&path).unwrap();
        assert_eq!(again.current_server().unwrap(), "https://h/clusters/root");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "leftover files: {names:?}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o640);
        }
    }

    #[test]
    fn locate_prefers_flag_then_env() {
        let flag = Path::new("/x/flag");
        assert_eq!(locate(Some(flag)).unwrap(), flag);
    }
}
