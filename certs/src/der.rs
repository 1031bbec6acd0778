//! Minimal DER plumbing for the one thing `rcgen` cannot do: a subject with
//! several Organization (O) attributes. Kubernetes maps every O value of a
//! client certificate to a group, so a user in several groups needs them all.
//!
//! The certificate is first produced by `rcgen`; its subject is then replaced
//! by a hand-encoded Name and the TBS part is signed again with the CA key.

use rcgen::SigningKey;

use crate::CertError;

/// DER tag of SEQUENCE (constructed).
const TAG_SEQUENCE: u8 = 0x30;
/// DER tag of SET (constructed).
const TAG_SET: u8 = 0x31;
/// DER tag of UTF8String.
const TAG_UTF8_STRING: u8 = 0x0c;
/// DER tag of BIT STRING.
const TAG_BIT_STRING: u8 = 0x03;
/// DER tag of the explicit `[0]` version field of a TBSCertificate.
const TAG_VERSION: u8 = 0xa0;
/// Encoded OBJECT IDENTIFIER 2.5.4.3 (commonName).
const OID_COMMON_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
/// Encoded OBJECT IDENTIFIER 2.5.4.10 (organizationName).
const OID_ORGANIZATION: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];

/// Appends a DER length.
fn push_len(len: usize, out: &mut Vec<u8>) {
    if len < 0x80 {
        // Fits in the short form.
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let significant = &bytes[skip..];
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
}

/// Encodes one tag-length-value element.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    push_len(content.len(), &mut out);
    out.extend_from_slice(content);
    out
}

/// Reads the element at the start of `input`.
/// Returns `(tag, header length, total length)`.
fn read_tlv(input: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *input.first()?;
    if tag & 0x1f == 0x1f {
        // High tag numbers never occur in the structures handled here.
        return None;
    }
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = input
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let total = header.checked_add(len)?;
    (total <= input.len()).then_some((tag, header, total))
}

/// Splits the content of a constructed element into its child elements.
fn children(mut content: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !content.is_empty() {
        let (_, _, total) = read_tlv(content)?;
        out.push(&content[..total]);
        content = &content[total..];
    }
    Some(out)
}

/// Returns the content of `input` if it is exactly one element with `tag`.
fn content_of(input: &[u8], tag: u8) -> Option<&[u8]> {
    let (t, header, total) = read_tlv(input)?;
    (t == tag && total == input.len()).then(|| &input[header..])
}

/// Encodes an X.501 Name holding one O attribute per entry of
/// `organizations` (in order) followed by the common name.
pub(crate) fn encode_name(common_name: &str, organizations: &[String]) -> Vec<u8> {
    let rdn = |oid: &[u8], value: &str| {
        let mut atv = oid.to_vec();
        atv.extend(tlv(TAG_UTF8_STRING, value.as_bytes()));
        tlv(TAG_SET, &tlv(TAG_SEQUENCE, &atv))
    };
    let mut rdns = Vec::new();
    for org in organizations {
        rdns.extend(rdn(OID_ORGANIZATION, org));
    }
    rdns.extend(rdn(OID_COMMON_NAME, common_name));
    tlv(TAG_SEQUENCE, &rdns)
}

/// Replaces the subject of the certificate `cert_der` with `subject` (an
/// encoded Name) and signs the result with `signer`, which must be the key
/// that signed `cert_der` (the signature algorithm is kept).
pub(crate) fn replace_subject(
    cert_der: &[u8],
    subject: &[u8],
    signer: &impl SigningKey,
) -> Result<Vec<u8>, CertError> {
    let malformed = || CertError::InvalidCertificate {
        origin: "generated certificate".to_string(),
        reason: "unexpected DER structure while rewriting the subject".to_string(),
    };

    let cert = content_of(cert_der, TAG_SEQUENCE).ok_or_else(malformed)?;
    let parts = children(cert).ok_or_else(malformed)?;
    let [tbs, signature_algorithm, _signature] = parts.as_slice() else {
        return Err(malformed());
    };
    let tbs_fields =
        children(content_of(tbs, TAG_SEQUENCE).ok_or_else(malformed)?).ok_or_else(malformed)?;
    // serialNumber, signature, issuer, validity, subject (+ optional version first).
    let subject_index = match tbs_fields.first() {
        Some(first) if first.first() == Some(&TAG_VERSION) => 5,
        _ => 4,
    };
    if tbs_fields.len() <= subject_index {
        return Err(malformed());
    }

    let mut new_tbs_content = Vec::with_capacity(tbs.len() + subject.len());
    for (i, field) in tbs_fields.iter().enumerate() {
        if i == subject_index {
            new_tbs_content.extend_from_slice(subject);
        } else {
            new_tbs_content.extend_from_slice(field);
        }
    }
    let new_tbs = tlv(TAG_SEQUENCE, &new_tbs_content);
    let signature = signer
        .sign(&new_tbs)
        .map_err(CertError::generate("sign certificate"))?;

    let mut bit_string = Vec::with_capacity(signature.len() + 1);
    bit_string.push(0); // no unused bits
    bit_string.extend_from_slice(&signature);

    let mut body = new_tbs;
    body.extend_from_slice(signature_algorithm);
    body.extend(tlv(TAG_BIT_STRING, &bit_string));
    Ok(tlv(TAG_SEQUENCE, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_round_trip() {
        for len in [0usize, 1, 127, 128, 255, 256, 65535, 65536, 1 << 20] {
            let content = vec![7u8; len];
            let encoded = tlv(TAG_SEQUENCE, &content);
            let (tag, header, total) = read_tlv(&encoded).expect("valid TLV");
            assert_eq!(tag, TAG_SEQUENCE);
            assert_eq!(total, encoded.len());
            assert_eq!(total - header, len);
        }
    }

    #[test]
    fn truncated_input_is_rejected() {
        let encoded = tlv(TAG_SEQUENCE, &[1, 2, 3]);
        assert!(read_tlv(&encoded[..encoded.len() - 1]).is_none());
        assert!(read_tlv(&[0x30, 0x85, 0, 0, 0, 0, 0]).is_none());
        assert!(read_tlv(&[]).is_none());
    }

    #[test]
    fn name_parses_with_x509_parser() {
        use x509_parser::prelude::FromDer;
        let der = encode_name("alice", &["dev".to_string(), "ops".to_string()]);
        let (rest, name) = x509_parser::x509::X509Name::from_der(&der).expect("valid Name");
        assert!(rest.is_empty());
        let orgs: Vec<_> = name
            .iter_organization()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        assert_eq!(orgs, ["dev", "ops"]);
        let cn = name.iter_common_name().next().expect("CN").as_str();
        assert_eq!(cn.ok(), Some("alice"));
    }
}
