//! The peers' own test suites, run against `platform-mesh serve` as users run it (default flags
//! and log) and, as the control, against the peer itself on this machine:
//!
//! - `kcp-e2e`: kcp's end-to-end tests (`github.com/kcp-dev/kcp/test/e2e`, at the release
//!   `tests/peers/kcp/go.mod` pins), the packages of `tests/peers/kcp/e2e-packages`, each top-level
//!   test in a process of its own. Control: kcp.
//! - `kube-conformance`: Kubernetes' conformance tests of `[sig-api-machinery]` and
//!   `[sig-auth]` (kube's specs of the `k8s.io/kubernetes` release `tests/peers/go/go.mod` pins,
//!   in `tests/peers/go/apiconformance`: e2e.test's suite without its checks for nodes), run in
//!   parallel test processes. Control: kube-apiserver with the kube-controller-manager of the same
//!   release.
//!
//! What does not pass is listed in `tests/peer-suites/<suite>.yaml`, each entry with its reason:
//! `not_applicable` (not run at all), `failing_on_serve` (passes on the peer, not here) and
//! `failing_on_peer` (fails on the peer itself here). A run fails on a test that fails and is not
//! listed, on a listed test that passes (the list is then stale), and on a listed test that did
//! not run. The README's "Tested against" table is checked against each run's counts. Every
//! test's output is kept in `target/peer-suites/<suite>/<server>/`.

mod common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::kube_apiserver::{peer_binary, Kcp, KubeApiserver, KCP_VERSION, KUBERNETES_VERSION};
use common::Server;
use serde::Deserialize;

/// How a test ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Passed,
    Skipped,
    /// Failed, with the lines that say why.
    Failed(String),
}

/// Where a suite ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Serve,
    Peer,
}

impl Target {
    fn dir_name(self) -> &'static str {
        match self {
            Target::Serve => "serve",
            Target::Peer => "peer",
        }
    }
}

/// One suite's list of what does not pass.
#[derive(Debug, Default, Deserialize)]
struct Lists {
    /// Not run at all: whole packages (kcp) or tests, with why.
    #[serde(default)]
    not_applicable: Vec<Entry>,
    /// Fail on `serve`, pass on the peer.
    #[serde(default)]
    failing_on_serve: Vec<Entry>,
    /// Fail on the peer itself here (and so are no measure of `serve`).
    #[serde(default)]
    failing_on_peer: Vec<Entry>,
    /// Pass or fail on the peer from run to run here: not judged there.
    #[serde(default)]
    flaky_on_peer: Vec<Entry>,
}

impl Lists {
    /// The tests the control runs on the peer: those `serve` does not pass (listed in
    /// `failing_on_serve`, which the serve side checks) and those that fail on the peer itself.
    /// A test `serve` passes needs no verdict from the peer, and the controls take the longest
    /// of the whole suite.
    fn control(&self) -> BTreeSet<&str> {
        self.failing_on_serve
            .iter()
            .chain(&self.failing_on_peer)
            .map(|e| e.test.as_str())
            .collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    /// The test (`<package>/<Test>` for kcp, the spec's full text for conformance) or, in
    /// `not_applicable` of kcp, a package.
    test: String,
    /// For `failing_on_serve`: `not built yet` or `difference` (deliberate, with its reason).
    #[serde(default)]
    kind: Option<Kind>,
    reason: String,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
enum Kind {
    #[serde(rename = "not built yet")]
    NotBuiltYet,
    #[serde(rename = "difference")]
    Difference,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_lists(suite: &str) -> Lists {
    let path = repo()
        .join("tests/peer-suites")
        .join(format!("{suite}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lists: Lists =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for e in &lists.failing_on_serve {
        assert!(
            e.kind.is_some(),
            "{}: {:?} in failing_on_serve needs a kind (`not built yet` or `difference`)",
            path.display(),
            e.test
        );
    }
    for e in lists
        .not_applicable
        .iter()
        .chain(&lists.failing_on_serve)
        .chain(&lists.failing_on_peer)
        .chain(&lists.flaky_on_peer)
    {
        assert!(
            !e.reason.trim().is_empty(),
            "{}: {:?} needs a reason",
            path.display(),
            e.test
        );
    }
    lists
}

/// A fresh directory for the outputs of one suite on one target.
fn output_dir(suite: &str, target: Target) -> PathBuf {
    let dir = repo()
        .join("target/peer-suites")
        .join(suite)
        .join(target.dir_name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("output directory");
    dir
}

/// Compares a run with the lists: the problems, each a line that says what to do.
fn judge(
    suite: &str,
    target: Target,
    outcomes: &BTreeMap<String, Outcome>,
    lists: &Lists,
    output: &Path,
) -> Vec<String> {
    let listed: BTreeMap<&str, &Entry> = match target {
        Target::Serve => &lists.failing_on_serve,
        Target::Peer => &lists.failing_on_peer,
    }
    .iter()
    .map(|e| (e.test.as_str(), e))
    .collect();
    let where_ = match target {
        Target::Serve => "platform-mesh serve",
        Target::Peer => "the peer",
    };
    let list_name = match target {
        Target::Serve => "failing_on_serve",
        Target::Peer => "failing_on_peer",
    };
    let flaky: BTreeSet<&str> = match target {
        Target::Serve => BTreeSet::new(),
        Target::Peer => lists
            .flaky_on_peer
            .iter()
            .map(|e| e.test.as_str())
            .collect(),
    };
    let mut problems = Vec::new();
    for (test, outcome) in outcomes {
        if flaky.contains(test.as_str()) {
            continue;
        }
        match (outcome, listed.contains_key(test.as_str())) {
            (Outcome::Failed(why), false) => problems.push(format!(
                "{test} fails on {where_} and is not in {list_name} of tests/peer-suites/{suite}.yaml \
                 (output in {}):\n{why}",
                output.display()
            )),
            (Outcome::Passed, true) => problems.push(format!(
                "{test} passes on {where_} now: take it out of {list_name} in tests/peer-suites/{suite}.yaml"
            )),
            _ => {}
        }
    }
    for test in listed.keys() {
        if !outcomes.contains_key(*test) {
            problems.push(format!(
                "{test} is in {list_name} of tests/peer-suites/{suite}.yaml but did not run"
            ));
        }
    }
    problems
}

/// The counts of one run, as the README's "Tested against" table gives them.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    run: usize,
    passed: usize,
    listed: usize,
    not_applicable: usize,
}

/// `passed` leaves out the tests of `flaky` (listed, and passing only in some runs), so that the
/// figures stay the same from run to run.
fn counts(
    outcomes: &BTreeMap<String, Outcome>,
    listed: usize,
    not_applicable: usize,
    flaky: &[Entry],
) -> Counts {
    let flaky: BTreeSet<&str> = flaky.iter().map(|e| e.test.as_str()).collect();
    Counts {
        run: outcomes.len(),
        passed: outcomes
            .iter()
            .filter(|(t, o)| **o == Outcome::Passed && !flaky.contains(t.as_str()))
            .count(),
        listed,
        not_applicable,
    }
}

/// Checks the README's row for `suite` on `target` against `counts`: the row is
/// `| <suite> | <target> | <peer version> | run | passed | listed | not applicable |`.
fn readme_row_problem(suite: &str, target: &str, counts: &Counts) -> Option<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let row = readme.lines().find(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        cells.len() > 3 && cells[1] == format!("`{suite}`") && cells[2] == target
    });
    let expected = [
        counts.run,
        counts.passed,
        counts.listed,
        counts.not_applicable,
    ]
    .map(|n| n.to_string());
    match row {
        None => Some(format!(
            "the README's \"Tested against\" table has no row for `{suite}` on {target}; it is: {:?}",
            expected
        )),
        Some(row) => {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let got: Vec<&str> = cells.iter().skip(4).take(4).copied().collect();
            (got != expected.iter().map(String::as_str).collect::<Vec<_>>()).then(|| {
                format!(
                    "the README's \"Tested against\" row for `{suite}` on {target} says run, passed, \
                     listed, not applicable = {got:?}; this run: {expected:?}"
                )
            })
        }
    }
}

/// Judges a run of `suite` on `target` (`peer` names the peer's README row) against its lists
/// and the README's figures, and fails with every problem found.
fn settle(
    suite: &str,
    target: Target,
    peer: &str,
    outcomes: &BTreeMap<String, Outcome>,
    lists: &Lists,
    not_applicable: usize,
    output: &Path,
) {
    let (listed, flaky, row) = match target {
        Target::Serve => (lists.failing_on_serve.len(), &[][..], "serve"),
        Target::Peer => (
            lists.failing_on_peer.len() + lists.flaky_on_peer.len(),
            &lists.flaky_on_peer[..],
            peer,
        ),
    };
    let counts = counts(outcomes, listed, not_applicable, flaky);
    eprintln!("{suite} on {}: {counts:?}", target.dir_name());
    let mut problems = judge(suite, target, outcomes, lists, output);
    problems.extend(readme_row_problem(suite, row, &counts));
    report(suite, target, problems);
}

fn report(suite: &str, target: Target, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{suite} on {}: {} problem(s):\n\n{}",
        target.dir_name(),
        problems.len(),
        problems.join("\n\n")
    );
}

// ---- kcp's end-to-end tests ----

/// The kcp e2e packages scripts/peers builds.
fn kcp_packages() -> Vec<String> {
    std::fs::read_to_string(repo().join("tests/peers/kcp/e2e-packages"))
        .expect("tests/peers/kcp/e2e-packages")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The kcp module's directory in Go's module cache (scripts/peers downloaded it).
fn kcp_module_dir() -> PathBuf {
    let out = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .expect("go env GOMODCACHE (Go builds the peers; scripts/test installs them)");
    let cache = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = Path::new(&cache).join(format!("github.com/kcp-dev/kcp@{KCP_VERSION}"));
    assert!(
        dir.is_dir(),
        "{} is missing: scripts/peers downloads it",
        dir.display()
    );
    dir
}

/// Every package of kcp's test/e2e with tests is either run or not applicable, so a package
/// is never left out silently.
#[test]
fn every_kcp_e2e_package_is_run_or_not_applicable() {
    let module = kcp_module_dir();
    let e2e = module.join("test/e2e");
    let mut with_tests = BTreeSet::new();
    let mut stack = vec![e2e.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read test/e2e") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with("_test.go") {
                let rel = dir.strip_prefix(&e2e).expect("under e2e");
                with_tests.insert(rel.to_string_lossy().to_string());
            }
        }
    }
    let lists = read_lists("kcp-e2e");
    let run: BTreeSet<String> = kcp_packages().into_iter().collect();
    let skipped: BTreeSet<String> = lists
        .not_applicable
        .iter()
        .filter(|e| !e.test.contains("/Test"))
        .map(|e| e.test.clone())
        .collect();
    let missing: Vec<_> = with_tests
        .iter()
        .filter(|p| !run.contains(*p) && !skipped.contains(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "kcp's test/e2e packages {missing:?} are neither in tests/peers/kcp/e2e-packages nor \
         not_applicable in tests/peer-suites/kcp-e2e.yaml"
    );
    let both: Vec<_> = run.intersection(&skipped).collect();
    assert!(both.is_empty(), "{both:?} are both run and not applicable");
}

/// The working directory kcp's test framework needs: a `.git` (it finds "its repository" by
/// walking up), its token file where it looks for it, and `.kcp/` with the kubeconfig and the
/// client CA whose key the tests sign user certificates with.
struct KcpWorkdir {
    dir: PathBuf,
    tokens: PathBuf,
    client_ca: PathBuf,
    kubeconfig: PathBuf,
}

fn kcp_workdir(output: &Path) -> KcpWorkdir {
    let dir = output.join("work");
    std::fs::create_dir_all(dir.join(".git")).expect(".git");
    std::fs::create_dir_all(dir.join("test/e2e/framework")).expect("framework dir");
    let kcp_dir = dir.join(".kcp");
    std::fs::create_dir_all(&kcp_dir).expect(".kcp");
    let tokens = dir.join("test/e2e/framework/auth-tokens.csv");
    std::fs::copy(
        kcp_module_dir().join("test/e2e/framework/auth-tokens.csv"),
        &tokens,
    )
    .expect("kcp's e2e token file");
    // An RSA CA: the framework signs its users' certificates with SHA256-RSA.
    let client_ca = kcp_dir.join("client-ca.crt");
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=kcp-client-ca", "-keyout"])
        .arg(kcp_dir.join("client-ca.key"))
        .arg("-out")
        .arg(&client_ca)
        .stderr(Stdio::null())
        .status()
        .expect("openssl (scripts/test installs it)");
    assert!(status.success(), "openssl could not make the client CA");
    KcpWorkdir {
        kubeconfig: kcp_dir.join("admin.kubeconfig"),
        dir,
        tokens,
        client_ca,
    }
}

/// A kubeconfig with the contexts kcp's framework asks for (`base`, `root`, `system:admin`,
/// `shard-base`), all as the token file's `admin` (in `system:masters`): this server's
/// administrators are that group (kcp's kcp-admin is a user of its own).
fn write_kcp_style_kubeconfig(path: &Path, base_url: &str, ca_pem: &str) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let cluster = |name: &str, suffix: &str| {
        format!(
            "- name: {name}\n  cluster:\n    server: {base_url}{suffix}\n    certificate-authority-data: {ca}\n"
        )
    };
    let context = |name: &str, cluster: &str| {
        format!("- name: {name}\n  context:\n    cluster: {cluster}\n    user: admin\n")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{}{}{}users:\n- name: admin\n  user:\n    token: admin-token\ncontexts:\n{}{}{}{}current-context: root\n",
        cluster("base", ""),
        cluster("root", "/clusters/root"),
        cluster("system:admin", "/clusters/system:admin"),
        context("base", "base"),
        context("root", "root"),
        context("system:admin", "system:admin"),
        context("shard-base", "base"),
    );
    std::fs::write(path, text).expect("kubeconfig");
}

/// The webhook tests serve their webhooks with the certificate they find beside the kubeconfig
/// as `apiserver.crt` (kcp's serving certificate there, which its CA in the kubeconfig signs).
fn give_webhook_certificate(work: &KcpWorkdir, cert: &Path, key: &Path) {
    let dir = work.kubeconfig.parent().expect(".kcp");
    std::fs::copy(cert, dir.join("apiserver.crt")).expect("apiserver.crt");
    std::fs::copy(key, dir.join("apiserver.key")).expect("apiserver.key");
}

/// One Go test to run: a top-level test of a package's binary.
#[derive(Clone)]
struct GoTest {
    package: String,
    name: String,
    binary: PathBuf,
}

impl GoTest {
    fn id(&self) -> String {
        format!("{}/{}", self.package, self.name)
    }
}

/// The top-level tests of a Go test binary.
fn go_tests_of(binary: &Path) -> Vec<String> {
    let out = Command::new(binary)
        .args(["-test.list", "."])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Test"))
        .map(String::from)
        .collect()
}

/// The outcome of one test's run from its `-test.v` output.
fn go_outcome(name: &str, output: &str, timed_out: bool) -> Outcome {
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            let mut words = rest.split_whitespace();
            let (verdict, test) = (words.next(), words.next());
            if test != Some(name) {
                continue;
            }
            match verdict {
                Some("PASS:") => return Outcome::Passed,
                Some("SKIP:") => return Outcome::Skipped,
                _ => {}
            }
        }
    }
    // The assertion that failed: testify's Error and Messages lines, else the end.
    let mut why: Vec<&str> = output
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("Error:") || t.starts_with("Messages:") || t.starts_with("panic:")
        })
        .take(6)
        .collect();
    if why.is_empty() {
        let lines: Vec<&str> = output.lines().collect();
        why = lines[lines.len().saturating_sub(6)..].to_vec();
    }
    let mut text: String = why
        .iter()
        .map(|l| format!("    {}", l.trim()))
        .collect::<Vec<_>>()
        .join("\n");
    if timed_out {
        text = format!("    (timed out)\n{text}");
    }
    Outcome::Failed(text)
}

/// Runs `tests` with `args`, `parallel` processes at once, each test in its own process (a
/// panic or a hang ends one test, not its package) with `timeout`; each output goes to
/// `output/<package>.<Test>.log`.
fn run_go_tests(
    tests: Vec<GoTest>,
    args: &[String],
    cwd: &Path,
    output: &Path,
    parallel: usize,
    timeout: Duration,
) -> BTreeMap<String, Outcome> {
    let queue = Arc::new(Mutex::new(VecDeque::from(tests)));
    let results = Arc::new(Mutex::new(BTreeMap::new()));
    let workers: Vec<_> = (0..parallel)
        .map(|_| {
            let (queue, results) = (queue.clone(), results.clone());
            let (args, cwd, output) = (args.to_vec(), cwd.to_path_buf(), output.to_path_buf());
            std::thread::spawn(move || loop {
                let Some(test) = queue.lock().expect("queue").pop_front() else {
                    return;
                };
                let log = output.join(format!(
                    "{}.{}.log",
                    test.package.replace('/', "-"),
                    test.name
                ));
                let file = std::fs::File::create(&log).expect("log file");
                let mut child = Command::new(&test.binary)
                    .args(["-test.v", "-test.run", &format!("^{}$", test.name)])
                    .args(["-test.timeout", &format!("{}s", timeout.as_secs() + 30)])
                    .args(&args)
                    .current_dir(&cwd)
                    .stdout(file.try_clone().expect("log file"))
                    .stderr(file)
                    .spawn()
                    .expect("start the test binary");
                let deadline = Instant::now() + timeout;
                let mut timed_out = false;
                while child.try_wait().expect("wait").is_none() {
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        timed_out = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let outcome = go_outcome(&test.name, &text, timed_out);
                eprintln!(
                    "{} {}",
                    test.id(),
                    match &outcome {
                        Outcome::Passed => "passed",
                        Outcome::Skipped => "skipped",
                        Outcome::Failed(_) => "FAILED",
                    }
                );
                results.lock().expect("results").insert(test.id(), outcome);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let results = results.lock().expect("results").clone();
    results
}

/// The kcp e2e tests to run: every top-level test of every package, but the not applicable.
fn kcp_tests(lists: &Lists) -> (Vec<GoTest>, usize) {
    let not_applicable: BTreeSet<&str> = lists
        .not_applicable
        .iter()
        .map(|e| e.test.as_str())
        .collect();
    let peers = peer_binary("kcp")
        .parent()
        .expect("peers dir")
        .join("kcp-e2e");
    let mut tests = Vec::new();
    let mut skipped = 0;
    for package in kcp_packages() {
        let binary = peers.join(format!("{}.test", package.replace('/', "-")));
        assert!(
            binary.is_file(),
            "{} is missing: scripts/peers builds it",
            binary.display()
        );
        for name in go_tests_of(&binary) {
            let test = GoTest {
                package: package.clone(),
                name,
                binary: binary.clone(),
            };
            if not_applicable.contains(test.id().as_str()) {
                skipped += 1;
                continue;
            }
            tests.push(test);
        }
    }
    // Whole packages not applicable count by their tests too.
    let module = kcp_module_dir();
    for e in &lists.not_applicable {
        if !e.test.contains("/Test") {
            skipped += count_go_tests(&module.join("test/e2e").join(&e.test));
        }
    }
    (tests, skipped)
}

/// The top-level tests in the `_test.go` files of a package directory.
fn count_go_tests(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with("_test.go"))
                .map(|e| {
                    std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .lines()
                        .filter(|l| l.starts_with("func Test") && l.contains("(t *testing.T)"))
                        .count()
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Test processes at once: the tests mostly wait for the server.
const KCP_PARALLEL: usize = 8;
/// The longest one kcp e2e test may take.
const KCP_TEST_TIMEOUT: Duration = Duration::from_secs(300);

fn run_kcp_suite(target: Target, work: &KcpWorkdir, output: &Path) {
    let lists = read_lists("kcp-e2e");
    let (mut tests, not_applicable) = kcp_tests(&lists);
    if target == Target::Peer {
        let control = lists.control();
        tests.retain(|t| control.contains(t.id().as_str()));
    }
    let args = vec![format!("--kcp-kubeconfig={}", work.kubeconfig.display())];
    let outcomes = run_go_tests(
        tests,
        &args,
        &work.dir,
        output,
        KCP_PARALLEL,
        KCP_TEST_TIMEOUT,
    );
    settle(
        "kcp-e2e",
        target,
        "kcp",
        &outcomes,
        &lists,
        not_applicable,
        output,
    );
}

#[test]
fn kcp_e2e_on_serve() {
    let output = output_dir("kcp-e2e", Target::Serve);
    let work = kcp_workdir(&output);
    let (tokens, ca) = (
        work.tokens.display().to_string(),
        work.client_ca.display().to_string(),
    );
    let server = Server::start_as_users_run(
        &output.join("data"),
        &["--token-auth-file", &tokens, "--client-ca-file", &ca],
        &output.join("serve.log"),
    );
    let ca_pem = std::fs::read_to_string(server.data_dir.join("pki/ca.crt")).expect("ca.crt");
    write_kcp_style_kubeconfig(&work.kubeconfig, &server.url(), &ca_pem);
    let pki = server.data_dir.join("pki");
    give_webhook_certificate(&work, &pki.join("serving.crt"), &pki.join("serving.key"));
    run_kcp_suite(Target::Serve, &work, &output);
}

#[tokio::test]
async fn kcp_e2e_on_kcp() {
    let output = output_dir("kcp-e2e", Target::Peer);
    let work = kcp_workdir(&output);
    // As kcp's own test server starts it (cmd/test-server): the e2e token file, the client CA
    // and the feature gates of its e2e runs.
    let kcp = Kcp::start_with(&[
        "--token-auth-file".into(),
        work.tokens.display().to_string(),
        "--client-ca-file".into(),
        work.client_ca.display().to_string(),
        "--feature-gates=WorkspaceMounts=true,CacheAPIs=true".into(),
    ])
    .await;
    // kcp's own admin.kubeconfig, as kcp's test server hands it to the tests: its `base`,
    // `root` and `system:admin` contexts as kcp-admin, `shard-base` as the shard's admin.
    std::fs::copy(&kcp.admin_kubeconfig, &work.kubeconfig).expect("kcp's admin.kubeconfig");
    let (cert, key) = kcp.serving_files();
    give_webhook_certificate(&work, &cert, &key);
    tokio::task::spawn_blocking(move || run_kcp_suite(Target::Peer, &work, &output))
        .await
        .expect("the suite");
}

// ---- Kubernetes' conformance tests ----

/// The conformance tests run: those of API machinery and authentication/authorization.
const CONFORMANCE_FOCUS: &str = r"\[sig-(api-machinery|auth)\].*\[Conformance\]";
/// Test processes at once: the tests mostly wait for the server.
const CONFORMANCE_PROCS: usize = 8;

/// A regular expression that matches exactly `text`.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Runs the conformance tests against `kubeconfig`; the outcome of each spec by its full text.
///
/// Each spec runs in a test process of its own, [`CONFORMANCE_PROCS`] at once, then the
/// `[Serial]` ones one by one; each process writes its own ginkgo report. (The specs and their
/// per-spec framework are independent of one another, as ginkgo's own parallel runs assume.)
fn run_conformance(
    target: Target,
    kubeconfig: &Path,
    lists: &Lists,
    output: &Path,
) -> BTreeMap<String, Outcome> {
    let skip = lists
        .not_applicable
        .iter()
        .map(|e| regex_escape(&e.test))
        .collect::<Vec<_>>()
        .join("|");
    // Which specs run: a dry run with the same focus and skip.
    let dry = output.join("dry-run.json");
    let mut listing = conformance_command(kubeconfig, output, &dry);
    listing.args(["--ginkgo.dry-run", "--ginkgo.focus", CONFORMANCE_FOCUS]);
    if !skip.is_empty() {
        listing.args(["--ginkgo.skip", &skip]);
    }
    listing.stdout(Stdio::null()).stderr(Stdio::null());
    listing.status().expect("the conformance test binary");
    let names: Vec<String> = spec_reports(&dry, output)
        .iter()
        .filter(|s| s["LeafNodeType"] == "It" && s["State"] == "passed")
        .map(spec_name)
        .collect();
    assert!(
        !names.is_empty(),
        "the dry run selected no spec; see {}",
        dry.display()
    );
    let names: Vec<String> = match target {
        Target::Serve => names,
        Target::Peer => {
            let control = lists.control();
            names
                .into_iter()
                .filter(|n| control.contains(n.as_str()))
                .collect()
        }
    };
    let (serial, parallel): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| n.contains("[Serial]"));
    let numbered: Vec<(usize, String)> = parallel.into_iter().enumerate().collect();
    let first_serial = numbered.len();
    let mut outcomes = run_specs(kubeconfig, output, numbered, CONFORMANCE_PROCS);
    let serial: Vec<(usize, String)> = serial
        .into_iter()
        .enumerate()
        .map(|(i, n)| (first_serial + i, n))
        .collect();
    outcomes.extend(run_specs(kubeconfig, output, serial, 1));
    outcomes
}

/// Runs each spec of `specs` in a test process of its own (a spec that panics in a goroutine
/// ends its process), `parallel` at once; the outcome of each by name.
fn run_specs(
    kubeconfig: &Path,
    output: &Path,
    specs: Vec<(usize, String)>,
    parallel: usize,
) -> BTreeMap<String, Outcome> {
    let queue = Mutex::new(VecDeque::from(specs));
    let outcomes = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            scope.spawn(|| loop {
                let Some((i, name)) = queue.lock().expect("queue").pop_front() else {
                    return;
                };
                let report = output.join(format!("spec-{i}.json"));
                let log_path = output.join(format!("spec-{i}.log"));
                let log = std::fs::File::create(&log_path).expect("log");
                conformance_command(kubeconfig, output, &report)
                    // (a name that is part of another's runs both: the report tells them apart)
                    .arg(format!("--ginkgo.focus={}", regex_escape(&name)))
                    .arg("--ginkgo.timeout=20m")
                    .stdout(log.try_clone().expect("log"))
                    .stderr(log)
                    .status()
                    .expect("the conformance test binary");
                let ran: Vec<serde_json::Value> = match report.is_file() {
                    true => spec_reports(&report, output)
                        .into_iter()
                        .filter(|s| s["LeafNodeType"] == "It")
                        .filter(|s| !matches!(s["State"].as_str(), Some("skipped" | "pending")))
                        .collect(),
                    false => Vec::new(),
                };
                let outcome = match ran.iter().find(|s| spec_name(s) == name) {
                    Some(spec) if spec["State"] == "passed" => Outcome::Passed,
                    Some(spec) => Outcome::Failed(format!(
                        "    {} (log: {})",
                        spec["Failure"]["Message"]
                            .as_str()
                            .unwrap_or("failed")
                            .lines()
                            .take(6)
                            .collect::<Vec<_>>()
                            .join("\n    "),
                        log_path.display()
                    )),
                    None => Outcome::Failed(format!(
                        "    the test process ended without a report (a panic?); log: {}",
                        log_path.display()
                    )),
                };
                eprintln!(
                    "{} {name}",
                    match &outcome {
                        Outcome::Passed => "passed",
                        Outcome::Skipped => "skipped",
                        Outcome::Failed(_) => "FAILED",
                    }
                );
                outcomes.lock().expect("outcomes").insert(name, outcome);
            });
        }
    });
    outcomes.into_inner().expect("outcomes")
}

/// The conformance test binary against `kubeconfig`, writing its ginkgo report to `report`.
fn conformance_command(kubeconfig: &Path, output: &Path, report: &Path) -> Command {
    let mut command = Command::new(peer_binary("api-conformance.test"));
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .arg("--ginkgo.no-color")
        .current_dir(output);
    command
}

/// The spec reports of a ginkgo JSON report; fails when the suite did not start.
fn spec_reports(report: &Path, output: &Path) -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(report).unwrap_or_else(|e| panic!("{}: {e}", report.display()));
    let suites: serde_json::Value = serde_json::from_str(&text).expect("ginkgo's JSON report");
    let specs: Vec<serde_json::Value> = suites
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|suite| suite["SpecReports"].as_array().cloned().unwrap_or_default())
        .collect();
    let setup_failed = specs
        .iter()
        .any(|s| s["LeafNodeType"] == "SynchronizedBeforeSuite" && s["State"] == "failed");
    assert!(
        !setup_failed,
        "the conformance suite did not start (its BeforeSuite failed); see the logs in {}",
        output.display()
    );
    specs
}

/// A spec's full text: its containers' texts and its own, as ginkgo prints it.
fn spec_name(spec: &serde_json::Value) -> String {
    let mut parts: Vec<&str> = spec["ContainerHierarchyTexts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str())
        .collect();
    parts.push(spec["LeafNodeText"].as_str().unwrap_or(""));
    parts.join(" ")
}

fn conformance_suite(target: Target, kubeconfig: &Path, output: &Path) {
    let lists = read_lists("kube-conformance");
    let outcomes = run_conformance(target, kubeconfig, &lists, output);
    let not_applicable = lists.not_applicable.len();
    settle(
        "kube-conformance",
        target,
        "kube-apiserver",
        &outcomes,
        &lists,
        not_applicable,
        output,
    );
}

#[test]
fn kube_conformance_on_serve() {
    let output = output_dir("kube-conformance", Target::Serve);
    let server = Server::start_as_users_run(&output.join("data"), &[], &output.join("serve.log"));
    conformance_suite(Target::Serve, &server.kubeconfig, &output);
}

#[test]
fn kube_conformance_on_kube_apiserver() {
    let output = output_dir("kube-conformance", Target::Peer);
    // Compaction every minute instead of five: the chunking test waits for its continue token
    // to be compacted away.
    let mut peer = KubeApiserver::start_with(&["--etcd-compaction-interval=1m".to_string()]);
    peer.start_controller_manager()
        .unwrap_or_else(|e| panic!("{e:#}"));
    conformance_suite(Target::Peer, &peer.admin_kubeconfig, &output);
}

#[test]
fn the_lists_name_their_peers_release() {
    // The lists are of these releases; a new pin is a new list.
    for (suite, version) in [
        ("kcp-e2e", KCP_VERSION),
        ("kube-conformance", KUBERNETES_VERSION),
    ] {
        let text = std::fs::read_to_string(
            repo()
                .join("tests/peer-suites")
                .join(format!("{suite}.yaml")),
        )
        .expect("list");
        assert!(
            text.lines().take(5).any(|l| l.contains(version)),
            "tests/peer-suites/{suite}.yaml does not say it is of {version} in its first lines"
        );
    }
}
