//! Runs the commands of every `examples/*/README.md` as written, against a fresh server, with
//! every kubectl version of the machine image, so the walkthroughs cannot drift from the code.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{kubectl_binary, Server};

/// One step of a walkthrough.
enum Step {
    /// A shell command that must succeed.
    Shell(String),
    /// `cargo run --release [-p PACKAGE] -- <args> &`: a binary of the workspace (this one's,
    /// or the package's) started in the background with `args`, stopped when the walkthrough
    /// ends.
    Background(PathBuf, Vec<String>),
    /// `cargo run --release -- serve <flags>`: the flags the walkthrough's server runs with
    /// (the test starts it itself).
    Serve(Vec<String>),
    /// `export NAME=value`: kept for every later command (each runs in a shell of its own).
    Export(String),
    /// A ```` ```text ```` block right after a block of commands: what its last command prints.
    /// Each non-empty line must appear, in this order, within the output's lines (runs of
    /// spaces count as one, so kubectl's column widths do not matter).
    Output(Vec<String>),
}

/// Fence languages of commands a user runs.
const SHELL_FENCES: &[&str] = &["sh", "bash", "shell"];
/// Fence languages of files and other text shown, not run.
const SHOWN_FENCES: &[&str] = &["yaml", "json", "go", "rust", "toml"];

/// The steps of a README: the commands of its shell fences, and the outputs its ```text
/// fences say to expect. The server's start becomes its flags. A fence of another language,
/// an output block that follows no commands, or an indented block of commands (which a user
/// would run but the test could not see) fails the test: the walkthrough has to say it in a
/// form that is checked.
fn commands(readme: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(readme).expect("read README");
    let name = readme.display();
    let mut out = Vec::new();
    // The fence being read: its language, and its lines.
    let mut fence: Option<(String, Vec<String>)> = None;
    // Whether the last fence was a block of commands (prose may follow it) in this section.
    let mut after_commands = false;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(lang) = t.strip_prefix("```") {
            match fence.take() {
                None => {
                    let lang = lang.trim().to_string();
                    assert!(
                        SHELL_FENCES.contains(&lang.as_str())
                            || SHOWN_FENCES.contains(&lang.as_str())
                            || lang == "text",
                        "{name}:{}: a ```{lang} fence is neither commands ({SHELL_FENCES:?}), an \
                         expected output (text) nor a file ({SHOWN_FENCES:?})",
                        n + 1
                    );
                    if lang == "text" {
                        assert!(
                            after_commands,
                            "{name}:{}: an output block must follow the block of commands whose \
                             last command prints it",
                            n + 1
                        );
                    }
                    fence = Some((lang, Vec::new()));
                }
                Some((lang, lines)) => {
                    if SHELL_FENCES.contains(&lang.as_str()) {
                        out.extend(lines.iter().filter_map(|l| step(l)));
                        after_commands = true;
                    } else {
                        if lang == "text" {
                            out.push(Step::Output(lines));
                        }
                        after_commands = false;
                    }
                }
            }
            continue;
        }
        if let Some((_, lines)) = fence.as_mut() {
            lines.push(line.to_string());
            continue;
        }
        // Prose may say what the output shows; a heading starts something else.
        if t.starts_with('#') {
            after_commands = false;
        }
        // Markdown's indented code block: four spaces after a blank line or another such line.
        let indented = line.starts_with("    ") && !t.starts_with(['-', '*']);
        let command = ["kubectl ", "platform-mesh ", "cargo ", "sh ", "curl "]
            .iter()
            .any(|c| t.starts_with(c));
        assert!(
            !(indented && command),
            "{name}:{}: an indented command (`{t}`) is not run by the tests; put it in a ```sh fence",
            n + 1
        );
    }
    assert!(fence.is_none(), "{name}: a fence is not closed");
    out
}

/// The step of one line of a shell fence (`None` for blank lines and comments).
fn step(line: &str) -> Option<Step> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    // A program named by its path (a walkthrough's program replaced by another
    // implementation), in the background.
    if let Some(line) = t.strip_suffix('&').filter(|l| l.starts_with('/')) {
        let mut words = line.split_whitespace().map(str::to_string);
        if let Some(program) = words.next() {
            return Some(Step::Background(PathBuf::from(program), words.collect()));
        }
    }
    if let Some((program, args)) = workspace_binary(t) {
        if let Some(args) = args.strip_suffix('&') {
            return Some(Step::Background(
                program,
                args.split_whitespace().map(str::to_string).collect(),
            ));
        }
    }
    if let Some(flags) = t.strip_prefix("cargo run --release -- serve") {
        return Some(Step::Serve(
            flags.split_whitespace().map(str::to_string).collect(),
        ));
    }
    if t.starts_with("export ") {
        return Some(Step::Export(t.to_string()));
    }
    if let Some((program, args)) = workspace_binary(t) {
        // Another command of a binary of the workspace, run in the foreground.
        return Some(Step::Shell(format!("{} {args}", program.display())));
    }
    Some(Step::Shell(t.to_string()))
}

/// `cargo run --release [-p PACKAGE] -- <args>`: the binary it runs (this package's, or the
/// workspace package's, built beside it) and the rest of the line.
fn workspace_binary(t: &str) -> Option<(PathBuf, &str)> {
    if let Some(args) = t.strip_prefix("cargo run --release -- ") {
        return Some((PathBuf::from(env!("CARGO_BIN_EXE_platform-mesh")), args));
    }
    let rest = t.strip_prefix("cargo run --release -p ")?;
    let (package, args) = rest.split_once(" -- ")?;
    let dir = Path::new(env!("CARGO_BIN_EXE_platform-mesh")).parent()?;
    Some((dir.join(package.trim()), args))
}

/// Whether `expected`'s lines appear in this order within `output`'s lines.
fn shows(output: &str, expected: &[String]) -> bool {
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut lines = output.lines().map(squash);
    expected
        .iter()
        .map(|e| squash(e))
        .filter(|e| !e.is_empty())
        .all(|e| lines.any(|l| l.contains(&e)))
}

fn run_walkthrough(example: &str, version: &str) {
    run_walkthrough_with(example, version, &[]);
}

/// [`run_walkthrough`] with each command's text `from` replaced by `to` first (the same
/// walkthrough with another implementation of one of its programs).
fn run_walkthrough_with(example: &str, version: &str, replace: &[(&str, &str)]) {
    let Some(bin) = kubectl_binary(version) else {
        panic!("kubectl.{version} is not installed beside the machine's kubectl");
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = root.join("examples").join(example).join("README.md");
    let cmds = commands(&readme);
    assert!(!cmds.is_empty(), "{} has no commands", readme.display());
    let cmds: Vec<Step> = if replace.is_empty() {
        cmds
    } else {
        // Replaced in the README's lines, so that the steps are parsed from what would run.
        let mut text = std::fs::read_to_string(&readme).expect("read README");
        for (from, to) in replace {
            assert!(text.contains(from), "{} has no {from:?}", readme.display());
            text = text.replace(from, to);
        }
        let dir = tempfile::tempdir().expect("dir");
        let copy = dir.path().join("README.md");
        std::fs::write(&copy, text).expect("write");
        commands(&copy)
    };
    let flags: Vec<&str> = cmds
        .iter()
        .filter_map(|s| match s {
            Step::Serve(flags) => Some(flags.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    let server = Server::start_with(&flags);
    let home = tempfile::tempdir().expect("home");
    let bin_dir = home.path().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin dir");
    std::os::unix::fs::symlink(&bin, bin_dir.join("kubectl")).expect("symlink kubectl");
    // The kubectl ws plugin of this repository.
    let plugin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-ws"))
        .parent()
        .expect("plugin directory")
        .to_path_buf();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        plugin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut background = Background(Vec::new());
    let mut exports = String::new();
    let mut last: Option<(String, String)> = None;
    // The walkthroughs name files of the server's data directory as the quick start makes it.
    let data_dir = format!("{}/", server.data_dir.display());
    let in_data_dir = |s: &str| s.replace(".platform-mesh/", &data_dir);
    for step in cmds {
        let cmd = match step {
            Step::Shell(cmd) => in_data_dir(&cmd),
            Step::Serve(_) => continue,
            Step::Export(line) => {
                exports.push_str(&in_data_dir(&line));
                exports.push('\n');
                continue;
            }
            Step::Output(expected) => {
                let (cmd, stdout) = last.as_ref().expect("an output block follows a command");
                assert!(
                    shows(stdout, &expected),
                    "kubectl {version}: `{cmd}` printed\n{stdout}\nnot what the README shows:\n{}",
                    expected.join("\n")
                );
                continue;
            }
            Step::Background(program, args) => {
                let args: Vec<String> = args.iter().map(|a| in_data_dir(a)).collect();
                // Its log goes to a file, shown when a later step fails.
                let log = home
                    .path()
                    .join(format!("background-{}.log", background.0.len()));
                let file = std::fs::File::create(&log).expect("background log");
                assert!(
                    program.exists(),
                    "{} is not built (`cargo build --workspace` builds it)",
                    program.display()
                );
                let child = Command::new(&program)
                    .args(&args)
                    .current_dir(&root)
                    .env("HOME", home.path())
                    .stdout(std::process::Stdio::null())
                    .stderr(file)
                    .spawn()
                    .expect("start background command");
                background.0.push((child, log));
                continue;
            }
        };
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{exports}{cmd}"))
            .current_dir(&root)
            .env("PATH", &path)
            .env("HOME", home.path())
            .env("KUBECONFIG", &server.kubeconfig)
            .env("PLATFORM_MESH_DATA_DIR", &server.data_dir)
            .output()
            .expect("run command");
        assert!(
            out.status.success(),
            "kubectl {version}: `{cmd}` failed ({}):\nstdout: {}\nstderr: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            background.logs()
        );
        // The quick start, as a new user runs it with the machine's kubectl, prints no
        // warning (kubectl's own, or one the server sent).
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            example != "quickstart" || !stderr.to_ascii_lowercase().contains("warning"),
            "kubectl {version}: `{cmd}` warned:\n{stderr}"
        );
        last = Some((cmd, String::from_utf8_lossy(&out.stdout).into_owned()));
    }
}

/// Background processes of a walkthrough and their log files; killed when it ends (also when
/// it fails).
struct Background(Vec<(std::process::Child, PathBuf)>);

impl Background {
    /// The last lines each background process logged, for a failure message.
    fn logs(&self) -> String {
        const LAST: usize = 60;
        let mut text = String::new();
        for (i, (_, log)) in self.0.iter().enumerate() {
            let all = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = all.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LAST)..];
            text.push_str(&format!(
                "\nbackground command {i}, its last {} log lines:\n{}",
                tail.len(),
                tail.join("\n")
            ));
        }
        text
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

macro_rules! walkthrough {
    ($($name:ident => $example:literal, $version:literal;)*) => {
        $(
            #[test]
            fn $name() {
                run_walkthrough($example, $version);
            }
        )*
    };
}

walkthrough! {
    accounts_kubectl_1_27 => "accounts", "1.27";
    broker_clusters_kubectl_1_27 => "broker-clusters", "1.27";
    broker_clusters_kubectl_1_33 => "broker-clusters", "1.33";
    workspace_authentication_kubectl_1_27 => "workspace-authentication", "1.27";
    workspace_authentication_kubectl_1_33 => "workspace-authentication", "1.33";
    broker_certs_kubectl_1_27 => "broker-certs", "1.27";
    broker_certs_kubectl_1_33 => "broker-certs", "1.33";
    accounts_kubectl_1_33 => "accounts", "1.33";
    providers_kubectl_1_27 => "providers", "1.27";
    managed_provider_kubectl_1_27 => "managed-provider", "1.27";
    managed_provider_kubectl_1_33 => "managed-provider", "1.33";
    providers_kubectl_1_33 => "providers", "1.33";
    quickstart_kubectl_1_27 => "quickstart", "1.27";
    quickstart_kubectl_1_30 => "quickstart", "1.30";
    quickstart_kubectl_1_33 => "quickstart", "1.33";
    platform_mesh_kubectl_1_27 => "platform-mesh", "1.27";
    platform_mesh_kubectl_1_33 => "platform-mesh", "1.33";
    workspaces_kubectl_1_27 => "workspaces", "1.27";
    workspaces_kubectl_1_33 => "workspaces", "1.33";
    service_accounts_kubectl_1_27 => "service-accounts", "1.27";
    service_accounts_kubectl_1_33 => "service-accounts", "1.33";
    marketplace_kubectl_1_27 => "marketplace", "1.27";
    marketplace_kubectl_1_33 => "marketplace", "1.33";
    mongodb_provider_kubectl_1_27 => "mongodb-provider", "1.27";
    mongodb_provider_kubectl_1_33 => "mongodb-provider", "1.33";
}

/// The MongoDB provider walkthrough with its controller in Go (controller-runtime,
/// multicluster-runtime and kcp's multicluster-provider, built by `scripts/peers`) instead of
/// Rust: the same commands, flags and checks.
#[test]
fn mongodb_provider_in_go_kubectl_1_33() {
    let go = common::kube_apiserver::peer_binary("mongodb-provider-go");
    let to = format!("{} provider", go.display());
    run_walkthrough_with(
        "mongodb-provider",
        "1.33",
        &[("cargo run --release -p mongodb-provider -- provider", &to)],
    );
}

#[test]
fn every_example_has_a_walkthrough_test() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let this = include_str!("examples.rs");
    for entry in std::fs::read_dir(&root).expect("examples dir") {
        let entry = entry.expect("entry");
        if entry.path().is_dir() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                entry.path().join("README.md").exists(),
                "examples/{name} has no README.md"
            );
            assert!(
                this.contains(&format!("=> \"{name}\"")),
                "examples/{name} is not run by tests/examples.rs"
            );
        }
    }
}

#[test]
fn a_readme_says_everything_a_user_runs_in_a_form_that_is_checked() {
    let dir = tempfile::tempdir().expect("dir");
    let parse = |text: &str| {
        let path = dir.path().join("README.md");
        std::fs::write(&path, text).expect("write");
        std::panic::catch_unwind(|| commands(&path).len()).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".into())
        })
    };
    assert_eq!(
        parse("```sh\nexport A=1\nkubectl get ns\n```\n\n```text\ndefault\n```\n"),
        Ok(3)
    );
    let indented = parse("Run:\n\n    kubectl get ns\n").expect_err("indented command");
    assert!(indented.contains("indented command"), "{indented}");
    let stray = parse("Prints:\n\n```text\ndefault\n```\n").expect_err("stray output");
    assert!(stray.contains("must follow"), "{stray}");
    let unknown = parse("```console\n$ kubectl get ns\n```\n").expect_err("unknown fence");
    assert!(unknown.contains("```console"), "{unknown}");
    assert!(shows("a   b\nc d\n", &["a b".into(), "c".into()]));
    assert!(
        !shows("c d\na b\n", &["a b".into(), "c".into()]),
        "order counts"
    );
}
