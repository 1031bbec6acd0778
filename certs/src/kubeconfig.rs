//! Generation of kubeconfig files that `kubectl` and client-go understand.

use std::path::Path;

use base64::Engine as _;
use serde::Serialize;

use crate::fsutil::{self, MODE_PRIVATE};
use crate::CertError;

/// What to put into a generated kubeconfig: one cluster, one user and one
/// context tying them together (which becomes the current context).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KubeconfigOptions {
    /// API server URL, e.g. `https://127.0.0.1:6443`.
    pub server: String,
    /// Name of the cluster entry.
    pub cluster_name: String,
    /// Name of the user entry.
    pub user_name: String,
    /// Name of the context entry; also the `current-context`.
    pub context_name: String,
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// PEM client certificate (requires `client_key_pem`).
    pub client_cert_pem: Option<String>,
    /// PEM private key of the client certificate (requires `client_cert_pem`).
    pub client_key_pem: Option<String>,
    /// Also a cluster and context of this workspace (e.g. `root`), named after it, at
    /// `<server>/clusters/<workspace>`, and that context current; the base one stays (listed
    /// first), as kcp's admin kubeconfig has `root` and `base`.
    pub workspace: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
}

impl std::fmt::Debug for KubeconfigOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Credentials are deliberately left out.
        f.debug_struct("KubeconfigOptions")
            .field("server", &self.server)
            .field("cluster_name", &self.cluster_name)
            .field("user_name", &self.user_name)
            .field("context_name", &self.context_name)
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

/// Top-level kubeconfig document (`apiVersion: v1`, `kind: Config`).
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Config<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    clusters: Vec<Named<'a, Cluster<'a>>>,
    users: Vec<Named<'a, User<'a>>>,
    contexts: Vec<Named<'a, Context<'a>>>,
    current_context: &'a str,
}

/// `{name: ..., <field>: ...}` list entry; the field name is given by `T`.
#[derive(Serialize)]
struct Named<'a, T: Serialize> {
    name: &'a str,
    #[serde(flatten)]
    item: T,
}

#[derive(Serialize)]
struct Cluster<'a> {
    cluster: ClusterSpec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterSpec<'a> {
    server: &'a str,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct User<'a> {
    user: UserSpec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct UserSpec<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    client_certificate_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_key_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<&'a str>,
}

#[derive(Serialize)]
struct Context<'a> {
    context: ContextSpec<'a>,
}

#[derive(Serialize)]
struct ContextSpec<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// Checks that the options describe a usable kubeconfig.
fn validate(opts: &KubeconfigOptions) -> Result<(), CertError> {
    let required = [
        ("server", &opts.server),
        ("cluster_name", &opts.cluster_name),
        ("user_name", &opts.user_name),
        ("context_name", &opts.context_name),
        ("ca_pem", &opts.ca_pem),
    ];
    for (field, value) in required {
        if value.trim().is_empty() {
            return Err(CertError::InvalidKubeconfig(format!(
                "{field} must not be empty"
            )));
        }
    }
    if !opts.server.starts_with("https://") && !opts.server.starts_with("http://") {
        return Err(CertError::InvalidKubeconfig(format!(
            "server {:?} must be an http(s) URL",
            opts.server
        )));
    }
    match (&opts.client_cert_pem, &opts.client_key_pem) {
        (Some(_), None) => Err(CertError::InvalidKubeconfig(
            "client certificate given without its key".to_string(),
        )),
        (None, Some(_)) => Err(CertError::InvalidKubeconfig(
            "client key given without its certificate".to_string(),
        )),
        _ => Ok(()),
    }
}

/// Renders a kubeconfig (`apiVersion: v1`, `kind: Config`) with one cluster
/// (`server`, `certificate-authority-data`), one user (`client-certificate-data`
/// and `client-key-data`, and/or `token`) and one context, set as
/// `current-context`. PEM data is embedded base64-encoded, as kubectl expects.
pub fn kubeconfig_yaml(opts: &KubeconfigOptions) -> Result<String, CertError> {
    validate(opts)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let workspace = opts.workspace.as_deref().map(|ws| {
        (
            ws,
            format!("{}/clusters/{ws}", opts.server.trim_end_matches('/')),
        )
    });
    let mut clusters = vec![Named {
        name: opts.cluster_name.as_str(),
        item: Cluster {
            cluster: ClusterSpec {
                server: &opts.server,
                certificate_authority_data: b64(&opts.ca_pem),
            },
        },
    }];
    let mut contexts = vec![Named {
        name: opts.context_name.as_str(),
        item: Context {
            context: ContextSpec {
                cluster: &opts.cluster_name,
                user: &opts.user_name,
            },
        },
    }];
    if let Some((ws, server)) = &workspace {
        clusters.push(Named {
            name: ws,
            item: Cluster {
                cluster: ClusterSpec {
                    server,
                    certificate_authority_data: b64(&opts.ca_pem),
                },
            },
        });
        contexts.push(Named {
            name: ws,
            item: Context {
                context: ContextSpec {
                    cluster: ws,
                    user: &opts.user_name,
                },
            },
        });
    }
    let config = Config {
        api_version: "v1",
        kind: "Config",
        clusters,
        users: vec![Named {
            name: &opts.user_name,
            item: User {
                user: UserSpec {
                    client_certificate_data: opts.client_cert_pem.as_deref().map(b64),
                    client_key_data: opts.client_key_pem.as_deref().map(b64),
                    token: opts.token.as_deref(),
                },
            },
        }],
        contexts,
        current_context: workspace
            .as_ref()
            .map_or(opts.context_name.as_str(), |(ws, _)| ws),
    };
    // Plain one-line scalars for the long base64 values, as kubectl writes them.
    let mut options = serde_saphyr::SerializerOptions::default();
    options.prefer_block_scalars = false;
    serde_saphyr::to_string_with_options(&config, options).map_err(CertError::Yaml)
}

/// Writes [`kubeconfig_yaml`] to `path` atomically with mode 0600 (unix),
/// creating parent directories as needed.
pub fn write_kubeconfig(path: &Path, opts: &KubeconfigOptions) -> Result<(), CertError> {
    let yaml = kubeconfig_yaml(opts)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fsutil::create_dir_all(parent)?;
    }
    fsutil::write_atomic(path, yaml.as_bytes(), MODE_PRIVATE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn options() -> KubeconfigOptions {
        KubeconfigOptions {
            server: "https://127.0.0.1:6443".to_string(),
            cluster_name: "platform-mesh".to_string(),
            user_name: "admin".to_string(),
            context_name: "pm-admin".to_string(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n".to_string(),
            client_cert_pem: Some("cert: 'quoted' # not a comment\n".to_string()),
            client_key_pem: Some("key\n".to_string()),
            workspace: None,
            token: None,
        }
    }

    #[test]
    fn a_workspace_context_is_current_and_the_base_one_stays_first() {
        let opts = KubeconfigOptions {
            workspace: Some("root".into()),
            ..options()
        };
        let v: Value =
            serde_saphyr::from_str(&kubeconfig_yaml(&opts).expect("render")).expect("parse back");
        assert_eq!(v["current-context"], "root");
        assert_eq!(v["clusters"][0]["name"], "platform-mesh");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        assert_eq!(v["clusters"][1]["name"], "root");
        assert_eq!(
            v["clusters"][1]["cluster"]["server"],
            "https://127.0.0.1:6443/clusters/root"
        );
        assert_eq!(v["contexts"][0]["name"], "pm-admin");
        assert_eq!(v["contexts"][1]["context"]["cluster"], "root");
        assert_eq!(v["contexts"][1]["context"]["user"], "admin");
    }

    fn decode(v: &Value) -> String {
        let s = v.as_str().expect("string value");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .expect("valid base64");
        String::from_utf8(bytes).expect("utf8")
    }

    #[test]
    fn client_certificate_kubeconfig_round_trips() {
        let opts = options();
        let yaml = kubeconfig_yaml(&opts).expect("render");
        assert!(!yaml.contains(">-") && !yaml.contains('|'), "{yaml}");
        let v: Value = serde_saphyr::from_str(&yaml).expect("parse back");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "Config");
        assert_eq!(v["current-context"], "pm-admin");
        assert_eq!(v["clusters"][0]["name"], "platform-mesh");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        assert_eq!(
            decode(&v["clusters"][0]["cluster"]["certificate-authority-data"]),
            opts.ca_pem
        );
        assert_eq!(v["users"][0]["name"], "admin");
        let user = &v["users"][0]["user"];
        assert_eq!(
            Some(decode(&user["client-certificate-data"])),
            opts.client_cert_pem
        );
        assert_eq!(Some(decode(&user["client-key-data"])), opts.client_key_pem);
        assert!(user.get("token").is_none());
        assert_eq!(v["contexts"][0]["name"], "pm-admin");
        assert_eq!(v["contexts"][0]["context"]["cluster"], "platform-mesh");
        assert_eq!(v["contexts"][0]["context"]["user"], "admin");
    }

    #[test]
    fn token_kubeconfig_round_trips() {
        let opts = KubeconfigOptions {
            client_cert_pem: None,
            client_key_pem: None,
            // Characters that would need quoting in YAML.
            token: Some("abc: #def 'x' \"y\"".to_string()),
            user_name: "true".to_string(),
            ..options()
        };
        let yaml = kubeconfig_yaml(&opts).expect("render");
        let v: Value = serde_saphyr::from_str(&yaml).expect("parse back");
        let user = &v["users"][0]["user"];
        assert_eq!(user["token"], "abc: #def 'x' \"y\"");
        assert!(user.get("client-certificate-data").is_none());
        assert!(user.get("client-key-data").is_none());
        assert_eq!(v["users"][0]["name"], "true");
        assert_eq!(v["contexts"][0]["context"]["user"], "true");
    }

    #[test]
    fn inconsistent_options_are_rejected() {
        let no_key = KubeconfigOptions {
            client_key_pem: None,
            ..options()
        };
        assert!(matches!(
            kubeconfig_yaml(&no_key),
            Err(CertError::InvalidKubeconfig(_))
        ));
        let no_server = KubeconfigOptions {
            server: String::new(),
            ..options()
        };
        assert!(matches!(
            kubeconfig_yaml(&no_server),
            Err(CertError::InvalidKubeconfig(_))
        ));
    }

    #[test]
    fn write_kubeconfig_is_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("nested/dir/admin.kubeconfig");
        write_kubeconfig(&path, &options()).expect("write");
        let text = std::fs::read_to_string(&path).expect("read back");
        assert_eq!(text, kubeconfig_yaml(&options()).expect("render"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Overwriting keeps working and leaves no temporary files behind.
        write_kubeconfig(&path, &options()).expect("rewrite");
        let entries = std::fs::read_dir(path.parent().expect("parent"))
            .expect("list")
            .count();
        assert_eq!(entries, 1);
    }
}
