//! Mapping a verified client certificate to a Kubernetes user.

use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::CertError;

/// The Kubernetes identity carried by a client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientIdentity {
    /// The user name: the subject's common name (CN).
    pub user: String,
    /// The groups: every organization (O) value of the subject, in order.
    pub groups: Vec<String>,
}

/// Extracts the user name (subject CN) and groups (all subject O values) from
/// a DER client certificate, the way the Kubernetes x509 authenticator does.
///
/// This only reads the subject; the caller must already have verified the
/// certificate chain (e.g. via the TLS handshake). Fails if the certificate
/// does not parse, has no or an empty CN, or has a CN/O that is not a string.
pub fn client_identity(cert_der: &[u8]) -> Result<ClientIdentity, CertError> {
    let invalid = |reason: String| CertError::InvalidCertificate {
        origin: "client certificate".to_string(),
        reason,
    };
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| invalid(e.to_string()))?;
    let subject = cert.subject();

    let user = match subject.iter_common_name().next() {
        Some(cn) => cn
            .as_str()
            .map_err(|e| invalid(format!("common name is not a string: {e}")))?,
        None => return Err(invalid("subject has no common name".to_string())),
    };
    if user.is_empty() {
        return Err(invalid("subject common name is empty".to_string()));
    }
    let groups = subject
        .iter_organization()
        .map(|o| {
            o.as_str()
                .map(str::to_string)
                .map_err(|e| invalid(format!("organization is not a string: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    Ok(ClientIdentity {
        user: user.to_string(),
        groups,
    })
}
