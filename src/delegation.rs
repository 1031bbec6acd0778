//! Trusting the kube-apiserver this server extends: `kube-system/extension-apiserver-authentication`
//! names the CA of its proxy client certificate, the allowed proxy names and the `X-Remote-*`
//! headers. Read at start from the host cluster (in-cluster service account or a kubeconfig) and
//! turned into request-header options; flags given explicitly win.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;

/// The ConfigMap kube-apiserver writes for extension servers.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";

/// The request-header part of that ConfigMap.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RequestHeaderSettings {
    pub client_ca_pem: String,
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefix: Vec<String>,
}

/// A list value of the ConfigMap: a JSON array of strings (empty or missing is no entries).
fn strings(data: &BTreeMap<String, String>, key: &str) -> anyhow::Result<Vec<String>> {
    match data.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(text)
            .with_context(|| format!("{NAMESPACE}/{NAME}: {key} is not a JSON list of strings")),
    }
}

/// Reads the request-header settings out of the ConfigMap's data.
pub fn parse(data: &BTreeMap<String, String>) -> anyhow::Result<RequestHeaderSettings> {
    let client_ca_pem = data
        .get("requestheader-client-ca-file")
        .filter(|s| !s.trim().is_empty())
        .cloned()
        .with_context(|| {
            format!(
                "{NAMESPACE}/{NAME} has no requestheader-client-ca-file: is kube-apiserver's \
                 --requestheader-client-ca-file set?"
            )
        })?;
    Ok(RequestHeaderSettings {
        client_ca_pem,
        allowed_names: strings(data, "requestheader-allowed-names")?,
        username_headers: strings(data, "requestheader-username-headers")?,
        uid_headers: strings(data, "requestheader-uid-headers")?,
        group_headers: strings(data, "requestheader-group-headers")?,
        extra_headers_prefix: strings(data, "requestheader-extra-headers-prefix")?,
    })
}

/// Fetches the settings from the cluster `config` reaches.
pub async fn fetch(config: kube::Config) -> anyhow::Result<RequestHeaderSettings> {
    let client = kube::Client::try_from(config).context("building the host cluster client")?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, NAMESPACE);
    let cm = api
        .get(NAME)
        .await
        .with_context(|| format!("reading {NAMESPACE}/{NAME} from the host cluster"))?;
    parse(&cm.data.unwrap_or_default())
}

/// The host cluster's client configuration: a kubeconfig file, or the in-cluster service account.
pub async fn host_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("using {}", path.display()))
        }
        None => kube::Config::incluster()
            .context("--authentication-in-cluster needs to run in a pod with a service account"),
    }
}

/// Fills the request-header options from `settings` where no flag set them; the CA is written to
/// `<data-dir>/pki/requestheader-client-ca.crt`.
pub fn apply(
    settings: RequestHeaderSettings,
    opts: &mut apiserver::server::ServeOptions,
) -> anyhow::Result<()> {
    if opts.requestheader_client_ca_file.is_none() {
        let dir = opts.data_dir.join("pki");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("requestheader-client-ca.crt");
        std::fs::write(&path, &settings.client_ca_pem)
            .with_context(|| format!("writing {}", path.display()))?;
        opts.requestheader_client_ca_file = Some(path);
    }
    let fill = |flag: &mut Vec<String>, from: Vec<String>| {
        if flag.is_empty() {
            *flag = from;
        }
    };
    fill(
        &mut opts.requestheader_allowed_names,
        settings.allowed_names,
    );
    fill(
        &mut opts.requestheader_username_headers,
        settings.username_headers,
    );
    fill(&mut opts.requestheader_uid_headers, settings.uid_headers);
    fill(
        &mut opts.requestheader_group_headers,
        settings.group_headers,
    );
    fill(
        &mut opts.requestheader_extra_headers_prefix,
        settings.extra_headers_prefix,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_configmap_kube_apiserver_writes() {
        let data: BTreeMap<String, String> = [
            ("client-ca-file", "CLIENT"),
            ("requestheader-client-ca-file", "PROXY CA"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
            ("requestheader-uid-headers", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s = parse(&data).expect("parse");
        assert_eq!(s.client_ca_pem, "PROXY CA");
        assert_eq!(s.allowed_names, vec!["front-proxy-client"]);
        assert_eq!(s.group_headers, vec!["X-Remote-Group"]);
        assert!(s.uid_headers.is_empty());

        let mut bad = data.clone();
        bad.insert(
            "requestheader-allowed-names".into(),
            "front-proxy-client".into(),
        );
        let err = parse(&bad).expect_err("not JSON");
        assert!(
            err.to_string().contains("requestheader-allowed-names"),
            "{err}"
        );
        bad.remove("requestheader-client-ca-file");
        let err = parse(&bad).expect_err("no CA");
        assert!(
            err.to_string().contains("requestheader-client-ca-file"),
            "{err}"
        );
    }

    #[test]
    fn explicit_flags_win() {
        let mut opts =
            apiserver::server::ServeOptions::new("127.0.0.1:0".parse().expect("addr"), "/x");
        opts.requestheader_allowed_names = vec!["mine".into()];
        opts.requestheader_client_ca_file = Some("/ca.crt".into());
        apply(
            RequestHeaderSettings {
                client_ca_pem: "CA".into(),
                allowed_names: vec!["theirs".into()],
                group_headers: vec!["X-Group".into()],
                ..Default::default()
            },
            &mut opts,
        )
        .expect("apply");
        assert_eq!(opts.requestheader_allowed_names, vec!["mine"]);
        assert_eq!(opts.requestheader_group_headers, vec!["X-Group"]);
        assert_eq!(
            opts.requestheader_client_ca_file.as_deref(),
            Some(std::path::Path::new("/ca.crt"))
        );
    }
}
