//! Certificate profiles (CA, serving, client) and signing with the CA.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use crate::pem::{encode_pem, key_matches_cert, key_pair_from_pem, leaf_from_pem};
use crate::{der, CertError};

/// Common name of the generated CA.
pub(crate) const CA_COMMON_NAME: &str = "platform-mesh-ca";
/// Common name of the serving certificate.
pub(crate) const SERVING_COMMON_NAME: &str = "platform-mesh";
/// Common name (user name) of the admin client certificate.
pub(crate) const ADMIN_COMMON_NAME: &str = "admin";
/// Organization (group) of the admin client certificate.
pub(crate) const ADMIN_GROUP: &str = "system:masters";
/// Names every serving certificate is valid for, besides the requested hosts.
pub(crate) const DEFAULT_SERVING_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Lifetime of the CA.
const CA_VALIDITY_DAYS: i64 = 3650;
/// Lifetime of the serving and admin certificates.
pub(crate) const LEAF_VALIDITY_DAYS: u32 = 365;
/// Leaf certificates are re-issued when they expire sooner than this.
pub(crate) const RENEW_BEFORE: Duration = Duration::days(30);
/// `notBefore` is back-dated by this much to tolerate clock skew.
const BACKDATE: Duration = Duration::minutes(5);

/// A host a serving certificate must be valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// An IP address (IP SAN).
    Ip(IpAddr),
    /// A DNS name, lower-cased, without trailing dot (DNS SAN).
    Dns(String),
}

impl Host {
    /// Parses one requested host. Surrounding whitespace and IPv6 brackets are
    /// ignored; empty input yields `None`.
    pub(crate) fn parse(raw: &str) -> Result<Option<Host>, CertError> {
        let s = raw.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let unbracketed = s
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(s);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(Some(Host::Ip(ip)));
        }
        let invalid = |reason| CertError::InvalidHost {
            host: raw.to_string(),
            reason,
        };
        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        if name.len() > 253 {
            return Err(invalid("DNS name longer than 253 characters"));
        }
        for (i, label) in name.split('.').enumerate() {
            if label.is_empty() || label.len() > 63 {
                return Err(invalid("DNS label must have 1 to 63 characters"));
            }
            if i == 0 && label == "*" {
                continue;
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(
                    "not an IP address, and DNS names may only contain letters, digits, '-', '_' and '.' (and a leading '*.')",
                ));
            }
        }
        Ok(Some(Host::Dns(name)))
    }

    /// Converts to an `rcgen` subject alternative name.
    fn to_san(&self) -> Result<SanType, CertError> {
        Ok(match self {
            Host::Ip(ip) => SanType::IpAddress(*ip),
            Host::Dns(name) => SanType::DnsName(
                name.as_str()
                    .try_into()
                    .map_err(CertError::generate("encode DNS name"))?,
            ),
        })
    }

    /// Whether `cert` carries a SAN for this host.
    fn covered_by(&self, cert: &X509Certificate<'_>) -> bool {
        let Ok(Some(san)) = cert.subject_alternative_name() else {
            return false;
        };
        san.value.general_names.iter().any(|gn| match (self, gn) {
            (Host::Dns(want), GeneralName::DNSName(have)) => have
                .strip_suffix('.')
                .unwrap_or(have)
                .eq_ignore_ascii_case(want),
            (Host::Ip(want), GeneralName::IPAddress(have)) => match want {
                IpAddr::V4(v4) => *have == v4.octets().as_slice(),
                IpAddr::V6(v6) => *have == v6.octets().as_slice(),
            },
            _ => false,
        })
    }
}

/// The default serving hosts plus `extra`, parsed and without duplicates.
pub(crate) fn serving_hosts(extra: &[String]) -> Result<Vec<Host>, CertError> {
    let mut hosts: Vec<Host> = Vec::new();
    let defaults = DEFAULT_SERVING_HOSTS.iter().map(|s| Host::parse(s));
    for host in defaults.chain(extra.iter().map(|s| Host::parse(s))) {
        if let Some(host) = host? {
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        }
    }
    Ok(hosts)
}

/// Whether the certificate `cert_der` has a SAN for every host in `hosts`.
pub(crate) fn covers_hosts(cert_der: &[u8], hosts: &[Host]) -> bool {
    match X509Certificate::from_der(cert_der) {
        Ok((_, cert)) => hosts.iter().all(|h| h.covered_by(&cert)),
        Err(_) => false,
    }
}

/// Whether `cert_der` is still valid for at least [`RENEW_BEFORE`].
pub(crate) fn valid_for_renewal_window(cert_der: &[u8]) -> bool {
    match X509Certificate::from_der(cert_der) {
        Ok((_, cert)) => cert
            .validity()
            .time_to_expiration()
            .is_some_and(|left| left >= RENEW_BEFORE),
        Err(_) => false,
    }
}

/// Generates a fresh self-signed CA. Returns `(cert_pem, key_pem)`.
pub(crate) fn generate_ca() -> Result<(String, String), CertError> {
    let key = KeyPair::generate().map_err(CertError::generate("generate CA key"))?;
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(CA_VALIDITY_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(CertError::generate("self-sign CA certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A loaded CA that can sign leaf certificates.
pub(crate) struct CaSigner {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    not_after: OffsetDateTime,
}

impl CaSigner {
    /// Loads the CA from PEM text; the paths are used in error messages only.
    ///
    /// Fails if either part does not parse, the certificate is not a CA, the
    /// key does not match, or the CA has expired.
    pub(crate) fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<Self, CertError> {
        let cert_origin = cert_path.display().to_string();
        let key_origin = key_path.display().to_string();
        let invalid = |reason: String| CertError::InvalidCertificate {
            origin: cert_origin.clone(),
            reason,
        };

        let cert_der = leaf_from_pem(cert_pem, &cert_origin)?;
        let key = key_pair_from_pem(key_pem, &key_origin)?;
        let (_, cert) = X509Certificate::from_der(&cert_der).map_err(|e| invalid(e.to_string()))?;
        let is_ca = matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
        if !is_ca {
            return Err(invalid(
                "not a CA certificate (basicConstraints CA:TRUE missing)".to_string(),
            ));
        }
        if key_matches_cert(&key, &cert_der) != Some(true) {
            return Err(CertError::KeyMismatch {
                cert_origin,
                key_origin,
            });
        }
        let not_after = cert.validity().not_after.to_datetime();
        if not_after <= OffsetDateTime::now_utc() {
            return Err(CertError::CaExpired {
                path: PathBuf::from(cert_path),
                not_after: not_after.to_string(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| invalid(format!("cannot use as issuer: {e}")))?;
        Ok(CaSigner {
            issuer,
            cert_der,
            not_after,
        })
    }

    /// Whether `cert_der` carries a valid signature of this CA.
    pub(crate) fn has_signed(&self, cert_der: &[u8]) -> bool {
        let Ok((_, ca)) = X509Certificate::from_der(&self.cert_der) else {
            return false;
        };
        match X509Certificate::from_der(cert_der) {
            Ok((_, cert)) => {
                cert.issuer() == ca.subject()
                    && cert.verify_signature(Some(ca.public_key())).is_ok()
            }
            Err(_) => false,
        }
    }

    /// Leaf parameters valid for `days` (capped at the CA's own expiry).
    fn leaf_params(&self, days: u32, common_name: &str) -> CertificateParams {
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = (now + Duration::days(i64::from(days))).min(self.not_after);
        params
    }

    /// Issues a serving certificate (CN `platform-mesh`, serverAuth) for
    /// `hosts`. Returns `(cert_pem, key_pem)`.
    pub(crate) fn issue_serving(&self, hosts: &[Host]) -> Result<(String, String), CertError> {
        let mut params = self.leaf_params(LEAF_VALIDITY_DAYS, SERVING_COMMON_NAME);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.subject_alt_names = hosts.iter().map(Host::to_san).collect::<Result<_, _>>()?;
        let key = KeyPair::generate().map_err(CertError::generate("generate serving key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CertError::generate("sign serving certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a client certificate (clientAuth) whose CN is the user name and
    /// whose O values are the groups. Returns `(cert_pem, key_pem)`.
    pub(crate) fn issue_client(
        &self,
        common_name: &str,
        organizations: &[String],
        valid_days: u32,
    ) -> Result<(String, String), CertError> {
        validate_name_value("common name", common_name)?;
        for org in organizations {
            validate_name_value("organization", org)?;
        }
        if valid_days == 0 {
            return Err(CertError::InvalidRequest(
                "valid_days must be at least 1".to_string(),
            ));
        }

        let mut params = self.leaf_params(valid_days, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if let [org] = organizations {
            // rcgen keeps insertion order; put O before CN as kubeadm does.
            let mut dn = DistinguishedName::new();
            dn.push(DnType::OrganizationName, org.as_str());
            dn.push(DnType::CommonName, common_name);
            params.distinguished_name = dn;
        }
        let key = KeyPair::generate().map_err(CertError::generate("generate client key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CertError::generate("sign client certificate"))?;

        let cert_pem = if organizations.len() > 1 {
            // rcgen holds at most one value per attribute type.
            let subject = der::encode_name(common_name, organizations);
            let der = der::replace_subject(cert.der(), &subject, self.issuer.key())?;
            encode_pem("CERTIFICATE", &der)
        } else {
            cert.pem()
        };
        Ok((cert_pem, key.serialize_pem()))
    }
}

/// Rejects empty values and control characters in subject attributes.
fn validate_name_value(what: &str, value: &str) -> Result<(), CertError> {
    if value.trim().is_empty() {
        return Err(CertError::InvalidRequest(format!(
            "{what} must not be empty"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(CertError::InvalidRequest(format!(
            "{what} {value:?} contains control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_parsing() {
        let parse = |s: &str| Host::parse(s).expect("valid host");
        assert_eq!(parse("  "), None);
        assert_eq!(parse("[::1]"), Some(Host::Ip("::1".parse().expect("ip"))));
        assert_eq!(
            parse("10.1.2.3"),
            Some(Host::Ip("10.1.2.3".parse().expect("ip")))
        );
        assert_eq!(
            parse("API.Example.COM."),
            Some(Host::Dns("api.example.com".into()))
        );
        assert_eq!(
            parse("*.apps.local"),
            Some(Host::Dns("*.apps.local".into()))
        );
        for bad in [
            "a..b",
            "foo bar",
            "https://x",
            "a.*.b",
            "ü.example",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(Host::parse(bad), Err(CertError::InvalidHost { .. })),
                "{bad:?} accepted"
            );
        }
        let hosts = serving_hosts(&["localhost".into(), "::1".into(), "x".into()]).expect("hosts");
        assert_eq!(hosts.len(), 4);
    }
}
