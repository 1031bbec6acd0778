//! PKI for platform-mesh.
//!
//! - [`Pki`]: the CA, serving certificate and admin client certificate kept
//!   in a data directory, created on first start and renewed when needed;
//!   it can also issue further client and serving certificates.
//! - [`load_pem_files`]: operator-supplied certificate/key overrides.
//! - [`client_identity`]: user name and groups of a client certificate.
//! - [`kubeconfig_yaml`] / [`write_kubeconfig`]: kubeconfig files for kubectl.
//!
//! Keys are ECDSA P-256, generated with `ring` through `rcgen`.

mod der;
mod error;
mod fsutil;
mod identity;
mod issue;
mod kubeconfig;
mod pem;
mod pki;

use std::path::Path;

pub use error::CertError;

/// Writes a private key (or any secret) readable by its owner only, atomically, creating the
/// directory if needed.
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> Result<(), CertError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fsutil::create_dir_all(dir)?;
    }
    fsutil::write_atomic(path, contents, fsutil::MODE_PRIVATE)
}
pub use identity::{client_identity, ClientIdentity};
pub use kubeconfig::{kubeconfig_yaml, write_kubeconfig, KubeconfigOptions};
pub use pem::{encode_pem, load_pem_files, pem_to_cert_chain, pem_to_private_key};
pub use pki::{
    Pki, ADMIN_CERT_FILE, ADMIN_KEY_FILE, CA_CERT_FILE, CA_KEY_FILE, DEFAULT_CLUSTER_NAME,
    SERVING_CERT_FILE, SERVING_KEY_FILE,
};
pub use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Loads or creates the PKI in `dir`; same as [`Pki::load_or_create`].
pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Pki, CertError> {
    Pki::load_or_create(dir, hosts)
}
