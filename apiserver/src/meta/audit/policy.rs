//! The audit policy (`--audit-policy-file`): read and validated as kube-apiserver does, and
//! matched against what a request is ([`Attributes`]) to decide how much of it is recorded.

use serde_json::{Map, Value};

use super::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::audit::fixtures::{non_resource, resource};

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
}
