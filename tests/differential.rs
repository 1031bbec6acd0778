//! The differential API test: one corpus of requests (`tests/differential/corpus.yaml`) sent in
//! order to the real kube-apiserver (the release pinned in `tests/peers/go`) and to
//! `platform-mesh serve`, each starting empty. Every answer is normalized (what differs between
//! any two runs of the same server: uids, resourceVersions, timestamps, continue tokens) and the
//! two are compared field by field. Every difference must be listed, with its reason, in
//! `tests/differential/known-differences.yaml`; a new difference fails the test, and so does a
//! listed one that no longer occurs (so the list only shrinks when something is fixed).
//!
//! The tenancy corpus (`tests/differential/kcp-corpus.yaml`, differences in
//! `kcp-known-differences.yaml`) is sent the same way to the real kcp (`tests/peers/kcp`) and to
//! `serve`: workspaces, APIResourceSchemas, APIExports, APIBindings and what a binding serves.
//!
//! A corpus step is one request (`each` repeats it per item):
//!
//! ```yaml
//! - id: unique-name              # differences are reported as <id><JSON pointer>
//!   method: POST                 # default GET
//!   path: /api/v1/namespaces/diff/configmaps?dryRun=All
//!   body: {kind: ConfigMap, ...} # sent as JSON; or `raw: "text"` sent as is
//!   protobuf: true               # the body sent as client-go sends built-in kinds:
//!                                # application/vnd.kubernetes.protobuf (differential/protobuf.rs)
//!   contentType: application/merge-patch+json   # default application/json with a body
//!   accept: application/json;as=Table;g=meta.k8s.io;v=v1   # default application/json
//!   save: {rv: /metadata/resourceVersion}  # ${rv} in later paths and bodies
//!   until: 200                   # repeat (up to 30 s) until the status is this one
//!   untilAt: {/status/phase: Ready}  # ... until the answer has these values (pointers as in select)
//!   stream: true                 # a watch: the answer is a list of events
//!   select: /components/schemas/x  # compare only this part of the answer
//!   each: [{name: a}, {name: b}] # one request per item, ${name} substituted, id gets -a, -b
//!                                # ("$json{name}" in a body takes the value as JSON)
//! ```

mod common;
#[path = "differential/protobuf.rs"]
mod protobuf;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::kube_apiserver::KubeApiserver;
use common::Server;
use http::Method;
use https_client::{ClientConfig, Reply};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Step {
    id: String,
    #[serde(default)]
    method: Option<String>,
    path: String,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    /// Send `body` as Kubernetes protobuf, as typed clients (kubectl among them) do.
    #[serde(default)]
    protobuf: bool,
    #[serde(default)]
    accept: Option<String>,
    #[serde(default)]
    save: BTreeMap<String, String>,
    #[serde(default)]
    until: Option<u16>,
    /// Repeat (up to 30 s) until the answer has these values at these JSON pointers.
    #[serde(default)]
    until_at: BTreeMap<String, Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    select: Option<String>,
    #[serde(default)]
    each: Vec<BTreeMap<String, String>>,
    /// `user`: sent as the peer's non-admin user (kcp's `user`, a client certificate for
    /// `user` on serve) instead of the admin.
    #[serde(default, rename = "as")]
    as_user: Option<String>,
    /// Why the step is there (documentation only).
    #[serde(default)]
    #[allow(dead_code)]
    why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Known {
    /// Patterns of `<step id><JSON pointer>` (or `<step id>#status`); `*` matches any run of
    /// characters. Each must match a difference.
    at: Vec<String>,
    reason: String,
    /// A difference of nearly every answer (the counts report answers identical but for these).
    #[serde(default)]
    everywhere: bool,
}

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential")
}

/// The corpus of `file` with every `each` expanded.
fn corpus(file: &str) -> Vec<Step> {
    let text = std::fs::read_to_string(dir().join(file)).expect("read corpus");
    let steps: Vec<Step> =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file} parses: {e}"));
    let mut out = Vec::new();
    for step in steps {
        if step.each.is_empty() {
            out.push(step);
            continue;
        }
        for item in &step.each {
            let mut s = step.clone();
            s.each.clear();
            let suffix: Vec<&str> = item.values().map(String::as_str).collect();
            s.id = format!("{}-{}", step.id, suffix.join("-"));
            s.path = substitute(&s.path, item);
            s.raw = s.raw.map(|r| substitute(&r, item));
            s.body = s.body.map(|b| {
                let mut text = b.to_string();
                // `"$json{k}"` takes the item's value as JSON (a number, an object).
                for (k, v) in item {
                    text = text.replace(&format!("\"$json{{{k}}}\""), v);
                }
                serde_json::from_str(&substitute(&text, item)).expect("body after each")
            });
            out.push(s);
        }
    }
    let mut ids = BTreeSet::new();
    for s in &out {
        assert!(ids.insert(s.id.clone()), "duplicate step id {}", s.id);
    }
    out
}

fn substitute(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (k, v) in vars {
        out = out.replace(&format!("${{{k}}}"), v);
    }
    out
}

/// Replaces what legitimately differs between runs with placeholders.
fn normalize(v: &mut Value, key: Option<&str>) {
    // kube-apiserver orders managedFields by operation, then by the second of each entry's
    // time, then by manager: within a run the order depends on when a second ends. They are
    // compared in the order of their identity instead.
    // The causes of a Status in field order: with several errors, kube-apiserver's order
    // follows Go's map iteration.
    if let (Some("causes"), Value::Array(causes)) = (key, &mut *v) {
        causes.sort_by_key(|c| {
            let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (s("field"), s("message"))
        });
    }
    if let (Some("managedFields"), Value::Array(entries)) = (key, &mut *v) {
        entries.sort_by_key(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (s("operation"), s("manager"), s("subresource"))
        });
    }
    match v {
        Value::Object(map) => {
            // A Table's Age cells depend on when each server was asked.
            let age = map
                .get("columnDefinitions")
                .and_then(Value::as_array)
                .and_then(|cols| cols.iter().position(|c| c["name"] == "Age"));
            if let (Some(i), Some(Value::Array(rows))) = (age, map.get_mut("rows")) {
                for row in rows {
                    if let Some(cell) = row.get_mut("cells").and_then(|c| c.get_mut(i)) {
                        *cell = json!("<age>");
                    }
                }
            }
            // A generated name ends in random characters.
            if map.get("generateName").is_some_and(Value::is_string) {
                if let Some(name) = map.get_mut("name") {
                    *name = json!("<generated>");
                }
            }
            for (k, child) in map.iter_mut() {
                normalize(child, Some(k));
            }
        }
        Value::Array(items) => {
            for child in items {
                normalize(child, key);
            }
        }
        Value::String(s) => {
            let placeholder = match key {
                Some("uid") => "<uid>",
                Some("resourceVersion") => "<rv>",
                Some(
                    "creationTimestamp" | "deletionTimestamp" | "time" | "lastTransitionTime"
                    | "timestamp",
                ) => "<time>",
                Some("continue") if !s.is_empty() => "<continue>",
                Some("message") => {
                    *s = normalize_message(s);
                    return;
                }
                _ => return,
            };
            *s = placeholder.to_string();
        }
        _ => {}
    }
}

/// A message without what differs between runs: uids, and the resourceVersions kube-apiserver
/// and this server quote in parentheses or after `current: `.
fn normalize_message(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let is_uuid = |s: &[u8]| {
        s.len() >= 36
            && s[..36].iter().enumerate().all(|(j, c)| match j {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_hexdigit(),
            })
    };
    while i < bytes.len() {
        if is_uuid(&bytes[i..]) {
            out.push_str("<uid>");
            i += 36;
            continue;
        }
        let rest = &text[i..];
        let number_after = ["(", "current: "].iter().find(|p| {
            rest.starts_with(**p)
                && rest[p.len()..].starts_with(|c: char| c.is_ascii_digit())
                && !is_uuid(&bytes[i + p.len()..])
        });
        if let Some(p) = number_after {
            out.push_str(p);
            out.push_str("<n>");
            i += p.len();
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        i += c.len_utf8();
    }
    // Each server's administrator has its own name: kcp's admin kubeconfig says `kcp-admin`.
    out.replace("User \"kcp-admin\"", "User \"admin\"")
}

/// `(pointer, value)` of every leaf (empty objects and arrays are leaves too).
fn flatten(v: &Value, at: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let k = k.replace('~', "~0").replace('/', "~1");
                flatten(child, format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                flatten(child, format!("{at}/{i}"), out);
            }
        }
        _ => {
            out.insert(at, v.clone());
        }
    }
}

/// What one server answered to one step, normalized.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
}

struct Runner {
    client: ClientConfig,
    /// Headers of every request (a bearer token).
    headers: Vec<(&'static str, String)>,
    /// The name the server's certificate is verified for.
    server_name: &'static str,
    vars: BTreeMap<String, String>,
    /// The non-admin user's client and headers, for steps `as: user`.
    user: Option<(ClientConfig, Vec<(&'static str, String)>)>,
}

impl Runner {
    /// Requests with `client`'s certificate, the server's verified for localhost.
    fn new(client: ClientConfig) -> Self {
        Runner {
            client,
            headers: Vec::new(),
            server_name: "localhost",
            vars: BTreeMap::new(),
            user: None,
        }
    }

    /// `serve`'s admin.
    fn admin_of(server: &Server) -> Self {
        Runner::new(server.client())
    }

    /// The server's `/metrics`.
    async fn metrics(&self) -> String {
        let headers: Vec<(&str, &str)> =
            self.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut conn = self
            .client
            .connect_to(self.server_name)
            .await
            .expect("connect");
        let reply = conn
            .send_with_headers(Method::GET, "/metrics", &headers, Vec::new())
            .await
            .expect("metrics");
        assert_eq!(reply.status.as_u16(), 200, "/metrics");
        String::from_utf8_lossy(&reply.body).into_owned()
    }

    async fn send(&self, step: &Step) -> Reply {
        let method =
            Method::from_bytes(step.method.as_deref().unwrap_or("GET").as_bytes()).expect("method");
        let path = substitute(&step.path, &self.vars);
        let body = match (&step.body, &step.raw) {
            (Some(b), _) if step.protobuf => {
                let text = substitute(&b.to_string(), &self.vars);
                protobuf::encode(&serde_json::from_str(&text).expect("body after substitution"))
            }
            (Some(b), _) => substitute(&b.to_string(), &self.vars).into_bytes(),
            (None, Some(r)) => substitute(r, &self.vars).into_bytes(),
            (None, None) => Vec::new(),
        };
        let (client, own_headers) = match (step.as_user.as_deref(), &self.user) {
            (None, _) => (&self.client, &self.headers),
            (Some("user"), Some((client, headers))) => (client, headers),
            (Some(other), _) => panic!("{}: no user {other:?} to send as", step.id),
        };
        let mut headers = vec![(
            "accept",
            step.accept.clone().unwrap_or("application/json".into()),
        )];
        headers.extend(own_headers.iter().cloned());
        if !body.is_empty() {
            let default = if step.protobuf {
                "application/vnd.kubernetes.protobuf"
            } else {
                "application/json"
            };
            headers.push((
                "content-type",
                step.content_type.clone().unwrap_or(default.into()),
            ));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut conn = client.connect_to(self.server_name).await.expect("connect");
        conn.send_with_headers(method, &path, &headers, body)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", step.id))
    }

    async fn run(&mut self, step: &Step) -> Answer {
        let deadline = Instant::now() + Duration::from_secs(30);
        let reply = loop {
            let reply = self.send(step).await;
            let status_differs = step.until.is_some_and(|want| reply.status.as_u16() != want);
            let value_differs = !step.until_at.is_empty() && {
                let body: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
                step.until_at
                    .iter()
                    .any(|(pointer, want)| select(&body, pointer).as_ref() != Some(want))
            };
            if (status_differs || value_differs) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            break reply;
        };
        let body = if step.stream {
            let events: Vec<Value> = serde_json::Deserializer::from_slice(&reply.body)
                .into_iter::<Value>()
                .map(|e| e.expect("watch event"))
                .collect();
            Value::Array(events)
        } else if reply.body.is_empty() {
            Value::Null
        } else if reply
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("yaml"))
        {
            let text = String::from_utf8_lossy(&reply.body);
            serde_saphyr::from_str(&text).unwrap_or_else(|_| json!({"<text>": text}))
        } else {
            serde_json::from_slice(&reply.body)
                .unwrap_or_else(|_| json!({"<text>": String::from_utf8_lossy(&reply.body)}))
        };
        for (name, pointer) in &step.save {
            let value = body.pointer(pointer).unwrap_or_else(|| {
                panic!(
                    "{}: nothing at {pointer} to save as {name}: {body}",
                    step.id
                )
            });
            let value = value
                .as_str()
                .map(str::to_string)
                .unwrap_or(value.to_string());
            self.vars.insert(name.clone(), value);
        }
        let mut body = match &step.select {
            Some(p) => select(&body, p).unwrap_or(json!("<absent>")),
            None => body,
        };
        normalize(&mut body, None);
        Answer {
            status: reply.status.as_u16(),
            body,
        }
    }
}

/// The part of `v` at `pointer`, a JSON pointer whose segments may also be `[field=value]`: the
/// element of an array whose `field` is `value` (discovery lists resources in an order of its
/// own).
fn select(v: &Value, pointer: &str) -> Option<Value> {
    let mut at = v;
    for segment in pointer.split('/').skip(1) {
        at = match segment
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.split_once('='))
        {
            Some((field, value)) => at.as_array()?.iter().find(|e| {
                let got = field.split('.').try_fold(*e, |v, k| v.get(k));
                got.and_then(Value::as_str) == Some(value)
            })?,
            None => {
                let key = segment.replace("~1", "/").replace("~0", "~");
                match at {
                    Value::Array(items) => items.get(key.parse::<usize>().ok()?)?,
                    _ => at.get(&key)?,
                }
            }
        };
    }
    Some(at.clone())
}

/// The differences of one step, as `<id><pointer>` → (kube, platform-mesh).
fn differences(id: &str, kube: &Answer, pm: &Answer) -> BTreeMap<String, (Value, Value)> {
    let mut out = BTreeMap::new();
    if kube.status != pm.status {
        out.insert(
            format!("{id}#status"),
            (json!(kube.status), json!(pm.status)),
        );
    }
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten(&kube.body, String::new(), &mut a);
    flatten(&pm.body, String::new(), &mut b);
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        if x != y {
            out.insert(
                format!("{id}{k}"),
                (
                    x.cloned().unwrap_or(json!("<absent>")),
                    y.cloned().unwrap_or(json!("<absent>")),
                ),
            );
        }
    }
    out
}

/// Whether the pattern `known` (`*` matches any run of characters) matches `at` whole.
fn covers(known: &str, at: &str) -> bool {
    let mut parts = known.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = at.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

#[test]
fn messages_lose_uids_and_quoted_revisions_only() {
    assert_eq!(
        normalize_message("UID (00000000-0000-0000-0000-000000000000) in record (b06b77c4-3bc2-4d6a-b390-d6eb38cb83da), rv (193), current: 47; must be at most 253"),
        "UID (<uid>) in record (<uid>), rv (<n>), current: <n>; must be at most 253"
    );
}

#[test]
fn known_difference_patterns_match_whole_pointers() {
    assert!(covers("a/b", "a/b"));
    assert!(!covers("a/b", "a/bc"));
    assert!(covers("a*", "a/b/c"));
    assert!(covers(
        "*/kcp.io~1cluster",
        "x/metadata/annotations/kcp.io~1cluster"
    ));
    assert!(!covers("*/kcp.io~1cluster", "x/kcp.io~1cluster/y"));
    assert!(covers("cm-*#status", "cm-create#status"));
    assert!(!covers("cm-*#status", "cr-create#status"));
}

/// The differences listed in `file`, checked to say where and why.
fn known_differences(file: &str) -> Vec<Known> {
    let known: Vec<Known> =
        serde_saphyr::from_str(&std::fs::read_to_string(dir().join(file)).expect("read known"))
            .unwrap_or_else(|e| panic!("{file} parses: {e}"));
    for k in &known {
        assert!(
            !k.reason.trim().is_empty() && !k.at.is_empty(),
            "{:?}: every known difference says where and why",
            k.at
        );
    }
    known
}

/// Sends every step to `peer` and to `serve`, and fails on a difference `known` does not list
/// (named after `known_file`) or a listed one that did not occur.
async fn compare(
    steps: &[Step],
    known: &[Known],
    known_file: &str,
    peer_name: &str,
    peer: &mut Runner,
    pm: &mut Runner,
) {
    let patterns: Vec<&str> = known
        .iter()
        .flat_map(|k| k.at.iter().map(String::as_str))
        .collect();
    let mut identical = 0;
    let mut all: BTreeMap<String, (Value, Value)> = BTreeMap::new();
    for step in steps {
        let a = peer.run(step).await;
        let b = pm.run(step).await;
        // DIFF_DUMP=<step id> prints both answers of that step, to study a difference.
        if std::env::var("DIFF_DUMP").is_ok_and(|id| id == step.id) {
            eprintln!(
                "{}\n{peer_name} {}: {:#}\nplatform-mesh {}: {:#}",
                step.id, a.status, a.body, b.status, b.body
            );
        }
        let d = differences(&step.id, &a, &b);
        if d.is_empty() {
            identical += 1;
        }
        all.extend(d);
    }
    let new: Vec<String> = all
        .iter()
        .filter(|(at, _)| !patterns.iter().any(|k| covers(k, at)))
        .map(|(at, (a, b))| format!("{at}\n    {peer_name}: {a}\n    platform-mesh:  {b}"))
        .collect();
    let stale: Vec<&str> = patterns
        .iter()
        .filter(|k| !all.keys().any(|at| covers(k, at)))
        .copied()
        .collect();
    let everywhere: Vec<&str> = known
        .iter()
        .filter(|k| k.everywhere)
        .flat_map(|k| k.at.iter().map(String::as_str))
        .collect();
    let beyond_everywhere: BTreeSet<&str> = all
        .keys()
        .filter(|at| !everywhere.iter().any(|k| covers(k, at)))
        .map(|at| &at[..at.find(['/', '#']).unwrap_or(at.len())])
        .collect();
    eprintln!(
        "differential ({peer_name}): {} requests: {identical} identical, {} more identical but for the differences listed as everywhere, {} with other listed differences ({} fields in all); {} listed differences ({} patterns)",
        steps.len(),
        steps.len() - identical - beyond_everywhere.len(),
        beyond_everywhere.len(),
        all.len(),
        known.len(),
        patterns.len()
    );
    assert!(
        new.is_empty(),
        "{} new differences from {peer_name} (fix them or list them with a reason in tests/differential/{known_file}):\n{}",
        new.len(),
        new.join("\n")
    );
    assert!(
        stale.is_empty(),
        "listed differences that no longer occur (remove them from {known_file}): {stale:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_and_serve_answer_the_corpus_alike() {
    let steps = corpus("corpus.yaml");
    assert!(
        steps.len() >= 200,
        "the corpus has {} requests",
        steps.len()
    );
    let known = known_differences("known-differences.yaml");
    let mut kube_peer = tokio::task::spawn_blocking(KubeApiserver::start)
        .await
        .expect("start kube-apiserver");
    // A cluster's kube-apiserver comes with its controller manager: what it puts in every
    // namespace (the root CA ConfigMap, the default ServiceAccount) and namespace deletion are
    // its work there, this server's own here.
    kube_peer
        .start_controller_manager()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let server = Server::start_with(&["--no-controllers"]);
    let mut kube = Runner::new(kube_peer.client());
    let mut pm = Runner::admin_of(&server);
    let name = format!(
        "kube-apiserver {}",
        common::kube_apiserver::KUBERNETES_VERSION
    );
    compare(
        &steps,
        &known,
        "known-differences.yaml",
        &name,
        &mut kube,
        &mut pm,
    )
    .await;
    let kube_metrics = kube.metrics().await;
    let pm_metrics = pm.metrics().await;
    compare_request_metrics(&name, &kube_metrics, &pm_metrics);
}

/// The request metrics kube's dashboards and alerts read.
const REQUEST_METRICS: &[&str] = &[
    "apiserver_request_total",
    "apiserver_request_duration_seconds_bucket",
    "apiserver_request_sli_duration_seconds_bucket",
];

/// Series only `serve` has after the corpus, as `verb resource scope`, with the reason. A new
/// one fails, and so does one that no longer occurs.
const KNOWN_METRIC_DIFFERENCES: &[(&str, &str)] = &[(
    "LIST widgets cluster",
    "kube-apiserver answers the corpus's one list of a custom resource across namespaces \
     (cr-list-all-namespaces) but does not count it; this server counts it with scope cluster, \
     as kube-apiserver counts the same list of a built-in type",
)];

/// Whether series `s` is the listed `verb resource scope`.
fn known_metric(id: &str, s: &BTreeMap<String, String>) -> bool {
    let label = |k: &str| s.get(k).map(String::as_str).unwrap_or_default();
    id == format!("{} {} {}", label("verb"), label("resource"), label("scope"))
}

/// The series of metric `name` in a Prometheus text or OpenMetrics exposition, as label maps.
fn series(text: &str, name: &str) -> Vec<BTreeMap<String, String>> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|l| l.split_once("} ").map(|(labels, _)| labels))
        .map(|labels| {
            let mut out = BTreeMap::new();
            let mut rest = labels;
            while let Some((key, after)) = rest.split_once("=\"") {
                let end = after.find('"').unwrap_or(after.len());
                out.insert(
                    key.trim_start_matches(',').to_string(),
                    after[..end].to_string(),
                );
                rest = after.get(end + 1..).unwrap_or_default();
            }
            out
        })
        .collect()
}

/// After the same corpus, the request metrics of both servers have the same names and label
/// names, and every request series of `serve` (but the bucket bound `le` and the code) is one
/// kube-apiserver has too; kube-apiserver's own controllers add series of their own there.
fn compare_request_metrics(peer: &str, kube: &str, pm: &str) {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for name in REQUEST_METRICS {
        let (k, p) = (series(kube, name), series(pm, name));
        if k.is_empty() || p.is_empty() {
            problems.push(format!(
                "{name}: {} series on {peer}, {} on serve",
                k.len(),
                p.len()
            ));
            continue;
        }
        let label_names = |s: &[BTreeMap<String, String>]| -> BTreeSet<Vec<String>> {
            s.iter().map(|m| m.keys().cloned().collect()).collect()
        };
        if label_names(&k) != label_names(&p) {
            problems.push(format!(
                "{name}: labels {:?} on {peer}, {:?} on serve",
                label_names(&k),
                label_names(&p)
            ));
        }
        let without = |m: &BTreeMap<String, String>| {
            let mut m = m.clone();
            m.remove("le");
            m.remove("code");
            m
        };
        let kube_series: BTreeSet<_> = k.iter().map(without).collect();
        for s in p.iter().map(without).collect::<BTreeSet<_>>() {
            if kube_series.contains(&s) {
                continue;
            }
            match KNOWN_METRIC_DIFFERENCES
                .iter()
                .position(|(id, _)| known_metric(id, &s))
            {
                Some(i) => {
                    seen.insert(i);
                }
                None => problems.push(format!("{name}: only serve has {s:?}")),
            }
        }
    }
    for (i, (id, _)) in KNOWN_METRIC_DIFFERENCES.iter().enumerate() {
        if !seen.contains(&i) {
            problems.push(format!("a listed difference no longer occurs: {id}"));
        }
    }
    assert!(
        problems.is_empty(),
        "the request metrics differ from {peer}'s:\n{}",
        problems.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcp_and_serve_answer_the_tenancy_corpus_alike() {
    use base64::Engine;
    let steps = corpus("kcp-corpus.yaml");
    let known = known_differences("kcp-known-differences.yaml");
    let kcp = common::kube_apiserver::Kcp::start().await;
    // kcp's admin: its CA and token, from the admin.kubeconfig it wrote.
    let kubeconfig: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&kcp.admin_kubeconfig).expect("kcp admin.kubeconfig"),
    )
    .expect("kubeconfig");
    let ca = kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .expect("kcp's CA");
    let (token, user_token) = (kcp.token("kcp-admin"), kcp.token("user"));
    let server = Server::start_with(&["--no-controllers"]);
    let kcp_client =
        ClientConfig::new(kcp.address, &String::from_utf8_lossy(&ca), None).expect("kcp client");
    let mut peer = Runner {
        client: kcp_client.clone(),
        headers: vec![("authorization", format!("Bearer {token}"))],
        // kcp's serving certificate names its external address, not localhost.
        server_name: "127.0.0.1",
        vars: BTreeMap::new(),
        user: Some((
            kcp_client,
            vec![("authorization", format!("Bearer {user_token}"))],
        )),
    };
    let mut pm = Runner::admin_of(&server);
    // The same user on serve: a client certificate of its CA.
    let pki = certs::load_or_create(&server.data_dir.join("pki"), &[]).expect("pki");
    let (cert, key) = pki
        .issue_client_certificate("user", &[], 1)
        .expect("user's certificate");
    pm.user = Some((
        ClientConfig::new(server.address, pki.ca_cert_pem(), Some((&cert, &key)))
            .expect("user client"),
        Vec::new(),
    ));
    let name = format!("kcp {}", common::kube_apiserver::KCP_VERSION);
    compare(
        &steps,
        &known,
        "kcp-known-differences.yaml",
        &name,
        &mut peer,
        &mut pm,
    )
    .await;
}
