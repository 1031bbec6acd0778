//! The controller runtime's section (`bench --only engage`): the `engage_bench` example of the
//! controllers crate, run as a child process with this binary as its server, its figures turned
//! into the README's table.
//!
//! The example starts `serve --in-memory`, binds `--engage-clusters` workspaces to one Widget
//! export with `--engage-objects` Widgets each, and runs, each in a process of its own, a bare
//! kube-rs watch of the export's virtual workspace (the baseline) and the runtime engaging every
//! workspace through the APIExport provider, while it writes `--engage-rate` patches per second.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{anyhow, Context};
use serde_json::Value;

use crate::bench::report::{rows, Row};
use crate::bench::BenchOptions;

/// The figures the example prints on its `FIGURES` line (RSS in MB of 10^6 bytes).
struct Figures(Value);

impl Figures {
    fn get(&self, name: &str) -> anyhow::Result<f64> {
        self.0[name]
            .as_f64()
            .ok_or_else(|| anyhow!("the example's figures have no {name}: {}", self.0))
    }
}

/// The rows of the engage section.
pub fn labels(opts: &BenchOptions) -> Vec<String> {
    let (clusters, objects) = (opts.engage_clusters, opts.engage_objects);
    vec![
        format!(
            "controller runtime, {clusters} engaged clusters x {objects} objects: RSS after the first sync and {} s of writes",
            opts.engage_write_seconds
        ),
        "time to the first full sync (every object reconciled once)".to_string(),
        format!(
            "write to the start of its reconcile, {} writes/s",
            opts.engage_rate
        ),
        "the server, in memory (not a target)".to_string(),
    ]
}

/// The example's binary: beside this one's, under `examples/` (Cargo's layout), unless
/// `PLATFORM_MESH_ENGAGE_BENCH` names it.
fn example_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("PLATFORM_MESH_ENGAGE_BENCH") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .map(|dir| dir.join("examples").join("engage_bench"))
        .ok_or_else(|| anyhow!("{} has no directory", exe.display()))?;
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with `cargo build --release -p controllers --example engage_bench` \
         (the profile of this binary), or name it in PLATFORM_MESH_ENGAGE_BENCH",
        path.display()
    );
    Ok(path)
}

/// Runs the example (on a thread of its own: it runs for minutes) and reads its figures.
async fn run_example(opts: &BenchOptions) -> anyhow::Result<Figures> {
    let example = example_binary()?;
    let mut command = Command::new(&example);
    command
        .arg("--server-bin")
        .arg(std::env::current_exe()?)
        .args(["--clusters", &opts.engage_clusters.to_string()])
        .args(["--objects", &opts.engage_objects.to_string()])
        .args(["--writes-per-second", &opts.engage_rate.to_string()])
        .args(["--write-seconds", &opts.engage_write_seconds.to_string()])
        .stdout(Stdio::piped());
    tokio::task::spawn_blocking(move || {
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", example.display()))?;
        let stdout = child.stdout.take().context("the example's stdout")?;
        let mut figures = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match line.strip_prefix("FIGURES ") {
                Some(json) => figures = Some(Figures(serde_json::from_str(json)?)),
                // Its own report goes to the progress output.
                None => eprintln!("{line}"),
            }
        }
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "{} failed: {status}", example.display());
        figures.ok_or_else(|| anyhow!("{} printed no FIGURES line", example.display()))
    })
    .await?
}

/// The engage section.
pub async fn engage(opts: &BenchOptions) -> anyhow::Result<Vec<Row>> {
    let f = run_example(opts).await?;
    let expected = opts.engage_clusters as f64;
    anyhow::ensure!(
        f.get("engaged")? >= expected,
        "the runtime engaged {} of {expected} clusters",
        f.get("engaged")?
    );
    let figures = vec![
        (
            format!(
                "{:.0} MB (peak {:.0} MB; {:.0} MB after the first sync)",
                f.get("rss_mb")?,
                f.get("peak_mb")?,
                f.get("synced_rss_mb")?
            ),
            format!(
                "one bare kube-rs watch of the same objects: {:.0} MB; target < 1 GiB",
                f.get("baseline_rss_mb")?
            ),
        ),
        (
            format!("{:.2} s", f.get("first_sync_s")?),
            format!(
                "the bare watch lists its {:.0} objects in {:.2} s; target < 120 s",
                f.get("baseline_objects")?,
                f.get("baseline_s")?
            ),
        ),
        (
            format!(
                "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({:.0} of {:.0} writes measured)",
                f.get("p50_ms")?,
                f.get("p99_ms")?,
                f.get("max_ms")?,
                f.get("measured")?,
                f.get("writes_ok")?
            ),
            "target p99 < 100 ms".to_string(),
        ),
        (
            format!(
                "{:.0} MB at the end; writing the workspaces, bindings and objects took {:.0} s",
                f.get("server_rss_mb")?,
                f.get("populate_s")?
            ),
            "—".to_string(),
        ),
    ];
    rows(labels(opts), figures)
}
