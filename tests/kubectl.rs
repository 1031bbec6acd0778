//! The kubectl conformance matrix: the same steps against a freshly started `platform-mesh serve`
//! with every kubectl version of the machine image (1.27 … 1.33), and with each version the
//! re-apply steps: every kind used in practice applied twice, client and server side, without a
//! warning.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{kubectl_binary, Kubectl, Server};

const PLATFORM_MESH: &str = include_str!("../examples/quickstart/platformmesh.yaml");
const SETTINGS: &str = include_str!("../examples/quickstart/settings.yaml");
const PROVIDER: &str = include_str!("../examples/quickstart/provider.yaml");
const TEAM_WORKSPACE: &str = include_str!("../examples/quickstart/team-workspace.yaml");

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `n` ConfigMaps of about 1 KiB each: 150 of them make a list over kube-apiserver's 128 KiB
/// compression threshold, so every kubectl version reads gzipped lists (client-go asks for gzip).
fn bulk_configmaps(n: usize) -> String {
    let mut s = String::from("apiVersion: v1\nkind: List\nitems:\n");
    let pad = "b".repeat(1000);
    for i in 0..n {
        s.push_str(&format!(
            "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: bulk-{i:04}\n    namespace: bulk\n  data:\n    index: \"{i}\"\n    pad: {pad}\n"
        ));
    }
    s
}

/// How many ConfigMaps the bulk step creates: 1,000 once (with the newest kubectl), and with
/// every other version enough for two chunks of `--chunk-size=100`, which exercises the same
/// continue-token paging without creating 1,000 objects seven times.
fn bulk_size(version: &str) -> usize {
    if version == NEWEST {
        1000
    } else {
        150
    }
}

/// The kubectl version that runs the full 1,000-object bulk step.
const NEWEST: &str = "1.33";

fn matrix(version: &str) {
    let bin = kubectl_binary(version).unwrap_or_else(|| {
        panic!("kubectl.{version} is not installed beside the machine's kubectl")
    });
    // The matrix writes PlatformMesh status itself (`kubectl wait` on a condition): the server's
    // own PlatformMesh controller would race it, so it runs without controllers.
    let server = Server::start_with(&["--no-controllers"]);
    let k = Kubectl::new(bin, &server.kubeconfig);

    // Discovery.
    let resources = k.ok(&["api-resources"]);
    for r in [
        "platformmeshes",
        "providers",
        "managedproviders",
        "acceptapis",
        "configmaps",
        "leases",
        "namespaces",
    ] {
        assert!(
            resources.contains(r),
            "api-resources lacks {r}:\n{resources}"
        );
    }
    let explain = k.ok(&["explain", "platformmesh.spec"]);
    assert!(
        explain.contains("kcp"),
        "explain platformmesh.spec:\n{explain}"
    );

    // create, apply twice.
    let created = k.ok_stdin(&["create", "-f", "-"], PLATFORM_MESH);
    assert!(
        created.contains("platformmesh.core.platform-mesh.io/demo created"),
        "{created}"
    );
    let first = k.ok_stdin(&["apply", "-f", "-"], SETTINGS);
    assert!(first.contains("configmap/settings created"), "{first}");
    let second = k.ok_stdin(&["apply", "-f", "-"], SETTINGS);
    assert!(second.contains("configmap/settings unchanged"), "{second}");
    let first = k.ok_stdin(&["apply", "-f", "-"], PROVIDER);
    assert!(
        first.contains("provider.providers.platform-mesh.io/certificates created"),
        "{first}"
    );
    let second = k.ok_stdin(&["apply", "-f", "-"], PROVIDER);
    assert!(second.contains("unchanged"), "{second}");
    let changed = k.ok_stdin(&["apply", "-f", "-"], &SETTINGS.replace("gold", "silver"));
    assert!(
        changed.contains("configmap/settings configured"),
        "{changed}"
    );
    assert_eq!(
        k.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.tier}"]),
        "silver"
    );

    // get in every output format.
    let wide = k.ok(&["get", "platformmeshes", "-o", "wide"]);
    assert!(wide.contains("NAME") && wide.contains("demo"), "{wide}");
    let yaml = k.ok(&["get", "platformmesh", "demo", "-o", "yaml"]);
    assert!(
        yaml.contains("endpointSliceName: core.platform-mesh.io"),
        "{yaml}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "cm", "settings", "-o", "json"])).expect("json");
    assert_eq!(json["data"]["region"], "eu-west");
    assert_eq!(
        k.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.region}"]),
        "eu-west"
    );
    let cc = k.ok(&[
        "get",
        "cm",
        "settings",
        "-o",
        "custom-columns=N:.metadata.name,R:.data.region",
    ]);
    assert!(cc.contains("settings") && cc.contains("eu-west"), "{cc}");
    assert_eq!(
        k.ok(&["get", "providers", "-o", "name"]).trim(),
        "provider.providers.platform-mesh.io/certificates"
    );
    let table = k.ok(&["get", "cm"]);
    assert!(
        table.contains("DATA") && table.contains("settings"),
        "{table}"
    );

    // -A and chunked lists over several chunks.
    let bulk = bulk_size(version);
    k.ok(&["create", "namespace", "bulk"]);
    k.ok_stdin(&["create", "-f", "-"], &bulk_configmaps(bulk));
    let all = k.ok(&["get", "cm", "-A"]);
    let last = format!("bulk-{:04}", bulk - 1);
    assert!(
        all.contains("NAMESPACE") && all.contains(&last) && all.contains("settings"),
        "-A output"
    );
    // (the namespace's kube-root-ca.crt besides the bulk)
    let chunked = k.ok(&["get", "cm", "-n", "bulk", "--chunk-size=100", "-o", "name"]);
    assert_eq!(chunked.lines().count(), bulk + 1, "chunked list");
    let chunked_table = k.ok(&[
        "get",
        "cm",
        "-n",
        "bulk",
        "--chunk-size=100",
        "--no-headers",
    ]);
    assert_eq!(chunked_table.lines().count(), bulk + 1, "chunked table");

    // get -w sees an update.
    let mut watch = k
        .command(&[
            "get",
            "cm",
            "settings",
            "-w",
            "-o",
            "jsonpath={.data.tier}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30))
            .expect("initial watch line"),
        "silver"
    );
    k.ok(&[
        "patch",
        "cm",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"tier":"bronze"}}"#,
    ]);
    let mut seen = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
        if line == "bronze" {
            seen = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "kubectl get -w did not see the update");

    // label, annotate, patch.
    assert!(k
        .ok(&["label", "cm", "settings", "team=a"])
        .contains("labeled"));
    assert_eq!(
        k.ok(&["get", "cm", "-l", "team=a", "-o", "name"]).trim(),
        "configmap/settings"
    );
    assert!(k
        .ok(&["annotate", "platformmesh", "demo", "note=hi"])
        .contains("annotate"));
    assert!(k
        .ok(&["label", "provider", "certificates", "tier=1"])
        .contains("labeled"));
    k.ok(&[
        "patch",
        "platformmesh",
        "demo",
        "--type=merge",
        "-p",
        r#"{"spec":{"exposure":{"port":8443}}}"#,
    ]);
    k.ok(&[
        "patch",
        "cm",
        "settings",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/data/zone","value":"z1"}]"#,
    ]);
    assert_eq!(
        k.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.zone}"]),
        "z1"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "platformmesh",
            "demo",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "2"
    );

    // diff: exit 1 with the change shown; 0 when nothing differs.
    let diff = k.run_stdin(
        &["diff", "-f", "-"],
        &SETTINGS.replace("eu-west", "us-east"),
    );
    assert_eq!(diff.status.code(), Some(1), "diff: {}", stderr_of(&diff));
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        text.contains("us-east") && text.contains("eu-west"),
        "{text}"
    );

    // wait for a condition set through the status subresource.
    let wait = k
        .command(&[
            "wait",
            "platformmesh/demo",
            "--for=condition=Ready",
            "--timeout=60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wait");
    std::thread::sleep(Duration::from_millis(500));
    k.ok(&[
        "patch",
        "platformmesh",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Ready","message":"done","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ]);
    let waited = wait.wait_with_output().expect("wait output");
    assert!(
        waited.status.success(),
        "wait failed: {}",
        stderr_of(&waited)
    );
    assert!(String::from_utf8_lossy(&waited.stdout).contains("condition met"));
    assert_eq!(
        k.ok(&[
            "get",
            "platformmesh",
            "demo",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "2"
    );

    // A finalizer holds deletion.
    k.ok(&["create", "cm", "held", "--from-literal=a=b"]);
    k.ok(&[
        "patch",
        "cm",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ]);
    assert!(k
        .ok(&["delete", "cm", "held", "--wait=false"])
        .contains("deleted"));
    assert!(!k
        .ok(&[
            "get",
            "cm",
            "held",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}"
        ])
        .is_empty());
    k.ok(&[
        "patch",
        "cm",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    let gone = k.run(&["get", "cm", "held"]);
    assert!(
        !gone.status.success() && stderr_of(&gone).contains("NotFound"),
        "{}",
        stderr_of(&gone)
    );

    // Another logical cluster, and the read-only wildcard.
    let base = server.url();
    let ws = k.ok_stdin(&["create", "-f", "-"], TEAM_WORKSPACE);
    assert!(
        ws.contains("workspace.tenancy.kcp.io/team-a created"),
        "{ws}"
    );
    let team = format!("--server={base}/clusters/root:team-a");
    k.ok(&[&team, "create", "cm", "only-in-team-a"]);
    assert!(k.ok(&[&team, "get", "ns"]).contains("default"));
    let root_cms = k.ok(&["get", "cm", "-o", "name"]);
    assert!(!root_cms.contains("only-in-team-a"), "{root_cms}");
    let wildcard = format!("--server={base}/clusters/*");
    let across = k.ok(&[&wildcard, "get", "cm", "-A", "-o", "jsonpath={range .items[*]}{.metadata.annotations.kcp\\.io/cluster}/{.metadata.name}{\"\\n\"}{end}"]);
    // Objects carry their logical cluster's name, an opaque one for team-a.
    let team_cluster = k.ok(&[
        &team,
        "get",
        "logicalcluster",
        "cluster",
        "-o",
        "jsonpath={.metadata.annotations.kcp\\.io/cluster}",
    ]);
    assert!(!team_cluster.is_empty() && team_cluster != "root");
    assert!(
        across.contains(&format!("{team_cluster}/only-in-team-a"))
            && across.contains("root/settings"),
        "{across}"
    );
    let unknown = k.run(&[&format!("--server={base}/clusters/root:nope"), "get", "cm"]);
    assert!(
        !unknown.status.success(),
        "an unknown workspace must be refused"
    );
    let refused = k.run(&[&wildcard, "create", "cm", "nope"]);
    assert!(
        !refused.status.success(),
        "writes through /clusters/* must fail"
    );

    // Delete waits until the object is gone.
    let deleted = k.ok_stdin(&["delete", "-f", "-"], PLATFORM_MESH);
    assert!(deleted.contains("deleted"), "{deleted}");
    assert!(!k.run(&["get", "platformmesh", "demo"]).status.success());
}

/// A CRD whose custom resources the re-apply steps write, with a nested list map and a set.
const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.reapply.example.com
spec:
  group: reapply.example.com
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              tags: {type: array, items: {type: string}, x-kubernetes-list-type: set}
              parts:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    count: {type: integer}
"#;

/// One object of every kind used in practice, for the re-apply steps: `${name}` is its name,
/// `${meta}` its labels and annotations (which change between the two applies) and `${round}`
/// a value in its content that changes too.
const REAPPLIED: &[(&str, &str)] = &[
    (
        "configmap",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\ndata:\n  round: \"${round}\"\n",
    ),
    (
        "secret",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nstringData:\n  round: \"${round}\"\n",
    ),
    (
        "namespace",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${name}\n${meta}\n",
    ),
    (
        "serviceaccount",
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nsecrets:\n- name: token-${round}\n",
    ),
    (
        "role",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nrules:\n- apiGroups: [\"\"]\n  resources: [configmaps]\n  verbs: [get, list]\n  resourceNames: [cm-${round}]\n",
    ),
    (
        "clusterrole",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: ${name}\n${meta}\nrules:\n- apiGroups: [\"\"]\n  resources: [namespaces]\n  verbs: [get]\n  resourceNames: [ns-${round}]\n",
    ),
    (
        "rolebinding",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: view\nsubjects:\n- kind: User\n  name: user-${round}\n",
    ),
    (
        "lease",
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nspec:\n  holderIdentity: holder-${round}\n",
    ),
    (
        "widget",
        "apiVersion: reapply.example.com/v1\nkind: Widget\nmetadata:\n  name: ${name}\n  namespace: default\n${meta}\nspec:\n  size: ${round}\n  tags: [a, t${round}]\n  parts:\n  - name: p\n    count: ${round}\n",
    ),
    (
        "account",
        "apiVersion: core.platform-mesh.io/v1alpha1\nkind: Account\nmetadata:\n  name: ${name}\n${meta}\nspec:\n  type: account\n  displayName: Team ${round}\n",
    ),
    (
        "provider",
        "apiVersion: providers.platform-mesh.io/v1alpha1\nkind: Provider\nmetadata:\n  name: ${name}\n${meta}\nspec:\n  hostOverride: https://kcp-${round}.example.com\n",
    ),
];

/// `kubectl apply` of an object a second time, changed, warns about nothing, client side (where
/// kubectl computes its patch from the server's OpenAPI documents, which must describe
/// `metadata`) and server side; and the second apply changes what it changed.
fn reapply(version: &str) {
    let bin = kubectl_binary(version).unwrap_or_else(|| {
        panic!("kubectl.{version} is not installed beside the machine's kubectl")
    });
    let server = Server::start_with(&["--no-controllers"]);
    let k = Kubectl::new(bin, &server.kubeconfig);
    k.ok_stdin(&["apply", "-f", "-"], WIDGET_CRD);
    k.ok(&[
        "wait",
        "crd/widgets.reapply.example.com",
        "--for=condition=Established",
        "--timeout=60s",
    ]);
    for (kind, template) in REAPPLIED {
        for (mode, args) in [
            ("csa", &["apply", "-f", "-"][..]),
            ("ssa", &["apply", "--server-side", "-f", "-"][..]),
        ] {
            let name = format!("reapply-{kind}-{mode}");
            for round in ["1", "2"] {
                let meta = format!(
                    "  labels:\n    round: \"{round}\"\n  annotations:\n    example.com/round: \"{round}\""
                );
                let manifest = template
                    .replace("${name}", &name)
                    .replace("${meta}", &meta)
                    .replace("${round}", round);
                let out = k.run_stdin(args, &manifest);
                let stderr = stderr_of(&out);
                assert!(
                    out.status.success() && !stderr.to_lowercase().contains("warning"),
                    "kubectl {version} {} of {kind}, round {round} ({}):\nstdout: {}\nstderr: {stderr}",
                    args.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                );
            }
            let annotation = k.ok(&[
                "get",
                kind,
                &name,
                "--namespace=default",
                "-o",
                r"jsonpath={.metadata.annotations.example\.com/round}/{.metadata.labels.round}",
            ]);
            assert_eq!(annotation, "2/2", "kubectl {version}, {kind} {name}");
        }
    }
}

macro_rules! reapply_versions {
    ($($name:ident => $v:literal;)*) => {
        $(
            #[test]
            fn $name() {
                reapply($v);
            }
        )*
    };
}

reapply_versions! {
    reapply_1_27 => "1.27";
    reapply_1_28 => "1.28";
    reapply_1_29 => "1.29";
    reapply_1_30 => "1.30";
    reapply_1_31 => "1.31";
    reapply_1_32 => "1.32";
    reapply_1_33 => "1.33";
}

macro_rules! kubectl_versions {
    ($($name:ident => $v:literal;)*) => {
        $(
            #[test]
            fn $name() {
                matrix($v);
            }
        )*
    };
}

kubectl_versions! {
    kubectl_1_27 => "1.27";
    kubectl_1_28 => "1.28";
    kubectl_1_29 => "1.29";
    kubectl_1_30 => "1.30";
    kubectl_1_31 => "1.31";
    kubectl_1_32 => "1.32";
    kubectl_1_33 => "1.33";
}
