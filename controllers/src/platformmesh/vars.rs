//! The data the PlatformMesh Deployment step renders its templates with: the profile, the
//! instance's `spec.values` and `spec.ocm`, and the addresses derived from `spec.exposure`, merged
//! in the order the platform-mesh-operator uses (see `merge_maps` for who wins).
//!
//! Rendering the profile's `components` section is a template step; it is passed in as a
//! [`Render`] so this module stays a pure function of its inputs and is tested without a cluster.

use serde_json::{json, Map, Value};

use api::core::platform_mesh::PlatformMeshSpec;

/// Key of the profile in its ConfigMap.
pub const PROFILE_KEY: &str = "profile.yaml";

/// Deep-merges `overwrite` into `base`: keys only in `base` are kept, maps present on both sides
/// are merged recursively, and for everything else (scalars, lists, an explicit `null`) the
/// `overwrite` value wins. Lists are replaced whole, never concatenated.
pub fn merge_maps(base: &Value, overwrite: &Value) -> Value {
    match (base, overwrite) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = o.clone();
            for (k, bv) in b {
                match out.get_mut(k) {
                    None => {
                        out.insert(k.clone(), bv.clone());
                    }
                    Some(ov) if ov.is_object() && bv.is_object() => {
                        *ov = merge_maps(bv, ov);
                    }
                    Some(_) => {}
                }
            }
            Value::Object(out)
        }
        (_, o) => o.clone(),
    }
}

/// Why a profile could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProfileError {
    /// The ConfigMap has no `profile.yaml` key.
    #[error("the profile ConfigMap has no key {PROFILE_KEY:?}")]
    MissingKey,
    /// `profile.yaml` is not YAML, or not a mapping.
    #[error("profile.yaml is not a YAML mapping: {0}")]
    Invalid(String),
    /// The `components` section did not render.
    #[error("the profile's components section: {0}")]
    Render(String),
}

/// A parsed profile: `infra` as data (never rendered), `components` as the YAML text that is
/// rendered as a template before it is parsed again.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The `infra` section.
    pub infra: Value,
    /// The `components` section, re-serialized as YAML so it can be rendered as a template.
    pub components_text: String,
}

pub(crate) fn parse_yaml(text: &str) -> Result<Value, String> {
    // The shipped profile repeats a service key; as the Go operator's YAML reader does, the
    // later entry wins instead of failing the whole profile.
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
    };
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| e.to_string())
}

fn section(v: &Value, key: &str) -> Value {
    match v.get(key) {
        Some(Value::Null) | None => Value::Object(Map::new()),
        Some(s) => s.clone(),
    }
}

impl Profile {
    /// Reads a profile from the `data` of its ConfigMap.
    pub fn from_config_map_data(data: &Map<String, Value>) -> Result<Self, ProfileError> {
        let text = data
            .get(PROFILE_KEY)
            .and_then(Value::as_str)
            .ok_or(ProfileError::MissingKey)?;
        Self::parse(text)
    }

    /// Parses `profile.yaml`.
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        let doc = parse_yaml(text).map_err(ProfileError::Invalid)?;
        let doc = match doc {
            Value::Null => Value::Object(Map::new()),
            Value::Object(_) => doc,
            other => {
                return Err(ProfileError::Invalid(format!(
                    "the document is a {}, not a mapping",
                    kind_of(&other)
                )))
            }
        };
        let components = section(&doc, "components");
        // Plain one-line scalars: a folded or wrapped string could split a template action.
        let options = serde_saphyr::ser_options! { prefer_block_scalars: false };
        let components_text = serde_saphyr::to_string_with_options(&components, options)
            .map_err(|e| ProfileError::Invalid(e.to_string()))?;
        Ok(Profile {
            infra: section(&doc, "infra"),
            components_text,
        })
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "mapping",
    }
}

/// Where the profile of a PlatformMesh lives: `spec.profileConfigMap`, else `<name>-profile`, in
/// the instance's namespace unless the reference names another.
pub fn profile_config_map(
    name: &str,
    namespace: &str,
    spec: &PlatformMeshSpec,
) -> (String, String) {
    match &spec.profile_config_map {
        Some(r) => (
            r.namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| namespace.to_string()),
            r.name.clone(),
        ),
        None => (namespace.to_string(), format!("{name}-profile")),
    }
}

/// How components are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentTechnology {
    /// Flux HelmReleases (the default).
    FluxCd,
    /// Argo CD Applications.
    ArgoCd,
}

impl DeploymentTechnology {
    /// Reads a profile value; anything but `argocd` (any case) is Flux, as upstream.
    pub fn parse(v: Option<&Value>) -> Self {
        match v
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("argocd") => Self::ArgoCd,
            _ => Self::FluxCd,
        }
    }

    /// The name templates compare against.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FluxCd => "fluxcd",
            Self::ArgoCd => "argocd",
        }
    }
}

/// The Secret holding the runtime cluster's kubeconfig for the infra cluster's deployers, when
/// the runtime is a remote cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRuntime {
    /// Secret name.
    pub secret_name: String,
    /// Key of the kubeconfig in the Secret.
    pub secret_key: String,
}

/// The default base domain when `spec.exposure.baseDomain` is not set.
pub const DEFAULT_BASE_DOMAIN: &str = "portal.localhost";
/// The default port when `spec.exposure.port` is not set.
pub const DEFAULT_PORT: i64 = 8443;

/// Addresses and namespace every template sees: `baseDomain`, `protocol`, `port` (a string),
/// `baseDomainPort` (the domain alone on 80 and 443) and `helmReleaseNamespace`.
pub fn template_vars(namespace: &str, spec: &PlatformMeshSpec) -> Value {
    let exposure = spec.exposure.as_ref();
    let base_domain = exposure
        .and_then(|e| e.base_domain.clone())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_BASE_DOMAIN.to_string());
    let protocol = exposure
        .and_then(|e| e.protocol.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "https".to_string());
    let port = exposure
        .and_then(|e| e.port)
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_PORT);
    let base_domain_port = if port == 80 || port == 443 {
        base_domain.clone()
    } else {
        format!("{base_domain}:{port}")
    };
    json!({
        "baseDomain": base_domain,
        "protocol": protocol,
        "port": port.to_string(),
        "baseDomainPort": base_domain_port,
        "helmReleaseNamespace": namespace,
    })
}

fn insert(v: &mut Value, key: &str, value: Value) {
    if let Value::Object(m) = v {
        m.insert(key.to_string(), value);
    }
}

fn add_remote(v: &mut Value, remote: Option<&RemoteRuntime>) {
    insert(v, "kubeConfigEnabled", Value::Bool(remote.is_some()));
    if let Some(r) = remote {
        insert(v, "kubeConfigSecretName", json!(r.secret_name));
        insert(v, "kubeConfigSecretKey", json!(r.secret_key));
    }
}

/// Data of the templates under `infra/infra`: the profile's `infra` section, the release
/// namespace, the remote-runtime Secret, the deployment technology, then [`template_vars`] on top.
pub fn infra_vars(
    profile: &Profile,
    namespace: &str,
    spec: &PlatformMeshSpec,
    remote: Option<&RemoteRuntime>,
) -> Value {
    let mut v = match &profile.infra {
        Value::Object(_) => profile.infra.clone(),
        _ => json!({}),
    };
    insert(&mut v, "releaseNamespace", json!(namespace));
    add_remote(&mut v, remote);
    let tech = DeploymentTechnology::parse(profile.infra.get("deploymentTechnology"));
    insert(&mut v, "deploymentTechnology", json!(tech.as_str()));
    let mut v = merge_maps(&v, &template_vars(namespace, spec));
    if v.get("helmReleaseNamespace").is_none() {
        insert(&mut v, "helmReleaseNamespace", json!(namespace));
    }
    v
}

/// Renders a template text with data (the project's Go-template engine in production).
pub trait Render {
    /// Renders `text`, named `name` in error messages, with `data`.
    fn render(&self, name: &str, text: &str, data: &Value) -> Result<String, String>;
}

impl Render for gotemplate::Engine {
    fn render(&self, name: &str, text: &str, data: &Value) -> Result<String, String> {
        gotemplate::Engine::render(self, name, text, data).map_err(|e| e.to_string())
    }
}

fn render_components(
    render: &dyn Render,
    profile: &Profile,
    data: &Value,
) -> Result<Value, ProfileError> {
    let text = render
        .render("profile.yaml/components", &profile.components_text, data)
        .map_err(ProfileError::Render)?;
    match parse_yaml(&text).map_err(|e| ProfileError::Render(format!("rendered YAML: {e}")))? {
        Value::Null => Ok(json!({})),
        v @ Value::Object(_) => Ok(v),
        other => Err(ProfileError::Render(format!(
            "rendered to a {}, not a mapping",
            kind_of(&other)
        ))),
    }
}

fn ocm_from_spec(spec: &PlatformMeshSpec) -> Option<Value> {
    let ocm = spec.ocm.as_ref()?;
    let mut v = json!({});
    if let Some(name) = ocm.repo.as_ref().and_then(|r| r.name.clone()) {
        insert(&mut v, "repo", json!({ "name": name }));
    }
    if let Some(name) = ocm.component.as_ref().and_then(|c| c.name.clone()) {
        insert(&mut v, "component", json!({ "name": name }));
    }
    if let Some(path) = &ocm.reference_path {
        let path: Vec<Value> = path.iter().map(|p| json!({ "name": p.name })).collect();
        insert(&mut v, "referencePath", Value::Array(path));
    }
    Some(v)
}

/// Data of the templates under `infra/runtime`: profile `infra`, then [`template_vars`], then
/// `spec.values`, then `spec.ocm` over the merged `ocm`; the rendered components' `services` win
/// over services from `spec.values`.
pub fn runtime_vars(
    render: &dyn Render,
    profile: &Profile,
    namespace: &str,
    spec: &PlatformMeshSpec,
    remote: Option<&RemoteRuntime>,
) -> Result<Value, ProfileError> {
    let mut v = merge_maps(&profile.infra, &template_vars(namespace, spec));
    if let Some(values) = spec.values.as_ref().filter(|v| v.is_object()) {
        v = merge_maps(&v, values);
    }
    if let Some(ocm) = ocm_from_spec(spec) {
        let merged = merge_maps(v.get("ocm").unwrap_or(&json!({})), &ocm);
        insert(&mut v, "ocm", merged);
    }
    let components = render_components(render, profile, &v)?;
    let services = merge_maps(
        v.get("services").unwrap_or(&json!({})),
        components.get("services").unwrap_or(&json!({})),
    );
    insert(&mut v, "services", services);
    insert(&mut v, "releaseNamespace", json!(namespace));
    insert(&mut v, "helmReleaseNamespace", json!(namespace));
    add_remote(&mut v, remote);
    Ok(v)
}

/// Data of the templates under `components`: `values` (the rendered components section with the
/// services of `spec.values` merged over it, and argocd sync waves filled in) and the addresses.
pub fn component_vars(
    render: &dyn Render,
    profile: &Profile,
    namespace: &str,
    spec: &PlatformMeshSpec,
    remote: Option<&RemoteRuntime>,
) -> Result<Value, ProfileError> {
    let tv = template_vars(namespace, spec);
    let components = profile_components(render, profile, &tv)?;
    let mut values = components.clone();
    let spec_services = match spec.values.as_ref() {
        Some(v) => match v.get("services") {
            Some(s @ Value::Object(_)) => s.clone(),
            _ => v.clone(),
        },
        None => json!({}),
    };
    let spec_services = render_spec_strings(render, &spec_services, &value_addresses(spec));
    let services = merge_maps(values.get("services").unwrap_or(&json!({})), &spec_services);
    insert(&mut values, "services", services);
    let tech = DeploymentTechnology::parse(
        tv.get("deploymentTechnology")
            .or(components.get("deploymentTechnology")),
    );
    if tech == DeploymentTechnology::ArgoCd {
        if let Some(Value::Object(services)) = values.get_mut("services") {
            sync_waves(services);
        }
    }
    let addresses = value_addresses(spec);
    let mut data = json!({
        "values": values,
        "releaseNamespace": namespace,
        "deploymentTechnology": tech.as_str(),
        "baseDomain": addresses["baseDomain"],
        "port": addresses["port"],
        "baseDomainWithPort": addresses["baseDomainWithPort"],
    });
    add_remote(&mut data, remote);
    if let Some(server) = components.get("destinationServer") {
        insert(&mut data, "destinationServer", server.clone());
    }
    Ok(data)
}

fn profile_components(
    render: &dyn Render,
    profile: &Profile,
    tv: &Value,
) -> Result<Value, ProfileError> {
    // The components are rendered with the addresses on top of their own (unrendered) values.
    let own = parse_yaml(&profile.components_text).unwrap_or(Value::Null);
    let own = if own.is_object() { own } else { json!({}) };
    render_components(render, profile, &merge_maps(&own, tv))
}

/// Addresses the strings of `spec.values` may use: the port defaults to 443 here (the domain
/// alone), unlike [`template_vars`].
fn value_addresses(spec: &PlatformMeshSpec) -> Value {
    let exposure = spec.exposure.as_ref();
    let base_domain = exposure
        .and_then(|e| e.base_domain.clone())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_BASE_DOMAIN.to_string());
    let port = exposure
        .and_then(|e| e.port)
        .filter(|p| *p != 0)
        .map(|p| p.to_string())
        .unwrap_or_else(|| "443".to_string());
    let with_port = if port == "443" {
        base_domain.clone()
    } else {
        format!("{base_domain}:{port}")
    };
    json!({
        "baseDomain": base_domain,
        "baseDomainPort": with_port,
        "port": port,
        "baseDomainWithPort": with_port,
    })
}

/// Renders the string leaves of `spec.values` that hold a template action; a string that does
/// not render stays as written.
fn render_spec_strings(render: &dyn Render, v: &Value, addresses: &Value) -> Value {
    match v {
        Value::String(s) if s.contains("{{") && s.contains("}}") => {
            let mut data = addresses.clone();
            insert(&mut data, "Values", addresses.clone());
            match render.render("spec.values", s, &data) {
                Ok(out) => Value::String(out),
                Err(_) => v.clone(),
            }
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), render_spec_strings(render, x, addresses)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| render_spec_strings(render, x, addresses))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Argo CD sync waves: a service's own `syncWave` (a number) stays; others get 0 without known
/// dependencies, else one more than the highest wave among the services they depend on.
/// Unknown dependencies are ignored; a dependency cycle stops after as many rounds as services.
pub fn sync_waves(services: &mut Map<String, Value>) {
    let fixed: std::collections::BTreeMap<String, i64> = services
        .iter()
        .filter_map(|(k, s)| {
            let w = s.get("syncWave")?;
            w.as_i64()
                .or_else(|| w.as_f64().map(|f| f as i64))
                .map(|w| (k.clone(), w))
        })
        .collect();
    let deps: std::collections::BTreeMap<String, Vec<String>> = services
        .iter()
        .map(|(k, s)| {
            let names = s
                .get("dependsOn")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.get("name").and_then(Value::as_str))
                        .filter(|n| services.contains_key(*n))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            (k.clone(), names)
        })
        .collect();
    let mut waves: std::collections::BTreeMap<String, i64> = deps
        .keys()
        .map(|k| (k.clone(), fixed.get(k).copied().unwrap_or(0)))
        .collect();
    for _ in 0..=services.len() {
        let mut changed = false;
        for (k, ds) in &deps {
            if fixed.contains_key(k) || ds.is_empty() {
                continue;
            }
            let w = 1 + ds.iter().map(|d| waves[d]).max().unwrap_or(-1);
            if waves[k] != w {
                waves.insert(k.clone(), w);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for (k, s) in services.iter_mut() {
        if let (Value::Object(m), Some(w)) = (s, waves.get(k)) {
            m.insert("syncWave".into(), json!(w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::core::platform_mesh::{ExposureConfig, OcmConfig, OcmName, OcmReferencePathElement};

    /// Replaces `{{ .key }}` with the top-level string of `data`: enough to see which data a
    /// template step was given, without the template engine.
    struct Substitute;

    impl Render for Substitute {
        fn render(&self, _name: &str, text: &str, data: &Value) -> Result<String, String> {
            let mut out = text.to_string();
            while let Some(start) = out.find("{{ .") {
                let end = out[start..].find(" }}").ok_or("unclosed action")? + start;
                let key = &out[start + 4..end];
                let v = data
                    .get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("map has no entry for key {key:?}"))?
                    .to_string();
                out.replace_range(start..end + 3, &v);
            }
            Ok(out)
        }
    }

    fn spec(values: Value) -> PlatformMeshSpec {
        PlatformMeshSpec {
            values: Some(values),
            ..Default::default()
        }
    }

    #[test]
    fn merge_overwrite_wins_lists_replace_and_maps_merge() {
        let base = json!({"a": 1, "m": {"x": 1, "y": [1, 2], "keep": true}, "only": "base"});
        let over = json!({"a": 2, "m": {"x": 9, "y": [3]}, "n": null});
        assert_eq!(
            merge_maps(&base, &over),
            json!({"a": 2, "m": {"x": 9, "y": [3], "keep": true}, "only": "base", "n": null})
        );
        // A null in the overwrite wins over a base map; a map in the overwrite wins over a scalar.
        assert_eq!(
            merge_maps(&json!({"k": {"a": 1}}), &json!({"k": null})),
            json!({"k": null})
        );
        assert_eq!(
            merge_maps(&json!({"k": 1}), &json!({"k": {"a": 1}})),
            json!({"k": {"a": 1}})
        );
        assert_eq!(merge_maps(&json!(1), &json!({"a": 1})), json!({"a": 1}));
    }

    #[test]
    fn template_vars_defaults_and_ports() {
        let tv = template_vars("pm-system", &PlatformMeshSpec::default());
        assert_eq!(
            tv,
            json!({"baseDomain": "portal.localhost", "protocol": "https", "port": "8443",
                   "baseDomainPort": "portal.localhost:8443", "helmReleaseNamespace": "pm-system"})
        );
        for (port, expect) in [
            (443, "example.io"),
            (80, "example.io"),
            (9443, "example.io:9443"),
        ] {
            let s = PlatformMeshSpec {
                exposure: Some(ExposureConfig {
                    base_domain: Some("example.io".into()),
                    port: Some(port),
                    protocol: Some("http".into()),
                }),
                ..Default::default()
            };
            let tv = template_vars("ns", &s);
            assert_eq!(tv["baseDomainPort"], expect);
            assert_eq!(tv["port"], port.to_string());
            assert_eq!(tv["protocol"], "http");
        }
    }

    #[test]
    fn profile_parsing_and_errors() {
        let p = Profile::parse("infra:\n  deploymentTechnology: ArgoCD\ncomponents:\n  services:\n    a: {enabled: true}\n    a: {enabled: false}\n").unwrap();
        assert_eq!(p.infra["deploymentTechnology"], "ArgoCD");
        // The later of two equal keys wins, as in the Go operator.
        let c = parse_yaml(&p.components_text).unwrap();
        assert_eq!(c["services"]["a"]["enabled"], false);
        assert_eq!(Profile::parse("").unwrap().infra, json!({}));
        // Template actions survive re-serialization unwrapped and unescaped, however long.
        let long = format!("{}{{{{ .x | default \"y\" }}}}", "word ".repeat(30));
        let p = Profile::parse(&format!("components:\n  a: '{long}'\n")).unwrap();
        assert!(p.components_text.contains(&long), "{}", p.components_text);
        assert!(
            matches!(Profile::parse("- a"), Err(ProfileError::Invalid(m)) if m.contains("list"))
        );
        assert!(matches!(
            Profile::parse("a: [1"),
            Err(ProfileError::Invalid(_))
        ));
        assert_eq!(
            Profile::from_config_map_data(&Map::new()),
            Err(ProfileError::MissingKey)
        );
    }

    #[test]
    fn profile_reference_defaults_to_name_profile_in_the_namespace() {
        let mut s = PlatformMeshSpec::default();
        assert_eq!(
            profile_config_map("pm", "ns", &s),
            ("ns".into(), "pm-profile".into())
        );
        s.profile_config_map = Some(api::core::platform_mesh::ConfigMapReference {
            name: "custom".into(),
            namespace: None,
        });
        assert_eq!(
            profile_config_map("pm", "ns", &s),
            ("ns".into(), "custom".into())
        );
        s.profile_config_map.as_mut().unwrap().namespace = Some("other".into());
        assert_eq!(
            profile_config_map("pm", "ns", &s),
            ("other".into(), "custom".into())
        );
    }

    #[test]
    fn infra_vars_layering() {
        let p = Profile::parse(
            "infra:\n  deploymentTechnology: Helm\n  port: '1'\n  certManager: {enabled: true}\n",
        )
        .unwrap();
        let remote = RemoteRuntime {
            secret_name: "rt".into(),
            secret_key: "kubeconfig".into(),
        };
        let v = infra_vars(&p, "pm-system", &PlatformMeshSpec::default(), Some(&remote));
        // Unknown technologies fall back to Flux; the addresses win over the profile.
        assert_eq!(v["deploymentTechnology"], "fluxcd");
        assert_eq!(v["port"], "8443");
        assert_eq!(v["certManager"]["enabled"], true);
        assert_eq!(v["releaseNamespace"], "pm-system");
        assert_eq!(v["kubeConfigEnabled"], true);
        assert_eq!(v["kubeConfigSecretName"], "rt");
        let v = infra_vars(&p, "pm-system", &PlatformMeshSpec::default(), None);
        assert_eq!(v["kubeConfigEnabled"], false);
        assert!(v.get("kubeConfigSecretName").is_none());
    }

    #[test]
    fn runtime_vars_layering() {
        let p = Profile::parse(
            "infra:\n  baseDomain: profile.io\n  ocm: {repo: {name: r0}, interval: 3m}\ncomponents:\n  services:\n    portal: {enabled: true, host: 'p.{{ .baseDomain }}'}\n",
        )
        .unwrap();
        let mut s = spec(
            json!({"services": {"portal": {"enabled": false, "x": 1}, "iam": {"enabled": true}}, "extra": "v"}),
        );
        s.ocm = Some(OcmConfig {
            repo: Some(OcmName {
                name: Some("r1".into()),
            }),
            component: None,
            reference_path: Some(vec![OcmReferencePathElement { name: "a".into() }]),
        });
        let v = runtime_vars(&Substitute, &p, "ns", &s, None).unwrap();
        // The addresses override the profile's infra; spec.ocm wins over the profile's ocm.
        assert_eq!(v["baseDomain"], "portal.localhost");
        assert_eq!(
            v["ocm"],
            json!({"repo": {"name": "r1"}, "interval": "3m", "referencePath": [{"name": "a"}]})
        );
        assert_eq!(v["extra"], "v");
        // The profile's services win over spec.values here; services only in spec.values stay.
        assert_eq!(
            v["services"]["portal"],
            json!({"enabled": true, "x": 1, "host": "p.portal.localhost"})
        );
        assert_eq!(v["services"]["iam"], json!({"enabled": true}));
        assert_eq!(v["helmReleaseNamespace"], "ns");
        assert_eq!(v["kubeConfigEnabled"], false);
    }

    #[test]
    fn component_vars_spec_values_win_and_render_addresses() {
        let p = Profile::parse(
            "components:\n  deploymentTechnology: fluxcd\n  destinationServer: https://argo\n  services:\n    portal: {enabled: true, host: 'p.{{ .baseDomainPort }}'}\n",
        )
        .unwrap();
        let mut s = spec(
            json!({"services": {"portal": {"enabled": false, "url": "https://{{ .baseDomainWithPort }}/x"}}}),
        );
        s.exposure = Some(ExposureConfig {
            base_domain: Some("example.io".into()),
            port: None,
            protocol: None,
        });
        let v = component_vars(&Substitute, &p, "ns", &s, None).unwrap();
        let portal = &v["values"]["services"]["portal"];
        assert_eq!(portal["enabled"], false);
        // The profile sees port 8443, spec.values strings see 443 (the domain alone).
        assert_eq!(portal["host"], "p.example.io:8443");
        assert_eq!(portal["url"], "https://example.io/x");
        assert_eq!(v["baseDomainWithPort"], "example.io");
        assert_eq!(v["deploymentTechnology"], "fluxcd");
        assert_eq!(v["destinationServer"], "https://argo");
        // A spec.values without `services` is taken as the services themselves; a string that
        // does not render stays as written.
        let s = spec(json!({"portal": {"note": "{{ .nope }}"}}));
        let v = component_vars(&Substitute, &p, "ns", &s, None).unwrap();
        assert_eq!(v["values"]["services"]["portal"]["note"], "{{ .nope }}");
        assert_eq!(v["values"]["services"]["portal"]["enabled"], true);
    }

    #[test]
    fn component_render_errors_are_reported() {
        let p = Profile::parse("components:\n  a: '{{ .missing }}'\n").unwrap();
        let err =
            component_vars(&Substitute, &p, "ns", &PlatformMeshSpec::default(), None).unwrap_err();
        assert!(matches!(err, ProfileError::Render(m) if m.contains("missing")));
    }

    #[test]
    fn the_upstream_e2e_profile_parses_and_renders() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/reference/platform-mesh-operator/e2e-samples/default-profile.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the reference e2e profile");
        let cm: Value = serde_saphyr::from_str(&text).expect("a ConfigMap");
        let p = Profile::from_config_map_data(cm["data"].as_object().expect("data")).unwrap();
        assert_eq!(p.infra["deploymentTechnology"], "fluxcd");
        assert_eq!(p.infra["certManager"]["enabled"], true);
        let v = component_vars(
            &Substitute,
            &p,
            "platform-mesh-system",
            &PlatformMeshSpec::default(),
            None,
        )
        .unwrap();
        let services = v["values"]["services"].as_object().expect("services");
        assert_eq!(
            services.len(),
            19,
            "{:?}",
            services.keys().collect::<Vec<_>>()
        );
        // The duplicated key keeps one entry.
        assert_eq!(services["terminal-controller-manager"]["enabled"], false);
        let rendered = serde_json::to_string(&v).unwrap();
        assert!(!rendered.contains("{{"), "every placeholder rendered");
        assert!(rendered.contains("kcp.api.portal.localhost"));
    }

    #[test]
    fn argocd_sync_waves_follow_dependencies() {
        let mut services = json!({
            "a": {},
            "b": {"dependsOn": [{"name": "a"}]},
            "c": {"dependsOn": [{"name": "b"}, {"name": "unknown"}]},
            "d": {"syncWave": 7, "dependsOn": [{"name": "a"}]},
            "e": {"dependsOn": [{"name": "d"}]},
            "x": {"dependsOn": [{"name": "y"}]},
            "y": {"dependsOn": [{"name": "x"}]},
        });
        sync_waves(services.as_object_mut().unwrap());
        let wave = |k: &str| services[k]["syncWave"].as_i64().unwrap();
        assert_eq!(
            (wave("a"), wave("b"), wave("c"), wave("d"), wave("e")),
            (0, 1, 2, 7, 8)
        );
        // A cycle terminates with some finite waves.
        assert!(wave("x") >= 0 && wave("y") >= 0);
    }
}
