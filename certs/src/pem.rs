//! PEM encoding/decoding helpers and loading of operator-supplied
//! certificate/key files.

use std::path::Path;

use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::fsutil;
use crate::CertError;

/// Encodes `der` as a PEM block with the given label (e.g. `CERTIFICATE`),
/// using 64-character lines and `\n` line endings.
pub fn encode_pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    // Base64 output is ASCII, so splitting at byte offsets is safe.
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Decodes every `CERTIFICATE` block of `pem`; each one must be a parseable
/// X.509 certificate and there must be at least one. `origin` names the source
/// in error messages.
pub(crate) fn cert_chain_from_pem(
    pem: &str,
    origin: &str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let invalid = |reason: String| CertError::InvalidCertificate {
        origin: origin.to_string(),
        reason,
    };
    let mut chain = Vec::new();
    for item in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = item.map_err(|e| invalid(format!("malformed PEM: {e}")))?;
        check_x509(&der)
            .map_err(|reason| invalid(format!("certificate #{}: {reason}", chain.len() + 1)))?;
        chain.push(der);
    }
    if chain.is_empty() {
        return Err(invalid(
            "no PEM block labelled CERTIFICATE found".to_string(),
        ));
    }
    Ok(chain)
}

/// Decodes the first certificate of `pem` (see [`cert_chain_from_pem`]).
pub(crate) fn leaf_from_pem(pem: &str, origin: &str) -> Result<CertificateDer<'static>, CertError> {
    let mut chain = cert_chain_from_pem(pem, origin)?;
    // cert_chain_from_pem never returns an empty chain.
    Ok(chain.swap_remove(0))
}

/// Checks that `der` is exactly one well-formed X.509 certificate.
fn check_x509(der: &[u8]) -> Result<(), String> {
    match X509Certificate::from_der(der) {
        Ok(([], _)) => Ok(()),
        Ok(_) => Err("trailing data after the certificate".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Decodes the private key of `pem` (PKCS#8 `PRIVATE KEY`, PKCS#1
/// `RSA PRIVATE KEY` or SEC1 `EC PRIVATE KEY`) and checks it is well-formed
/// DER. `origin` names the source in error messages.
pub(crate) fn private_key_from_pem(
    pem: &str,
    origin: &str,
) -> Result<PrivateKeyDer<'static>, CertError> {
    let invalid = |reason: String| CertError::InvalidKey {
        origin: origin.to_string(),
        reason,
    };
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => invalid(
            "no PEM block labelled PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY found"
                .to_string(),
        ),
        other => invalid(format!("malformed PEM: {other}")),
    })?;
    match x509_parser::der_parser::parse_der(key.secret_der()) {
        Ok((rest, obj)) if rest.is_empty() && obj.as_sequence().is_ok() => Ok(key),
        Ok(_) => Err(invalid("key is not a single DER SEQUENCE".to_string())),
        Err(e) => Err(invalid(format!("malformed DER: {e}"))),
    }
}

/// Loads an `rcgen` key pair (PKCS#8, ECDSA P-256/P-384, Ed25519 or RSA) from
/// PEM, for signing.
pub(crate) fn key_pair_from_pem(pem: &str, origin: &str) -> Result<rcgen::KeyPair, CertError> {
    let key = private_key_from_pem(pem, origin)?;
    rcgen::KeyPair::try_from(&key).map_err(|e| CertError::InvalidKey {
        origin: origin.to_string(),
        reason: format!("unsupported key (a PKCS#8 ECDSA, Ed25519 or RSA key is required): {e}"),
    })
}

/// Returns whether `key` is the private half of the public key in `cert_der`.
/// `None` when the certificate cannot be parsed.
pub(crate) fn key_matches_cert(key: &rcgen::KeyPair, cert_der: &[u8]) -> Option<bool> {
    let (_, cert) = X509Certificate::from_der(cert_der).ok()?;
    Some(cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw())
}

/// Parses a PEM bundle into the DER certificates it contains, in order (leaf
/// first for a chain), e.g. to build a `rustls` server configuration.
///
/// Fails if there is no `CERTIFICATE` block or if any block is not a valid
/// X.509 certificate.
pub fn pem_to_cert_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    cert_chain_from_pem(pem, "PEM data")
}

/// Parses a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) into DER, e.g. to
/// build a `rustls` server configuration.
pub fn pem_to_private_key(pem: &str) -> Result<PrivateKeyDer<'static>, CertError> {
    private_key_from_pem(pem, "PEM data")
}

/// Reads an operator-supplied certificate and private key (e.g. from
/// `--tls-cert-file` / `--tls-private-key-file`) and returns their PEM text.
///
/// The certificate file may hold a chain (leaf first); every block must parse
/// as X.509. The key file must hold a PKCS#8, PKCS#1 or SEC1 private key. When
/// the key type is one this crate can load (PKCS#8 ECDSA P-256/P-384, Ed25519,
/// RSA), it is also checked to match the leaf certificate. Errors name the
/// offending file.
pub fn load_pem_files(cert: &Path, key: &Path) -> Result<(String, String), CertError> {
    let cert_pem = fsutil::read_required(cert)?;
    let key_pem = fsutil::read_required(key)?;
    let cert_origin = cert.display().to_string();
    let key_origin = key.display().to_string();

    let chain = cert_chain_from_pem(&cert_pem, &cert_origin)?;
    let key_der = private_key_from_pem(&key_pem, &key_origin)?;
    if let Ok(pair) = rcgen::KeyPair::try_from(&key_der) {
        if key_matches_cert(&pair, &chain[0]) == Some(false) {
            return Err(CertError::KeyMismatch {
                cert_origin,
                key_origin,
            });
        }
    }
    Ok((cert_pem, key_pem))
}
