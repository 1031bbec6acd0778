//! `kubectl apply --server-side` against the server, as against kube-apiserver: creates, conflicts
//! name the other manager, `--force-conflicts` wins, and managedFields list both managers.

mod common;

use common::{kubectl_binary, Kubectl, Server};

const SETTINGS: &str = include_str!("../examples/quickstart/settings.yaml");
const PLATFORM_MESH: &str = include_str!("../examples/quickstart/platformmesh.yaml");

fn server_side_apply(version: &str) {
    let bin =
        kubectl_binary(version).unwrap_or_else(|| panic!("kubectl.{version} is not installed"));
    let server = Server::start();
    let k = Kubectl::new(bin, &server.kubeconfig);

    for (doc, what, changed) in [
        (
            SETTINGS,
            "configmap/settings",
            SETTINGS.replace("gold", "platinum"),
        ),
        (
            PLATFORM_MESH,
            "platformmesh.core.platform-mesh.io/demo",
            PLATFORM_MESH.replace("platform-mesh-operator-kubeconfig", "other-secret"),
        ),
    ] {
        let out = k.ok_stdin(&["apply", "--server-side", "-f", "-"], doc);
        assert!(out.contains(&format!("{what} serverside-applied")), "{out}");
        // Applying the same configuration again changes nothing.
        let rv = |k: &Kubectl| k.ok(&["get", what, "-o", "jsonpath={.metadata.resourceVersion}"]);
        let before = rv(&k);
        k.ok_stdin(&["apply", "--server-side", "-f", "-"], doc);
        assert_eq!(
            before,
            rv(&k),
            "re-applying the same configuration wrote the object"
        );

        let refused = k.run_stdin(
            &["apply", "--server-side", "--field-manager=other", "-f", "-"],
            &changed,
        );
        assert!(!refused.status.success(), "conflicting apply succeeded");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("Apply failed with 1 conflict: conflict with \"kubectl\""),
            "{err}"
        );

        let forced = k.ok_stdin(
            &[
                "apply",
                "--server-side",
                "--field-manager=other",
                "--force-conflicts",
                "-f",
                "-",
            ],
            &changed,
        );
        assert!(forced.contains("serverside-applied"), "{forced}");
        let managed = k.ok(&["get", what, "--show-managed-fields", "-o", "yaml"]);
        assert!(managed.contains("manager: kubectl\n"), "{managed}");
        assert!(managed.contains("manager: other\n"), "{managed}");
        assert!(managed.contains("operation: Apply"), "{managed}");
    }
    // Client-side writes are tracked too: a later apply conflicts with them by name.
    k.ok(&["label", "cm", "settings", "team=a"]);
    let managed = k.ok(&[
        "get",
        "cm",
        "settings",
        "--show-managed-fields",
        "-o",
        "yaml",
    ]);
    assert!(managed.contains("manager: kubectl-label"), "{managed}");
}

#[test]
fn server_side_apply_kubectl_1_27() {
    server_side_apply("1.27");
}

#[test]
fn server_side_apply_kubectl_1_33() {
    server_side_apply("1.33");
}
