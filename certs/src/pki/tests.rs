use std::fs;

use base64::Engine as _;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
};
use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use super::*;
use crate::{
    client_identity, kubeconfig_yaml, load_pem_files, pem_to_cert_chain, pem_to_private_key,
};

const ALL_FILES: [&str; 6] = [
    CA_CERT_FILE,
    CA_KEY_FILE,
    SERVING_CERT_FILE,
    SERVING_KEY_FILE,
    ADMIN_CERT_FILE,
    ADMIN_KEY_FILE,
];

fn hosts(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn der(pem: &str) -> Vec<u8> {
    pem_to_cert_chain(pem).expect("valid PEM certificate")[0].to_vec()
}

fn read_all(dir: &Path) -> Vec<Vec<u8>> {
    ALL_FILES
        .iter()
        .map(|f| fs::read(dir.join(f)).expect("file exists"))
        .collect()
}

/// Asserts that `cert_pem` carries a valid signature of the CA `ca_pem`.
fn assert_signed_by(cert_pem: &str, ca_pem: &str) {
    let ca_der = der(ca_pem);
    let cert_der = der(cert_pem);
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("parse CA");
    let (_, cert) = X509Certificate::from_der(&cert_der).expect("parse cert");
    cert.verify_signature(Some(ca.public_key()))
        .expect("signature verifies with the CA public key");
    assert_eq!(cert.issuer(), ca.subject());
}

/// DNS and IP SANs of a certificate, rendered as strings.
fn sans(cert_pem: &str) -> Vec<String> {
    let cert_der = der(cert_pem);
    let (_, cert) = X509Certificate::from_der(&cert_der).expect("parse cert");
    let san = cert
        .subject_alternative_name()
        .expect("valid SAN extension")
        .expect("SAN present");
    san.value
        .general_names
        .iter()
        .map(|gn| match gn {
            GeneralName::DNSName(name) => name.to_string(),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => std::net::IpAddr::from(<[u8; 4]>::try_from(*bytes).expect("v4")).to_string(),
                16 => std::net::IpAddr::from(<[u8; 16]>::try_from(*bytes).expect("v6")).to_string(),
                _ => panic!("bad IP SAN"),
            },
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

/// Overwrites a leaf pair with one signed by the CA in `dir` that expires in
/// `days`.
fn write_short_lived_leaf(dir: &Path, cert_file: &str, key_file: &str, days: i64) {
    let ca_cert = fs::read_to_string(dir.join(CA_CERT_FILE)).expect("ca.crt");
    let ca_key = KeyPair::from_pem(&fs::read_to_string(dir.join(CA_KEY_FILE)).expect("ca.key"))
        .expect("CA key");
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, ca_key).expect("issuer");
    let mut params =
        CertificateParams::new(hosts(&["localhost", "127.0.0.1", "::1"])).expect("params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "system:masters");
    dn.push(DnType::CommonName, "admin");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(days);
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("sign");
    fs::write(dir.join(cert_file), cert.pem()).expect("write cert");
    fs::write(dir.join(key_file), key.serialize_pem()).expect("write key");
}

#[test]
fn first_call_creates_all_files_with_private_keys() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data/pki");
    let pki = Pki::load_or_create(&dir, &[]).expect("create");

    for file in ALL_FILES {
        assert!(dir.join(file).is_file(), "{file} missing");
        assert!(pki.written_files().contains(&file), "{file} not reported");
    }
    assert_eq!(fs::read_dir(&dir).expect("list").count(), 6, "stray files");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| {
            fs::metadata(dir.join(f))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        for key in [CA_KEY_FILE, SERVING_KEY_FILE, ADMIN_KEY_FILE] {
            assert_eq!(mode(key), 0o600, "{key}");
        }
        for cert in [CA_CERT_FILE, SERVING_CERT_FILE, ADMIN_CERT_FILE] {
            assert_eq!(mode(cert) & 0o077 & !0o044, 0, "{cert} writable by others");
        }
    }
    assert_eq!(
        fs::read_to_string(dir.join(CA_CERT_FILE)).expect("read"),
        pki.ca_cert_pem()
    );
    assert_eq!(
        fs::read_to_string(dir.join(SERVING_KEY_FILE)).expect("read"),
        pki.serving_key_pem()
    );
    assert_eq!(
        fs::read_to_string(dir.join(ADMIN_CERT_FILE)).expect("read"),
        pki.admin_cert_pem()
    );
    assert_eq!(pki.dir(), dir);
}

#[test]
fn certificates_have_the_expected_profiles() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki =
        Pki::load_or_create(tmp.path(), &hosts(&["pm.example.com", "10.0.0.7"])).expect("create");

    let ca_der = der(pki.ca_cert_pem());
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("parse CA");
    assert_eq!(
        ca.subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some("platform-mesh-ca")
    );
    assert!(
        ca.basic_constraints()
            .expect("bc")
            .expect("bc present")
            .value
            .ca
    );
    let ku = ca.key_usage().expect("ku").expect("ku present").value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    let ca_days = ca
        .validity()
        .time_to_expiration()
        .expect("valid")
        .whole_days();
    assert!((3640..=3650).contains(&ca_days), "CA valid {ca_days} days");
    ca.verify_signature(None).expect("CA is self-signed");

    assert_signed_by(pki.serving_cert_pem(), pki.ca_cert_pem());
    let serving_der = der(pki.serving_cert_pem());
    let (_, serving) = X509Certificate::from_der(&serving_der).expect("parse serving");
    assert_eq!(
        serving
            .subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some("platform-mesh")
    );
    let eku = serving
        .extended_key_usage()
        .expect("eku")
        .expect("eku present")
        .value;
    assert!(eku.server_auth && !eku.client_auth);
    assert!(!serving.is_ca());
    let days = serving
        .validity()
        .time_to_expiration()
        .expect("valid")
        .whole_days();
    assert!((360..=365).contains(&days), "serving valid {days} days");
    assert_eq!(
        sans(pki.serving_cert_pem()),
        [
            "localhost",
            "127.0.0.1",
            "::1",
            "pm.example.com",
            "10.0.0.7"
        ]
    );

    assert_signed_by(pki.admin_cert_pem(), pki.ca_cert_pem());
    let admin_der = der(pki.admin_cert_pem());
    let (_, admin) = X509Certificate::from_der(&admin_der).expect("parse admin");
    let eku = admin
        .extended_key_usage()
        .expect("eku")
        .expect("eku present")
        .value;
    assert!(eku.client_auth && !eku.server_auth);
}

#[test]
fn second_call_reuses_everything() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = hosts(&["pm.example.com"]);
    let first = Pki::load_or_create(tmp.path(), &h).expect("create");
    let before = read_all(tmp.path());
    let second = Pki::load_or_create(tmp.path(), &h).expect("load");

    assert!(
        second.written_files().is_empty(),
        "{:?}",
        second.written_files()
    );
    assert_eq!(first.ca_cert_pem(), second.ca_cert_pem());
    assert_eq!(first.serving_cert_pem(), second.serving_cert_pem());
    assert_eq!(first.serving_key_pem(), second.serving_key_pem());
    assert_eq!(first.admin_cert_pem(), second.admin_cert_pem());
    assert_eq!(first.admin_key_pem(), second.admin_key_pem());
    assert_eq!(before, read_all(tmp.path()));

    // Hosts already covered (defaults, different spelling) change nothing.
    let third = Pki::load_or_create(
        tmp.path(),
        &hosts(&["LOCALHOST", "[::1]", " pm.example.com. "]),
    )
    .expect("load");
    assert!(
        third.written_files().is_empty(),
        "{:?}",
        third.written_files()
    );
}

#[test]
fn new_host_reissues_only_the_serving_certificate() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let first = Pki::load_or_create(tmp.path(), &[]).expect("create");
    let ca_before = fs::read(tmp.path().join(CA_CERT_FILE)).expect("read");
    let ca_key_before = fs::read(tmp.path().join(CA_KEY_FILE)).expect("read");

    let second = Pki::load_or_create(tmp.path(), &hosts(&["api.example.com", "192.168.1.10"]))
        .expect("reload");
    assert_eq!(
        second.written_files(),
        [SERVING_KEY_FILE, SERVING_CERT_FILE]
    );
    assert_eq!(
        fs::read(tmp.path().join(CA_CERT_FILE)).expect("read"),
        ca_before
    );
    assert_eq!(
        fs::read(tmp.path().join(CA_KEY_FILE)).expect("read"),
        ca_key_before
    );
    assert_eq!(first.admin_cert_pem(), second.admin_cert_pem());
    assert_ne!(first.serving_cert_pem(), second.serving_cert_pem());
    assert_ne!(first.serving_key_pem(), second.serving_key_pem());

    let names = sans(second.serving_cert_pem());
    assert!(names.contains(&"api.example.com".to_string()), "{names:?}");
    assert!(names.contains(&"192.168.1.10".to_string()), "{names:?}");
    assert_signed_by(second.serving_cert_pem(), second.ca_cert_pem());
    assert_eq!(
        fs::read_to_string(tmp.path().join(SERVING_CERT_FILE)).expect("read"),
        second.serving_cert_pem()
    );
}

#[test]
fn expiring_leaves_are_reissued() {
    let tmp = tempfile::tempdir().expect("tempdir");
    Pki::load_or_create(tmp.path(), &[]).expect("create");

    write_short_lived_leaf(tmp.path(), ADMIN_CERT_FILE, ADMIN_KEY_FILE, 10);
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert_eq!(pki.written_files(), [ADMIN_KEY_FILE, ADMIN_CERT_FILE]);

    write_short_lived_leaf(tmp.path(), SERVING_CERT_FILE, SERVING_KEY_FILE, 10);
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert_eq!(pki.written_files(), [SERVING_KEY_FILE, SERVING_CERT_FILE]);

    // A leaf with more than 30 days left is kept.
    write_short_lived_leaf(tmp.path(), SERVING_CERT_FILE, SERVING_KEY_FILE, 60);
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert!(pki.written_files().is_empty(), "{:?}", pki.written_files());
}

#[test]
fn broken_or_foreign_leaves_are_reissued() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    Pki::load_or_create(tmp.path(), &[]).expect("create");
    Pki::load_or_create(other.path(), &[]).expect("create other");

    // Signed by a different CA.
    for f in [SERVING_CERT_FILE, SERVING_KEY_FILE] {
        fs::copy(other.path().join(f), tmp.path().join(f)).expect("copy");
    }
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert_eq!(pki.written_files(), [SERVING_KEY_FILE, SERVING_CERT_FILE]);
    assert_signed_by(pki.serving_cert_pem(), pki.ca_cert_pem());

    // Key that does not belong to the certificate (crash between writes).
    fs::copy(
        other.path().join(ADMIN_KEY_FILE),
        tmp.path().join(ADMIN_KEY_FILE),
    )
    .expect("copy");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert_eq!(pki.written_files(), [ADMIN_KEY_FILE, ADMIN_CERT_FILE]);

    // Corrupt and missing leaf files.
    fs::write(tmp.path().join(SERVING_CERT_FILE), "garbage").expect("write");
    fs::remove_file(tmp.path().join(ADMIN_KEY_FILE)).expect("remove");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("reload");
    assert_eq!(
        pki.written_files(),
        [
            SERVING_KEY_FILE,
            SERVING_CERT_FILE,
            ADMIN_KEY_FILE,
            ADMIN_CERT_FILE
        ]
    );
}

#[test]
fn corrupt_ca_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    Pki::load_or_create(tmp.path(), &[]).expect("create");
    let ca_path = tmp.path().join(CA_CERT_FILE);
    fs::write(&ca_path, "not a certificate").expect("corrupt");

    let err = Pki::load_or_create(tmp.path(), &[]).expect_err("corrupt CA must fail");
    assert!(
        matches!(err, CertError::InvalidCertificate { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&ca_path.display().to_string()),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(&ca_path).expect("read"),
        "not a certificate"
    );

    // Truncated PEM (valid framing lost halfway).
    let other = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(other.path(), &[]).expect("create");
    let half = &pki.ca_cert_pem()[..pki.ca_cert_pem().len() / 2];
    fs::write(&ca_path, half).expect("truncate");
    let err = Pki::load_or_create(tmp.path(), &[]).expect_err("truncated CA must fail");
    assert!(
        err.to_string().contains(&ca_path.display().to_string()),
        "{err}"
    );
}

#[test]
fn corrupt_or_missing_ca_key_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    Pki::load_or_create(tmp.path(), &[]).expect("create");
    let key_path = tmp.path().join(CA_KEY_FILE);

    fs::write(
        &key_path,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .expect("corrupt");
    let err = Pki::load_or_create(tmp.path(), &[]).expect_err("corrupt key must fail");
    assert!(matches!(err, CertError::InvalidKey { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&key_path.display().to_string()),
        "{err}"
    );

    // A key from another CA.
    let other = tempfile::tempdir().expect("tempdir");
    Pki::load_or_create(other.path(), &[]).expect("create");
    fs::copy(other.path().join(CA_KEY_FILE), &key_path).expect("copy");
    let err = Pki::load_or_create(tmp.path(), &[]).expect_err("mismatched key must fail");
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err:?}");

    fs::remove_file(&key_path).expect("remove");
    let err = Pki::load_or_create(tmp.path(), &[]).expect_err("missing key must fail");
    assert!(matches!(err, CertError::IncompleteCa { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&key_path.display().to_string()),
        "{err}"
    );
    assert!(!key_path.exists(), "CA key must not be regenerated");
}

#[test]
fn invalid_host_is_rejected_before_writing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("pki");
    let err = Pki::load_or_create(&dir, &hosts(&["https://bad host/"])).expect_err("bad host");
    assert!(matches!(err, CertError::InvalidHost { .. }), "{err:?}");
    assert!(!dir.exists());
}

#[test]
fn admin_identity_and_kubeconfig() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");
    let id = client_identity(&der(pki.admin_cert_pem())).expect("identity");
    assert_eq!(id.user, "admin");
    assert_eq!(id.groups, ["system:masters"]);

    let yaml = kubeconfig_yaml(&pki.admin_kubeconfig_options("https://127.0.0.1:6443"))
        .expect("kubeconfig");
    let v: serde_json::Value = serde_saphyr::from_str(&yaml).expect("parse");
    let b64 = base64::engine::general_purpose::STANDARD;
    let ca = b64
        .decode(
            v["clusters"][0]["cluster"]["certificate-authority-data"]
                .as_str()
                .expect("str"),
        )
        .expect("base64");
    assert_eq!(ca, pki.ca_cert_pem().as_bytes());
    assert_eq!(
        v["clusters"][0]["cluster"]["certificate-authority-data"],
        pki.ca_bundle_base64()
    );
    let cert = b64
        .decode(
            v["users"][0]["user"]["client-certificate-data"]
                .as_str()
                .expect("str"),
        )
        .expect("base64");
    assert_eq!(cert, pki.admin_cert_pem().as_bytes());
    assert_eq!(v["current-context"], DEFAULT_CLUSTER_NAME);
}

#[test]
fn issues_client_certificates() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");

    let groups = hosts(&["system:authenticated", "team-a", "team-b"]);
    let (cert, key) = pki
        .issue_client_certificate("alice", &groups, 7)
        .expect("issue");
    assert_signed_by(&cert, pki.ca_cert_pem());
    let id = client_identity(&der(&cert)).expect("identity");
    assert_eq!(id.user, "alice");
    assert_eq!(id.groups, groups);
    let cert_der = der(&cert);
    let (_, parsed) = X509Certificate::from_der(&cert_der).expect("parse");
    let days = parsed
        .validity()
        .time_to_expiration()
        .expect("valid")
        .whole_days();
    assert!((6..=7).contains(&days), "{days}");
    let eku = parsed
        .extended_key_usage()
        .expect("eku")
        .expect("present")
        .value;
    assert!(eku.client_auth);
    let pair = KeyPair::from_pem(&key).expect("key");
    assert_eq!(
        parsed.public_key().subject_public_key.data.as_ref(),
        pair.public_key_raw()
    );

    let (cert, _) = pki.issue_client_certificate("bob", &[], 1).expect("issue");
    let id = client_identity(&der(&cert)).expect("identity");
    assert_eq!((id.user.as_str(), id.groups.len()), ("bob", 0));

    for (cn, days) in [("", 1), ("carol", 0), ("bad\nname", 1)] {
        let err = pki
            .issue_client_certificate(cn, &[], days)
            .expect_err("invalid request");
        assert!(matches!(err, CertError::InvalidRequest(_)), "{err:?}");
    }
}

#[test]
fn issues_serving_certificates() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");
    let (cert, key) = pki
        .issue_serving_certificate(&hosts(&["webhook.svc", "*.apps.example.com", "fd00::1"]))
        .expect("issue");
    assert_signed_by(&cert, pki.ca_cert_pem());
    assert_eq!(
        sans(&cert),
        [
            "localhost",
            "127.0.0.1",
            "::1",
            "webhook.svc",
            "*.apps.example.com",
            "fd00::1"
        ]
    );
    assert_eq!(pem_to_cert_chain(&cert).expect("chain").len(), 1);
    pem_to_private_key(&key).expect("key");
    // Nothing was written.
    assert_ne!(
        fs::read_to_string(tmp.path().join(SERVING_CERT_FILE)).expect("read"),
        cert
    );
}

#[test]
fn ca_bundle_is_base64_of_the_ca_pem() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(pki.ca_bundle_base64())
        .expect("base64");
    assert_eq!(decoded, pki.ca_cert_pem().as_bytes());
}

#[test]
fn load_pem_files_checks_both_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");
    Pki::load_or_create(other.path(), &[]).expect("create other");
    let cert = tmp.path().join(SERVING_CERT_FILE);
    let key = tmp.path().join(SERVING_KEY_FILE);

    let (c, k) = load_pem_files(&cert, &key).expect("load");
    assert_eq!(
        (c.as_str(), k.as_str()),
        (pki.serving_cert_pem(), pki.serving_key_pem())
    );

    // A chain (leaf + CA) is accepted.
    let chain = tmp.path().join("chain.crt");
    fs::write(
        &chain,
        format!("{}{}", pki.serving_cert_pem(), pki.ca_cert_pem()),
    )
    .expect("write");
    load_pem_files(&chain, &key).expect("chain");

    let err = load_pem_files(&cert, &other.path().join(SERVING_KEY_FILE)).expect_err("mismatch");
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err:?}");

    let bad = tmp.path().join("bad.pem");
    fs::write(&bad, "hello").expect("write");
    for (c, k, named) in [
        (&bad, &key, &bad),
        (&cert, &bad, &bad),
        (&cert, &cert, &cert),
    ] {
        let err = load_pem_files(c, k).expect_err("invalid");
        assert!(
            err.to_string().contains(&named.display().to_string()),
            "{err}"
        );
    }
    let missing = tmp.path().join("missing.pem");
    let err = load_pem_files(&missing, &key).expect_err("missing");
    assert!(matches!(err, CertError::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
fn client_identity_rejects_garbage() {
    let err = client_identity(b"\x30\x03\x02\x01\x00").expect_err("garbage");
    assert!(
        matches!(err, CertError::InvalidCertificate { .. }),
        "{err:?}"
    );
}

#[test]
fn debug_output_hides_keys() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::load_or_create(tmp.path(), &[]).expect("create");
    let text = format!("{pki:?} {:?}", pki.admin_kubeconfig_options("https://x:1"));
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}
