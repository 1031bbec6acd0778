//! Kubeconfig files the controllers hand out: one server, one bearer token.

use base64::Engine as _;
use kube::config::{
    AuthInfo, Cluster as KubeCluster, Context as KubeContext, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};

/// `text` in standard base64, as a kubeconfig's `*-data` fields hold it.
pub(crate) fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A kubeconfig of one cluster `default-cluster`, user `default-auth` with `token`, context
/// `default-context`.
pub(crate) fn token_kubeconfig(server: &str, ca_pem: &str, token: &str) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(KubeCluster {
                server: Some(server.into()),
                certificate_authority_data: (!ca_pem.is_empty()).then(|| b64(ca_pem)),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                token: Some(token.to_string().into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(KubeContext {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some("default-context".into()),
        ..Default::default()
    }
}

/// The kubeconfig as the text a Secret holds (JSON, which every kubeconfig reader takes).
pub(crate) fn to_text(kc: &Kubeconfig) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(kc)
}
