//! TLS towards etcd: the CA that signs etcd's certificate and, for an etcd that verifies its
//! clients, this server's client certificate.

use super::EtcdOptions;
use crate::storage::{Result, StorageError};

/// TLS towards etcd, as kube-apiserver's `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile`.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// PEM bundle of the CAs that sign etcd's serving certificate.
    pub ca_pem: Vec<u8>,
    /// PEM client certificate and its key, for an etcd that asks for one (`--client-cert-auth`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

/// The TLS settings for `options`, refusing a mix of `http://` and `https://` endpoints and TLS
/// settings without an `https://` endpoint to use them (either is a misconfiguration that
/// would otherwise show only as a refused connection).
pub(super) fn client_config(options: &EtcdOptions) -> Result<Option<etcd_client::TlsOptions>> {
    let https = options
        .endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    let config = |m: String| Err(StorageError::Backend(format!("etcd: {m}")));
    if https > 0 && https < options.endpoints.len() {
        return config("the endpoints mix http:// and https://; use one scheme".into());
    }
    match (&options.tls, https > 0) {
        (None, false) => Ok(None),
        (Some(_), false) => config(
            "TLS files are given but the endpoints are http://; use https:// endpoints".into(),
        ),
        (None, true) => config(
            "https:// endpoints need the CA that signs etcd's certificate (--etcd-cafile)".into(),
        ),
        (Some(tls), true) => {
            let mut t = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.client {
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            Ok(Some(t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::EtcdProcess;
    use super::super::EtcdStore;
    use super::*;
    use crate::storage::Store;
    use futures::StreamExt;

    fn failure(options: EtcdOptions) -> String {
        match client_config(&options) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted {options:?}"),
        }
    }

    #[test]
    fn misconfigurations_are_refused_with_the_flag_to_fix() {
        let https = EtcdOptions {
            endpoints: vec!["https://127.0.0.1:2379".into()],
            ..EtcdOptions::default()
        };
        assert!(failure(https.clone()).contains("--etcd-cafile"));
        let tls = Some(EtcdTls::default());
        let http = EtcdOptions {
            tls: tls.clone(),
            ..EtcdOptions::default()
        };
        assert!(failure(http).contains("use https:// endpoints"));
        let mixed = EtcdOptions {
            endpoints: vec!["https://a:2379".into(), "http://b:2379".into()],
            tls,
            ..EtcdOptions::default()
        };
        assert!(failure(mixed).contains("mix http:// and https://"));
        assert!(client_config(&EtcdOptions::default()).unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_etcd_that_verifies_clients_serves_a_store_with_the_client_certificate() {
        let etcd = EtcdProcess::start_tls().await.expect("etcd with TLS");
        assert!(etcd.endpoint().starts_with("https://"));
        let store = etcd.store("/tls").await.expect("store over TLS");
        let from = store.current_revision();
        let mut watch = store.watch("/k/", from).await.expect("watch");
        let value: crate::storage::Encoder = Box::new(|rv| format!("{{\"rv\":{rv}}}").into_bytes());
        let kv = store.create("/k/a", value).await.expect("create");
        let got = store.get("/k/a").await.expect("get").expect("stored");
        assert_eq!(got.mod_revision, kv.mod_revision);
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
            .await
            .expect("an event in time")
            .expect("stream open")
            .expect("no error");
        assert_eq!(
            (event.key.as_ref(), event.revision),
            ("/k/a", kv.mod_revision)
        );

        // Without a client certificate etcd refuses the connection.
        let mut anonymous = etcd.options("/tls");
        if let Some(t) = anonymous.tls.as_mut() {
            t.client = None;
        }
        assert!(EtcdStore::connect(anonymous).await.is_err());
        // A CA that did not sign etcd's certificate is refused too.
        let other = tempfile::tempdir().expect("tempdir");
        let stranger = certs::Pki::load_or_create(other.path(), &[]).expect("another CA");
        let mut untrusting = etcd.options("/tls");
        if let Some(t) = untrusting.tls.as_mut() {
            t.ca_pem = stranger.ca_cert_pem().as_bytes().to_vec();
        }
        assert!(EtcdStore::connect(untrusting).await.is_err());
    }
}
