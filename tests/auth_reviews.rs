//! `kubectl auth whoami` and `kubectl auth can-i [--list]` against the server, for the admin and
//! for a user whose rights come from a RoleBinding, a static-token user and a ServiceAccount token
//! from `kubectl create token` (kubectl 1.27 and 1.33).

mod common;

use common::{kubectl_binary, Kubectl, Server};

const ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: configmap-reader
  namespace: default
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: alice-reads-configmaps
  namespace: default
subjects:
- kind: User
  name: alice
  apiGroup: rbac.authorization.k8s.io
roleRef:
  kind: Role
  name: configmap-reader
  apiGroup: rbac.authorization.k8s.io
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: role-writer
  namespace: default
rules:
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["create", "get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: alice-writes-roles
  namespace: default
subjects:
- kind: User
  name: alice
  apiGroup: rbac.authorization.k8s.io
roleRef:
  kind: Role
  name: role-writer
  apiGroup: rbac.authorization.k8s.io
"#;

fn role(name: &str, resource: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {name}\n  namespace: default\nrules:\n- apiGroups: [\"\"]\n  resources: [\"{resource}\"]\n  verbs: [\"get\"]\n"
    )
}

fn reviews(version: &str) {
    let bin =
        kubectl_binary(version).unwrap_or_else(|| panic!("kubectl.{version} is not installed"));
    let server = Server::start();
    let admin = Kubectl::new(bin.clone(), &server.kubeconfig);
    let whoami = admin.ok(&["auth", "whoami"]);
    assert!(
        whoami.contains("admin") && whoami.contains("system:masters"),
        "{whoami}"
    );
    assert_eq!(
        admin.ok(&["auth", "can-i", "delete", "secrets"]).trim(),
        "yes"
    );
    admin.ok_stdin(&["apply", "-f", "-"], ROLE);

    // A second identity: a client certificate for alice (group dev) from the server's CA.
    let pki = certs::load_or_create(&server.data_dir.join("pki"), &[]).expect("pki");
    let (cert, key) = pki
        .issue_client_certificate("alice", &["dev".to_string()], 1)
        .expect("alice cert");
    let mut opts = pki.admin_kubeconfig_options(&server.url());
    opts.user_name = "alice".into();
    opts.client_cert_pem = Some(cert);
    opts.client_key_pem = Some(key);
    let alice_config = server.data_dir.join("alice.kubeconfig");
    certs::write_kubeconfig(&alice_config, &opts).expect("kubeconfig");
    let alice = Kubectl::new(bin, &alice_config);
    let whoami = alice.ok(&["auth", "whoami"]);
    assert!(
        whoami.contains("alice") && whoami.contains("dev") && !whoami.contains("system:masters"),
        "{whoami}"
    );
    assert_eq!(
        alice.ok(&["auth", "can-i", "get", "configmaps"]).trim(),
        "yes"
    );
    let no = alice.run(&["auth", "can-i", "delete", "configmaps"]);
    assert!(!no.status.success());
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    let no = alice.run(&["auth", "can-i", "get", "configmaps", "-n", "kube-system"]);
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    // The same rules decide her requests.
    admin.ok(&["create", "configmap", "shared", "--from-literal=k=v"]);
    assert_eq!(
        alice.ok(&["get", "configmap", "shared", "-o", "jsonpath={.data.k}"]),
        "v"
    );
    let denied = alice.run(&["delete", "configmap", "shared"]);
    assert!(!denied.status.success());
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        err.contains("configmaps \"shared\" is forbidden: User \"alice\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
    assert!(!alice.run(&["get", "secrets"]).status.success());
    assert!(!alice
        .run(&["get", "configmaps", "-n", "kube-system"])
        .status
        .success());
    // She may hand out what she holds, and nothing more.
    alice.ok_stdin(
        &["create", "-f", "-"],
        &role("configmap-getter", "configmaps"),
    );
    let escalation = alice.run_stdin(&["create", "-f", "-"], &role("secret-getter", "secrets"));
    assert!(!escalation.status.success());
    let err = String::from_utf8_lossy(&escalation.stderr);
    assert!(
        err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    let list = alice.ok(&["auth", "can-i", "--list"]);
    assert!(
        list.contains("configmaps") && list.contains("[get list watch]"),
        "{list}"
    );
}

#[test]
fn auth_reviews_kubectl_1_27() {
    reviews("1.27");
}

#[test]
fn auth_reviews_kubectl_1_33() {
    reviews("1.33");
}

fn token_identity(version: &str) {
    let bin =
        kubectl_binary(version).unwrap_or_else(|| panic!("kubectl.{version} is not installed"));
    let files = tempfile::tempdir().expect("tempdir");
    let token_file = files.path().join("tokens.csv");
    std::fs::write(
        &token_file,
        "s3cr3t-token-for-bob,bob,uid-bob,\"viewers,ops\"\n",
    )
    .expect("token file");
    let server = Server::start_with(&["--token-auth-file", token_file.to_str().expect("path")]);
    let pki = certs::load_or_create(&server.data_dir.join("pki"), &[]).expect("pki");
    let kubeconfig = |token: &str, name: &str| {
        let mut opts = pki.admin_kubeconfig_options(&server.url());
        opts.user_name = "bob".into();
        opts.client_cert_pem = None;
        opts.client_key_pem = None;
        opts.token = Some(token.to_string());
        let path = files.path().join(name);
        certs::write_kubeconfig(&path, &opts).expect("kubeconfig");
        path
    };
    let bob = Kubectl::new(
        bin.clone(),
        &kubeconfig("s3cr3t-token-for-bob", "bob.kubeconfig"),
    );
    let whoami = bob.ok(&["auth", "whoami"]);
    assert!(
        whoami.contains("bob") && whoami.contains("viewers") && whoami.contains("ops"),
        "{whoami}"
    );
    let no = bob.run(&["auth", "can-i", "get", "configmaps"]);
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    assert!(!bob.run(&["get", "configmaps"]).status.success());
    // A binding to the token's group shows up in bob's rules.
    let admin = Kubectl::new(bin.clone(), &server.kubeconfig);
    admin.ok(&[
        "create",
        "clusterrole",
        "lease-viewer",
        "--verb=get,list",
        "--resource=leases.coordination.k8s.io",
    ]);
    admin.ok(&[
        "create",
        "clusterrolebinding",
        "viewers-see-leases",
        "--clusterrole=lease-viewer",
        "--group=viewers",
    ]);
    let list = bob.ok(&["auth", "can-i", "--list"]);
    assert!(
        list.contains("leases.coordination.k8s.io") && list.contains("[get list]"),
        "{list}"
    );
    assert!(!list.contains("configmaps"), "{list}");
    let forged = Kubectl::new(
        bin,
        &kubeconfig("s3cr3t-token-for-bobX", "forged.kubeconfig"),
    );
    let refused = forged.run(&["get", "configmaps"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("You must be logged in"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn token_identity_kubectl_1_27() {
    token_identity("1.27");
}

#[test]
fn token_identity_kubectl_1_33() {
    token_identity("1.33");
}

/// The third kind of identity: a ServiceAccount token from `kubectl create token` (TokenRequest).
fn service_account_identity(version: &str) {
    let bin =
        kubectl_binary(version).unwrap_or_else(|| panic!("kubectl.{version} is not installed"));
    let server = Server::start();
    let admin = Kubectl::new(bin.clone(), &server.kubeconfig);
    admin.ok(&["create", "serviceaccount", "robot"]);
    admin.ok(&[
        "create",
        "rolebinding",
        "robot-reads-configmaps",
        "--clusterrole=view-configmaps",
        "--serviceaccount=default:robot",
    ]);
    admin.ok(&[
        "create",
        "clusterrole",
        "view-configmaps",
        "--verb=get,list,watch",
        "--resource=configmaps",
    ]);
    let token = admin.ok(&["create", "token", "robot", "--duration=1h"]);
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "not a JWT: {token}");
    let pki = certs::load_or_create(&server.data_dir.join("pki"), &[]).expect("pki");
    let mut opts = pki.admin_kubeconfig_options(&server.url());
    opts.user_name = "robot".into();
    opts.client_cert_pem = None;
    opts.client_key_pem = None;
    opts.token = Some(token.to_string());
    let path = server.data_dir.join("robot.kubeconfig");
    certs::write_kubeconfig(&path, &opts).expect("kubeconfig");
    let robot = Kubectl::new(bin, &path);
    let whoami = robot.ok(&["auth", "whoami"]);
    for expected in [
        "system:serviceaccount:default:robot",
        "system:serviceaccounts:default",
        "system:authenticated",
    ] {
        assert!(whoami.contains(expected), "{expected} missing: {whoami}");
    }
    assert!(!whoami.contains("system:masters"), "{whoami}");
    let list = robot.ok(&["auth", "can-i", "--list"]);
    assert!(
        list.contains("configmaps") && list.contains("[get list watch]"),
        "{list}"
    );
    assert!(!list.contains("secrets"), "{list}");
    assert_eq!(
        robot.ok(&["auth", "can-i", "list", "configmaps"]).trim(),
        "yes"
    );
    let no = robot.run(&["auth", "can-i", "list", "secrets"]);
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    admin.ok(&["create", "configmap", "seen", "--from-literal=k=v"]);
    assert_eq!(
        robot.ok(&["get", "configmap", "seen", "-o", "jsonpath={.data.k}"]),
        "v"
    );
    let denied = robot.run(&["get", "secrets"]);
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains(
            "User \"system:serviceaccount:default:robot\" cannot list resource \"secrets\""
        ),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    // Deleting the account revokes the token.
    admin.ok(&["delete", "serviceaccount", "robot"]);
    let gone = robot.run(&["get", "configmaps"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("You must be logged in"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
}

#[test]
fn service_account_identity_kubectl_1_27() {
    service_account_identity("1.27");
}

#[test]
fn service_account_identity_kubectl_1_33() {
    service_account_identity("1.33");
}
