//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) into
//! JSON, for the built-in kinds typed clients send that way (`kubectl create namespace`, …).
//! Responses are always JSON, which every client accepts.
//!
//! kube-apiserver decodes such a body into its Go struct, and everything after (defaulting,
//! managed fields, storage, the answer) sees what Go's JSON encoding of that struct prints. The
//! decoder gives that same JSON, which is not what is on the wire: Go's marshallers write every
//! field held by value (a `string`, a number, a `bool`, a struct) even when it is empty, so
//! `kubectl create configmap` sends an empty `generateName` and a zero `generation`. Each field
//! of the tables below says how Go holds it ([`Go`]): a value field whose JSON tag has
//! `omitempty` is left out when it decodes to its zero value, one without is printed as Go prints
//! it (`""`, `0`, `false`, a `null` time); a pointer (`*bool`, `*int32`, `*T`) is on the wire only
//! when set and is kept as sent, a zero included (`immutable: false`); a slice or map without
//! elements is left out (`omitempty`) or `null`.

use base64::Engine;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The four magic bytes in front of every Kubernetes protobuf message.
pub const MAGIC: &[u8] = b"k8s\x00";

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    /// map<string, string>
    MapStr,
    /// map<string, bytes>: base64 strings in JSON
    MapBytes,
    /// map<string, ExtraValue> (a message of repeated strings): lists of strings in JSON
    MapList,
    /// metav1.Time (seconds), RFC 3339; the zero time is `null`
    Time,
    /// metav1.MicroTime, RFC 3339 with microseconds; the zero time is `null`
    MicroTime,
    /// FieldsV1: raw JSON bytes
    RawJson,
}

impl Ty {
    fn is_map(self) -> bool {
        matches!(self, Ty::MapStr | Ty::MapBytes | Ty::MapList)
    }
}

/// How the Go struct holds a field, and so what JSON its decoded value prints as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Go {
    /// A value without `omitempty`: printed zero or not (`""`, `0`, `false`, a zero time as
    /// `null`, a struct with its own fields).
    Value,
    /// A value with `omitempty`: left out when it is an empty string, zero or false. A struct is
    /// never empty to Go, so it is printed, and a zero time prints `null`.
    OmitEmpty,
    /// A value with `omitzero`: left out when it is its zero value, a zero time included.
    OmitZero,
    /// A pointer with `omitempty`: printed as sent when on the wire (a zero included), left out
    /// when not.
    Pointer,
    /// A pointer without `omitempty`: `null` when not on the wire.
    PointerOrNull,
    /// A slice or map with `omitempty`: left out when it has no element.
    List,
    /// A slice or map without `omitempty`: `null` when it has no element.
    ListOrNull,
}

#[derive(Clone, Copy)]
struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
    go: Go,
}

/// A value field with `omitempty` (most optional fields: `string`, `int64`, `bool`, structs).
const fn opt(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::OmitEmpty,
    }
}

/// A value field without `omitempty` (`PolicyRule.verbs` is a list, see [`req_list`]).
const fn req(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::Value,
    }
}

/// A pointer with `omitempty`.
const fn ptr(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::Pointer,
    }
}

/// A pointer without `omitempty`.
const fn req_ptr(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::PointerOrNull,
    }
}

/// A slice or map with `omitempty`.
const fn list(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::List,
    }
}

/// A slice or map without `omitempty`.
const fn req_list(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        go: Go::ListOrNull,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    req(1, "kind", Ty::Str),
    req(3, "name", Ty::Str),
    req(4, "uid", Ty::Str),
    req(5, "apiVersion", Ty::Str),
    ptr(6, "controller", Ty::Bool),
    ptr(7, "blockOwnerDeletion", Ty::Bool),
];

const MANAGED_FIELDS: &[Field] = &[
    opt(1, "manager", Ty::Str),
    opt(2, "operation", Ty::Str),
    opt(3, "apiVersion", Ty::Str),
    ptr(4, "time", Ty::Time),
    opt(6, "fieldsType", Ty::Str),
    ptr(7, "fieldsV1", Ty::RawJson),
    opt(8, "subresource", Ty::Str),
];

const OBJECT_META: &[Field] = &[
    opt(1, "name", Ty::Str),
    opt(2, "generateName", Ty::Str),
    opt(3, "namespace", Ty::Str),
    opt(4, "selfLink", Ty::Str),
    opt(5, "uid", Ty::Str),
    opt(6, "resourceVersion", Ty::Str),
    opt(7, "generation", Ty::Int),
    // `omitempty,omitzero` since Kubernetes 1.34: no `creationTimestamp: null` any more.
    Field {
        num: 8,
        name: "creationTimestamp",
        ty: Ty::Time,
        go: Go::OmitZero,
    },
    ptr(9, "deletionTimestamp", Ty::Time),
    ptr(10, "deletionGracePeriodSeconds", Ty::Int),
    list(11, "labels", Ty::MapStr),
    list(12, "annotations", Ty::MapStr),
    list(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    list(14, "finalizers", Ty::Str),
    list(17, "managedFields", Ty::Msg(MANAGED_FIELDS)),
];

/// meta/v1 DeleteOptions, which client-go sends with every delete of a kind it prefers protobuf
/// for (ConfigMaps, Secrets, Namespaces, …).
const DELETE_OPTIONS: &[Field] = &[
    ptr(1, "gracePeriodSeconds", Ty::Int),
    ptr(
        2,
        "preconditions",
        Ty::Msg(&[ptr(1, "uid", Ty::Str), ptr(2, "resourceVersion", Ty::Str)]),
    ),
    ptr(3, "orphanDependents", Ty::Bool),
    ptr(4, "propagationPolicy", Ty::Str),
    list(5, "dryRun", Ty::Str),
    ptr(
        6,
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        Ty::Bool,
    ),
];

/// core/v1 ObjectReference: every field optional.
const OBJECT_REFERENCE: &[Field] = &[
    opt(1, "kind", Ty::Str),
    opt(2, "namespace", Ty::Str),
    opt(3, "name", Ty::Str),
    opt(4, "uid", Ty::Str),
    opt(5, "apiVersion", Ty::Str),
    opt(6, "resourceVersion", Ty::Str),
    opt(7, "fieldPath", Ty::Str),
];

const NAMESPACE_CONDITION: &[Field] = &[
    req(1, "type", Ty::Str),
    req(2, "status", Ty::Str),
    opt(4, "lastTransitionTime", Ty::Time),
    opt(5, "reason", Ty::Str),
    opt(6, "message", Ty::Str),
];

const NAMESPACE: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    opt(2, "spec", Ty::Msg(&[list(1, "finalizers", Ty::Str)])),
    opt(
        3,
        "status",
        Ty::Msg(&[
            opt(1, "phase", Ty::Str),
            list(2, "conditions", Ty::Msg(NAMESPACE_CONDITION)),
        ]),
    ),
];

const CONFIG_MAP: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    list(2, "data", Ty::MapStr),
    list(3, "binaryData", Ty::MapBytes),
    ptr(4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    list(2, "data", Ty::MapBytes),
    opt(3, "type", Ty::Str),
    list(4, "stringData", Ty::MapStr),
    ptr(5, "immutable", Ty::Bool),
];

const SERVICE_ACCOUNT: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    list(2, "secrets", Ty::Msg(OBJECT_REFERENCE)),
    list(3, "imagePullSecrets", Ty::Msg(&[opt(1, "name", Ty::Str)])),
    ptr(4, "automountServiceAccountToken", Ty::Bool),
];

const LEASE: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    opt(
        2,
        "spec",
        Ty::Msg(&[
            ptr(1, "holderIdentity", Ty::Str),
            ptr(2, "leaseDurationSeconds", Ty::Int),
            ptr(3, "acquireTime", Ty::MicroTime),
            ptr(4, "renewTime", Ty::MicroTime),
            ptr(5, "leaseTransitions", Ty::Int),
            ptr(6, "strategy", Ty::Str),
            ptr(7, "preferredHolder", Ty::Str),
        ]),
    ),
];

const EVENT_SOURCE: &[Field] = &[opt(1, "component", Ty::Str), opt(2, "host", Ty::Str)];

/// core/v1 Event. Its reportingComponent and reportingInstance have no `omitempty`.
const EVENT: &[Field] = &[
    req(1, "metadata", Ty::Msg(OBJECT_META)),
    req(2, "involvedObject", Ty::Msg(OBJECT_REFERENCE)),
    opt(3, "reason", Ty::Str),
    opt(4, "message", Ty::Str),
    opt(5, "source", Ty::Msg(EVENT_SOURCE)),
    opt(6, "firstTimestamp", Ty::Time),
    opt(7, "lastTimestamp", Ty::Time),
    opt(8, "count", Ty::Int),
    opt(9, "type", Ty::Str),
    opt(10, "eventTime", Ty::MicroTime),
    ptr(
        11,
        "series",
        Ty::Msg(&[
            opt(1, "count", Ty::Int),
            opt(2, "lastObservedTime", Ty::MicroTime),
        ]),
    ),
    opt(12, "action", Ty::Str),
    ptr(13, "related", Ty::Msg(OBJECT_REFERENCE)),
    req(14, "reportingComponent", Ty::Str),
    req(15, "reportingInstance", Ty::Str),
];

/// events.k8s.io/v1 Event, which client-go's newer event recorders send.
const EVENTS_V1_EVENT: &[Field] = &[
    req(1, "metadata", Ty::Msg(OBJECT_META)),
    req(2, "eventTime", Ty::MicroTime),
    ptr(
        3,
        "series",
        Ty::Msg(&[
            req(1, "count", Ty::Int),
            req(2, "lastObservedTime", Ty::MicroTime),
        ]),
    ),
    opt(4, "reportingController", Ty::Str),
    opt(5, "reportingInstance", Ty::Str),
    opt(6, "action", Ty::Str),
    opt(7, "reason", Ty::Str),
    opt(8, "regarding", Ty::Msg(OBJECT_REFERENCE)),
    ptr(9, "related", Ty::Msg(OBJECT_REFERENCE)),
    opt(10, "note", Ty::Str),
    opt(11, "type", Ty::Str),
    opt(12, "deprecatedSource", Ty::Msg(EVENT_SOURCE)),
    opt(13, "deprecatedFirstTimestamp", Ty::Time),
    opt(14, "deprecatedLastTimestamp", Ty::Time),
    opt(15, "deprecatedCount", Ty::Int),
];

/// metav1 LabelSelectorRequirement and FieldSelectorRequirement.
const SELECTOR_REQUIREMENT: &[Field] = &[
    req(1, "key", Ty::Str),
    req(2, "operator", Ty::Str),
    list(3, "values", Ty::Str),
];

/// authorization/v1 FieldSelectorAttributes and LabelSelectorAttributes.
const SELECTOR_ATTRIBUTES: &[Field] = &[
    opt(1, "rawSelector", Ty::Str),
    list(2, "requirements", Ty::Msg(SELECTOR_REQUIREMENT)),
];

const RESOURCE_ATTRIBUTES: &[Field] = &[
    opt(1, "namespace", Ty::Str),
    opt(2, "verb", Ty::Str),
    opt(3, "group", Ty::Str),
    opt(4, "version", Ty::Str),
    opt(5, "resource", Ty::Str),
    opt(6, "subresource", Ty::Str),
    opt(7, "name", Ty::Str),
    ptr(8, "fieldSelector", Ty::Msg(SELECTOR_ATTRIBUTES)),
    ptr(9, "labelSelector", Ty::Msg(SELECTOR_ATTRIBUTES)),
];

const NON_RESOURCE_ATTRIBUTES: &[Field] = &[opt(1, "path", Ty::Str), opt(2, "verb", Ty::Str)];

// The reviews' status is the server's answer and is not read from a request.

const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req(
        2,
        "spec",
        Ty::Msg(&[
            ptr(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
            ptr(2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
        ]),
    ),
];

const SELF_SUBJECT_RULES_REVIEW: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req(2, "spec", Ty::Msg(&[opt(1, "namespace", Ty::Str)])),
];

const SELF_SUBJECT_REVIEW: &[Field] = &[opt(1, "metadata", Ty::Msg(OBJECT_META))];

const POLICY_RULE: &[Field] = &[
    req_list(1, "verbs", Ty::Str),
    list(2, "apiGroups", Ty::Str),
    list(3, "resources", Ty::Str),
    list(4, "resourceNames", Ty::Str),
    list(5, "nonResourceURLs", Ty::Str),
];

const LABEL_SELECTOR: &[Field] = &[
    list(1, "matchLabels", Ty::MapStr),
    list(2, "matchExpressions", Ty::Msg(SELECTOR_REQUIREMENT)),
];

const ROLE: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req_list(2, "rules", Ty::Msg(POLICY_RULE)),
];

const CLUSTER_ROLE: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req_list(2, "rules", Ty::Msg(POLICY_RULE)),
    ptr(
        3,
        "aggregationRule",
        Ty::Msg(&[list(1, "clusterRoleSelectors", Ty::Msg(LABEL_SELECTOR))]),
    ),
];

/// RoleBinding and ClusterRoleBinding. A subject's kind and name and all of roleRef have no
/// `omitempty`.
const ROLE_BINDING: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    list(
        2,
        "subjects",
        Ty::Msg(&[
            req(1, "kind", Ty::Str),
            opt(2, "apiGroup", Ty::Str),
            req(3, "name", Ty::Str),
            opt(4, "namespace", Ty::Str),
        ]),
    ),
    req(
        3,
        "roleRef",
        Ty::Msg(&[
            req(1, "apiGroup", Ty::Str),
            req(2, "kind", Ty::Str),
            req(3, "name", Ty::Str),
        ]),
    ),
];

/// authentication/v1 TokenRequest: the spec's fields have no `omitempty`, so an unset
/// expiration or bound object reads `null`.
const TOKEN_REQUEST: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req(
        2,
        "spec",
        Ty::Msg(&[
            req_list(1, "audiences", Ty::Str),
            req_ptr(
                3,
                "boundObjectRef",
                Ty::Msg(&[
                    opt(1, "kind", Ty::Str),
                    opt(2, "apiVersion", Ty::Str),
                    opt(3, "name", Ty::Str),
                    opt(4, "uid", Ty::Str),
                ]),
            ),
            req_ptr(4, "expirationSeconds", Ty::Int),
        ]),
    ),
];

const TOKEN_REVIEW: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req(
        2,
        "spec",
        Ty::Msg(&[opt(1, "token", Ty::Str), list(2, "audiences", Ty::Str)]),
    ),
];

const SUBJECT_ACCESS_REVIEW: &[Field] = &[
    opt(1, "metadata", Ty::Msg(OBJECT_META)),
    req(
        2,
        "spec",
        Ty::Msg(&[
            ptr(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
            ptr(2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
            opt(3, "user", Ty::Str),
            list(4, "groups", Ty::Str),
            list(5, "extra", Ty::MapList),
            opt(6, "uid", Ty::Str),
        ]),
    ),
];

fn message_for(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        (
            "authentication.k8s.io/v1"
            | "authentication.k8s.io/v1beta1"
            | "authentication.k8s.io/v1alpha1",
            "SelfSubjectReview",
        ) => SELF_SUBJECT_REVIEW,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("authentication.k8s.io/v1", "TokenReview") => TOKEN_REVIEW,
        ("authorization.k8s.io/v1", "SubjectAccessReview") => SUBJECT_ACCESS_REVIEW,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Event") => EVENT,
        ("events.k8s.io/v1", "Event") => EVENTS_V1_EVENT,
        ("coordination.k8s.io/v1", "Lease") => LEASE,
        // Options kinds are registered in every group-version.
        (_, "DeleteOptions") => DELETE_OPTIONS,
        _ => return None,
    })
}

/// A JSON object from a request body that is JSON or, as typed clients (kubectl's among them)
/// send built-in kinds, Kubernetes protobuf; `None` if it is neither.
pub fn decode_json_or_protobuf(body: &[u8]) -> Option<serde_json::Value> {
    let decoded = if body.starts_with(MAGIC) {
        decode_object(body).ok()
    } else {
        serde_json::from_slice::<Value>(body).ok()
    };
    decoded.filter(Value::is_object)
}

/// A protobuf body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ProtobufError(String);

fn err(m: impl Into<String>) -> ProtobufError {
    ProtobufError(m.into())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| err("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err("varint too long"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtobufError> {
        let len = usize::try_from(self.varint()?).map_err(|_| err("length too large"))?;
        if len > self.buf.len() {
            return Err(err("truncated length-delimited field"));
        }
        let (b, rest) = self.buf.split_at(len);
        self.buf = rest;
        Ok(b)
    }

    fn skip(&mut self, wire: u64) -> Result<(), ProtobufError> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.advance(8),
            2 => self.bytes().map(|_| ()),
            5 => self.advance(4),
            w => Err(err(format!("unsupported wire type {w}"))),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), ProtobufError> {
        if n > self.buf.len() {
            return Err(err("truncated fixed field"));
        }
        self.buf = &self.buf[n..];
        Ok(())
    }
}

/// One field as read: number, wire type, bytes (length-delimited) and varint value.
type RawField = (u64, u64, Vec<u8>, u64);

/// Reads the fields of one message (varint and length-delimited; others are skipped).
fn fields(buf: &[u8]) -> Result<Vec<RawField>, ProtobufError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while !r.buf.is_empty() {
        let tag = r.varint()?;
        let (num, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => {
                let v = r.varint()?;
                out.push((num, wire, Vec::new(), v));
            }
            2 => {
                let b = r.bytes()?;
                out.push((num, wire, b.to_vec(), 0));
            }
            other => r.skip(other)?,
        }
    }
    Ok(out)
}

fn utf8(b: &[u8]) -> Result<String, ProtobufError> {
    String::from_utf8(b.to_vec()).map_err(|_| err("string field is not UTF-8"))
}

/// A metav1.Time or MicroTime message. As in Go, nothing (or a time of zero seconds and zero
/// nanoseconds, the Unix epoch) is the zero time, which prints `null`.
fn time_value(b: &[u8], micro: bool) -> Result<Value, ProtobufError> {
    let mut secs: i64 = 0;
    let mut nanos: i64 = 0;
    for (num, wire, _, v) in fields(b)? {
        match (num, wire) {
            (1, 0) => secs = v as i64,
            (2, 0) => nanos = i64::from(v as i32),
            _ => {}
        }
    }
    if secs == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let t = OffsetDateTime::from_unix_timestamp(secs).map_err(|_| err("timestamp out of range"))?;
    let t = if micro {
        t.replace_microsecond(((nanos / 1000).clamp(0, 999_999)) as u32)
            .map_err(|_| err("bad microseconds"))?
    } else {
        t
    };
    let s = t
        .format(&Rfc3339)
        .map_err(|_| err("cannot format timestamp"))?;
    Ok(if micro && !s.contains('.') {
        json!(s.replace('Z', ".000000Z"))
    } else {
        json!(s)
    })
}

/// One entry of a map field: its key, and its value as Go prints it.
fn map_entry(b: &[u8], ty: Ty) -> Result<(String, Value), ProtobufError> {
    let mut key = String::new();
    let mut value = match ty {
        Ty::MapBytes | Ty::MapStr => json!(""),
        // A list of strings without elements: a nil slice.
        _ => Value::Null,
    };
    let mut items = Vec::new();
    for (num, wire, data, _) in fields(b)? {
        match (num, wire) {
            (1, 2) => key = utf8(&data)?,
            (2, 2) => match ty {
                Ty::MapBytes => {
                    value = json!(base64::engine::general_purpose::STANDARD.encode(&data))
                }
                Ty::MapStr => value = json!(utf8(&data)?),
                _ => {
                    for (n, w, d, _) in fields(&data)? {
                        if (n, w) == (1, 2) {
                            items.push(json!(utf8(&d)?));
                        }
                    }
                }
            },
            (1 | 2, w) => return Err(err(format!("map entry has an unexpected wire type {w}"))),
            _ => {}
        }
    }
    if !items.is_empty() {
        value = Value::Array(items);
    }
    Ok((key, value))
}

/// One occurrence of a (non-map) field on the wire, as Go prints it.
fn element(field: &Field, wire: u64, data: &[u8], v: u64) -> Result<Value, ProtobufError> {
    Ok(match (field.ty, wire) {
        (Ty::Str, 2) => json!(utf8(data)?),
        (Ty::Int, 0) => json!(v as i64),
        (Ty::Bool, 0) => json!(v != 0),
        (Ty::Msg(d), 2) => decode_message(data, d)?,
        (Ty::Time, 2) => time_value(data, false)?,
        (Ty::MicroTime, 2) => time_value(data, true)?,
        (Ty::RawJson, 2) => {
            let raw = fields(data)?
                .into_iter()
                .find(|(n, ..)| *n == 1)
                .map(|(_, _, d, _)| d)
                .unwrap_or_default();
            serde_json::from_slice(&raw).map_err(|_| err("fieldsV1 is not JSON"))?
        }
        _ => {
            return Err(err(format!(
                "field {} has an unexpected wire type {wire}",
                field.name
            )))
        }
    })
}

/// What a field Go holds by value prints when it is not on the wire.
fn zero_value(ty: Ty) -> Result<Value, ProtobufError> {
    Ok(match ty {
        Ty::Str => json!(""),
        Ty::Int => json!(0),
        Ty::Bool => json!(false),
        Ty::Msg(d) => decode_message(&[], d)?,
        Ty::Time | Ty::MicroTime | Ty::RawJson | Ty::MapStr | Ty::MapBytes | Ty::MapList => {
            Value::Null
        }
    })
}

/// Whether Go's `omitempty` leaves the value out: an empty string, a zero, false. (Structs,
/// times among them, are never empty to Go.)
fn is_empty(ty: Ty, v: &Value) -> bool {
    match ty {
        Ty::Str => v.as_str() == Some(""),
        Ty::Int => v.as_i64() == Some(0),
        Ty::Bool => v.as_bool() == Some(false),
        _ => false,
    }
}

/// Decodes one message into the JSON Go prints for it (see the module's documentation).
fn decode_message(buf: &[u8], desc: &[Field]) -> Result<Value, ProtobufError> {
    // What is on the wire, per field of `desc`.
    let mut seen: Vec<Vec<(u64, Vec<u8>, u64)>> = vec![Vec::new(); desc.len()];
    for (num, wire, data, v) in fields(buf)? {
        if let Some(i) = desc.iter().position(|f| f.num == num) {
            seen[i].push((wire, data, v));
        }
    }
    let mut out = Map::new();
    for (field, occurrences) in desc.iter().zip(seen) {
        let value = match field.go {
            Go::List | Go::ListOrNull => {
                let value = if field.ty.is_map() {
                    let mut m = Map::new();
                    for (wire, data, _) in &occurrences {
                        if *wire != 2 {
                            return Err(err(format!(
                                "field {} has an unexpected wire type {wire}",
                                field.name
                            )));
                        }
                        let (k, v) = map_entry(data, field.ty)?;
                        m.insert(k, v);
                    }
                    (!m.is_empty()).then_some(Value::Object(m))
                } else {
                    let items = occurrences
                        .iter()
                        .map(|(wire, data, v)| element(field, *wire, data, *v))
                        .collect::<Result<Vec<_>, _>>()?;
                    (!items.is_empty()).then_some(Value::Array(items))
                };
                match (value, field.go) {
                    (Some(v), _) => v,
                    (None, Go::ListOrNull) => Value::Null,
                    (None, _) => continue,
                }
            }
            _ => {
                let merge = matches!(field.ty, Ty::Msg(_))
                    && occurrences.len() > 1
                    && occurrences.iter().all(|(w, ..)| *w == 2);
                let value = if merge {
                    // A message sent more than once is merged, as protobuf does: one decode of
                    // the pieces in order.
                    let joined: Vec<u8> = occurrences.into_iter().flat_map(|(_, d, _)| d).collect();
                    Some(element(field, 2, &joined, 0)?)
                } else {
                    match occurrences.last() {
                        Some((wire, data, v)) => Some(element(field, *wire, data, *v)?),
                        None => None,
                    }
                };
                match (value, field.go) {
                    (Some(v), Go::Pointer | Go::PointerOrNull) => v,
                    (None, Go::Pointer) => continue,
                    (None, Go::PointerOrNull) => Value::Null,
                    (value, go) => {
                        let v = match value {
                            Some(v) => v,
                            None => zero_value(field.ty)?,
                        };
                        let omit = match go {
                            Go::OmitEmpty => is_empty(field.ty, &v),
                            Go::OmitZero => v == zero_value(field.ty)?,
                            _ => false,
                        };
                        if omit {
                            continue;
                        }
                        v
                    }
                }
            }
        };
        out.insert(field.name.to_string(), value);
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf-encoded object of a built-in kind into its JSON form.
pub fn decode_object(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| err("the body does not start with the Kubernetes protobuf prefix"))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw = Vec::new();
    for (num, _, data, _) in fields(rest)? {
        match num {
            1 => {
                for (n, _, d, _) in fields(&data)? {
                    match n {
                        1 => api_version = utf8(&d)?,
                        2 => kind = utf8(&d)?,
                        _ => {}
                    }
                }
            }
            2 => raw = data,
            _ => {}
        }
    }
    let desc = message_for(&api_version, &kind).ok_or_else(|| {
        err(format!(
            "protobuf is not supported for {kind} in {api_version:?}; send JSON"
        ))
    })?;
    let mut obj = decode_message(&raw, desc)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

/// What Go prints for the zero value of a built-in kind this module knows (`spec: {}` of a
/// Namespace, `roleRef` with empty strings, a `null` eventTime): the object kube-apiserver
/// compares a new object with when it records who set which field on create.
pub fn zero_object(api_version: &str, kind: &str) -> Option<Value> {
    let desc = message_for(api_version, kind)?;
    let mut obj = decode_message(&[], desc).ok()?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Some(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, num: u64, data: &[u8]) {
        varint(out, num << 3 | 2);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    fn number(out: &mut Vec<u8>, num: u64, v: u64) {
        varint(out, num << 3);
        varint(out, v);
    }

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        field(&mut tm, 1, api_version.as_bytes());
        field(&mut tm, 2, kind.as_bytes());
        let mut unknown = Vec::new();
        field(&mut unknown, 1, &tm);
        field(&mut unknown, 2, raw);
        let mut out = MAGIC.to_vec();
        out.extend(unknown);
        out
    }

    /// ObjectMeta as Go writes it for a struct with only `name` set: every string, the
    /// generation and the creation time on the wire, empty.
    fn go_meta(name: &str) -> Vec<u8> {
        let mut meta = Vec::new();
        field(&mut meta, 1, name.as_bytes());
        for num in 2..=6 {
            field(&mut meta, num, b"");
        }
        number(&mut meta, 7, 0);
        field(&mut meta, 8, b"");
        meta
    }

    #[test]
    fn decodes_a_namespace_as_kubectl_sends_it() {
        let mut meta = go_meta("team-a");
        let mut label = Vec::new();
        field(&mut label, 1, b"env");
        field(&mut label, 2, b"dev");
        field(&mut meta, 11, &label);
        let mut ns = Vec::new();
        field(&mut ns, 1, &meta);
        field(&mut ns, 2, &[]);
        field(&mut ns, 3, &[]);
        let v = decode_object(&envelope("v1", "Namespace", &ns)).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"env": "dev"}}, "spec": {}, "status": {}})
        );
    }

    #[test]
    fn empty_values_of_omitempty_fields_are_absent() {
        // kubectl create configmap pb1 --from-literal=a=b
        let mut entry = Vec::new();
        field(&mut entry, 1, b"a");
        field(&mut entry, 2, b"b");
        let mut cm = Vec::new();
        field(&mut cm, 1, &go_meta("pb1"));
        field(&mut cm, 2, &entry);
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pb1"}, "data": {"a": "b"}})
        );
        // Without data: no `data` at all, not an empty map.
        let mut cm = Vec::new();
        field(&mut cm, 1, &go_meta("pb2"));
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pb2"}})
        );
        // What is set stays, however it is written: a generation, a map value that is empty.
        let mut meta = go_meta("pb3");
        number(&mut meta, 7, 3);
        let mut note = Vec::new();
        field(&mut note, 1, b"note");
        field(&mut note, 2, b"");
        field(&mut meta, 12, &note);
        let mut cm = Vec::new();
        field(&mut cm, 1, &meta);
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(
            v["metadata"],
            json!({"name": "pb3", "generation": 3, "annotations": {"note": ""}})
        );
    }

    #[test]
    fn pointers_keep_their_zero_values() {
        let mut cm = Vec::new();
        field(&mut cm, 1, &go_meta("frozen"));
        number(&mut cm, 4, 0);
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(v["immutable"], json!(false));
        let mut sa = Vec::new();
        field(&mut sa, 1, &go_meta("sa"));
        number(&mut sa, 4, 0);
        let v = decode_object(&envelope("v1", "ServiceAccount", &sa)).expect("decode");
        assert_eq!(v["automountServiceAccountToken"], json!(false));
        // A Lease's fields are all pointers: a zero duration sent is a zero duration.
        let mut spec = Vec::new();
        field(&mut spec, 1, b"");
        number(&mut spec, 2, 0);
        let mut lease = Vec::new();
        field(&mut lease, 1, &go_meta("l"));
        field(&mut lease, 2, &spec);
        let v =
            decode_object(&envelope("coordination.k8s.io/v1", "Lease", &lease)).expect("decode");
        assert_eq!(
            v["spec"],
            json!({"holderIdentity": "", "leaseDurationSeconds": 0})
        );
    }

    #[test]
    fn fields_without_omitempty_print_their_zero_values() {
        // A subject's kind and name and all of roleRef are printed even when empty.
        let mut subject = Vec::new();
        field(&mut subject, 1, b"ServiceAccount");
        field(&mut subject, 2, b"");
        field(&mut subject, 3, b"");
        field(&mut subject, 4, b"ns");
        let mut binding = Vec::new();
        field(&mut binding, 1, &go_meta("b"));
        field(&mut binding, 2, &subject);
        let v = decode_object(&envelope(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            &binding,
        ))
        .expect("decode");
        assert_eq!(
            v["subjects"],
            json!([{"kind": "ServiceAccount", "name": "", "namespace": "ns"}])
        );
        assert_eq!(
            v["roleRef"],
            json!({"apiGroup": "", "kind": "", "name": ""})
        );
        // A role's rules and a rule's verbs have no omitempty: nil prints null. An empty
        // string among the apiGroups is the core group and stays.
        let mut rule = Vec::new();
        field(&mut rule, 2, b"");
        field(&mut rule, 3, b"pods");
        let mut role = Vec::new();
        field(&mut role, 1, &go_meta("r"));
        field(&mut role, 2, &rule);
        let v = decode_object(&envelope("rbac.authorization.k8s.io/v1", "Role", &role))
            .expect("decode");
        assert_eq!(
            v["rules"],
            json!([{"verbs": null, "apiGroups": [""], "resources": ["pods"]}])
        );
        let mut role = Vec::new();
        field(&mut role, 1, &go_meta("r"));
        let v = decode_object(&envelope("rbac.authorization.k8s.io/v1", "Role", &role))
            .expect("decode");
        assert_eq!(v.get("rules"), Some(&Value::Null));
        // TokenRequest: an unset expiration and bound object are null, not absent.
        let mut spec = Vec::new();
        field(&mut spec, 1, b"api");
        let mut tr = Vec::new();
        field(&mut tr, 1, &go_meta(""));
        field(&mut tr, 2, &spec);
        let v = decode_object(&envelope("authentication.k8s.io/v1", "TokenRequest", &tr))
            .expect("decode");
        assert_eq!(
            v["spec"],
            json!({"audiences": ["api"], "boundObjectRef": null, "expirationSeconds": null})
        );
        assert_eq!(v["metadata"], json!({}));
    }

    #[test]
    fn zero_times_are_null_and_the_creation_time_absent() {
        // core/v1 Event as client-go's recorder writes it: zero eventTime, empty reporting
        // fields (no omitempty), a first timestamp.
        let mut first = Vec::new();
        number(&mut first, 1, 1_700_000_000);
        let mut ev = Vec::new();
        field(&mut ev, 1, &go_meta("e"));
        field(&mut ev, 2, b"");
        field(&mut ev, 3, b"Started");
        field(&mut ev, 4, b"");
        field(&mut ev, 5, b"");
        field(&mut ev, 6, &first);
        field(&mut ev, 7, b"");
        number(&mut ev, 8, 1);
        field(&mut ev, 9, b"Normal");
        field(&mut ev, 10, b"");
        field(&mut ev, 12, b"");
        field(&mut ev, 14, b"");
        field(&mut ev, 15, b"");
        let v = decode_object(&envelope("v1", "Event", &ev)).expect("decode");
        assert_eq!(
            v,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e"},
                "involvedObject": {},
                "reason": "Started",
                "source": {},
                "firstTimestamp": "2023-11-14T22:13:20Z",
                "lastTimestamp": null,
                "count": 1,
                "type": "Normal",
                "eventTime": null,
                "reportingComponent": "",
                "reportingInstance": ""
            })
        );
        // A creation time that is set is kept.
        let mut meta = Vec::new();
        field(&mut meta, 1, b"x");
        field(&mut meta, 8, &first);
        let mut cm = Vec::new();
        field(&mut cm, 1, &meta);
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(
            v["metadata"],
            json!({"name": "x", "creationTimestamp": "2023-11-14T22:13:20Z"})
        );
    }

    #[test]
    fn a_message_sent_twice_is_merged() {
        let mut a = Vec::new();
        field(&mut a, 1, b"x");
        let mut b = Vec::new();
        let mut label = Vec::new();
        field(&mut label, 1, b"k");
        field(&mut label, 2, b"v");
        field(&mut b, 11, &label);
        let mut cm = Vec::new();
        field(&mut cm, 1, &a);
        field(&mut cm, 1, &b);
        let v = decode_object(&envelope("v1", "ConfigMap", &cm)).expect("decode");
        assert_eq!(v["metadata"], json!({"name": "x", "labels": {"k": "v"}}));
    }

    #[test]
    fn decodes_secret_bytes_as_base64() {
        let mut entry = Vec::new();
        field(&mut entry, 1, b"k");
        field(&mut entry, 2, b"\x00\xff");
        let mut secret = Vec::new();
        field(&mut secret, 1, &go_meta("s"));
        field(&mut secret, 2, &entry);
        field(&mut secret, 3, b"Opaque");
        let v = decode_object(&envelope("v1", "Secret", &secret)).expect("decode");
        assert_eq!(v["data"]["k"], "AP8=");
        assert_eq!(v["type"], "Opaque");
        // An empty type is left out (and defaulted later), as kube-apiserver does.
        let mut secret = Vec::new();
        field(&mut secret, 1, &go_meta("s"));
        field(&mut secret, 3, b"");
        let v = decode_object(&envelope("v1", "Secret", &secret)).expect("decode");
        assert_eq!(v.get("type"), None);
    }

    #[test]
    fn subject_access_review_extra_is_a_map_of_lists() {
        let mut items = Vec::new();
        field(&mut items, 1, b"a");
        field(&mut items, 1, b"b");
        let mut entry = Vec::new();
        field(&mut entry, 1, b"scopes");
        field(&mut entry, 2, &items);
        let mut attrs = Vec::new();
        field(&mut attrs, 2, b"get");
        field(&mut attrs, 3, b"");
        let mut spec = Vec::new();
        field(&mut spec, 1, &attrs);
        field(&mut spec, 3, b"alice");
        field(&mut spec, 5, &entry);
        field(&mut spec, 6, b"");
        let mut sar = Vec::new();
        field(&mut sar, 1, &go_meta(""));
        field(&mut sar, 2, &spec);
        let v = decode_object(&envelope(
            "authorization.k8s.io/v1",
            "SubjectAccessReview",
            &sar,
        ))
        .expect("decode");
        assert_eq!(
            v["spec"],
            json!({"resourceAttributes": {"verb": "get"}, "user": "alice", "extra": {"scopes": ["a", "b"]}})
        );
    }

    #[test]
    fn zero_objects_are_what_go_prints_for_an_empty_struct() {
        assert_eq!(
            zero_object("v1", "Namespace"),
            Some(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}, "spec": {}, "status": {}})
            )
        );
        assert_eq!(
            zero_object("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
            Some(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {}, "roleRef": {"apiGroup": "", "kind": "", "name": ""}
            }))
        );
        assert_eq!(
            zero_object("v1", "ConfigMap"),
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}))
        );
        assert_eq!(zero_object("v1", "Pod"), None);
    }

    #[test]
    fn refuses_garbage_without_panicking() {
        assert!(decode_object(b"k8s").is_err());
        assert!(decode_object(b"k8s\x00\x0a\xff\xff\xff").is_err());
        assert!(decode_object(&envelope("v1", "Pod", &[])).is_err());
        // A string field sent as a number.
        let mut cm = Vec::new();
        let mut meta = Vec::new();
        number(&mut meta, 1, 5);
        field(&mut cm, 1, &meta);
        assert!(decode_object(&envelope("v1", "ConfigMap", &cm)).is_err());
        for n in 0..64u8 {
            let mut b = MAGIC.to_vec();
            b.extend((0..n).map(|i| i.wrapping_mul(37)));
            let _ = decode_object(&b);
        }
    }
}
