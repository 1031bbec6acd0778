//! `deploy/aggregation`: built with kubectl's kustomize, it must register every group-version the
//! server serves, point at the Service it defines, grant what kube-apiserver's aggregation layer
//! requires, and run `serve` only with flags that exist. The `platform-mesh certs` commands of its
//! README run here as written.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .map(str::trim)
        .filter(|d| !d.is_empty() && !d.lines().all(|l| l.starts_with('#') || l.trim().is_empty()))
        .map(|d| serde_saphyr::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_aggregation_kustomization_registers_every_served_group_version() {
    let kubectl = common::kubectl_binary("1.33").expect("kubectl.1.33 is not installed");
    let out = Command::new(kubectl)
        .args(["kustomize"])
        .arg(repo().join("deploy/aggregation"))
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = documents(&String::from_utf8_lossy(&out.stdout));

    // Every Platform Mesh group-version, one APIService each, pointing at the Service here.
    let served: BTreeSet<String> = api::serving::served_types()
        .iter()
        .filter(|t| t.group.ends_with("platform-mesh.io"))
        .map(|t| format!("{}.{}", t.version, t.group))
        .collect();
    let registered: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "APIService")
        .map(|d| {
            let spec = &d["spec"];
            let name = d["metadata"]["name"].as_str().expect("name").to_string();
            assert_eq!(
                name,
                format!(
                    "{}.{}",
                    spec["version"].as_str().expect("version"),
                    spec["group"].as_str().expect("group")
                ),
                "an APIService is named version.group"
            );
            assert_eq!(spec["service"]["name"], "platform-mesh");
            assert_eq!(spec["service"]["namespace"], "platform-mesh-system");
            assert_eq!(spec["caBundle"], "CA_BUNDLE");
            assert!(spec["insecureSkipTLSVerify"].is_null());
            let gpm = spec["groupPriorityMinimum"].as_i64().expect("priority");
            assert!((1..=20000).contains(&gpm));
            let vp = spec["versionPriority"].as_i64().expect("priority");
            assert!((1..=1000).contains(&vp));
            name
        })
        .collect();
    assert_eq!(registered, served);

    let service = find(&docs, "Service", "platform-mesh");
    let port = &service["spec"]["ports"][0];
    for api_service in docs.iter().filter(|d| d["kind"] == "APIService") {
        assert_eq!(api_service["spec"]["service"]["port"], port["port"]);
    }
    // The webhook configurations use the same Service.
    for file in ["validating.yaml", "mutating.yaml"] {
        let text =
            std::fs::read_to_string(repo().join("deploy/webhooks").join(file)).expect("read");
        for doc in documents(&text) {
            for hook in doc["webhooks"].as_array().expect("webhooks") {
                let svc = &hook["clientConfig"]["service"];
                assert_eq!(svc["name"], "platform-mesh");
                assert_eq!(svc["namespace"], "platform-mesh-system");
                assert_eq!(svc["port"], port["port"], "{file}");
            }
        }
    }

    // kube's aggregation RBAC.
    let delegator = find(
        &docs,
        "ClusterRoleBinding",
        "platform-mesh:system:auth-delegator",
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    let reader = find(
        &docs,
        "RoleBinding",
        "platform-mesh:extension-apiserver-authentication-reader",
    );
    assert_eq!(reader["metadata"]["namespace"], "kube-system");
    assert_eq!(reader["roleRef"]["kind"], "Role");
    assert_eq!(
        reader["roleRef"]["name"],
        "extension-apiserver-authentication-reader"
    );
    for binding in [delegator, reader] {
        assert_eq!(binding["subjects"][0]["name"], "platform-mesh");
        assert_eq!(binding["subjects"][0]["namespace"], "platform-mesh-system");
    }

    // The Deployment runs `serve` with flags that exist, selected by the Service.
    let deployment = find(&docs, "Deployment", "platform-mesh");
    let pod = &deployment["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "platform-mesh");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        service["spec"]["selector"]["app.kubernetes.io/name"]
    );
    let args: Vec<&str> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    assert_eq!(args[0], "serve");
    assert!(args.contains(&"--authentication-in-cluster"));
    let help = Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
        .args(["serve", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in &args[1..] {
        let flag = arg.split('=').next().unwrap_or(arg);
        assert!(help.contains(flag), "serve has no flag {flag}");
    }
}

#[test]
fn the_readme_certificate_commands_run_as_written() {
    let readme =
        std::fs::read_to_string(repo().join("deploy/aggregation/README.md")).expect("readme");
    let work = tempfile::tempdir().expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_platform-mesh");
    let mut ran = 0;
    for line in readme.lines() {
        let Some(rest) = line
            .strip_prefix("platform-mesh certs ")
            .or_else(|| line.strip_prefix("CA_BUNDLE=$(platform-mesh certs "))
        else {
            continue;
        };
        let rest = rest.trim_end_matches(')');
        let out = Command::new(bin)
            .arg("certs")
            .args(rest.split_whitespace())
            .current_dir(work.path())
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "platform-mesh certs {rest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert_eq!(ran, 2, "the README's certs commands changed");
    // The serving certificate is for the Service's name and chains to the printed CA bundle.
    let cert = std::fs::read(work.path().join("serving/tls.crt")).expect("cert");
    let key = work.path().join("serving/tls.key");
    assert!(key.exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).expect("key").permissions().mode();
        assert_eq!(mode & 0o077, 0, "tls.key is readable by others");
    }
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&cert).expect("pem");
    let text = String::from_utf8_lossy(der.as_ref()).into_owned();
    assert!(text.contains("platform-mesh.platform-mesh-system.svc"));
}

#[test]
fn certs_kubeconfig_needs_the_servers_data_directory_and_writes_a_user_of_it() {
    let bin = env!("CARGO_BIN_EXE_platform-mesh");
    let work = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        Command::new(bin)
            .arg("certs")
            .args(args)
            .current_dir(work.path())
            .output()
            .expect("run")
    };
    // No CA yet: the message says how to get one, and nothing is written.
    let out = run(&[
        "kubeconfig",
        "--data-dir",
        "dd",
        "--user",
        "broker",
        "--out",
        "u.kubeconfig",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no CA") && err.contains("platform-mesh serve"),
        "{err}"
    );
    assert!(!work.path().join("u.kubeconfig").exists());
    // A data directory as `serve` leaves it: the CA, and admin.kubeconfig naming the server.
    assert!(run(&["ca-bundle", "--data-dir", "dd"]).status.success());
    std::fs::write(
        work.path().join("dd/admin.kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:7443'}\n",
    )
    .expect("admin.kubeconfig");
    let out = run(&[
        "kubeconfig",
        "--data-dir",
        "dd",
        "--user",
        "broker",
        "--group",
        "team-a",
        "--out",
        "u.kubeconfig",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(work.path().join("u.kubeconfig")).expect("kubeconfig");
    let kc: serde_json::Value = serde_saphyr::from_str(&text).expect("yaml");
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        "https://127.0.0.1:7443"
    );
    let cert = kc["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .expect("cert");
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(cert)
        .expect("base64");
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).expect("pem");
    let text = String::from_utf8_lossy(der.as_ref()).into_owned();
    assert!(text.contains("broker") && text.contains("team-a"));
    let out = run(&[
        "kubeconfig",
        "--data-dir",
        "dd",
        "--user",
        " ",
        "--out",
        "v.kubeconfig",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--user"));
}
