//! The on-disk PKI of a platform-mesh data directory: CA, serving
//! certificate and admin client certificate.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::fsutil::{self, MODE_PRIVATE, MODE_PUBLIC};
use crate::issue::{self, CaSigner, Host, ADMIN_COMMON_NAME, ADMIN_GROUP, LEAF_VALIDITY_DAYS};
use crate::kubeconfig::KubeconfigOptions;
use crate::pem::{key_matches_cert, key_pair_from_pem, leaf_from_pem};
use crate::CertError;

/// File name of the CA certificate inside the PKI directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the PKI directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// File name of the serving certificate inside the PKI directory.
pub const SERVING_CERT_FILE: &str = "serving.crt";
/// File name of the serving private key inside the PKI directory.
pub const SERVING_KEY_FILE: &str = "serving.key";
/// File name of the admin client certificate inside the PKI directory.
pub const ADMIN_CERT_FILE: &str = "admin.crt";
/// File name of the admin client private key inside the PKI directory.
pub const ADMIN_KEY_FILE: &str = "admin.key";

/// Name used for the cluster and context of generated admin kubeconfigs.
pub const DEFAULT_CLUSTER_NAME: &str = "platform-mesh";

/// The certificates and keys of a platform-mesh instance, as PEM text.
///
/// Obtained from [`Pki::load_or_create`]. Holds the CA key, so it can issue
/// further certificates. `Debug` output omits the private keys.
#[derive(Clone)]
pub struct Pki {
    dir: PathBuf,
    ca_cert_pem: String,
    ca_key_pem: String,
    serving_cert_pem: String,
    serving_key_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
    written: Vec<&'static str>,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Loads the PKI from `dir`, creating whatever is missing.
    ///
    /// On the first call (empty or missing `dir`, created with its parents)
    /// this generates:
    /// - a self-signed ECDSA P-256 CA, CN `platform-mesh-ca`, valid 10 years
    ///   ([`CA_CERT_FILE`], [`CA_KEY_FILE`]);
    /// - a serving certificate, CN `platform-mesh`, serverAuth, valid 1 year,
    ///   with SANs `localhost`, `127.0.0.1`, `::1` and every entry of `hosts`
    ///   (IP addresses as IP SANs, anything else as DNS SANs)
    ///   ([`SERVING_CERT_FILE`], [`SERVING_KEY_FILE`]);
    /// - an admin client certificate, CN `admin`, O `system:masters`,
    ///   clientAuth, valid 1 year ([`ADMIN_CERT_FILE`], [`ADMIN_KEY_FILE`]).
    ///
    /// Later calls reuse the files unchanged. The serving certificate is
    /// re-issued (with the existing CA) when it lacks a SAN for a requested
    /// host, expires within 30 days, is not signed by the CA, does not match
    /// its key, or is missing or unparseable; the admin certificate likewise
    /// (except for the SAN rule). The CA itself is never replaced: if its
    /// files are unreadable, corrupt, mismatched, expired or only half
    /// present, an error naming the file is returned.
    ///
    /// Files are written atomically (temporary file + rename); private keys
    /// get mode 0600 on unix, certificates 0644.
    pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Pki, CertError> {
        // Validate the hosts before touching the disk.
        let hosts = issue::serving_hosts(hosts)?;
        fsutil::create_dir_all(dir)?;
        let mut written = Vec::new();

        let (ca_cert_pem, ca_key_pem) = load_or_create_ca(dir, &mut written)?;
        let ca = CaSigner::from_pem(
            &ca_cert_pem,
            &ca_key_pem,
            &dir.join(CA_CERT_FILE),
            &dir.join(CA_KEY_FILE),
        )?;

        let (serving_cert_pem, serving_key_pem) = ensure_leaf(
            dir,
            (SERVING_CERT_FILE, SERVING_KEY_FILE),
            &ca,
            Some(&hosts),
            || ca.issue_serving(&hosts),
            &mut written,
        )?;
        let (admin_cert_pem, admin_key_pem) = ensure_leaf(
            dir,
            (ADMIN_CERT_FILE, ADMIN_KEY_FILE),
            &ca,
            None,
            || {
                ca.issue_client(
                    ADMIN_COMMON_NAME,
                    &[ADMIN_GROUP.to_string()],
                    LEAF_VALIDITY_DAYS,
                )
            },
            &mut written,
        )?;

        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_cert_pem,
            ca_key_pem,
            serving_cert_pem,
            serving_key_pem,
            admin_cert_pem,
            admin_key_pem,
            written,
        })
    }

    /// The directory the PKI was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (PEM).
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The serving certificate (PEM).
    pub fn serving_cert_pem(&self) -> &str {
        &self.serving_cert_pem
    }

    /// The private key of the serving certificate (PKCS#8 PEM).
    pub fn serving_key_pem(&self) -> &str {
        &self.serving_key_pem
    }

    /// The admin client certificate (PEM).
    pub fn admin_cert_pem(&self) -> &str {
        &self.admin_cert_pem
    }

    /// The private key of the admin client certificate (PKCS#8 PEM).
    pub fn admin_key_pem(&self) -> &str {
        &self.admin_key_pem
    }

    /// Base64 of the CA certificate PEM, as expected in the `caBundle` field
    /// of APIService and webhook configurations.
    pub fn ca_bundle_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_cert_pem.as_bytes())
    }

    /// File names (relative to [`Pki::dir`]) that this `load_or_create` call
    /// wrote, in order; empty when everything was reused.
    pub fn written_files(&self) -> &[&'static str] {
        &self.written
    }

    /// Kubeconfig options for the admin user against `server` (e.g.
    /// `https://127.0.0.1:6443`), with cluster and context named
    /// [`DEFAULT_CLUSTER_NAME`] and user `admin`.
    pub fn admin_kubeconfig_options(&self, server: &str) -> KubeconfigOptions {
        KubeconfigOptions {
            server: server.to_string(),
            cluster_name: DEFAULT_CLUSTER_NAME.to_string(),
            user_name: ADMIN_COMMON_NAME.to_string(),
            context_name: DEFAULT_CLUSTER_NAME.to_string(),
            ca_pem: self.ca_cert_pem.clone(),
            client_cert_pem: Some(self.admin_cert_pem.clone()),
            client_key_pem: Some(self.admin_key_pem.clone()),
            workspace: None,
            token: None,
        }
    }

    /// Issues a client certificate signed by the CA: `common_name` becomes
    /// the Kubernetes user name and each entry of `organizations` a group
    /// (one O attribute each). Valid for `valid_days` (at least 1), capped at
    /// the CA's expiry. Returns `(cert_pem, key_pem)`; nothing is written to
    /// disk.
    pub fn issue_client_certificate(
        &self,
        common_name: &str,
        organizations: &[String],
        valid_days: u32,
    ) -> Result<(String, String), CertError> {
        self.signer()?
            .issue_client(common_name, organizations, valid_days)
    }

    /// Issues a serving certificate signed by the CA for `localhost`,
    /// `127.0.0.1`, `::1` and `hosts`, valid 1 year (capped at the CA's
    /// expiry). Returns `(cert_pem, key_pem)`; nothing is written to disk.
    pub fn issue_serving_certificate(
        &self,
        hosts: &[String],
    ) -> Result<(String, String), CertError> {
        let hosts = issue::serving_hosts(hosts)?;
        self.signer()?.issue_serving(&hosts)
    }

    /// Loads the CA for signing.
    fn signer(&self) -> Result<CaSigner, CertError> {
        CaSigner::from_pem(
            &self.ca_cert_pem,
            &self.ca_key_pem,
            &self.dir.join(CA_CERT_FILE),
            &self.dir.join(CA_KEY_FILE),
        )
    }
}

/// Reads the CA files, or generates and writes a new CA when both are absent.
/// The content is validated later by [`CaSigner::from_pem`].
fn load_or_create_ca(
    dir: &Path,
    written: &mut Vec<&'static str>,
) -> Result<(String, String), CertError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    match (
        fsutil::read_optional(&cert_path)?,
        fsutil::read_optional(&key_path)?,
    ) {
        (Some(cert), Some(key)) => Ok((cert, key)),
        (None, None) => {
            let (cert, key) = issue::generate_ca()?;
            // Key first: a present ca.crt then always has its key on disk.
            fsutil::write_atomic(&key_path, key.as_bytes(), MODE_PRIVATE)?;
            fsutil::write_atomic(&cert_path, cert.as_bytes(), MODE_PUBLIC)?;
            written.extend([CA_KEY_FILE, CA_CERT_FILE]);
            Ok((cert, key))
        }
        (Some(_), None) => Err(CertError::IncompleteCa {
            present: cert_path,
            missing: key_path,
        }),
        (None, Some(_)) => Err(CertError::IncompleteCa {
            present: key_path,
            missing: cert_path,
        }),
    }
}

/// Returns the leaf certificate and key stored under `files` in `dir` if
/// they are still usable, otherwise calls `issue` and writes the result.
fn ensure_leaf(
    dir: &Path,
    (cert_file, key_file): (&'static str, &'static str),
    ca: &CaSigner,
    hosts: Option<&[Host]>,
    issue: impl FnOnce() -> Result<(String, String), CertError>,
    written: &mut Vec<&'static str>,
) -> Result<(String, String), CertError> {
    let cert_path = dir.join(cert_file);
    let key_path = dir.join(key_file);
    let cert = fsutil::read_optional(&cert_path)?;
    let key = fsutil::read_optional(&key_path)?;
    if let (Some(cert), Some(key)) = (cert, key) {
        if leaf_is_usable(&cert, &key, ca, hosts) {
            return Ok((cert, key));
        }
    }
    let (cert, key) = issue()?;
    // Key first; a crash in between leaves a mismatched pair, which the next
    // call detects and repairs.
    fsutil::write_atomic(&key_path, key.as_bytes(), MODE_PRIVATE)?;
    fsutil::write_atomic(&cert_path, cert.as_bytes(), MODE_PUBLIC)?;
    written.extend([key_file, cert_file]);
    Ok((cert, key))
}

/// Whether an existing leaf can be kept: it parses, matches its key, is
/// signed by `ca`, is not about to expire, and covers `hosts` (if given).
fn leaf_is_usable(cert_pem: &str, key_pem: &str, ca: &CaSigner, hosts: Option<&[Host]>) -> bool {
    let (Ok(der), Ok(key)) = (
        leaf_from_pem(cert_pem, "leaf certificate"),
        key_pair_from_pem(key_pem, "leaf key"),
    ) else {
        return false;
    };
    key_matches_cert(&key, &der) == Some(true)
        && ca.has_signed(&der)
        && issue::valid_for_renewal_window(&der)
        && hosts.is_none_or(|h| issue::covers_hosts(&der, h))
}

#[cfg(test)]
mod tests;
