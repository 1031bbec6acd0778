//! Content negotiation: which representation a client asked for in `Accept`, and what a request
//! body is in `Content-Type`.

use crate::meta::status::ApiError;

/// One clause of an `Accept` header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MediaRange {
    /// The media type without parameters, lowercased (`application/json`, `*/*`).
    pub essence: String,
    /// The parameters (`as=Table`, `g=meta.k8s.io`, `v=v1`): names lowercased, values unquoted.
    pub params: Vec<(String, String)>,
}

impl MediaRange {
    /// The value of a parameter, the name matched case-insensitively.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Splits an `Accept` (or `Content-Type`) header into media ranges, in the client's order.
pub fn parse_accept(header: &str) -> Vec<MediaRange> {
    header
        .split(',')
        .filter_map(|clause| {
            let mut pieces = clause.split(';');
            let essence = pieces.next()?.trim().to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let params = pieces
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((
                        k.trim().to_ascii_lowercase(),
                        v.trim().trim_matches('"').to_string(),
                    ))
                })
                .collect();
            Some(MediaRange { essence, params })
        })
        .collect()
}

/// Serialization the response body uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `application/json` (also chosen for `*/*` and `application/*`).
    Json,
    /// `application/yaml`.
    Yaml,
}

/// What shape of object a resource response carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The objects themselves.
    Object,
    /// A `meta.k8s.io` Table of the given version (`v1` or `v1beta1`).
    Table {
        /// `v1` or `v1beta1`.
        version: String,
    },
    /// `PartialObjectMetadata[List]` of the given version.
    Metadata {
        /// `v1` or `v1beta1`.
        version: String,
    },
}

/// The negotiated response form of a resource request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// How the body is serialized.
    pub encoding: Encoding,
    /// What the body holds: objects, a Table, or metadata only.
    pub output: Output,
}

fn is_json_like(essence: &str) -> bool {
    matches!(essence, "application/json" | "*/*" | "application/*")
}

/// Picks the response form for a resource request. `as=Table` / `as=PartialObjectMetadata[List]`
/// clauses win in the client's order; plain JSON or `*/*` falls back to objects; 406 when nothing fits.
pub fn negotiate_resource(accept: Option<&str>) -> Result<Negotiated, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Negotiated {
            encoding: Encoding::Json,
            output: Output::Object,
        });
    };
    for m in parse_accept(accept) {
        let encoding = match m.essence.as_str() {
            e if is_json_like(e) => Encoding::Json,
            "application/yaml" => Encoding::Yaml,
            _ => continue,
        };
        match m.param("as") {
            None => {
                return Ok(Negotiated {
                    encoding,
                    output: Output::Object,
                })
            }
            Some(kind) => {
                if m.param("g") != Some("meta.k8s.io") {
                    continue;
                }
                let version = m.param("v").unwrap_or("v1");
                if version != "v1" && version != "v1beta1" {
                    continue;
                }
                let output = match kind {
                    "Table" => Output::Table {
                        version: version.to_string(),
                    },
                    "PartialObjectMetadata" | "PartialObjectMetadataList" => Output::Metadata {
                        version: version.to_string(),
                    },
                    _ => continue,
                };
                return Ok(Negotiated { encoding, output });
            }
        }
    }
    Err(ApiError::not_acceptable(accept))
}

/// For the resources kube-apiserver serves without a Table form (the reviews and TokenRequest,
/// which are only created and have no table convertor there): 406 `NotAcceptable` when the
/// client accepts nothing but Tables, as kube's negotiation refuses them. Objects (as JSON, YAML
/// or protobuf, which is answered as JSON), `*/*` and partial metadata are acceptable.
pub fn refuse_tables_only(accept: Option<&str>) -> Result<(), ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(());
    };
    let acceptable = parse_accept(accept).iter().any(|m| {
        let object = is_json_like(&m.essence)
            || m.essence == "application/yaml"
            || m.essence == "application/vnd.kubernetes.protobuf";
        object && m.param("as").is_none_or(|k| k != "Table")
    });
    if acceptable {
        Ok(())
    } else {
        Err(ApiError::not_acceptable(accept))
    }
}

/// Aggregated-discovery version a client asked for (`v2` or `v2beta1`), if any, in its order.
pub fn aggregated_discovery_version(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    for m in parse_accept(accept) {
        if m.essence != "application/json" {
            continue;
        }
        if m.param("g") == Some("apidiscovery.k8s.io")
            && m.param("as") == Some("APIGroupDiscoveryList")
        {
            match m.param("v") {
                Some("v2") => return Some("v2"),
                Some("v2beta1") => return Some("v2beta1"),
                _ => continue,
            }
        }
        // Plain JSON listed before any aggregated clause: the client prefers legacy discovery.
        m.param("as")?;
    }
    None
}

/// Request body formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`, also assumed when there is no `Content-Type`.
    Json,
    /// `application/yaml`.
    Yaml,
    /// `application/json-patch+json`: a JSON Patch (RFC 6902), a list of operations.
    JsonPatch,
    /// `application/merge-patch+json`: a JSON Merge Patch (RFC 7386).
    MergePatch,
    /// `application/strategic-merge-patch+json`: a Kubernetes strategic merge patch.
    StrategicMergePatch,
    /// `application/apply-patch+yaml`: the configuration of a server-side apply.
    ApplyPatch,
}

/// Reads a request's `Content-Type` (charset and other parameters ignored).
pub fn body_format(content_type: Option<&str>) -> Result<BodyFormat, String> {
    let essence = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase())
        .unwrap_or_default();
    Ok(match essence.as_str() {
        "" | "application/json" => BodyFormat::Json,
        "application/yaml" => BodyFormat::Yaml,
        "application/json-patch+json" => BodyFormat::JsonPatch,
        "application/merge-patch+json" => BodyFormat::MergePatch,
        "application/strategic-merge-patch+json" => BodyFormat::StrategicMergePatch,
        "application/apply-patch+yaml" => BodyFormat::ApplyPatch,
        _ => return Err(essence),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_asked_for_only_as_a_table_is_not_acceptable() {
        let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
        let e = refuse_tables_only(Some(table)).expect_err("406");
        assert_eq!(e.code, 406);
        assert_eq!(e.reason, "NotAcceptable");
        for ok in [
            None,
            Some(""),
            Some("application/json"),
            Some("*/*"),
            Some("application/vnd.kubernetes.protobuf, */*"),
            Some("application/json;as=Table;v=v1;g=meta.k8s.io, application/json"),
        ] {
            assert_eq!(refuse_tables_only(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn kubectl_get_asks_for_table() {
        let n = negotiate_resource(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        ))
        .expect("negotiate");
        assert_eq!(
            n.output,
            Output::Table {
                version: "v1".into()
            }
        );
    }

    #[test]
    fn protobuf_first_falls_back_to_json() {
        let n = negotiate_resource(Some("application/vnd.kubernetes.protobuf, */*"))
            .expect("negotiate");
        assert_eq!(
            n,
            Negotiated {
                encoding: Encoding::Json,
                output: Output::Object
            }
        );
        assert!(negotiate_resource(Some("application/vnd.kubernetes.protobuf")).is_err());
        let n = negotiate_resource(Some(
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        ))
        .expect("negotiate");
        assert_eq!(
            n.output,
            Output::Metadata {
                version: "v1".into()
            }
        );
    }

    #[test]
    fn discovery_versions() {
        let v127 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_discovery_version(Some(v127)), Some("v2beta1"));
        let v133 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_discovery_version(Some(v133)), Some("v2"));
        assert_eq!(
            aggregated_discovery_version(Some("application/json, */*")),
            None
        );
        assert_eq!(aggregated_discovery_version(None), None);
    }

    #[test]
    fn body_formats() {
        assert_eq!(
            body_format(Some("application/json; charset=utf-8")),
            Ok(BodyFormat::Json)
        );
        assert_eq!(
            body_format(Some("application/apply-patch+yaml")),
            Ok(BodyFormat::ApplyPatch)
        );
        assert!(body_format(Some("application/vnd.kubernetes.protobuf")).is_err());
    }
}
