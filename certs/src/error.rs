//! Error type shared by every function of this crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while loading, generating or serialising
/// certificates, keys and kubeconfig files.
///
/// Variants that concern a file carry its path so that the message tells the
/// operator which file to look at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// An I/O operation on `path` failed.
    #[error("failed to {action} {}: {source}", path.display())]
    Io {
        /// What was attempted, e.g. `"read"` or `"write"`.
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// A certificate (from a file or from memory) could not be parsed.
    #[error("invalid certificate in {origin}: {reason}")]
    InvalidCertificate {
        /// Where the certificate came from: a file path or a short description.
        origin: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A private key (from a file or from memory) could not be parsed.
    #[error("invalid private key in {origin}: {reason}")]
    InvalidKey {
        /// Where the key came from: a file path or a short description.
        origin: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A private key does not belong to the certificate it is paired with.
    #[error("private key {key_origin} does not match the public key of certificate {cert_origin}")]
    KeyMismatch {
        /// Where the certificate came from.
        cert_origin: String,
        /// Where the key came from.
        key_origin: String,
    },

    /// Only one half of the CA (certificate or key) exists on disk.
    ///
    /// The CA is never regenerated silently; the operator has to restore the
    /// missing file or remove the remaining one.
    #[error(
        "incomplete CA: {} exists but {} is missing; restore the missing file, \
         or remove both to generate a new CA (all issued certificates become invalid)",
        present.display(),
        missing.display()
    )]
    IncompleteCa {
        /// The CA file that exists.
        present: PathBuf,
        /// The CA file that is missing.
        missing: PathBuf,
    },

    /// The CA certificate is expired, so nothing it signs would be trusted.
    #[error("CA certificate {} expired at {not_after}; replace the CA", path.display())]
    CaExpired {
        /// Path of the CA certificate.
        path: PathBuf,
        /// The CA's notAfter time (RFC 3339).
        not_after: String,
    },

    /// A requested host name is neither an IP address nor a valid DNS name.
    #[error("invalid host {host:?} for a certificate: {reason}")]
    InvalidHost {
        /// The rejected value.
        host: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The parameters of a certificate request are not acceptable.
    #[error("invalid certificate request: {0}")]
    InvalidRequest(String),

    /// Certificate or key generation failed inside `rcgen`.
    #[error("failed to {context}: {source}")]
    Generate {
        /// What was being generated.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },

    /// The kubeconfig options are inconsistent (e.g. a client certificate
    /// without its key).
    #[error("invalid kubeconfig options: {0}")]
    InvalidKubeconfig(String),

    /// The kubeconfig could not be serialised to YAML.
    #[error("failed to serialize kubeconfig: {0}")]
    Yaml(#[source] serde_saphyr::SerializeError),
}

impl CertError {
    /// Builds a [`CertError::Io`].
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CertError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// Builds a [`CertError::Generate`]; meant for `map_err`.
    pub(crate) fn generate(context: &'static str) -> impl FnOnce(rcgen::Error) -> Self {
        move |source| CertError::Generate { context, source }
    }
}
