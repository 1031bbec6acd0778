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

// deploy/chart, rendered and linted with the Helm pinned in tests/peers/helm (`scripts/peers`
// builds it into target/peers), and the Dockerfile that makes the image both deploy.

/// The Helm `scripts/peers` builds; missing, the test fails saying so.
fn helm_binary() -> std::path::PathBuf {
    let bin = repo().join("target/peers/helm");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/peers (it builds the Helm pinned in tests/peers/helm)",
        bin.display()
    );
    bin
}

/// Runs helm in the repository with its own config, cache and data directories.
fn helm(args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().expect("tempdir");
    Command::new(helm_binary())
        .args(args)
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .current_dir(repo())
        .output()
        .expect("run helm")
}

/// `helm template deploy/chart` with `--set` of each of `sets`, as parsed objects.
fn helm_template(sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "platform-mesh", "deploy/chart"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = helm(&args);
    assert!(
        out.status.success(),
        "helm {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    // Helm's output starts with `---`; the split in `documents` wants it after a newline.
    documents(&format!("\n{}", String::from_utf8_lossy(&out.stdout)))
}

/// `kubectl kustomize` of a directory under deploy/, as parsed objects.
fn kustomize(dir: &str) -> Vec<Value> {
    let kubectl = common::kubectl_binary("1.33").expect("kubectl.1.33 is not installed");
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&String::from_utf8_lossy(&out.stdout))
}

/// Objects by kind, namespace ("" when cluster-scoped) and name; a key seen twice fails.
fn by_key(docs: Vec<Value>) -> std::collections::BTreeMap<(String, String, String), Value> {
    let mut map = std::collections::BTreeMap::new();
    for doc in docs {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let key = (
            text(&doc["kind"]),
            text(&doc["metadata"]["namespace"]),
            text(&doc["metadata"]["name"]),
        );
        assert!(!key.0.is_empty() && !key.2.is_empty(), "{doc}");
        if let Some(old) = map.insert(key.clone(), doc) {
            panic!("{key:?} is rendered twice: {old}");
        }
    }
    map
}

/// The only container's `args` of the Deployment named platform-mesh.
fn deployment_args(docs: &[Value]) -> Vec<String> {
    let deployment = find(docs, "Deployment", "platform-mesh");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    containers[0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect()
}

/// `platform-mesh serve --help`.
fn serve_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
        .args(["serve", "--help"])
        .output()
        .expect("help");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The named entries (volumes, volumeMounts) of a list, by name.
fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .expect("a list")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[test]
fn the_chart_passes_helm_lint() {
    for sets in [
        &[][..],
        &[
            "replicas=3",
            "etcd.servers={https://etcd-0:2379}",
            "etcd.tls.secretName=etcd-client",
            "audit.enabled=true",
            "tls.generate=true",
        ][..],
    ] {
        let mut args = vec!["lint", "--strict", "deploy/chart"];
        for set in sets {
            args.extend(["--set", set]);
        }
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_charts_defaults_render_what_the_kustomize_bases_render() {
    let mut bases = kustomize("deploy/aggregation");
    bases.extend(kustomize("deploy/webhooks"));
    let bases = by_key(bases);
    let chart = by_key(helm_template(&[]));
    let keys = |m: &std::collections::BTreeMap<_, _>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        keys(&chart),
        keys(&bases),
        "the chart's objects (left) and the kustomize bases' (right)"
    );
    // Whole objects: kinds, names, namespaces, labels, args, ports, probes, volumes, RBAC,
    // APIServices and webhook rules alike.
    for (key, base) in &bases {
        let rendered = &chart[key];
        assert_eq!(
            rendered,
            base,
            "{key:?} differs:\nchart: {}\nkustomize: {}",
            serde_json::to_string_pretty(rendered).expect("json"),
            serde_json::to_string_pretty(base).expect("json")
        );
    }
}

#[test]
fn the_chart_takes_replicas_etcd_and_audit_from_values() {
    let docs = helm_template(&[
        "replicas=3",
        "etcd.servers={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}",
        "etcd.prefix=/pm-prod",
        "etcd.tls.secretName=etcd-client",
        "audit.enabled=true",
        "audit.logPath=/var/log/pm/audit.log",
        "audit.maxSize=50",
        "audit.maxBackup=3",
        "audit.maxAge=7",
        "image.repository=registry.example.com/platform-mesh",
        "image.tag=0.1.0",
        "image.pullPolicy=IfNotPresent",
    ]);
    let deployment = find(&docs, "Deployment", "platform-mesh");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/platform-mesh:0.1.0"
    );
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");

    let args = deployment_args(&docs);
    for want in [
        "--etcd-servers=https://etcd-0.etcd:2379,https://etcd-1.etcd:2379",
        "--etcd-prefix=/pm-prod",
        "--etcd-cafile=/etc/platform-mesh/etcd/ca.crt",
        "--etcd-certfile=/etc/platform-mesh/etcd/tls.crt",
        "--etcd-keyfile=/etc/platform-mesh/etcd/tls.key",
        "--audit-policy-file=/etc/platform-mesh/audit/policy.yaml",
        "--audit-log-path=/var/log/pm/audit.log",
        "--audit-log-maxsize=50",
        "--audit-log-maxbackup=3",
        "--audit-log-maxage=7",
    ] {
        assert!(args.iter().any(|a| a == want), "no {want} in {args:?}");
    }
    // The kustomize bases' flags stay.
    assert_eq!(args[0], "serve");
    assert!(args.iter().any(|a| a == "--authentication-in-cluster"));
    // Every flag the chart passes exists in `serve`.
    let help = serve_help();
    for arg in &args[1..] {
        let flag = arg.split('=').next().unwrap_or(arg);
        assert!(help.contains(flag), "serve has no flag {flag}");
    }

    // The etcd client certificate, the audit policy and the log directory are mounted where the
    // flags point.
    let mounts = &container["volumeMounts"];
    let volumes = &pod["volumes"];
    let etcd = named(mounts, "etcd-tls");
    assert_eq!(etcd["mountPath"], "/etc/platform-mesh/etcd");
    assert_eq!(etcd["readOnly"], true);
    assert_eq!(
        named(volumes, "etcd-tls")["secret"]["secretName"],
        "etcd-client"
    );
    assert_eq!(
        named(mounts, "audit-policy")["mountPath"],
        "/etc/platform-mesh/audit"
    );
    let policy_map = named(volumes, "audit-policy")["configMap"]["name"]
        .as_str()
        .expect("configMap");
    assert_eq!(named(mounts, "audit-log")["mountPath"], "/var/log/pm");
    assert!(named(volumes, "audit-log")["emptyDir"].is_object());
    // The root filesystem stays read-only; the log goes to the emptyDir.
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // The policy ConfigMap holds an audit.k8s.io Policy under the name the flag reads.
    let config_map = find(&docs, "ConfigMap", policy_map);
    assert_eq!(config_map["metadata"]["namespace"], "platform-mesh-system");
    let policy: Value =
        serde_saphyr::from_str(config_map["data"]["policy.yaml"].as_str().expect("policy"))
            .expect("policy yaml");
    assert_eq!(policy["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(policy["kind"], "Policy");
    assert!(!policy["rules"].as_array().expect("rules").is_empty());
    // A changed policy rolls the pods.
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert!(annotations["platform-mesh.io/audit-policy-sha256"].is_string());

    // Without a client certificate only the CA is given; audit to standard output needs no
    // volume and no rotation.
    let docs = helm_template(&[
        "etcd.servers={https://etcd:2379}",
        "etcd.tls.secretName=etcd-ca",
        "etcd.tls.clientCertificate=false",
        "audit.enabled=true",
        "audit.logPath=-",
    ]);
    let args = deployment_args(&docs);
    assert!(args
        .iter()
        .any(|a| a == "--etcd-cafile=/etc/platform-mesh/etcd/ca.crt"));
    assert!(!args.iter().any(|a| a.starts_with("--etcd-certfile")));
    assert!(args.iter().any(|a| a == "--audit-log-path=-"));
    assert!(!args.iter().any(|a| a.starts_with("--audit-log-max")));
    let deployment = find(&docs, "Deployment", "platform-mesh");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    assert!(volumes.iter().all(|v| v["name"] != "audit-log"));
}

#[test]
fn the_chart_refuses_values_that_cannot_work() {
    for (sets, message) in [
        (
            &["replicas=2"][..],
            "more than one replica needs etcd.servers",
        ),
        (&["etcd.tls.secretName=etcd-client"][..], "set etcd.servers"),
        (&["tls.secretName="][..], "tls.secretName"),
        (&["tls.caBundle="][..], "tls.caBundle"),
        (
            &["etcd.server=https://etcd:2379"][..],
            "'server' not allowed",
        ),
        (&["webhooks.failurePolicy=Sometimes"][..], "failurePolicy"),
    ] {
        let mut args = vec!["template", "platform-mesh", "deploy/chart"];
        for set in sets {
            args.extend(["--set", set]);
        }
        let out = helm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "helm {} rendered", args.join(" "));
        assert!(err.contains(message), "helm {}: {err}", args.join(" "));
    }
}

#[test]
fn the_chart_renders_each_mode_alone() {
    let kinds = |docs: &[Value]| -> BTreeSet<String> {
        docs.iter()
            .map(|d| d["kind"].as_str().expect("kind").to_string())
            .collect()
    };
    // Webhooks only: no APIServices, none of the aggregation RBAC, no front-proxy trust.
    let docs = helm_template(&["aggregation.enabled=false"]);
    let present = kinds(&docs);
    for kind in ["APIService", "ClusterRoleBinding", "RoleBinding"] {
        assert!(!present.contains(kind), "{kind} rendered: {present:?}");
    }
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "Deployment",
        "Service",
    ] {
        assert!(present.contains(kind), "no {kind}: {present:?}");
    }
    assert!(!deployment_args(&docs)
        .iter()
        .any(|a| a == "--authentication-in-cluster"));

    // Aggregation only.
    let docs = helm_template(&["webhooks.enabled=false"]);
    let present = kinds(&docs);
    assert!(present.contains("APIService"));
    assert!(!present.contains("ValidatingWebhookConfiguration"));
    assert!(!present.contains("MutatingWebhookConfiguration"));

    // An existing namespace and no volume claim.
    let docs = helm_template(&["namespace.create=false", "persistence.enabled=false"]);
    let present = kinds(&docs);
    assert!(!present.contains("Namespace") && !present.contains("PersistentVolumeClaim"));
    let deployment = find(&docs, "Deployment", "platform-mesh");
    let data = named(&deployment["spec"]["template"]["spec"]["volumes"], "data");
    assert!(data["emptyDir"].is_object(), "{data}");
}

#[test]
fn the_chart_generates_a_serving_certificate_for_the_service_and_trusts_its_ca() {
    use base64::Engine as _;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

    let docs = helm_template(&["tls.generate=true"]);
    let secret = find(&docs, "Secret", "platform-mesh-serving");
    assert_eq!(secret["metadata"]["namespace"], "platform-mesh-system");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let data = &secret["data"];
    let ca_bundle = data["ca.crt"].as_str().expect("ca.crt");
    // Every APIService and webhook trusts that CA.
    let mut bundles = 0;
    for doc in &docs {
        if doc["kind"] == "APIService" {
            assert_eq!(doc["spec"]["caBundle"], ca_bundle);
            bundles += 1;
        }
        if let Some(hooks) = doc["webhooks"].as_array() {
            for hook in hooks {
                assert_eq!(hook["clientConfig"]["caBundle"], ca_bundle);
                bundles += 1;
            }
        }
    }
    assert_eq!(bundles, 5, "three APIServices and two webhooks");
    // The Deployment serves the Secret's certificate.
    let deployment = find(&docs, "Deployment", "platform-mesh");
    let serving = named(
        &deployment["spec"]["template"]["spec"]["volumes"],
        "serving",
    );
    assert_eq!(serving["secret"]["secretName"], "platform-mesh-serving");

    // The certificate chains to the CA for the Service's name, and goes with its key.
    let pem = |key: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(data[key].as_str().expect(key))
            .expect("base64")
    };
    let ca = CertificateDer::from_pem_slice(&pem("ca.crt")).expect("ca pem");
    let cert = CertificateDer::from_pem_slice(&pem("tls.crt")).expect("cert pem");
    let key = PrivateKeyDer::from_pem_slice(&pem("tls.key")).expect("key pem");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("the CA");
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .expect("verifier");
    let host = ServerName::try_from("platform-mesh.platform-mesh-system.svc").expect("name");
    verifier
        .verify_server_cert(&cert, &[], &host, &[], UnixTime::now())
        .expect("the serving certificate is valid for the Service and signed by caBundle");
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("the key is the certificate's");
}

/// The Dockerfile's instructions (continuation lines joined, comments dropped) by stage.
fn dockerfile_stages() -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (op, rest) = current.split_once(' ').unwrap_or((&current, ""));
        instructions.push((op.to_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    for (op, rest) in instructions {
        if op == "FROM" {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push((op, rest));
        }
    }
    stages
}

#[test]
fn the_dockerfile_builds_a_locked_release_and_runs_it_distroless_as_nonroot() {
    let stages = dockerfile_stages();
    assert!(stages.len() >= 2, "a multi-stage build");
    let from = |stage: &[(String, String)]| stage[0].1.clone();

    // The build: an official Rust image on Debian bookworm, protoc for the etcd client, the
    // locked release build of the binary with etcd.
    let build = &stages[0];
    let build_from = from(build);
    let image = build_from.split_whitespace().next().expect("image");
    assert!(
        image
            .trim_start_matches("docker.io/library/")
            .starts_with("rust:")
            && image.ends_with("-bookworm"),
        "{build_from}"
    );
    let alias = build_from
        .split_whitespace()
        .skip_while(|w| !w.eq_ignore_ascii_case("as"))
        .nth(1)
        .expect("the build stage is named");
    let runs: Vec<&str> = build
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, r)| r.as_str())
        .collect();
    assert!(
        runs.iter().any(|r| r.contains("apt-get install")
            && r.contains("protobuf-compiler")
            && r.contains("libprotobuf-dev")),
        "{runs:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r
                .contains("cargo build --release --locked --features etcd --bin platform-mesh")),
        "{runs:?}"
    );

    // The image: distroless, the binary only, the non-root user the Deployment runs as.
    let last = stages.last().expect("stages");
    assert_eq!(from(last), "gcr.io/distroless/cc-debian12:nonroot");
    let ops = |op: &str| -> Vec<&str> {
        last.iter()
            .filter(|(o, _)| o == op)
            .map(|(_, r)| r.as_str())
            .collect()
    };
    assert!(ops("RUN").is_empty(), "distroless has no shell to RUN with");
    let copies = ops("COPY");
    assert!(
        copies
            .iter()
            .all(|c| c.contains(&format!("--from={alias}"))),
        "the image takes only build output: {copies:?}"
    );
    let entrypoint: Vec<String> =
        serde_json::from_str(ops("ENTRYPOINT").last().expect("ENTRYPOINT")).expect("exec form");
    assert_eq!(entrypoint.len(), 1);
    let binary = &entrypoint[0];
    assert!(binary.ends_with("/platform-mesh"), "{binary}");
    assert!(
        copies.iter().any(|c| c.ends_with(&format!(" {binary}"))),
        "the binary is copied to {binary}: {copies:?}"
    );
    let cmd: Vec<String> =
        serde_json::from_str(ops("CMD").last().expect("CMD")).expect("exec form");
    assert_eq!(cmd, ["serve"]);
    let user = *ops("USER").last().expect("USER");
    assert!(user == "65532:65532" || user == "nonroot", "{user}");

    // The Deployment (kustomize's and so the chart's) runs the image's user, and its data
    // directory is the image's volume, owned by that user.
    let manifest = std::fs::read_to_string(repo().join("deploy/aggregation/deployment.yaml"))
        .expect("deployment.yaml");
    let manifests = documents(&manifest);
    let deployment = find(&manifests, "Deployment", "platform-mesh");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"],
        65532
    );
    let data_dir = deployment_args(&manifests)
        .iter()
        .find_map(|a| a.strip_prefix("--data-dir=").map(str::to_string))
        .expect("--data-dir");
    assert!(
        ops("VOLUME").iter().any(|v| v.contains(&data_dir)),
        "VOLUME {data_dir}"
    );
    assert!(
        copies
            .iter()
            .any(|c| c.contains("--chown=65532:65532") && c.ends_with(&format!(" {data_dir}"))),
        "{data_dir} belongs to the user: {copies:?}"
    );
    // The environment the image sets is read by `serve`.
    let help = serve_help();
    for env in ops("ENV") {
        for pair in env.split_whitespace() {
            let name = pair.split('=').next().unwrap_or(pair);
            assert!(
                help.contains(&format!("env: {name}=")),
                "serve reads no {name}"
            );
        }
    }

    // The build context leaves out build output and local data.
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    let ignored: BTreeSet<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for entry in ["target", ".git", ".platform-mesh"] {
        assert!(ignored.contains(entry), ".dockerignore lacks {entry}");
    }
}
