//! Stamps the binary with the git commit it was built from, for `platform-mesh --version`.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-dirty")
    } else {
        commit
    };
    println!("cargo:rustc-env=PLATFORM_MESH_GIT_COMMIT={commit}");
    // For `/version`: the full commit, the tree's state and the commit's date (the build date
    // of a reproducible build: the same source, the same binary, whatever the day).
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .env("TZ", "UTC")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    println!(
        "cargo:rustc-env=PLATFORM_MESH_GIT_FULL_COMMIT={}",
        git(&["rev-parse", "HEAD"])
    );
    println!(
        "cargo:rustc-env=PLATFORM_MESH_GIT_TREE_STATE={}",
        if dirty { "dirty" } else { "clean" }
    );
    println!(
        "cargo:rustc-env=PLATFORM_MESH_BUILD_DATE={}",
        git(&[
            "log",
            "-1",
            "--format=%cd",
            "--date=format-local:%Y-%m-%dT%H:%M:%SZ"
        ])
    );
    // A new commit changes HEAD or the ref it points at.
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-changed=.git/index");
}
