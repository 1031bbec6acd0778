//! platform-mesh behind the real kube-apiserver (the release pinned in `tests/peers/go`): the
//! APIServices of `deploy/aggregation` and the webhook configurations of `deploy/webhooks`,
//! applied as their READMEs say, with kubectl talking to kube-apiserver only.
//!
//! No pods run here, so the Service both point at is of type ExternalName naming `localhost`,
//! on the port `serve` listens on: kube-apiserver resolves it to `https://localhost:<port>` and
//! verifies the serving certificate for `platform-mesh.platform-mesh-system.svc`, as in a cluster.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::kube_apiserver::KubeApiserver;
use common::{Kubectl, Server};
use serde_json::Value;

const SERVICE_HOST: &str = "platform-mesh.platform-mesh-system.svc";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn kubectl_bin() -> PathBuf {
    common::kubectl_binary("1.33").expect("kubectl 1.33 ships with the machine image")
}

/// Runs `platform-mesh <args>` and returns its stdout.
fn platform_mesh(args: &[&str]) -> String {
    common::stdout_of(
        Command::new(env!("CARGO_BIN_EXE_platform-mesh")).args(args),
        &format!("platform-mesh {}", args.join(" ")),
    )
}

/// kube-apiserver and a `serve` it can reach as the Service `platform-mesh` in
/// `platform-mesh-system`, with a serving certificate for that name.
struct Cluster {
    /// kubectl as kube-apiserver's admin.
    kube: Kubectl,
    /// kubectl as platform-mesh's own admin (straight to serve).
    pm: Kubectl,
    server: Server,
    peer: KubeApiserver,
    ca_bundle: String,
}

impl Cluster {
    /// `aggregated`: serve authenticates kube-apiserver's proxy as its `--authentication-kubeconfig`
    /// (kube-system/extension-apiserver-authentication) says.
    fn start(aggregated: bool) -> Cluster {
        let peer = KubeApiserver::start();
        let data = peer.dir().join("platform-mesh");
        let serving = peer.dir().join("serving");
        let data_s = data.display().to_string();
        // The deploy READMEs' steps: a serving certificate for the Service name, the CA bundle.
        platform_mesh(&[
            "certs",
            "serving",
            "--data-dir",
            &data_s,
            "--host",
            SERVICE_HOST,
            "--out-dir",
            &serving.display().to_string(),
        ]);
        let ca_bundle = platform_mesh(&["certs", "ca-bundle", "--data-dir", &data_s])
            .trim()
            .to_string();
        let (cert, key) = (serving.join("tls.crt"), serving.join("tls.key"));
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let mut flags = vec![
            "--tls-cert-file",
            &cert,
            "--tls-private-key-file",
            &key,
            "--no-controllers",
        ];
        let admin_kubeconfig = peer.admin_kubeconfig.display().to_string();
        if aggregated {
            flags.extend(["--authentication-kubeconfig", &admin_kubeconfig]);
        }
        let server = Server::start_in_with(&data, &flags);
        let kube = Kubectl::new(kubectl_bin(), &peer.admin_kubeconfig);
        let pm = Kubectl::new(kubectl_bin(), &server.kubeconfig);
        kube.ok(&[
            "apply",
            "-f",
            &repo("deploy/aggregation/namespace.yaml")
                .display()
                .to_string(),
        ]);
        let service = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: platform-mesh, namespace: platform-mesh-system}}\n\
             spec:\n  type: ExternalName\n  externalName: localhost\n  ports:\n  - {{name: https, port: {}}}\n",
            server.address.port()
        );
        kube.ok_stdin(&["apply", "-f", "-"], &service);
        Cluster {
            kube,
            pm,
            server,
            peer,
            ca_bundle,
        }
    }

    /// A manifest of `deploy/` with the CA bundle filled in and the Service port of this test.
    fn manifest(&self, path: &str) -> String {
        std::fs::read_to_string(repo(path))
            .expect("read manifest")
            .replace("CA_BUNDLE", &self.ca_bundle)
            .replace(
                "port: 6443",
                &format!("port: {}", self.server.address.port()),
            )
    }

    /// kubectl through kube-apiserver as `user` in `groups`.
    fn kubectl_as(&self, user: &str, groups: &[&str]) -> Kubectl {
        Kubectl::new(kubectl_bin(), &self.peer.user_kubeconfig(user, groups))
    }
}

/// kubectl's stderr; the command must fail.
fn refused(k: &Kubectl, args: &[&str], stdin: &str) -> String {
    let out = k.run_stdin(args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kubectl {} succeeded: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).expect("kubectl printed JSON")
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Everything on the three Platform Mesh groups.
const EDITOR_ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: platform-mesh-editor}
rules:
- apiGroups: [core.platform-mesh.io, providers.platform-mesh.io, broker.platform-mesh.io]
  resources: ["*"]
  verbs: ["*"]
"#;

/// The editor role and a binding of it named `name` to one subject (`User` or `Group`).
fn editors(name: &str, kind: &str, subject: &str) -> String {
    format!(
        "{EDITOR_ROLE}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {{name: {name}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: platform-mesh-editor}}\n\
         subjects:\n- {{kind: {kind}, apiGroup: rbac.authorization.k8s.io, name: {subject}}}\n"
    )
}

#[test]
fn kube_apiserver_serves_the_platform_mesh_apis_through_its_aggregator() {
    let c = Cluster::start(true);
    let kube = &c.kube;

    // deploy/aggregation, as its README applies it (the Service replaced, see above).
    kube.ok(&[
        "apply",
        "-f",
        &repo("deploy/aggregation/rbac.yaml").display().to_string(),
    ]);
    kube.ok_stdin(
        &["apply", "-f", "-"],
        &c.manifest("deploy/aggregation/apiservices.yaml"),
    );
    for gv in [
        "v1alpha1.core.platform-mesh.io",
        "v1alpha1.providers.platform-mesh.io",
        "v1alpha1.broker.platform-mesh.io",
    ] {
        kube.ok(&[
            "wait",
            "--for=condition=Available",
            &format!("apiservice/{gv}"),
            "--timeout=60s",
        ]);
    }
    let resources = kube.ok(&[
        "api-resources",
        "--api-group=core.platform-mesh.io",
        "-o",
        "name",
    ]);
    for r in [
        "platformmeshes.core.platform-mesh.io",
        "accounts.core.platform-mesh.io",
    ] {
        assert!(
            resources.lines().any(|l| l == r),
            "{r} missing from:\n{resources}"
        );
    }
    // OpenAPI v3 comes from serve, through the aggregator (which fetches it once the
    // APIService is available).
    let explain = [
        "explain",
        "providers.spec",
        "--api-version=providers.platform-mesh.io/v1alpha1",
    ];
    wait_until("kubectl explain through kube-apiserver", || {
        kube.run(&explain).status.success()
    });
    let explained = kube.ok(&explain);
    assert!(explained.contains("hostOverride"), "{explained}");
    let paths = json(&kube.ok(&["get", "--raw", "/openapi/v3"]));
    assert!(
        paths["paths"]["apis/core.platform-mesh.io/v1alpha1"].is_object(),
        "{paths}"
    );

    // Create, list, patch, delete through kube-apiserver.
    let examples = |f: &str| std::fs::read_to_string(repo(f)).expect("example");
    kube.ok_stdin(
        &["create", "-f", "-"],
        &examples("examples/quickstart/provider.yaml"),
    );
    kube.ok_stdin(
        &["create", "-f", "-"],
        &examples("examples/quickstart/platformmesh.yaml"),
    );
    kube.ok_stdin(
        &["create", "-f", "-"],
        &examples("examples/broker-certs/acceptapi-internalca.yaml"),
    );
    let names = kube.ok(&["get", "providers.providers.platform-mesh.io", "-o", "name"]);
    assert_eq!(
        names.trim(),
        "provider.providers.platform-mesh.io/certificates"
    );
    kube.ok(&[
        "patch",
        "providers.providers.platform-mesh.io",
        "certificates",
        "--type=merge",
        "-p",
        r#"{"spec":{"hostOverride":"https://kcp2.example.com"}}"#,
    ]);
    // The object lives in platform-mesh: its own admin sees the patch.
    let stored = json(&c.pm.ok(&[
        "get",
        "providers.providers.platform-mesh.io",
        "certificates",
        "-o",
        "json",
    ]));
    assert_eq!(stored["spec"]["hostOverride"], "https://kcp2.example.com");
    let table = kube.ok(&[
        "get",
        "platformmeshes.core.platform-mesh.io",
        "-n",
        "default",
    ]);
    assert!(
        table.starts_with("NAME") && table.contains("demo"),
        "{table}"
    );
    let acc = kube.ok(&[
        "get",
        "acceptapis.broker.platform-mesh.io",
        "-n",
        "default",
        "-o",
        "name",
    ]);
    assert_eq!(
        acc.trim(),
        "acceptapi.broker.platform-mesh.io/certificates.example.platform-mesh.io"
    );

    // platform-mesh's own 422 messages reach the user unchanged.
    for case in apiserver::admission::rules::invalid_cases()
        .iter()
        .filter(|c| ["PlatformMesh", "Provider", "AcceptAPI"].contains(&c.kind))
    {
        let mut obj = case.object.clone();
        let mut args = vec!["create", "-f", "-"];
        if case.namespaced {
            obj["metadata"]["namespace"] = "default".into();
            args.extend(["-n", "default"]);
        }
        let err = refused(kube, &args, &obj.to_string());
        let want = format!("{}: {}", case.field, case.message);
        assert!(
            err.contains("is invalid") && err.contains(&want),
            "{}: {err}\nwant {want}",
            case.name
        );
    }

    kube.ok(&[
        "delete",
        "providers.providers.platform-mesh.io",
        "certificates",
    ]);
    let left =
        c.pm.ok(&["get", "providers.providers.platform-mesh.io", "-o", "name"]);
    assert_eq!(left.trim(), "");

    // Users of kube-apiserver, authorized twice: kube's RBAC, then platform-mesh's.
    // kube-apiserver lets the whole group edit; platform-mesh only alice.
    kube.ok_stdin(
        &["apply", "-f", "-"],
        &editors("platform-mesh-users", "Group", "platform-mesh-users"),
    );
    c.pm.ok_stdin(
        &["apply", "-f", "-"],
        &editors("alice-edits", "User", "alice"),
    );
    let alice = c.kubectl_as("alice", &["platform-mesh-users"]);
    let bob = c.kubectl_as("bob", &["platform-mesh-users"]);
    let carol = c.kubectl_as("carol", &[]);
    let seen = alice.ok(&[
        "get",
        "platformmeshes.core.platform-mesh.io",
        "-n",
        "default",
        "-o",
        "name",
    ]);
    assert_eq!(seen.trim(), "platformmesh.core.platform-mesh.io/demo");
    alice.ok(&[
        "delete",
        "acceptapis.broker.platform-mesh.io",
        "-n",
        "default",
        "--all",
    ]);
    // bob passes kube's RBAC; platform-mesh's refuses him, in kube's words.
    let err = refused(
        &bob,
        &[
            "get",
            "platformmeshes.core.platform-mesh.io",
            "-n",
            "default",
        ],
        "",
    );
    assert!(
        err.contains(r#"platformmeshes.core.platform-mesh.io is forbidden: User "bob" cannot list resource "platformmeshes" in API group "core.platform-mesh.io" in the namespace "default""#),
        "{err}"
    );
    // carol never gets past kube-apiserver.
    let err = refused(&carol, &["get", "providers.providers.platform-mesh.io"], "");
    assert!(
        err.contains(r#"providers.providers.platform-mesh.io is forbidden: User "carol" cannot list resource "providers" in API group "providers.platform-mesh.io" at the cluster scope"#),
        "{err}"
    );
}

/// Sets `failurePolicy` of both webhook configurations.
fn set_failure_policy(kube: &Kubectl, policy: &str) {
    let patch =
        format!(r#"[{{"op":"replace","path":"/webhooks/0/failurePolicy","value":"{policy}"}}]"#);
    for kind in [
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    ] {
        kube.ok(&["patch", kind, "platform-mesh", "--type=json", "-p", &patch]);
    }
}

#[test]
fn kube_apiserver_asks_the_webhooks_for_platform_mesh_crds() {
    let mut c = Cluster::start(false);
    let kube = &c.kube;
    // The CRDs of manifests/crds in kube-apiserver, then deploy/webhooks as its README applies it.
    kube.ok(&["apply", "-f", &repo("manifests/crds").display().to_string()]);
    kube.ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ]);
    kube.ok_stdin(
        &["apply", "-f", "-"],
        &c.manifest("deploy/webhooks/validating.yaml"),
    );
    kube.ok_stdin(
        &["apply", "-f", "-"],
        &c.manifest("deploy/webhooks/mutating.yaml"),
    );

    // Every invalid object of the broker kinds is refused with platform-mesh's message: by the
    // CRD's own schema and CEL rules where they catch it (kube-apiserver checks them before it
    // calls validating webhooks), by the webhook for the rules only platform-mesh knows.
    let cases = apiserver::admission::rules::invalid_cases();
    let broker: Vec<_> = cases
        .iter()
        .filter(|c| c.group == "broker.platform-mesh.io")
        .collect();
    let mut by_webhook = std::collections::BTreeMap::<&str, usize>::new();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut conn = rt
        .block_on(c.peer.client().connect())
        .expect("connect to kube-apiserver");
    for case in &broker {
        let mut obj = case.object.clone();
        obj["metadata"]["namespace"] = "default".into();
        assert!(case.namespaced, "{}", case.name);
        let path = format!(
            "/apis/{}/v1alpha1/namespaces/default/{}",
            case.group, case.plural
        );
        let reply = rt.block_on(conn.post_json(&path, &obj)).expect("create");
        let status = reply.json();
        let want = format!("{}: {}", case.field, case.message);
        let message = status["message"].as_str().unwrap_or_default();
        assert_eq!(reply.status, 422, "{}: {status}", case.name);
        assert!(
            message.contains(&want),
            "{}: {message}\nwant {want}",
            case.name
        );
        if message
            .starts_with(r#"admission webhook "validate.platform-mesh.io" denied the request: "#)
        {
            *by_webhook.entry(case.kind).or_default() += 1;
        }
    }
    eprintln!(
        "refused by the webhook: {by_webhook:?} of {} cases",
        broker.len()
    );
    for kind in ["AcceptAPI", "Migration", "MigrationConfiguration"] {
        assert!(
            by_webhook.get(kind).is_some_and(|n| *n > 0),
            "no {kind} refused by the webhook: {by_webhook:?}"
        );
    }

    // Defaults come from /admission/mutate: the object kube-apiserver stores is the object
    // platform-mesh itself would store.
    let pm_yaml =
        std::fs::read_to_string(repo("examples/quickstart/platformmesh.yaml")).expect("example");
    kube.ok_stdin(&["create", "-f", "-"], &pm_yaml);
    c.pm.ok_stdin(&["create", "-f", "-"], &pm_yaml);
    let get = [
        "get",
        "platformmeshes.core.platform-mesh.io",
        "demo",
        "-n",
        "default",
        "-o",
        "json",
    ];
    let in_kube = json(&kube.ok(&get));
    let in_pm = json(&c.pm.ok(&get));
    assert_ne!(
        in_kube["spec"],
        serde_saphyr_spec(&pm_yaml),
        "kube-apiserver stored the object without defaults"
    );
    assert_eq!(in_kube["spec"], in_pm["spec"]);

    // The webhook server gone: failurePolicy Fail refuses, Ignore admits.
    c.server.kill();
    let accept = std::fs::read_to_string(repo("examples/broker-certs/acceptapi-internalca.yaml"))
        .expect("example");
    let err = refused(kube, &["create", "-f", "-"], &accept);
    assert!(
        err.contains(r#"failed calling webhook "default.platform-mesh.io""#),
        "{err}"
    );
    set_failure_policy(kube, "Ignore");
    kube.ok_stdin(&["create", "-f", "-"], &accept);
}

/// The `spec` of a YAML manifest, as JSON.
fn serde_saphyr_spec(yaml: &str) -> Value {
    let v: Value = serde_saphyr::from_str(yaml).expect("yaml");
    v["spec"].clone()
}
