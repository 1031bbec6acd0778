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
//! One file each: `policy.rs`, `event.rs`, `writer.rs` (with rotation). This module imports
//! nothing from the rest of the crate.

mod event;
mod policy;
mod writer;

pub use event::*;
pub use policy::*;
pub use writer::*;

/// Auditing: which requests are recorded how (`--audit-policy-file`), and the log they go to
/// (`--audit-log-path`).
pub struct Audit {
    /// Decides each request's level and stages.
    pub policy: Policy,
    /// Where events go.
    pub writer: LogWriter,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit").finish_non_exhaustive()
    }
}

use std::fmt;

use serde::Serialize;

/// The `apiVersion` of audit policies and events.
pub const API_VERSION: &str = "audit.k8s.io/v1";

/// The audit annotation kcp gives the logical cluster's name.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";
/// The audit annotation kcp gives the logical cluster's name as well (its older key).
pub const WORKSPACE_ANNOTATION: &str = "tenancy.kcp.io/workspace";
/// The audit annotation kcp gives the logical cluster's canonical workspace path
/// (`root:org:team`); kcp writes it empty when the path is not known.
pub const PATH_ANNOTATION: &str = "kcp.io/path";

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

/// Requests the tests of the policy and of events both judge.
#[cfg(test)]
mod fixtures {
    use super::*;

    pub(super) fn resource(
        verb: &str,
        group: &str,
        res: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
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

    pub(super) fn non_resource(verb: &str, path: &str) -> Attributes {
        Attributes {
            user: "alice".into(),
            groups: vec!["dev".into()],
            verb: verb.into(),
            target: Target::NonResource { path: path.into() },
        }
    }

    pub(super) fn decision(level: Level) -> Decision {
        Decision {
            level,
            ..Decision::default()
        }
    }
}
