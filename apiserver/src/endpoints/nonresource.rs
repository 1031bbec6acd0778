//! The paths that are not resources: discovery (`/api`, `/apis`, aggregated discovery),
//! OpenAPI v2 and v3 of the API a request sees, `/version`, the health checks and `/metrics`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};
use serde_json::{json, Value};

use crate::endpoints::exchange::Exchange;
use crate::meta::body::Body;
use crate::meta::metrics::Metrics;
use crate::meta::response::{bytes_response, error_response, json_response, text_response};
use crate::meta::status::ApiError;
use crate::registry::catalog::ApiView;
use crate::registry::discovery;
use crate::registry::openapi::KUBE_VERSION;
use crate::request::negotiation::aggregated_discovery_version;
use crate::request::query::Query;
use crate::request::request_info::Target;

/// The non-resource paths: discovery and OpenAPI of the API a request sees, version, health
/// and metrics.
pub struct NonResource {
    /// What `/metrics` renders.
    pub metrics: Arc<Metrics>,
    /// `host:port` clients reach the server at (for `/api`).
    pub advertise_address: String,
}

impl NonResource {
    /// Answers a non-resource request of `x`, whose API is `view`.
    pub fn serve(&self, view: &ApiView, x: &Exchange) -> Response<Body> {
        let method = &x.parts.method;
        if method != Method::GET && method != Method::HEAD {
            return error_response(&ApiError::method_not_allowed(
                method.as_str(),
                &crate::meta::status::GroupResource::new("", x.parts.uri.path()),
            ));
        }
        self.serve_get(view, &x.info.target, x.accept(), &x.query)
    }

    fn serve_get(
        &self,
        view: &ApiView,
        target: &Target,
        accept: Option<&str>,
        query: &Query,
    ) -> Response<Body> {
        let docs = view.discovery();
        match target {
            Target::CoreRoot => match aggregated_discovery_version(accept) {
                Some("v2") => discovery_response(docs.core_v2.clone(), "v2"),
                Some(_) => discovery_response(docs.core_v2beta1.clone(), "v2beta1"),
                None => json_response(
                    StatusCode::OK,
                    &discovery::core_versions(&self.advertise_address),
                ),
            },
            Target::GroupList => match aggregated_discovery_version(accept) {
                Some("v2") => discovery_response(docs.apis_v2.clone(), "v2"),
                Some(_) => discovery_response(docs.apis_v2beta1.clone(), "v2beta1"),
                None => bytes_response(StatusCode::OK, "application/json", docs.group_list.clone()),
            },
            Target::Group(g) => match discovery::group(&view.registry, g) {
                Some(v) => json_response(StatusCode::OK, &v),
                None => error_response(&ApiError::path_not_found()),
            },
            Target::ResourceList { group, version } => {
                match discovery::resource_list(&view.registry, group, version) {
                    Some(v) => json_response(StatusCode::OK, &v),
                    None => error_response(&ApiError::path_not_found()),
                }
            }
            Target::OpenApiV3Root => {
                bytes_response(StatusCode::OK, "application/json", view.openapi().root())
            }
            Target::OpenApiV3Group { group, version } => {
                match view.openapi().document(group, version) {
                    Some((doc, hash)) => {
                        let mut r = bytes_response(StatusCode::OK, "application/json", doc);
                        if let Ok(v) = HeaderValue::from_str(&format!("\"{hash}\"")) {
                            r.headers_mut().insert(header::ETAG, v);
                        }
                        if query.get("hash") == Some(hash) {
                            r.headers_mut().insert(
                                header::CACHE_CONTROL,
                                HeaderValue::from_static("public, immutable"),
                            );
                        }
                        r
                    }
                    None => error_response(&ApiError::path_not_found()),
                }
            }
            Target::OpenApiV2 => {
                let wants_proto = accept.is_some_and(|a| a.contains("protobuf"));
                if wants_proto {
                    bytes_response(
                        StatusCode::OK,
                        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                        view.openapi().v2_protobuf(),
                    )
                } else {
                    bytes_response(StatusCode::OK, "application/json", view.openapi().v2_json())
                }
            }
            Target::Version => json_response(StatusCode::OK, &version_info()),
            Target::Health { endpoint, check } => health(endpoint, check.as_deref(), query),
            Target::Metrics => bytes_response(
                StatusCode::OK,
                crate::meta::metrics::CONTENT_TYPE,
                Bytes::from(self.metrics.render()),
            ),
            Target::Resource(_) | Target::Admission(_) | Target::Unknown => {
                error_response(&ApiError::path_not_found())
            }
        }
    }
}

/// What `/version` says of the build: stamped by the binary at start ([`set_build`]), as a
/// library cannot know the commit of the program it is linked into.
#[derive(Clone, Debug, Default)]
pub struct Build {
    /// The full git commit.
    pub commit: &'static str,
    /// `clean`, or `dirty` when the tree had changes to tracked files.
    pub tree_state: &'static str,
    /// RFC 3339, UTC.
    pub date: &'static str,
}

static BUILD: std::sync::OnceLock<Build> = std::sync::OnceLock::new();

/// Records the build `/version` reports (the first call wins; a process has one build).
pub fn set_build(build: Build) {
    let _ = BUILD.set(build);
}

/// `/version`.
pub fn version_info() -> Value {
    let build = BUILD.get().cloned().unwrap_or_default();
    let minor = KUBE_VERSION
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .unwrap_or("33");
    json!({
        "major": "1",
        "minor": minor,
        "gitVersion": format!("{KUBE_VERSION}+platform-mesh-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": build.commit,
        "gitTreeState": if build.tree_state.is_empty() { "clean" } else { build.tree_state },
        "buildDate": if build.date.is_empty() { "1970-01-01T00:00:00Z" } else { build.date },
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

const HEALTH_CHECKS: &[&str] = &["ping", "storage"];

fn health(endpoint: &str, check: Option<&str>, query: &Query) -> Response<Body> {
    if let Some(c) = check {
        return if HEALTH_CHECKS.contains(&c) {
            text_response(StatusCode::OK, "ok".into())
        } else {
            error_response(&ApiError::path_not_found())
        };
    }
    if query.get("verbose").is_some() {
        let mut out = String::new();
        for c in HEALTH_CHECKS {
            out.push_str(&format!("[+]{c} ok\n"));
        }
        out.push_str(&format!("{endpoint} check passed\n"));
        text_response(StatusCode::OK, out)
    } else {
        text_response(StatusCode::OK, "ok".into())
    }
}

fn discovery_response(body: Bytes, version: &str) -> Response<Body> {
    let mut r = bytes_response(StatusCode::OK, "application/json", body);
    if let Ok(v) = HeaderValue::from_str(&discovery::aggregated_content_type(version)) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}
