//! Audit logging with kube-apiserver's semantics (`audit.k8s.io/v1`).
//!
//! Three parts, used in this order for each request:
//!
//! - [`Policy`]: the audit policy (`--audit-policy-file`), read and validated by
//!   [`Policy::from_bytes`]. [`Policy::decide`] takes what a request is ([`Attributes`]) and
//!   answers how much of it to record ([`Decision`]): the first matching rule wins, no match is
//!   level `None`.
//! - [`EventBuilder`]: one per audited request. It is created right after authentication (the
//!   policy sees the authenticated user, not an impersonated one), collects what the request
//!   handling learns (impersonation, request and response objects, status, annotations) and
//!   yields an [`Event`] at each stage the server passes: [`EventBuilder::request_received`],
//!   [`EventBuilder::response_started`] (long-running requests such as watches only),
//!   [`EventBuilder::response_complete`] or [`EventBuilder::panicked`]. A stage the decision
//!   omits, or level `None`, yields nothing.
//! - [`LogWriter`]: the log backend (`--audit-log-path`, `--audit-log-maxsize`,
//!   `--audit-log-maxbackup`, `--audit-log-maxage`). It writes one JSON object per line from a
//!   dedicated thread fed by a bounded channel, and rotates the file the way kube-apiserver's
//!   (lumberjack's) rotation does.
//!
//! This module imports nothing from the rest of the crate.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};
use tokio::sync::{mpsc, oneshot};

/// The `apiVersion` of audit policies and events.
pub const API_VERSION: &str = "audit.k8s.io/v1";

/// The audit annotation kcp gives the logical cluster's name.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";
/// The audit annotation kcp gives the logical cluster's name as well (its older key).
pub const WORKSPACE_ANNOTATION: &str = "tenancy.kcp.io/workspace";
/// The audit annotation kcp gives the logical cluster's canonical workspace path
/// (`root:org:team`); kcp writes it empty when the path is not known.
pub const PATH_ANNOTATION: &str = "kcp.io/path";

// ---------------------------------------------------------------------------------------------
// Levels and stages
// ---------------------------------------------------------------------------------------------

/// How much of a request is recorded. Levels are ordered: each one records what the one
/// before it does, and more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub enum Level {
    /// Nothing is recorded.
    #[default]
    None,
    /// The request's metadata: user, verb, resource, timestamps, response status. No bodies.
    Metadata,
    /// The metadata and the request body.
    Request,
    /// The metadata, the request body and the response body.
    RequestResponse,
}

impl Level {
    /// The levels, lowest first.
    pub const ALL: [Level; 4] = [
        Level::None,
        Level::Metadata,
        Level::Request,
        Level::RequestResponse,
    ];

    /// The level's name as written in policies and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }

    /// The level of that name, if it is one.
    pub fn parse(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == name)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A point in a request's handling at which an event may be written. Ordered as they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Stage {
    /// The request was received and authenticated; nothing has been handled yet.
    RequestReceived,
    /// The response headers were sent, the body not yet (long-running requests: watch).
    ResponseStarted,
    /// The response is complete.
    ResponseComplete,
    /// The handler panicked.
    Panic,
}

impl Stage {
    /// The stages, in the order they happen.
    pub const ALL: [Stage; 4] = [
        Stage::RequestReceived,
        Stage::ResponseStarted,
        Stage::ResponseComplete,
        Stage::Panic,
    ];

    /// The stage's name as written in policies and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }

    /// The stage of that name, if it is one.
    pub fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------------------------

/// An audit policy (`kind: Policy`, `apiVersion: audit.k8s.io/v1`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The rules, tried in order; the first that matches a request decides its level.
    pub rules: Vec<PolicyRule>,
    /// Stages no event is written for, whichever rule matches (added to each rule's own).
    pub omit_stages: Vec<Stage>,
    /// Whether request and response bodies are recorded without `metadata.managedFields`,
    /// unless the matching rule says otherwise.
    pub omit_managed_fields: bool,
}

/// One rule of a [`Policy`]. Every selector that is set must match; an empty one matches
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    /// The level of the requests this rule matches.
    pub level: Level,
    /// User names the rule applies to.
    pub users: Vec<String>,
    /// Groups the rule applies to: the user must be in one of them.
    pub user_groups: Vec<String>,
    /// Verbs the rule applies to (`get`, `list`, `watch`, `create`, ...).
    pub verbs: Vec<String>,
    /// Resources the rule applies to. A rule with resources or namespaces matches resource
    /// requests only.
    pub resources: Vec<GroupResources>,
    /// Namespaces the rule applies to; `""` is the cluster-scoped requests.
    pub namespaces: Vec<String>,
    /// Non-resource paths the rule applies to: exact, `prefix*` or `*`. A rule with these
    /// matches non-resource requests only.
    pub non_resource_urls: Vec<String>,
    /// Stages no event is written for when this rule matches.
    pub omit_stages: Vec<Stage>,
    /// Overrides the policy's `omitManagedFields` for the requests this rule matches.
    pub omit_managed_fields: Option<bool>,
}

/// Resources of one API group, as a rule selects them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupResources {
    /// The API group; `""` is the core group.
    pub group: String,
    /// Resources of the group: `pods`, `pods/log` (a subresource), `*` (every resource and
    /// subresource), `pods/*` (pods and all their subresources), `*/scale` (that subresource of
    /// every resource). Empty: every resource of the group.
    pub resources: Vec<String>,
    /// Object names the rule is limited to; empty: all.
    pub resource_names: Vec<String>,
}

/// Why an audit policy was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The bytes are neither YAML nor JSON.
    #[error("audit policy: cannot read the document ({0}); write it as YAML or JSON")]
    Decode(String),
    /// The document is not a mapping.
    #[error(
        "audit policy: the document must be an object with apiVersion, kind and rules, not {0}"
    )]
    NotAnObject(&'static str),
    /// `apiVersion` is missing or not `audit.k8s.io/v1`.
    #[error("audit policy: apiVersion is {found:?}; set it to \"audit.k8s.io/v1\"")]
    ApiVersion {
        /// The apiVersion found (empty when missing).
        found: String,
    },
    /// `kind` is missing or not `Policy`.
    #[error("audit policy: kind is {found:?}; set it to \"Policy\"")]
    Kind {
        /// The kind found (empty when missing).
        found: String,
    },
    /// Fields with wrong values, all of them.
    #[error("audit policy is invalid: {}", join_errors(.0))]
    Invalid(Vec<PolicyFieldError>),
    /// The policy has no rules.
    #[error(
        "audit policy has no rules; add at least one (a policy that records nothing needs one \
         rule with `level: None`)"
    )]
    NoRules,
}

fn join_errors(errors: &[PolicyFieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One wrong field of an audit policy, with its path (`rules[2].omitStages[0]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFieldError {
    /// The field has the wrong type.
    #[error("{path}: must be {expected}")]
    WrongType {
        /// The field's path.
        path: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A rule has no level.
    #[error("{path}: required; set one of None, Metadata, Request, RequestResponse")]
    MissingLevel {
        /// The field's path.
        path: String,
    },
    /// A rule's level is not one of the four.
    #[error(
        "{path}: unsupported level {value:?}; use one of None, Metadata, Request, RequestResponse"
    )]
    UnsupportedLevel {
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
    },
    /// A stage in `omitStages` is not one of the four.
    #[error(
        "{path}: unsupported stage {value:?}; use one of RequestReceived, ResponseStarted, \
         ResponseComplete, Panic"
    )]
    UnsupportedStage {
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
    },
    /// A rule has `nonResourceURLs` and also `resources` or `namespaces`.
    #[error(
        "{path}: a rule cannot select non-resource URLs together with resources or namespaces; \
         split it into two rules"
    )]
    NonResourceUrlsWithResources {
        /// The field's path.
        path: String,
    },
    /// A non-resource URL does not start with `/`.
    #[error("{path}: {value:?} must start with '/' (or be \"*\" for every non-resource URL)")]
    NonResourceUrlNotAbsolute {
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
    },
    /// A non-resource URL has `*` somewhere other than at its end.
    #[error(
        "{path}: {value:?} has a '*' before its end; '*' may only be the last character \
         (a prefix match)"
    )]
    NonResourceUrlWildcard {
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
    },
    /// A group name is not a DNS subdomain.
    #[error(
        "{path}: {value:?} is not an API group name (a lowercase DNS subdomain); write \"\" for \
         the core group"
    )]
    InvalidGroup {
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
    },
    /// `resourceNames` without `resources`.
    #[error("{path}: resourceNames needs at least one entry in resources")]
    ResourceNamesWithoutResources {
        /// The field's path.
        path: String,
    },
}

const POLICY_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "rules",
    "omitStages",
    "omitManagedFields",
];
const RULE_FIELDS: &[&str] = &[
    "level",
    "users",
    "userGroups",
    "verbs",
    "resources",
    "namespaces",
    "nonResourceURLs",
    "omitStages",
    "omitManagedFields",
];
const GROUP_RESOURCE_FIELDS: &[&str] = &["group", "resources", "resourceNames"];

impl Policy {
    /// Reads and validates a policy from YAML or JSON. Unknown fields are not an error (as in
    /// kube-apiserver, which falls back to lenient decoding) but are logged as warnings.
    pub fn from_bytes(bytes: &[u8]) -> Result<Policy, PolicyError> {
        let (policy, warnings) = Policy::from_bytes_with_warnings(bytes)?;
        for warning in warnings {
            tracing::warn!("audit policy: {warning}");
        }
        Ok(policy)
    }

    /// As [`Policy::from_bytes`], returning the warnings (unknown fields) instead of logging
    /// them.
    pub fn from_bytes_with_warnings(bytes: &[u8]) -> Result<(Policy, Vec<String>), PolicyError> {
        let doc = decode_document(bytes)?;
        let Value::Object(top) = &doc else {
            return Err(PolicyError::NotAnObject(type_name(&doc)));
        };
        let api_version = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if api_version != API_VERSION {
            return Err(PolicyError::ApiVersion {
                found: api_version.to_string(),
            });
        }
        let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != "Policy" {
            return Err(PolicyError::Kind {
                found: kind.to_string(),
            });
        }
        let mut r = Reader::default();
        r.unknown_fields(top, POLICY_FIELDS, "");
        let mut policy = Policy {
            omit_stages: r.stages(top, "omitStages", ""),
            omit_managed_fields: r.bool(top, "omitManagedFields", "").unwrap_or(false),
            rules: Vec::new(),
        };
        if let Some(rules) = r.list(top, "rules", "") {
            for (i, rule) in rules.iter().enumerate() {
                let path = format!("rules[{i}]");
                if let Some(rule) = r.object(rule, &path) {
                    policy.rules.push(r.rule(rule, &path));
                }
            }
        }
        if !r.errors.is_empty() {
            return Err(PolicyError::Invalid(r.errors));
        }
        if policy.rules.is_empty() {
            return Err(PolicyError::NoRules);
        }
        Ok((policy, r.warnings))
    }

    /// How much to record of a request: the first rule that matches decides the level; no match
    /// is level `None`. The policy's `omitStages` are added to the rule's.
    pub fn decide(&self, attributes: &Attributes) -> Decision {
        match self.rules.iter().find(|rule| rule.matches(attributes)) {
            Some(rule) => {
                let mut omit_stages = self.omit_stages.clone();
                omit_stages.extend_from_slice(&rule.omit_stages);
                omit_stages.sort();
                omit_stages.dedup();
                Decision {
                    level: rule.level,
                    omit_stages,
                    omit_managed_fields: rule
                        .omit_managed_fields
                        .unwrap_or(self.omit_managed_fields),
                }
            }
            None => {
                let mut omit_stages = self.omit_stages.clone();
                omit_stages.sort();
                omit_stages.dedup();
                Decision {
                    level: Level::None,
                    omit_stages,
                    omit_managed_fields: self.omit_managed_fields,
                }
            }
        }
    }
}

/// Decodes the document: JSON when it looks like JSON, YAML otherwise (and as the fallback for
/// a YAML flow mapping that is not JSON).
fn decode_document(bytes: &[u8]) -> Result<Value, PolicyError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| PolicyError::Decode(format!("not UTF-8: {e}")))?;
    let text = text.trim_start_matches('\u{feff}');
    if text.trim_start().starts_with('{') {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => return Ok(v),
            Err(json_error) => {
                return serde_saphyr::from_str::<Value>(text)
                    .map_err(|_| PolicyError::Decode(format!("invalid JSON: {json_error}")));
            }
        }
    }
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| PolicyError::Decode(format!("invalid YAML: {e}")))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "an empty document",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Reads the policy document into the typed policy, collecting every error and warning.
#[derive(Default)]
struct Reader {
    errors: Vec<PolicyFieldError>,
    warnings: Vec<String>,
}

impl Reader {
    fn wrong_type(&mut self, path: String, expected: &'static str) {
        self.errors
            .push(PolicyFieldError::WrongType { path, expected });
    }

    fn unknown_fields(&mut self, obj: &Map<String, Value>, known: &[&str], path: &str) {
        for key in obj.keys() {
            if !known.contains(&key.as_str()) {
                self.warnings
                    .push(format!("unknown field {:?} ignored", child(path, key)));
            }
        }
    }

    fn object<'a>(&mut self, v: &'a Value, path: &str) -> Option<&'a Map<String, Value>> {
        match v {
            Value::Object(o) => Some(o),
            _ => {
                self.wrong_type(path.to_string(), "an object");
                None
            }
        }
    }

    /// A list field; absent or null is `None`.
    fn list<'a>(
        &mut self,
        obj: &'a Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Option<&'a Vec<Value>> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(a),
            Some(_) => {
                self.wrong_type(child(path, key), "a list");
                None
            }
        }
    }

    fn string_list(&mut self, obj: &Map<String, Value>, key: &str, path: &str) -> Vec<String> {
        let Some(items) = self.list(obj, key, path) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                _ => self.wrong_type(format!("{}[{i}]", child(path, key)), "a string"),
            }
        }
        out
    }

    fn string(&mut self, obj: &Map<String, Value>, key: &str, path: &str) -> Option<String> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.wrong_type(child(path, key), "a string");
                None
            }
        }
    }

    fn bool(&mut self, obj: &Map<String, Value>, key: &str, path: &str) -> Option<bool> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                self.wrong_type(child(path, key), "true or false");
                None
            }
        }
    }

    fn stages(&mut self, obj: &Map<String, Value>, key: &str, path: &str) -> Vec<Stage> {
        let names = self.string_list(obj, key, path);
        let mut out = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            match Stage::parse(&name) {
                Some(stage) => out.push(stage),
                None => self.errors.push(PolicyFieldError::UnsupportedStage {
                    path: format!("{}[{i}]", child(path, key)),
                    value: name,
                }),
            }
        }
        out
    }

    fn rule(&mut self, obj: &Map<String, Value>, path: &str) -> PolicyRule {
        self.unknown_fields(obj, RULE_FIELDS, path);
        let level = match self.string(obj, "level", path) {
            None => {
                // A level of the wrong type was reported already.
                if matches!(obj.get("level"), None | Some(Value::Null)) {
                    self.errors.push(PolicyFieldError::MissingLevel {
                        path: child(path, "level"),
                    });
                }
                Level::None
            }
            Some(name) if name.is_empty() => {
                self.errors.push(PolicyFieldError::MissingLevel {
                    path: child(path, "level"),
                });
                Level::None
            }
            Some(name) => match Level::parse(&name) {
                Some(level) => level,
                None => {
                    self.errors.push(PolicyFieldError::UnsupportedLevel {
                        path: child(path, "level"),
                        value: name,
                    });
                    Level::None
                }
            },
        };
        let mut rule = PolicyRule {
            level,
            users: self.string_list(obj, "users", path),
            user_groups: self.string_list(obj, "userGroups", path),
            verbs: self.string_list(obj, "verbs", path),
            resources: Vec::new(),
            namespaces: self.string_list(obj, "namespaces", path),
            non_resource_urls: self.string_list(obj, "nonResourceURLs", path),
            omit_stages: self.stages(obj, "omitStages", path),
            omit_managed_fields: self.bool(obj, "omitManagedFields", path),
        };
        let resources_path = child(path, "resources");
        if let Some(items) = self.list(obj, "resources", path) {
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{resources_path}[{i}]");
                if let Some(gr) = self.object(item, &item_path) {
                    rule.resources.push(self.group_resources(gr, &item_path));
                }
            }
        }
        let urls_path = child(path, "nonResourceURLs");
        for (i, url) in rule.non_resource_urls.iter().enumerate() {
            if url == "*" {
                continue;
            }
            let url_path = format!("{urls_path}[{i}]");
            if !url.starts_with('/') {
                self.errors
                    .push(PolicyFieldError::NonResourceUrlNotAbsolute {
                        path: url_path,
                        value: url.clone(),
                    });
            } else if url.strip_suffix('*').unwrap_or(url).contains('*') {
                self.errors.push(PolicyFieldError::NonResourceUrlWildcard {
                    path: url_path,
                    value: url.clone(),
                });
            }
        }
        if !rule.non_resource_urls.is_empty()
            && (!rule.resources.is_empty() || !rule.namespaces.is_empty())
        {
            self.errors
                .push(PolicyFieldError::NonResourceUrlsWithResources { path: urls_path });
        }
        rule
    }

    fn group_resources(&mut self, obj: &Map<String, Value>, path: &str) -> GroupResources {
        self.unknown_fields(obj, GROUP_RESOURCE_FIELDS, path);
        let gr = GroupResources {
            group: self.string(obj, "group", path).unwrap_or_default(),
            resources: self.string_list(obj, "resources", path),
            resource_names: self.string_list(obj, "resourceNames", path),
        };
        if !gr.group.is_empty() && !is_dns_subdomain(&gr.group) {
            self.errors.push(PolicyFieldError::InvalidGroup {
                path: child(path, "group"),
                value: gr.group.clone(),
            });
        }
        if !gr.resource_names.is_empty() && gr.resources.is_empty() {
            self.errors
                .push(PolicyFieldError::ResourceNamesWithoutResources {
                    path: child(path, "resourceNames"),
                });
        }
        gr
    }
}

/// A lowercase RFC 1123 subdomain: dot-separated labels of `a-z`, `0-9` and `-`, each starting
/// and ending with a letter or digit, 253 characters at most.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            match (b.first(), b.last()) {
                (Some(first), Some(last)) => {
                    alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
                }
                _ => false,
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Matching
// ---------------------------------------------------------------------------------------------

/// What a request is, as the policy sees it: the authenticated user (before impersonation), the
/// verb and the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// The user name.
    pub user: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// The verb: for resources `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; for other paths the lowercase HTTP method.
    pub verb: String,
    /// What the request is for.
    pub target: Target,
}

/// What a request is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// An API resource.
    Resource(ResourceAttributes),
    /// Any other path (`/healthz`, `/openapi/v2`, `/apis`), without the query and without the
    /// `/clusters/<name>` prefix.
    NonResource {
        /// The path.
        path: String,
    },
}

impl Default for Target {
    fn default() -> Self {
        Target::NonResource {
            path: String::new(),
        }
    }
}

/// The resource a request is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// The API group; `""` is the core group.
    pub api_group: String,
    /// The API version (`v1`).
    pub api_version: String,
    /// The resource (`pods`).
    pub resource: String,
    /// The subresource (`status`, `log`), if any.
    pub subresource: String,
    /// The namespace; `""` for cluster-scoped resources (and cluster-wide lists).
    pub namespace: String,
    /// The object's name, if the request names one.
    pub name: String,
}

/// How much of one request to record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The level.
    pub level: Level,
    /// The stages no event is written for, in stage order.
    pub omit_stages: Vec<Stage>,
    /// Whether bodies are recorded without `metadata.managedFields`.
    pub omit_managed_fields: bool,
}

impl Decision {
    /// Whether an event is written at `stage`.
    pub fn records(&self, stage: Stage) -> bool {
        self.level > Level::None && !self.omit_stages.contains(&stage)
    }
}

impl PolicyRule {
    /// Whether the rule selects the request.
    pub fn matches(&self, a: &Attributes) -> bool {
        if !self.users.is_empty() && !self.users.contains(&a.user) {
            return false;
        }
        if !self.user_groups.is_empty() && !a.groups.iter().any(|g| self.user_groups.contains(g)) {
            return false;
        }
        if !self.verbs.is_empty() && !self.verbs.contains(&a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return match &a.target {
                Target::Resource(r) => self.matches_resource(r),
                Target::NonResource { .. } => false,
            };
        }
        if !self.non_resource_urls.is_empty() {
            return match &a.target {
                Target::NonResource { path } => self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(path, spec)),
                Target::Resource(_) => false,
            };
        }
        true
    }

    fn matches_resource(&self, r: &ResourceAttributes) -> bool {
        if !self.namespaces.is_empty() && !self.namespaces.contains(&r.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        self.resources
            .iter()
            .filter(|gr| gr.group == r.api_group)
            .any(|gr| gr.matches(r))
    }
}

impl GroupResources {
    /// Whether this entry selects the resource (its group already matched).
    fn matches(&self, r: &ResourceAttributes) -> bool {
        if self.resources.is_empty() {
            return true;
        }
        if !self.resource_names.is_empty() && !self.resource_names.contains(&r.name) {
            return false;
        }
        self.resources.iter().any(|spec| {
            if spec == "*" {
                return true;
            }
            let exact = if r.subresource.is_empty() {
                *spec == r.resource
            } else {
                spec.strip_prefix(r.resource.as_str())
                    .and_then(|rest| rest.strip_prefix('/'))
                    == Some(r.subresource.as_str())
            };
            if exact {
                return true;
            }
            if !r.subresource.is_empty() && spec.strip_prefix("*/") == Some(r.subresource.as_str())
            {
                return true;
            }
            spec.strip_suffix("/*") == Some(r.resource.as_str())
        })
    }
}

/// Whether a non-resource path matches a rule's entry: `*`, the exact path, or `prefix*`.
fn path_matches(path: &str, spec: &str) -> bool {
    if spec == "*" || spec == path {
        return true;
    }
    match spec.strip_suffix('*') {
        Some(_) => path.starts_with(spec.trim_end_matches('*')),
        None => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// A user as recorded in an event (authentication.k8s.io/v1 `UserInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UserInfo {
    /// The user name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// The user's uid.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The user's groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Extra attributes from the authenticator.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The object a request is about, as recorded in an event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The resource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    /// The namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The object's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The object's uid, when the request body carries it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The API group; empty for the core group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// The API version.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The object's resourceVersion, when the request body carries it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// The subresource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

impl From<&ResourceAttributes> for ObjectRef {
    fn from(r: &ResourceAttributes) -> Self {
        ObjectRef {
            resource: r.resource.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            api_group: r.api_group.clone(),
            api_version: r.api_version.clone(),
            subresource: r.subresource.clone(),
            ..ObjectRef::default()
        }
    }
}

/// The response's status as recorded in an event (a meta/v1 `Status` with the bounded fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseStatus {
    /// The HTTP status code.
    pub code: u16,
    /// `Success` or `Failure`, when the response was a Status object.
    pub status: String,
    /// The human-readable message of a failure.
    pub message: String,
    /// The machine-readable reason of a failure (`NotFound`, `Forbidden`, ...).
    pub reason: String,
    /// The Status object's `details`, if any.
    pub details: Option<Value>,
}

impl ResponseStatus {
    /// A status with only the code (a successful response).
    pub fn with_code(code: u16) -> Self {
        ResponseStatus {
            code,
            ..ResponseStatus::default()
        }
    }

    /// A failure with its reason and message.
    pub fn failure(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ResponseStatus {
            code,
            status: "Failure".to_string(),
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }

    /// The status of a meta/v1 `Status` object (`kind: Status`); `None` for other objects.
    pub fn from_status_object(obj: &Value) -> Option<Self> {
        if obj.get("kind").and_then(Value::as_str) != Some("Status") {
            return None;
        }
        let text = |key: &str| {
            obj.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Some(ResponseStatus {
            code: obj
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            status: text("status"),
            message: text("message"),
            reason: text("reason"),
            details: obj.get("details").filter(|d| !d.is_null()).cloned(),
        })
    }
}

impl Serialize for ResponseStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Status", 6)?;
        st.serialize_field("metadata", &Map::new())?;
        if self.status.is_empty() {
            st.skip_field("status")?;
        } else {
            st.serialize_field("status", &self.status)?;
        }
        if self.message.is_empty() {
            st.skip_field("message")?;
        } else {
            st.serialize_field("message", &self.message)?;
        }
        if self.reason.is_empty() {
            st.skip_field("reason")?;
        } else {
            st.serialize_field("reason", &self.reason)?;
        }
        match &self.details {
            Some(details) => st.serialize_field("details", details)?,
            None => st.skip_field("details")?,
        }
        if self.code == 0 {
            st.skip_field("code")?;
        } else {
            st.serialize_field("code", &self.code)?;
        }
        st.end()
    }
}

/// One audit event (audit.k8s.io/v1 `Event`), serialized as kube-apiserver's log backend writes
/// it: `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":...}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    kind: &'static str,
    api_version: &'static str,
    /// The level the event was recorded at.
    pub level: Level,
    /// The request's audit ID, the same in every event of the request.
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// The stage the event was written at.
    pub stage: Stage,
    /// The request URI: path and query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The verb.
    pub verb: String,
    /// The authenticated user.
    pub user: UserInfo,
    /// The user the request impersonates, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<UserInfo>,
    /// The client addresses: the `X-Forwarded-For` chain, then the peer.
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    /// The client's `User-Agent`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    /// The object of a resource request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    /// The response status (not at `RequestReceived`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    /// The request body (levels `Request` and `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    /// The response body (level `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// When the request arrived.
    #[serde(serialize_with = "serialize_micro_time")]
    pub request_received_timestamp: OffsetDateTime,
    /// When this stage was reached.
    #[serde(serialize_with = "serialize_micro_time")]
    pub stage_timestamp: OffsetDateTime,
    /// Annotations (the logical cluster, the authorization decision, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Event {
    /// The event as one line of JSON, without the newline.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

const MICRO_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");

/// A timestamp as events write it: RFC 3339 in UTC with microseconds
/// (`2026-01-02T03:04:05.123456Z`).
pub fn format_micro_time(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(MICRO_TIME)
        .unwrap_or_default()
}

fn serialize_micro_time<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_micro_time(*t))
}

/// A new audit ID (a random UUID), for a request without an `Audit-ID` header.
pub fn new_audit_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Removes `metadata.managedFields` from an object, or from each item of a list.
fn strip_managed_fields(obj: &mut Value) {
    let strip = |o: &mut Value| {
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    strip(obj);
    if let Some(items) = obj.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
}

/// Collects what one request's events record, and yields the events at its stages.
///
/// Create it once the request is authenticated, with the policy's [`Decision`] for it; then:
///
/// 1. [`request_received`](Self::request_received) right away;
/// 2. [`set_impersonated_user`](Self::set_impersonated_user) if the request impersonates,
///    [`annotate`](Self::annotate) for annotations (authorization decision, ...),
///    [`set_request_object`](Self::set_request_object) once the body is decoded,
///    [`set_response_object`](Self::set_response_object) with the response body (an error's
///    Status included);
/// 3. for long-running requests (watch, exec, proxy), [`response_started`](Self::response_started)
///    when the response headers are sent;
/// 4. [`response_complete`](Self::response_complete) when the response is done, or
///    [`panicked`](Self::panicked) if the handler panicked.
///
/// Each stage method returns the event to hand to the [`LogWriter`], or `None` when the level is
/// `None` or the decision omits the stage.
#[derive(Clone, Debug)]
pub struct EventBuilder {
    decision: Decision,
    audit_id: String,
    request_uri: String,
    verb: String,
    user: UserInfo,
    impersonated_user: Option<UserInfo>,
    source_ips: Vec<String>,
    user_agent: String,
    object_ref: Option<ObjectRef>,
    request_received: OffsetDateTime,
    annotations: BTreeMap<String, String>,
    request_object: Option<Value>,
    response_object: Option<Value>,
    response_status: Option<ResponseStatus>,
}

impl EventBuilder {
    /// The events of one request: `attributes` give the verb, the user (name and groups) and,
    /// for resource requests, the object reference; `request_uri` is the path with the query.
    /// The request counts as received now (see [`received_at`](Self::received_at)).
    pub fn new(
        decision: Decision,
        attributes: &Attributes,
        audit_id: impl Into<String>,
        request_uri: impl Into<String>,
    ) -> Self {
        EventBuilder {
            decision,
            audit_id: audit_id.into(),
            request_uri: request_uri.into(),
            verb: attributes.verb.clone(),
            user: UserInfo {
                username: attributes.user.clone(),
                groups: attributes.groups.clone(),
                ..UserInfo::default()
            },
            impersonated_user: None,
            source_ips: Vec::new(),
            user_agent: String::new(),
            object_ref: match &attributes.target {
                Target::Resource(r) => Some(ObjectRef::from(r)),
                Target::NonResource { .. } => None,
            },
            request_received: OffsetDateTime::now_utc(),
            annotations: BTreeMap::new(),
            request_object: None,
            response_object: None,
            response_status: None,
        }
    }

    /// Sets when the request arrived.
    pub fn received_at(mut self, at: OffsetDateTime) -> Self {
        self.request_received = at;
        self
    }

    /// Replaces the user taken from the attributes (to add its uid and extra).
    pub fn user(mut self, user: UserInfo) -> Self {
        self.user = user;
        self
    }

    /// Sets the client addresses.
    pub fn source_ips(mut self, ips: Vec<String>) -> Self {
        self.source_ips = ips;
        self
    }

    /// Sets the client's `User-Agent`.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Replaces the object reference taken from the attributes.
    pub fn object_ref(mut self, object_ref: Option<ObjectRef>) -> Self {
        self.object_ref = object_ref;
        self
    }

    /// Records the logical cluster the request is for, under the annotations kcp uses:
    /// [`CLUSTER_ANNOTATION`] and [`WORKSPACE_ANNOTATION`] (the cluster's name) and
    /// [`PATH_ANNOTATION`] (its canonical path; empty when not known).
    pub fn logical_cluster(mut self, cluster: &str, canonical_path: &str) -> Self {
        self.set_logical_cluster(cluster, canonical_path);
        self
    }

    /// As [`logical_cluster`](Self::logical_cluster), once the builder is in use (the cluster
    /// is known only after the workspace path is resolved). Events already taken lack it.
    pub fn set_logical_cluster(&mut self, cluster: &str, canonical_path: &str) {
        if !cluster.is_empty() {
            self.annotate(PATH_ANNOTATION, canonical_path);
            self.annotate(WORKSPACE_ANNOTATION, cluster);
            self.annotate(CLUSTER_ANNOTATION, cluster);
        }
    }

    /// The level of the request.
    pub fn level(&self) -> Level {
        self.decision.level
    }

    /// The decision the events follow.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether the request body is recorded: the server can skip handing it over otherwise.
    pub fn wants_request_object(&self) -> bool {
        self.decision.level >= Level::Request
    }

    /// Whether the response body is recorded: the server can skip handing it over otherwise.
    pub fn wants_response_object(&self) -> bool {
        self.decision.level >= Level::RequestResponse
    }

    /// Records the user the request impersonates.
    pub fn set_impersonated_user(&mut self, user: UserInfo) {
        self.impersonated_user = Some(user);
    }

    /// Adds an annotation. As in kube-apiserver, the first value of a key stays.
    pub fn annotate(&mut self, key: impl Into<String>, value: impl Into<String>) {
        if self.decision.level == Level::None {
            return;
        }
        let key = key.into();
        let value = value.into();
        match self.annotations.get(&key) {
            Some(old) if *old != value => {
                tracing::debug!(key = %key, old = %old, new = %value, "audit annotation already set; kept");
            }
            Some(_) => {}
            None => {
                self.annotations.insert(key, value);
            }
        }
    }

    /// Records the decoded request body: its namespace, name, uid and resourceVersion fill what
    /// the object reference lacks, and at levels `Request` and `RequestResponse` the body itself
    /// is recorded.
    pub fn set_request_object(&mut self, obj: &Value) {
        if self.decision.level == Level::None {
            return;
        }
        if let (Some(r), Some(meta)) = (self.object_ref.as_mut(), obj.get("metadata")) {
            let text = |key: &str| meta.get(key).and_then(Value::as_str).unwrap_or_default();
            for (field, key) in [
                (&mut r.namespace, "namespace"),
                (&mut r.name, "name"),
                (&mut r.uid, "uid"),
                (&mut r.resource_version, "resourceVersion"),
            ] {
                if field.is_empty() {
                    *field = text(key).to_string();
                }
            }
        }
        if self.wants_request_object() {
            let mut obj = obj.clone();
            if self.decision.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            self.request_object = Some(obj);
        }
    }

    /// Records the response body: a Status object (an error) becomes the response status, and
    /// at level `RequestResponse` the body itself is recorded.
    pub fn set_response_object(&mut self, obj: &Value) {
        if self.decision.level == Level::None {
            return;
        }
        if let Some(status) = ResponseStatus::from_status_object(obj) {
            self.response_status = Some(status);
        }
        if self.wants_response_object() {
            let mut obj = obj.clone();
            if self.decision.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            self.response_object = Some(obj);
        }
    }

    /// Sets the response status (replacing one taken from a Status body).
    pub fn set_response_status(&mut self, status: ResponseStatus) {
        self.response_status = Some(status);
    }

    /// Sets the HTTP status code of the response, keeping a Status body's reason and message.
    pub fn set_response_code(&mut self, code: u16) {
        self.response_status
            .get_or_insert_with(ResponseStatus::default)
            .code = code;
    }

    /// The event of stage `RequestReceived`: call it once the request is authenticated.
    pub fn request_received(&self) -> Option<Event> {
        self.event_at(Stage::RequestReceived, OffsetDateTime::now_utc())
    }

    /// The event of stage `ResponseStarted`, for a long-running request whose response headers
    /// (status `code`) were just sent.
    pub fn response_started(&mut self, code: u16) -> Option<Event> {
        self.set_response_code(code);
        self.event_at(Stage::ResponseStarted, OffsetDateTime::now_utc())
    }

    /// The event of stage `ResponseComplete`: the response, of status `code`, is done.
    pub fn response_complete(&mut self, code: u16) -> Option<Event> {
        self.set_response_code(code);
        self.event_at(Stage::ResponseComplete, OffsetDateTime::now_utc())
    }

    /// The event of stage `Panic`: the handler panicked with `message`; the response status is
    /// a 500 InternalError.
    pub fn panicked(&mut self, message: &str) -> Option<Event> {
        self.response_status = Some(ResponseStatus::failure(
            500,
            "InternalError",
            format!("the API server panicked while handling the request: {message}"),
        ));
        self.event_at(Stage::Panic, OffsetDateTime::now_utc())
    }

    /// The event of `stage` as of `at`, or `None` when the decision does not record it. At
    /// `RequestReceived` the event has no response status and no bodies.
    pub fn event_at(&self, stage: Stage, at: OffsetDateTime) -> Option<Event> {
        if !self.decision.records(stage) {
            return None;
        }
        let received = stage == Stage::RequestReceived;
        let level = self.decision.level;
        Some(Event {
            kind: "Event",
            api_version: API_VERSION,
            level,
            audit_id: self.audit_id.clone(),
            stage,
            request_uri: self.request_uri.clone(),
            verb: self.verb.clone(),
            user: self.user.clone(),
            impersonated_user: self.impersonated_user.clone(),
            source_ips: self.source_ips.clone(),
            user_agent: self.user_agent.clone(),
            object_ref: self.object_ref.clone(),
            response_status: if received {
                None
            } else {
                self.response_status.clone()
            },
            request_object: if received || level < Level::Request {
                None
            } else {
                self.request_object.clone()
            },
            response_object: if received || level < Level::RequestResponse {
                None
            } else {
                self.response_object.clone()
            },
            request_received_timestamp: self.request_received,
            stage_timestamp: at,
            annotations: self.annotations.clone(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Log backend
// ---------------------------------------------------------------------------------------------

/// Where and how the log backend writes (kube-apiserver's `--audit-log-*` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// The log file (`--audit-log-path`); `-` is standard output.
    pub path: PathBuf,
    /// Rotate the file before it grows beyond this many megabytes (`--audit-log-maxsize`);
    /// 0 never rotates.
    pub max_size_mb: u64,
    /// Rotated files to keep, the newest (`--audit-log-maxbackup`); 0 keeps all.
    pub max_backups: usize,
    /// Days to keep rotated files, by the time in their name (`--audit-log-maxage`); 0 keeps
    /// all.
    pub max_age_days: u64,
    /// Events that may wait for the writer thread; beyond that [`LogWriter::send`] waits.
    pub buffer_size: usize,
}

impl LogConfig {
    /// Events waiting for the writer thread, by default.
    pub const DEFAULT_BUFFER_SIZE: usize = 1024;

    /// Writes to `path` without rotation.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogConfig {
            path: path.into(),
            max_size_mb: 0,
            max_backups: 0,
            max_age_days: 0,
            buffer_size: LogConfig::DEFAULT_BUFFER_SIZE,
        }
    }

    /// Whether the log goes to standard output.
    pub fn is_stdout(&self) -> bool {
        self.path.as_os_str() == "-"
    }
}

/// Why the log backend did not start.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file (or its directory) cannot be created or opened.
    #[error(
        "audit log {}: cannot open it for appending: {source}; make sure its directory can be \
         created and written, or pass `-` to log to standard output",
        .path.display()
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the audit log writer thread: {0}")]
    Spawn(#[source] io::Error),
}

enum Command {
    Event(Box<Event>),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The log backend: writes events as JSON lines from a dedicated thread, with rotation.
///
/// Clones share the writer; the thread ends when every clone is dropped or on
/// [`close`](Self::close), after writing what was sent before.
#[derive(Clone, Debug)]
pub struct LogWriter {
    tx: mpsc::Sender<Command>,
    closed_warned: Arc<AtomicBool>,
}

impl LogWriter {
    /// Opens the log (creating the file and its directory) and starts the writer thread. Call
    /// it at startup: opening the file blocks.
    pub fn open(config: LogConfig) -> Result<LogWriter, LogError> {
        let output = if config.is_stdout() {
            Output::Stdout
        } else {
            let mut file = RotatingFile::new(&config);
            file.open_append().map_err(|source| LogError::Open {
                path: config.path.clone(),
                source,
            })?;
            Output::File(Box::new(file))
        };
        let (tx, rx) = mpsc::channel(config.buffer_size.max(1));
        std::thread::Builder::new()
            .name("audit-log".to_string())
            .spawn(move || run_writer(output, rx))
            .map_err(LogError::Spawn)?;
        Ok(LogWriter {
            tx,
            closed_warned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Queues an event, waiting while the queue is full. After [`close`](Self::close) the event
    /// is dropped (with one warning).
    pub async fn send(&self, event: Event) {
        if self.tx.send(Command::Event(Box::new(event))).await.is_err() {
            self.warn_closed();
        }
    }

    /// Waits until every event sent before is written out to the file (or stdout).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Writes every event sent before, closes the file and ends the writer thread; events sent
    /// afterwards are dropped. Waits until that is done.
    pub async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Close(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    fn warn_closed(&self) {
        if !self.closed_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("the audit log is closed; audit events are dropped");
        }
    }
}

fn run_writer(mut output: Output, mut rx: mpsc::Receiver<Command>) {
    let mut warned = Warned::default();
    while let Some(first) = rx.blocking_recv() {
        let mut next = Some(first);
        while let Some(command) = next.take() {
            match command {
                Command::Event(event) => output.write_event(&event, &mut warned),
                Command::Flush(ack) => {
                    output.flush(&mut warned);
                    let _ = ack.send(());
                }
                Command::Close(ack) => {
                    // No new sends; write what is already queued, then stop.
                    rx.close();
                    let mut acks = vec![ack];
                    while let Ok(command) = rx.try_recv() {
                        match command {
                            Command::Event(event) => output.write_event(&event, &mut warned),
                            Command::Flush(ack) | Command::Close(ack) => acks.push(ack),
                        }
                    }
                    output.flush(&mut warned);
                    drop(output);
                    for ack in acks {
                        let _ = ack.send(());
                    }
                    return;
                }
            }
            next = rx.try_recv().ok();
        }
        // The queue is empty: hand the batch to the OS.
        output.flush(&mut warned);
    }
    output.flush(&mut warned);
}

/// The kinds of failure the writer reports, each once until it recovers.
#[derive(Clone, Copy, Debug)]
enum Failure {
    Open = 0,
    Write,
    Flush,
    Rotate,
    Prune,
    Encode,
}

#[derive(Default)]
struct Warned {
    kinds: [bool; 6],
    lost: u64,
}

impl Warned {
    fn fail(&mut self, kind: Failure, path: &Path, error: &dyn fmt::Display) {
        let seen = &mut self.kinds[kind as usize];
        if !*seen {
            *seen = true;
            let what = match kind {
                Failure::Open => "cannot open the audit log; events are lost until it opens",
                Failure::Write => "cannot write the audit log; events are lost until it works",
                Failure::Flush => "cannot flush the audit log",
                Failure::Rotate => "cannot rotate the audit log; appending to the current file",
                Failure::Prune => "cannot remove an old rotated audit log",
                Failure::Encode => "cannot encode an audit event; it is dropped",
            };
            tracing::warn!(path = %path.display(), error = %error, "{what}");
        }
    }

    fn ok(&mut self, kind: Failure) {
        self.kinds[kind as usize] = false;
    }

    fn written(&mut self, path: &Path) {
        self.ok(Failure::Open);
        self.ok(Failure::Write);
        if self.lost > 0 {
            tracing::warn!(
                path = %path.display(),
                lost = self.lost,
                "the audit log is written again; events were lost meanwhile"
            );
            self.lost = 0;
        }
    }
}

enum Output {
    Stdout,
    File(Box<RotatingFile>),
}

impl Output {
    fn path(&self) -> &Path {
        match self {
            Output::Stdout => Path::new("-"),
            Output::File(f) => &f.path,
        }
    }

    fn write_event(&mut self, event: &Event, warned: &mut Warned) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(e) => {
                warned.fail(Failure::Encode, self.path(), &e);
                return;
            }
        };
        line.push(b'\n');
        match self {
            Output::Stdout => match io::stdout().lock().write_all(&line) {
                Ok(()) => warned.written(Path::new("-")),
                Err(e) => {
                    warned.lost += 1;
                    warned.fail(Failure::Write, Path::new("-"), &e);
                }
            },
            Output::File(file) => file.write_line(&line, warned),
        }
    }

    fn flush(&mut self, warned: &mut Warned) {
        let (result, path) = match self {
            Output::Stdout => (io::stdout().lock().flush(), Path::new("-")),
            Output::File(file) => (file.flush(), file.path.as_path()),
        };
        match result {
            Ok(()) => warned.ok(Failure::Flush),
            Err(e) => warned.fail(Failure::Flush, path, &e),
        }
    }
}

const MEGABYTE: u64 = 1024 * 1024;

const BACKUP_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]-[minute]-[second].[subsecond digits:3]");

/// The log file with lumberjack's rotation: before a write would take the file beyond the
/// maximum size, it is renamed to `<name>-<UTC time>.<ext>` and a new one started; then rotated
/// files beyond the count or age limits are removed.
struct RotatingFile {
    path: PathBuf,
    /// In bytes; 0: never rotate.
    max_size: u64,
    max_backups: usize,
    max_age: Option<time::Duration>,
    file: Option<BufWriter<File>>,
    size: u64,
}

impl RotatingFile {
    fn new(config: &LogConfig) -> Self {
        // Beyond this the cutoff would fall before year 1 anyway.
        const MAX_DAYS: u64 = 3_000_000;
        RotatingFile {
            path: config.path.clone(),
            max_size: config.max_size_mb.saturating_mul(MEGABYTE),
            max_backups: config.max_backups,
            max_age: (config.max_age_days > 0)
                .then(|| time::Duration::days(config.max_age_days.min(MAX_DAYS) as i64)),
            file: None,
            size: 0,
        }
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    fn options(truncate: bool) -> OpenOptions {
        let mut options = OpenOptions::new();
        options.create(true);
        if truncate {
            options.write(true).truncate(true);
        } else {
            options.append(true);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        options
    }

    /// Opens the file for appending, creating it and its directory.
    fn open_append(&mut self) -> io::Result<()> {
        fs::create_dir_all(self.dir())?;
        let file = RotatingFile::options(false).open(&self.path)?;
        self.size = file.metadata()?.len();
        self.file = Some(BufWriter::new(file));
        Ok(())
    }

    fn write_line(&mut self, line: &[u8], warned: &mut Warned) {
        if self.file.is_none() {
            if let Err(e) = self.open_append() {
                warned.lost += 1;
                warned.fail(Failure::Open, &self.path, &e);
                return;
            }
        }
        let len = line.len() as u64;
        // A line larger than the maximum gets a file of its own rather than being lost.
        if self.max_size > 0 && self.size > 0 && self.size.saturating_add(len) > self.max_size {
            self.rotate(warned);
        }
        let Some(file) = self.file.as_mut() else {
            warned.lost += 1;
            return;
        };
        match file.write_all(line) {
            Ok(()) => {
                self.size += len;
                warned.written(&self.path);
            }
            Err(e) => {
                warned.lost += 1;
                warned.fail(Failure::Write, &self.path, &e);
                // Reopen on the next event (the file may have been removed).
                self.file = None;
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }

    /// `<name>-` and `.<ext>` of rotated files (Go's `filepath.Ext`: from the last dot).
    fn backup_parts(&self) -> (String, String) {
        let base = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (stem, ext) = match base.rfind('.') {
            Some(i) => base.split_at(i),
            None => (base.as_str(), ""),
        };
        (format!("{stem}-"), ext.to_string())
    }

    fn backup_path(&self, at: OffsetDateTime) -> PathBuf {
        let (prefix, ext) = self.backup_parts();
        let stamp = at
            .to_offset(UtcOffset::UTC)
            .format(BACKUP_TIME)
            .unwrap_or_default();
        self.dir().join(format!("{prefix}{stamp}{ext}"))
    }

    fn rotate(&mut self, warned: &mut Warned) {
        if let Err(e) = self.flush() {
            warned.fail(Failure::Flush, &self.path, &e);
        }
        self.file = None;
        // Rotations within one millisecond get the next free millisecond.
        let mut at = OffsetDateTime::now_utc();
        let mut target = self.backup_path(at);
        for _ in 0..1000 {
            if !target.exists() {
                break;
            }
            at += time::Duration::milliseconds(1);
            target = self.backup_path(at);
        }
        let renamed = match fs::rename(&self.path, &target) {
            Ok(()) => {
                warned.ok(Failure::Rotate);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => {
                warned.fail(Failure::Rotate, &self.path, &e);
                false
            }
        };
        let opened = if renamed {
            fs::create_dir_all(self.dir())
                .and_then(|()| RotatingFile::options(true).open(&self.path))
                .map(|file| {
                    self.size = 0;
                    self.file = Some(BufWriter::new(file));
                })
        } else {
            self.open_append()
        };
        if let Err(e) = opened {
            warned.fail(Failure::Open, &self.path, &e);
        }
        if renamed {
            self.prune(warned);
        }
    }

    /// Removes rotated files beyond `max_backups` (oldest first) and older than `max_age`.
    fn prune(&self, warned: &mut Warned) {
        if self.max_backups == 0 && self.max_age.is_none() {
            return;
        }
        let dir = self.dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                warned.fail(Failure::Prune, &dir, &e);
                return;
            }
        };
        let (prefix, ext) = self.backup_parts();
        let mut backups: Vec<(OffsetDateTime, PathBuf)> = entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let stamp = name.strip_prefix(&prefix)?.strip_suffix(&ext)?;
                let at = PrimitiveDateTime::parse(stamp, BACKUP_TIME).ok()?;
                Some((at.assume_utc(), entry.path()))
            })
            .collect();
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let mut remove = Vec::new();
        if self.max_backups > 0 && backups.len() > self.max_backups {
            remove = backups.split_off(self.max_backups);
        }
        if let Some(cutoff) = self
            .max_age
            .and_then(|age| OffsetDateTime::now_utc().checked_sub(age))
        {
            remove.extend(backups.into_iter().filter(|(at, _)| *at < cutoff));
        }
        for (_, path) in remove {
            match fs::remove_file(&path) {
                Ok(()) => warned.ok(Failure::Prune),
                Err(e) => warned.fail(Failure::Prune, &path, &e),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    // --- policy parsing ---

    const FULL_POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
metadata:
  name: example
omitStages: ["RequestReceived"]
omitManagedFields: true
rules:
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
    resources:
      - group: ""
        resources: ["endpoints", "services"]
  - level: Metadata
    userGroups: ["system:authenticated"]
    nonResourceURLs: ["/healthz*", "/version"]
    omitStages: [ResponseStarted]
  - level: Request
    namespaces: ["kube-system", ""]
    omitManagedFields: false
  - level: RequestResponse
    resources:
      - group: apps
        resources: ["deployments/scale"]
        resourceNames: ["web"]
"#;

    fn parse_err(text: &str) -> PolicyError {
        match Policy::from_bytes(text.as_bytes()) {
            Ok(p) => panic!("accepted: {p:?}"),
            Err(e) => e,
        }
    }

    fn field_errors(text: &str) -> Vec<PolicyFieldError> {
        match parse_err(text) {
            PolicyError::Invalid(errors) => errors,
            other => panic!("not a field error: {other}"),
        }
    }

    fn policy_with_rules(rules: &str) -> String {
        format!("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n{rules}")
    }

    #[test]
    fn policy_parses_yaml() {
        let p = Policy::from_bytes(FULL_POLICY.as_bytes()).unwrap();
        assert_eq!(p.omit_stages, vec![Stage::RequestReceived]);
        assert!(p.omit_managed_fields);
        assert_eq!(p.rules.len(), 4);
        assert_eq!(
            p.rules[0],
            PolicyRule {
                level: Level::None,
                users: vec!["system:kube-proxy".into()],
                verbs: vec!["watch".into()],
                resources: vec![GroupResources {
                    group: String::new(),
                    resources: vec!["endpoints".into(), "services".into()],
                    resource_names: vec![],
                }],
                ..PolicyRule::default()
            }
        );
        assert_eq!(p.rules[1].level, Level::Metadata);
        assert_eq!(p.rules[1].user_groups, vec!["system:authenticated"]);
        assert_eq!(p.rules[1].non_resource_urls, vec!["/healthz*", "/version"]);
        assert_eq!(p.rules[1].omit_stages, vec![Stage::ResponseStarted]);
        assert_eq!(p.rules[2].namespaces, vec!["kube-system", ""]);
        assert_eq!(p.rules[2].omit_managed_fields, Some(false));
        assert_eq!(p.rules[3].resources[0].group, "apps");
        assert_eq!(p.rules[3].resources[0].resource_names, vec!["web"]);
    }

    #[test]
    fn policy_parses_json() {
        let text = r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy",
            "rules":[{"level":"Metadata","verbs":["get"]},{"level":"RequestResponse"}]}"#;
        let p = Policy::from_bytes(text.as_bytes()).unwrap();
        assert_eq!(p.rules.len(), 2);
        assert_eq!(p.rules[0].verbs, vec!["get"]);
        assert_eq!(p.rules[1].level, Level::RequestResponse);
    }

    #[test]
    fn policy_parses_yaml_flow_mapping() {
        let text = "{apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}";
        let p = Policy::from_bytes(text.as_bytes()).unwrap();
        assert_eq!(p.rules[0].level, Level::Metadata);
    }

    #[test]
    fn policy_unknown_fields_are_warnings() {
        let text = policy_with_rules("  - level: Metadata\n    colour: blue\n");
        let (p, warnings) = Policy::from_bytes_with_warnings(text.as_bytes()).unwrap();
        assert_eq!(p.rules.len(), 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("rules[0].colour"), "{warnings:?}");
    }

    #[test]
    fn policy_rejects_undecodable_documents() {
        assert!(matches!(
            Policy::from_bytes(b"\xff\xfe"),
            Err(PolicyError::Decode(_))
        ));
        assert!(matches!(
            parse_err("rules: [unclosed"),
            PolicyError::Decode(_)
        ));
        assert!(matches!(
            parse_err("{\"apiVersion\": "),
            PolicyError::Decode(_)
        ));
        assert_eq!(parse_err("- a\n- b\n"), PolicyError::NotAnObject("a list"));
        assert_eq!(parse_err(""), PolicyError::NotAnObject("an empty document"));
    }

    #[test]
    fn policy_rejects_wrong_api_version() {
        let e = parse_err("apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]");
        assert_eq!(
            e,
            PolicyError::ApiVersion {
                found: "audit.k8s.io/v1beta1".into()
            }
        );
        assert!(e.to_string().contains("set it to \"audit.k8s.io/v1\""));
        assert_eq!(
            parse_err("kind: Policy\nrules: [{level: None}]"),
            PolicyError::ApiVersion { found: "".into() }
        );
    }

    #[test]
    fn policy_rejects_wrong_kind() {
        let e = parse_err("apiVersion: audit.k8s.io/v1\nkind: Event\nrules: [{level: None}]");
        assert_eq!(
            e,
            PolicyError::Kind {
                found: "Event".into()
            }
        );
        assert!(e.to_string().contains("set it to \"Policy\""));
    }

    #[test]
    fn policy_rejects_no_rules() {
        assert_eq!(
            parse_err("apiVersion: audit.k8s.io/v1\nkind: Policy\n"),
            PolicyError::NoRules
        );
        assert_eq!(
            parse_err("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []\n"),
            PolicyError::NoRules
        );
    }

    #[test]
    fn policy_rejects_missing_level() {
        assert_eq!(
            field_errors(&policy_with_rules("  - verbs: [get]\n")),
            vec![PolicyFieldError::MissingLevel {
                path: "rules[0].level".into()
            }]
        );
        assert_eq!(
            field_errors(&policy_with_rules("  - level: \"\"\n")),
            vec![PolicyFieldError::MissingLevel {
                path: "rules[0].level".into()
            }]
        );
    }

    #[test]
    fn policy_rejects_unsupported_level() {
        let errors = field_errors(&policy_with_rules(
            "  - level: Metadata\n  - level: Everything\n",
        ));
        assert_eq!(
            errors,
            vec![PolicyFieldError::UnsupportedLevel {
                path: "rules[1].level".into(),
                value: "Everything".into()
            }]
        );
        let message = PolicyError::Invalid(errors).to_string();
        assert!(message.contains("rules[1].level"), "{message}");
        assert!(message.contains("RequestResponse"), "{message}");
    }

    #[test]
    fn policy_rejects_unsupported_stages() {
        let text = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Started]\nrules:\n  \
                    - level: Metadata\n    omitStages: [Panic, Done]\n";
        assert_eq!(
            field_errors(text),
            vec![
                PolicyFieldError::UnsupportedStage {
                    path: "omitStages[0]".into(),
                    value: "Started".into()
                },
                PolicyFieldError::UnsupportedStage {
                    path: "rules[0].omitStages[1]".into(),
                    value: "Done".into()
                },
            ]
        );
    }

    #[test]
    fn policy_rejects_non_resource_urls_with_resources_or_namespaces() {
        let errors = field_errors(&policy_with_rules(
            "  - level: Metadata\n    nonResourceURLs: [/healthz]\n    resources: [{group: \"\"}]\n  \
             - level: Metadata\n    nonResourceURLs: [/healthz]\n    namespaces: [default]\n",
        ));
        assert_eq!(
            errors,
            vec![
                PolicyFieldError::NonResourceUrlsWithResources {
                    path: "rules[0].nonResourceURLs".into()
                },
                PolicyFieldError::NonResourceUrlsWithResources {
                    path: "rules[1].nonResourceURLs".into()
                },
            ]
        );
        assert!(errors[0].to_string().contains("split it into two rules"));
    }

    #[test]
    fn policy_rejects_bad_non_resource_urls() {
        let errors = field_errors(&policy_with_rules(
            "  - level: Metadata\n    nonResourceURLs: [\"*\", /ok*, healthz, /a*/b, \"\"]\n",
        ));
        assert_eq!(
            errors,
            vec![
                PolicyFieldError::NonResourceUrlNotAbsolute {
                    path: "rules[0].nonResourceURLs[2]".into(),
                    value: "healthz".into()
                },
                PolicyFieldError::NonResourceUrlWildcard {
                    path: "rules[0].nonResourceURLs[3]".into(),
                    value: "/a*/b".into()
                },
                PolicyFieldError::NonResourceUrlNotAbsolute {
                    path: "rules[0].nonResourceURLs[4]".into(),
                    value: "".into()
                },
            ]
        );
    }

    #[test]
    fn policy_rejects_invalid_group() {
        let errors = field_errors(&policy_with_rules(
            "  - level: Metadata\n    resources:\n      - group: apps\n      - group: Apps_\n      \
             - group: example.com\n      - group: \"-x.io\"\n",
        ));
        assert_eq!(
            errors,
            vec![
                PolicyFieldError::InvalidGroup {
                    path: "rules[0].resources[1].group".into(),
                    value: "Apps_".into()
                },
                PolicyFieldError::InvalidGroup {
                    path: "rules[0].resources[3].group".into(),
                    value: "-x.io".into()
                },
            ]
        );
    }

    #[test]
    fn policy_rejects_resource_names_without_resources() {
        assert_eq!(
            field_errors(&policy_with_rules(
                "  - level: Metadata\n    resources:\n      - group: \"\"\n        resourceNames: [x]\n"
            )),
            vec![PolicyFieldError::ResourceNamesWithoutResources {
                path: "rules[0].resources[0].resourceNames".into()
            }]
        );
    }

    #[test]
    fn policy_rejects_wrong_types() {
        let text = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitManagedFields: yes please\n\
                    rules:\n  - level: [Metadata]\n    users: alice\n    verbs: [get, 3]\n  \
                    - just a string\n  - level: None\n    resources: [pods]\n";
        assert_eq!(
            field_errors(text),
            vec![
                PolicyFieldError::WrongType {
                    path: "omitManagedFields".into(),
                    expected: "true or false"
                },
                PolicyFieldError::WrongType {
                    path: "rules[0].level".into(),
                    expected: "a string"
                },
                PolicyFieldError::WrongType {
                    path: "rules[0].users".into(),
                    expected: "a list"
                },
                PolicyFieldError::WrongType {
                    path: "rules[0].verbs[1]".into(),
                    expected: "a string"
                },
                PolicyFieldError::WrongType {
                    path: "rules[1]".into(),
                    expected: "an object"
                },
                PolicyFieldError::WrongType {
                    path: "rules[2].resources[0]".into(),
                    expected: "an object"
                },
            ]
        );
        assert_eq!(
            field_errors("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: {level: None}\n"),
            vec![PolicyFieldError::WrongType {
                path: "rules".into(),
                expected: "a list"
            }]
        );
    }

    // --- matching ---

    fn resource(verb: &str, group: &str, res: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            user: "alice".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            verb: verb.into(),
            target: Target::Resource(ResourceAttributes {
                api_group: group.into(),
                api_version: if group.is_empty() { "v1" } else { "v1beta1" }.into(),
                resource: res.into(),
                subresource: sub.into(),
                namespace: ns.into(),
                name: name.into(),
            }),
        }
    }

    fn non_resource(verb: &str, path: &str) -> Attributes {
        Attributes {
            user: "alice".into(),
            groups: vec!["dev".into()],
            verb: verb.into(),
            target: Target::NonResource { path: path.into() },
        }
    }

    /// The level a policy of `rules` (YAML list items) gives the request.
    fn level_of(rules: &str, a: &Attributes) -> Level {
        let text = policy_with_rules(rules);
        Policy::from_bytes(text.as_bytes()).unwrap().decide(a).level
    }

    fn matches(rule: &str, a: &Attributes) -> bool {
        level_of(&format!("  - level: RequestResponse\n{rule}"), a) == Level::RequestResponse
    }

    #[test]
    fn match_users_and_groups() {
        let pods = resource("get", "", "pods", "", "default", "p");
        assert!(matches("    users: [bob, alice]\n", &pods));
        assert!(!matches("    users: [bob]\n", &pods));
        assert!(matches("    userGroups: [system:authenticated]\n", &pods));
        assert!(!matches("    userGroups: [system:masters]\n", &pods));
        assert!(!matches(
            "    users: [alice]\n    userGroups: [system:masters]\n",
            &pods
        ));
    }

    #[test]
    fn match_verbs() {
        let pods = resource("watch", "", "pods", "", "default", "");
        assert!(matches("    verbs: [list, watch]\n", &pods));
        assert!(!matches("    verbs: [get]\n", &pods));
        assert!(matches(
            "    verbs: [get]\n",
            &non_resource("get", "/healthz")
        ));
    }

    #[test]
    fn match_resources_by_group() {
        let pods = resource("get", "", "pods", "", "default", "p");
        let deploy = resource("get", "apps", "deployments", "", "default", "d");
        let core = "    resources: [{group: \"\", resources: [pods]}]\n";
        assert!(matches(core, &pods));
        assert!(!matches(core, &deploy));
        assert!(matches("    resources: [{group: apps}]\n", &deploy));
        assert!(!matches("    resources: [{group: apps}]\n", &pods));
        // A resource rule never matches a non-resource request.
        assert!(!matches(core, &non_resource("get", "/api/v1/pods")));
    }

    #[test]
    fn match_resource_wildcards_and_subresources() {
        let pod = resource("get", "", "pods", "", "default", "p");
        let log = resource("get", "", "pods", "log", "default", "p");
        let scale = resource("update", "apps", "deployments", "scale", "default", "d");
        let rule = |res: &str, group: &str| {
            format!("    resources: [{{group: \"{group}\", resources: [\"{res}\"]}}]\n")
        };
        // "*": every resource and subresource.
        assert!(matches(&rule("*", ""), &pod));
        assert!(matches(&rule("*", ""), &log));
        // "pods" is the pods themselves, not their subresources.
        assert!(matches(&rule("pods", ""), &pod));
        assert!(!matches(&rule("pods", ""), &log));
        // "pods/log": that subresource only.
        assert!(matches(&rule("pods/log", ""), &log));
        assert!(!matches(&rule("pods/log", ""), &pod));
        assert!(!matches(&rule("pods/exec", ""), &log));
        // "pods/*": pods and all their subresources.
        assert!(matches(&rule("pods/*", ""), &log));
        assert!(matches(&rule("pods/*", ""), &pod));
        assert!(!matches(&rule("services/*", ""), &log));
        // "*/scale": the scale subresource of anything in the group.
        assert!(matches(&rule("*/scale", "apps"), &scale));
        assert!(!matches(&rule("*/scale", ""), &log));
        assert!(!matches(
            &rule("*/scale", "apps"),
            &resource("get", "apps", "deployments", "", "default", "d")
        ));
    }

    #[test]
    fn match_resource_names() {
        let rule =
            "    resources: [{group: \"\", resources: [configmaps], resourceNames: [a, b]}]\n";
        assert!(matches(
            rule,
            &resource("get", "", "configmaps", "", "ns", "b")
        ));
        assert!(!matches(
            rule,
            &resource("get", "", "configmaps", "", "ns", "c")
        ));
        assert!(!matches(
            rule,
            &resource("list", "", "configmaps", "", "ns", "")
        ));
    }

    #[test]
    fn match_namespaces_including_cluster_scope() {
        let namespaced = resource("get", "", "pods", "", "default", "p");
        let cluster = resource("get", "", "nodes", "", "", "n");
        assert!(matches("    namespaces: [default]\n", &namespaced));
        assert!(!matches("    namespaces: [default]\n", &cluster));
        assert!(matches("    namespaces: [\"\"]\n", &cluster));
        assert!(!matches("    namespaces: [\"\"]\n", &namespaced));
        assert!(!matches(
            "    namespaces: [\"\"]\n",
            &non_resource("get", "/healthz")
        ));
    }

    #[test]
    fn match_non_resource_urls() {
        let rule = "    nonResourceURLs: [/healthz*, /version]\n";
        assert!(matches(rule, &non_resource("get", "/healthz")));
        assert!(matches(rule, &non_resource("get", "/healthz/ready")));
        assert!(matches(rule, &non_resource("get", "/version")));
        assert!(!matches(rule, &non_resource("get", "/version/x")));
        assert!(!matches(rule, &non_resource("get", "/livez")));
        assert!(!matches(
            rule,
            &resource("get", "", "pods", "", "default", "")
        ));
        let all = "    nonResourceURLs: [\"*\"]\n";
        assert!(matches(all, &non_resource("get", "/anything")));
        assert!(!matches(all, &resource("get", "", "pods", "", "", "")));
    }

    #[test]
    fn match_first_rule_wins_and_default_is_none() {
        let rules = "  - level: None\n    users: [alice]\n    verbs: [watch]\n  \
                     - level: Request\n    users: [alice]\n  - level: Metadata\n";
        assert_eq!(
            level_of(rules, &resource("watch", "", "pods", "", "", "")),
            Level::None
        );
        assert_eq!(
            level_of(rules, &resource("get", "", "pods", "", "", "")),
            Level::Request
        );
        let mut bob = resource("get", "", "pods", "", "", "");
        bob.user = "bob".into();
        assert_eq!(level_of(rules, &bob), Level::Metadata);
        let only_alice = policy_with_rules("  - level: Metadata\n    users: [alice]\n");
        let d = Policy::from_bytes(only_alice.as_bytes())
            .unwrap()
            .decide(&bob);
        assert_eq!(d.level, Level::None);
        assert!(!d.records(Stage::ResponseComplete));
    }

    #[test]
    fn decision_merges_omit_stages_and_managed_fields() {
        let p = Policy::from_bytes(FULL_POLICY.as_bytes()).unwrap();
        let health = Attributes {
            groups: vec!["system:authenticated".into()],
            ..non_resource("get", "/healthz")
        };
        let d = p.decide(&health);
        assert_eq!(d.level, Level::Metadata);
        assert_eq!(
            d.omit_stages,
            vec![Stage::RequestReceived, Stage::ResponseStarted]
        );
        assert!(d.omit_managed_fields);
        assert!(!d.records(Stage::RequestReceived));
        assert!(d.records(Stage::ResponseComplete));
        // The rule's omitManagedFields overrides the policy's.
        let d = p.decide(&resource("get", "", "nodes", "", "", "n"));
        assert_eq!(d.level, Level::Request);
        assert_eq!(d.omit_stages, vec![Stage::RequestReceived]);
        assert!(!d.omit_managed_fields);
        // No match: level None with the policy's settings.
        let d = p.decide(&resource("get", "", "pods", "", "default", "p"));
        assert_eq!(d.level, Level::None);
        assert_eq!(d.omit_stages, vec![Stage::RequestReceived]);
        assert!(d.omit_managed_fields);
        // Duplicates collapse.
        let text =
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Panic, RequestReceived]\n\
                    rules:\n  - level: Metadata\n    omitStages: [RequestReceived]\n";
        let d = Policy::from_bytes(text.as_bytes()).unwrap().decide(&health);
        assert_eq!(d.omit_stages, vec![Stage::RequestReceived, Stage::Panic]);
    }

    // --- events ---

    const RECEIVED: OffsetDateTime = datetime!(2026-01-02 03:04:05.123456 UTC);
    const DONE: OffsetDateTime = datetime!(2026-01-02 03:04:05.234567 UTC);

    fn decision(level: Level) -> Decision {
        Decision {
            level,
            ..Decision::default()
        }
    }

    fn builder(level: Level, attrs: &Attributes) -> EventBuilder {
        EventBuilder::new(
            decision(level),
            attrs,
            "0b9e6c5e-2f5a-4a45-9d7e-1d1f0d6f6a11",
            "/api/v1/namespaces/default/pods?limit=500",
        )
        .received_at(RECEIVED)
        .source_ips(vec!["10.0.0.1".into()])
        .user_agent("kubectl/v1.33.0")
    }

    fn pod_body() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "default", "uid": "u-1",
                            "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]}})
    }

    fn complete(b: &mut EventBuilder, code: u16) -> Value {
        b.set_response_code(code);
        let e = b.event_at(Stage::ResponseComplete, DONE).unwrap();
        serde_json::from_str(&e.to_json().unwrap()).unwrap()
    }

    #[test]
    fn event_metadata_shape() {
        let attrs = resource("list", "", "pods", "", "default", "");
        let mut b = builder(Level::Metadata, &attrs).logical_cluster("root", "root");
        b.set_request_object(&pod_body());
        b.set_response_object(&json!({"kind": "PodList", "items": []}));
        b.set_response_code(200);
        let line = b
            .event_at(Stage::ResponseComplete, DONE)
            .unwrap()
            .to_json()
            .unwrap();
        assert_eq!(
            line,
            concat!(
                r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","#,
                r#""auditID":"0b9e6c5e-2f5a-4a45-9d7e-1d1f0d6f6a11","stage":"ResponseComplete","#,
                r#""requestURI":"/api/v1/namespaces/default/pods?limit=500","verb":"list","#,
                r#""user":{"username":"alice","groups":["dev","system:authenticated"]},"#,
                r#""sourceIPs":["10.0.0.1"],"userAgent":"kubectl/v1.33.0","#,
                r#""objectRef":{"resource":"pods","namespace":"default","name":"p","uid":"u-1","#,
                r#""apiVersion":"v1","resourceVersion":"7"},"#,
                r#""responseStatus":{"metadata":{},"code":200},"#,
                r#""requestReceivedTimestamp":"2026-01-02T03:04:05.123456Z","#,
                r#""stageTimestamp":"2026-01-02T03:04:05.234567Z","#,
                r#""annotations":{"kcp.io/cluster":"root","kcp.io/path":"root","#,
                r#""tenancy.kcp.io/workspace":"root"}}"#
            )
        );
    }

    #[test]
    fn event_request_level_has_request_object_only() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::Request, &attrs);
        assert!(b.wants_request_object());
        assert!(!b.wants_response_object());
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert_eq!(v["requestObject"], pod_body());
        assert!(v.get("responseObject").is_none());
        assert_eq!(v["responseStatus"], json!({"metadata": {}, "code": 201}));
    }

    #[test]
    fn event_request_response_level_has_both_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::RequestResponse, &attrs);
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert_eq!(v["requestObject"], pod_body());
        assert_eq!(v["responseObject"], pod_body());
        assert_eq!(v["level"], "RequestResponse");
    }

    #[test]
    fn event_metadata_level_has_no_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::Metadata, &attrs);
        assert!(!b.wants_request_object());
        b.set_request_object(&pod_body());
        b.set_response_object(&pod_body());
        let v = complete(&mut b, 201);
        assert!(v.get("requestObject").is_none());
        assert!(v.get("responseObject").is_none());
    }

    #[test]
    fn event_omits_managed_fields_when_decided() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let d = Decision {
            level: Level::RequestResponse,
            omit_stages: vec![],
            omit_managed_fields: true,
        };
        let mut b = EventBuilder::new(d, &attrs, "id", "/api/v1/namespaces/default/pods");
        b.set_request_object(&pod_body());
        let list = json!({"kind": "PodList", "items": [pod_body(), pod_body()]});
        b.set_response_object(&list);
        let v = complete(&mut b, 200);
        assert!(v["requestObject"]["metadata"]
            .get("managedFields")
            .is_none());
        assert_eq!(v["requestObject"]["metadata"]["name"], "p");
        for item in v["responseObject"]["items"].as_array().unwrap() {
            assert!(item["metadata"].get("managedFields").is_none());
        }
    }

    #[test]
    fn event_level_none_and_omitted_stages_yield_nothing() {
        let attrs = resource("get", "", "pods", "", "default", "p");
        let mut none = builder(Level::None, &attrs);
        assert!(none.request_received().is_none());
        assert!(none.response_started(200).is_none());
        assert!(none.response_complete(200).is_none());
        assert!(none.panicked("boom").is_none());
        let d = Decision {
            level: Level::Metadata,
            omit_stages: vec![Stage::RequestReceived, Stage::Panic],
            omit_managed_fields: false,
        };
        let mut b = EventBuilder::new(d, &attrs, "id", "/api/v1/namespaces/default/pods/p");
        assert!(b.request_received().is_none());
        assert!(b.panicked("boom").is_none());
        assert_eq!(
            b.response_started(200).map(|e| e.stage),
            Some(Stage::ResponseStarted)
        );
        assert_eq!(
            b.response_complete(200).map(|e| e.stage),
            Some(Stage::ResponseComplete)
        );
    }

    #[test]
    fn event_request_received_has_no_status_or_objects() {
        let attrs = resource("create", "", "pods", "", "default", "");
        let mut b = builder(Level::RequestResponse, &attrs);
        b.set_request_object(&pod_body());
        b.set_response_code(201);
        let e = b.request_received().unwrap();
        assert_eq!(e.stage, Stage::RequestReceived);
        assert!(e.response_status.is_none());
        assert!(e.request_object.is_none());
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        assert!(v.get("responseStatus").is_none());
        assert!(v.get("requestObject").is_none());
    }

    #[test]
    fn event_failure_status_from_status_object() {
        let attrs = resource("get", "", "pods", "", "default", "missing");
        let mut b = builder(Level::Metadata, &attrs);
        b.set_response_object(&json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "kind": "pods"}, "code": 404}));
        let line = {
            b.set_response_code(404);
            b.event_at(Stage::ResponseComplete, DONE)
                .unwrap()
                .to_json()
                .unwrap()
        };
        assert!(
            line.contains(concat!(
                r#""responseStatus":{"metadata":{},"status":"Failure","#,
                r#""message":"pods \"missing\" not found","reason":"NotFound","details":{"#
            )),
            "{line}"
        );
        assert!(
            line.contains(r#""},"code":404},"requestReceivedTimestamp""#),
            "{line}"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v["responseStatus"]["details"],
            json!({"name": "missing", "kind": "pods"})
        );
    }

    #[test]
    fn event_panic_and_impersonation() {
        let attrs = non_resource("get", "/healthz");
        let mut b = builder(Level::Metadata, &attrs);
        b.set_impersonated_user(UserInfo {
            username: "bob".into(),
            groups: vec!["ops".into()],
            ..UserInfo::default()
        });
        let e = b.panicked("index out of range").unwrap();
        assert_eq!(e.stage, Stage::Panic);
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        assert_eq!(v["responseStatus"]["code"], 500);
        assert_eq!(v["responseStatus"]["status"], "Failure");
        assert_eq!(v["responseStatus"]["reason"], "InternalError");
        assert!(v["responseStatus"]["message"]
            .as_str()
            .unwrap()
            .contains("index out of range"));
        assert_eq!(
            v["impersonatedUser"],
            json!({"username": "bob", "groups": ["ops"]})
        );
        assert!(v.get("objectRef").is_none());
    }

    #[test]
    fn event_object_ref_omits_empty_fields() {
        let attrs = resource("update", "apps", "deployments", "scale", "team", "web");
        let mut b = builder(Level::Metadata, &attrs);
        let v = complete(&mut b, 200);
        assert_eq!(
            v["objectRef"],
            json!({"resource": "deployments", "namespace": "team", "name": "web",
                   "apiGroup": "apps", "apiVersion": "v1beta1", "subresource": "scale"})
        );
        let cluster = resource("list", "", "namespaces", "", "", "");
        let v = complete(&mut builder(Level::Metadata, &cluster), 200);
        assert_eq!(
            v["objectRef"],
            json!({"resource": "namespaces", "apiVersion": "v1"})
        );
    }

    #[test]
    fn event_annotations_keep_the_first_value() {
        let attrs = resource("get", "", "pods", "", "default", "p");
        let mut b = builder(Level::Metadata, &attrs).logical_cluster("2abc", "");
        b.annotate("authorization.k8s.io/decision", "allow");
        b.annotate("authorization.k8s.io/decision", "forbid");
        let e = b.event_at(Stage::ResponseComplete, DONE).unwrap();
        assert_eq!(e.annotations["authorization.k8s.io/decision"], "allow");
        assert_eq!(e.annotations[CLUSTER_ANNOTATION], "2abc");
        assert_eq!(e.annotations[WORKSPACE_ANNOTATION], "2abc");
        assert_eq!(e.annotations[PATH_ANNOTATION], "");
    }

    #[test]
    fn timestamp_format_is_rfc3339_micro_utc() {
        assert_eq!(format_micro_time(RECEIVED), "2026-01-02T03:04:05.123456Z");
        assert_eq!(
            format_micro_time(datetime!(2026-01-02 03:04:05 UTC)),
            "2026-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            format_micro_time(datetime!(2026-01-02 05:04:05.5 +02:00)),
            "2026-01-02T03:04:05.500000Z"
        );
        let attrs = non_resource("get", "/version");
        let e = builder(Level::Metadata, &attrs).request_received().unwrap();
        let v: Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
        let stamp = v["stageTimestamp"].as_str().unwrap();
        assert_eq!(stamp.len(), "2026-01-02T03:04:05.123456Z".len(), "{stamp}");
        assert!(
            stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.',
            "{stamp}"
        );
        assert!(
            PrimitiveDateTime::parse(stamp, MICRO_TIME).is_ok(),
            "{stamp}"
        );
    }

    // --- log writer ---

    fn event_with_body(id: usize, body_len: usize) -> Event {
        let attrs = resource("create", "", "configmaps", "", "default", "");
        let mut b = EventBuilder::new(
            decision(Level::Request),
            &attrs,
            format!("id-{id}"),
            "/api/v1/namespaces/default/configmaps",
        );
        b.set_request_object(&json!({"data": {"x": "a".repeat(body_len)}}));
        b.response_complete(201).unwrap()
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn is_backup_name(name: &str) -> bool {
        name.strip_prefix("audit-")
            .and_then(|r| r.strip_suffix(".log"))
            .is_some_and(|stamp| PrimitiveDateTime::parse(stamp, BACKUP_TIME).is_ok())
    }

    #[tokio::test]
    async fn log_writer_writes_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/audit.log");
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        for i in 0..3 {
            w.send(event_with_body(i, 3)).await;
        }
        w.flush().await;
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2]["auditID"], "id-2");
        assert_eq!(lines[0]["kind"], "Event");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        w.close().await;
        // After close, events are dropped, not written, and nothing hangs.
        w.send(event_with_body(9, 3)).await;
        w.flush().await;
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 3);
    }

    #[tokio::test]
    async fn log_writer_appends_to_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        fs::write(&path, "{\"earlier\":true}\n").unwrap();
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        w.send(event_with_body(0, 1)).await;
        w.close().await;
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.starts_with("{\"earlier\":true}\n"));
    }

    #[tokio::test]
    async fn log_writer_rotates_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = LogConfig {
            max_size_mb: 1,
            max_backups: 2,
            buffer_size: 2,
            ..LogConfig::new(&path)
        };
        let w = LogWriter::open(config).unwrap();
        // ~400 KB per event: two fit in 1 MB, the third starts a new file.
        for i in 0..9 {
            w.send(event_with_body(i, 400 * 1024)).await;
        }
        w.close().await;
        let names = files_in(dir.path());
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains(&"audit.log".to_string()), "{names:?}");
        let backups: Vec<&String> = names.iter().filter(|n| n.as_str() != "audit.log").collect();
        assert!(backups.iter().all(|n| is_backup_name(n)), "{names:?}");
        // Every file stays within the limit; the newest backups hold the latest events.
        for name in &names {
            let len = fs::metadata(dir.path().join(name)).unwrap().len();
            assert!(len <= MEGABYTE, "{name}: {len}");
        }
        let current = fs::read_to_string(&path).unwrap();
        let ids: Vec<String> = current
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["auditID"].to_string())
            .collect();
        assert_eq!(ids, vec!["\"id-8\""]);
        let newest = fs::read_to_string(dir.path().join(backups[1])).unwrap();
        assert!(newest.contains("\"id-6\"") && newest.contains("\"id-7\""));
    }

    #[tokio::test]
    async fn log_writer_without_max_size_never_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        for i in 0..4 {
            w.send(event_with_body(i, 400 * 1024)).await;
        }
        w.close().await;
        assert_eq!(files_in(dir.path()), vec!["audit.log"]);
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 4);
    }

    #[test]
    fn rotation_prunes_by_age_and_keeps_all_without_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let old = "audit-2000-01-01T00-00-00.000.log";
        fs::write(dir.path().join(old), "old\n").unwrap();
        fs::write(dir.path().join("audit-notes.log"), "not a backup\n").unwrap();
        fs::write(dir.path().join("other-2000-01-01T00-00-00.000.log"), "x\n").unwrap();

        // No limits: rotation keeps every backup.
        let mut warned = Warned::default();
        {
            let mut file = RotatingFile::new(&LogConfig::new(&path));
            file.max_size = 10;
            file.write_line(b"0123456789\n", &mut warned);
            file.write_line(b"0123456789\n", &mut warned);
        }
        assert!(dir.path().join(old).exists());

        // Max age one day: the year-2000 backup goes, the fresh one and unrelated files stay.
        let config = LogConfig {
            max_age_days: 1,
            ..LogConfig::new(&path)
        };
        let mut file = RotatingFile::new(&config);
        file.max_size = 10;
        file.write_line(b"0123456789\n", &mut warned);
        file.flush().unwrap();
        let names = files_in(dir.path());
        assert!(!names.contains(&old.to_string()), "{names:?}");
        assert!(names.contains(&"audit-notes.log".to_string()));
        assert!(names.contains(&"other-2000-01-01T00-00-00.000.log".to_string()));
        assert_eq!(
            names.iter().filter(|n| is_backup_name(n)).count(),
            2,
            "{names:?}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "0123456789\n");
    }

    #[test]
    fn backup_names_follow_lumberjack() {
        let at = datetime!(2026-01-02 03:04:05.678901 UTC);
        let file = RotatingFile::new(&LogConfig::new("/var/log/audit.log"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("/var/log/audit-2026-01-02T03-04-05.678.log")
        );
        let file = RotatingFile::new(&LogConfig::new("/var/log/audit.json.log"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("/var/log/audit.json-2026-01-02T03-04-05.678.log")
        );
        let file = RotatingFile::new(&LogConfig::new("audit"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("./audit-2026-01-02T03-04-05.678")
        );
    }

    #[test]
    fn log_writer_open_reports_unusable_paths() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = LogWriter::open(LogConfig::new(blocker.join("audit.log"))).unwrap_err();
        assert!(matches!(err, LogError::Open { .. }), "{err}");
        assert!(err.to_string().contains("audit.log"), "{err}");
    }

    #[test]
    fn level_and_stage_names_round_trip() {
        for level in Level::ALL {
            assert_eq!(Level::parse(level.as_str()), Some(level));
        }
        for stage in Stage::ALL {
            assert_eq!(Stage::parse(stage.as_str()), Some(stage));
        }
        assert!(Level::Metadata < Level::Request);
        assert_eq!(Level::parse("metadata"), None);
    }
}
