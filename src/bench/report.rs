//! The benchmark's report: one table per section, stamped with the date, the commit and the
//! cores of the run, in exactly the form the README embeds between `<!-- bench NAME -->` and
//! `<!-- /bench NAME -->`. `bench --write-readme README.md` replaces those blocks; a test checks
//! that every block of the README has the rows its section prints.
//!
//! A section's rows are named by its `labels` function (from the options alone), so the names
//! of the rows a run would print are known without running it.

use std::ops::Range;
use std::path::Path;
use std::process::Command;

use crate::bench::BenchOptions;

/// One row of a section's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// What is measured (the first column; fixed by the options, see [`labels`]).
    pub measurement: String,
    /// This server's figure.
    pub ours: String,
    /// The baseline measured in the same run, and the target.
    pub baseline: String,
}

/// The rows of a section: `labels` (from the section's `labels` function) beside the figures
/// measured for them, in the same order.
pub fn rows(labels: Vec<String>, figures: Vec<(String, String)>) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        labels.len() == figures.len(),
        "the bench measured {} rows for {} labels",
        figures.len(),
        labels.len()
    );
    Ok(labels
        .into_iter()
        .zip(figures)
        .map(|(measurement, (ours, baseline))| Row {
            measurement,
            ours,
            baseline,
        })
        .collect())
}

/// The third column's heading of a section's table.
pub fn baseline_heading(section: &str) -> String {
    match section {
        "kcp" => format!("kcp {}", crate::peers::KCP_VERSION),
        _ => "baseline / target".to_string(),
    }
}

/// The names of the rows `section` prints when run with `opts`.
pub fn labels(section: &str, opts: &BenchOptions) -> Vec<String> {
    match section {
        "serving" => crate::bench::serving_labels(opts),
        "admission" => crate::bench::admission_labels(opts),
        "workspaces" => crate::bench::workspace_labels(opts),
        "overload" => crate::bench::overload_labels(opts),
        "broker" => crate::bench::broker::labels(opts),
        "etcd" => etcd_labels(opts),
        "attacks" => crate::bench::attacks::labels(opts),
        "views" => crate::bench::views::labels(opts),
        "kube" => kube_labels(opts),
        "kcp" => crate::bench::kcp::labels(opts),
        "claims" => crate::bench::claims::labels(opts),
        "engage" => crate::bench::engage::labels(opts),
        _ => Vec::new(),
    }
}

/// Watches of the kube section's fan-out.
pub const KUBE_WATCHERS: usize = 1_000;
/// Writes per second while they follow.
pub const KUBE_FANOUT_RATE: u64 = 20;

/// The rows of the kube section (here: that section is built only with the etcd feature).
pub fn kube_labels(opts: &BenchOptions) -> Vec<String> {
    vec![
        format!("side by side: GET 1 KiB object, {} connections", opts.connections),
        format!("side by side: LIST {} x 1 KiB", opts.list_objects),
        format!("side by side: creates, {} clients", opts.writers),
        format!(
            "side by side: watch fan-out, {KUBE_WATCHERS} watchers of one namespace, {KUBE_FANOUT_RATE} writes/s"
        ),
        "side by side: RSS after the run".to_string(),
    ]
}

/// The rows of the etcd section (here: that section is built only with the etcd feature).
pub fn etcd_labels(opts: &BenchOptions) -> Vec<String> {
    let (watchers, spaces, rate) = (opts.watchers, opts.watch_workspaces.max(1), opts.watch_rate);
    vec![
        format!("creates of 1 KiB ConfigMaps on etcd, {} clients", opts.connections),
        "CPU per create through the server (µs)".to_string(),
        format!(
            "watch fan-out on etcd: {watchers} watchers over {spaces} workspaces (each write reaches {}), {rate} writes/s for {} s",
            watchers / spaces,
            opts.seconds.max(10)
        ),
    ]
}

/// Where and when a run was made.
#[derive(Clone, Debug)]
pub struct Stamp {
    /// `YYYY-MM-DD`, UTC.
    pub date: String,
    /// The abbreviated commit of the working tree, `+changes` when it had uncommitted changes.
    pub commit: String,
    pub cores: usize,
    /// The run's arguments after `bench`, without `--only` and `--write-readme`.
    pub args: Vec<String>,
}

impl Stamp {
    /// This run's stamp: today, the commit of the current directory, this machine's cores.
    pub fn now(args: Vec<String>) -> Stamp {
        let days = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 86_400);
        Stamp {
            date: civil_date(days),
            commit: current_commit(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            args,
        }
    }

    /// The command that reruns `section` with this run's options.
    pub fn command(&self, section: &str) -> String {
        let mut words = vec![
            "platform-mesh".to_string(),
            "bench".to_string(),
            "--only".to_string(),
            section.to_string(),
        ];
        words.extend(self.args.iter().cloned());
        words.join(" ")
    }
}

/// The arguments of a bench command line that change what is measured: all but `--only` and
/// `--write-readme` (and their values).
pub fn measured_args(args: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if skip_value {
            skip_value = false;
            continue;
        }
        let name = arg.split('=').next().unwrap_or_default();
        if name == "--only" || name == "--write-readme" {
            skip_value = !arg.contains('=');
            continue;
        }
        kept.push(arg.clone());
    }
    kept
}

/// `YYYY-MM-DD` of a count of days since 1970-01-01 (the proleptic Gregorian calendar).
fn civil_date(days: u64) -> String {
    // Days are shifted to start on 0000-03-01, so a leap day ends its 400-year era's year.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn current_commit() -> String {
    let Some(commit) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown".to_string();
    };
    let changed =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if changed {
        format!("{commit}+changes")
    } else {
        commit
    }
}

fn begin_marker(section: &str) -> String {
    format!("<!-- bench {section} -->")
}

fn end_marker(section: &str) -> String {
    format!("<!-- /bench {section} -->")
}

/// A section's table as the README embeds it, markers included.
pub fn render(section: &str, stamp: &Stamp, rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&begin_marker(section));
    out.push('\n');
    out.push_str(&format!(
        "`{}` on {}, commit {}, {} cores:\n\n",
        stamp.command(section),
        stamp.date,
        stamp.commit,
        stamp.cores
    ));
    out.push_str(&format!(
        "| measurement | platform-mesh | {} |\n|---|---|---|\n",
        baseline_heading(section)
    ));
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(&r.measurement),
            cell(&r.ours),
            cell(&r.baseline)
        ));
    }
    out.push_str(&end_marker(section));
    out
}

/// A table cell: a `|` inside it would start a new column.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Why a README's bench blocks cannot be read or replaced.
#[derive(Debug, thiserror::Error)]
pub enum ReadmeError {
    #[error(
        "the README has no `{0}` line to replace; add the section's markers where its table goes"
    )]
    NoBlock(String),
    #[error("the README's `{0}` has no matching end marker")]
    Unterminated(String),
    #[error("the README's block of section {section} is malformed: {what}")]
    Malformed { section: String, what: String },
}

/// `readme` with the block of `section` replaced by `block` (from [`render`]).
pub fn splice(readme: &str, section: &str, block: &str) -> Result<String, ReadmeError> {
    let (whole, _) = block_span(readme, section)?;
    Ok(format!(
        "{}{block}{}",
        &readme[..whole.start],
        &readme[whole.end..]
    ))
}

/// Where the (first) block of `section` is in `readme`: from its begin marker to past its end
/// marker, and its body between the two.
fn block_span(readme: &str, section: &str) -> Result<(Range<usize>, Range<usize>), ReadmeError> {
    let (begin, end) = (begin_marker(section), end_marker(section));
    let start = readme
        .find(&begin)
        .ok_or_else(|| ReadmeError::NoBlock(begin.clone()))?;
    let body = start + begin.len();
    let body_end = readme[body..]
        .find(&end)
        .map(|i| body + i)
        .ok_or(ReadmeError::Unterminated(begin))?;
    Ok((start..body_end + end.len(), body..body_end))
}

/// Fails unless the README at `path` has a block for every one of `sections` (checked before a
/// run, so a missing marker does not surface after the measurements).
pub fn check_readme(path: &Path, sections: &[&str]) -> anyhow::Result<()> {
    let readme = std::fs::read_to_string(path)?;
    for section in sections {
        block_span(&readme, section)?;
    }
    Ok(())
}

/// Writes `tables` (section, rows) into the README at `path`, and reads them back.
pub fn write_readme(
    path: &Path,
    stamp: &Stamp,
    opts: &BenchOptions,
    tables: &[(&str, Vec<Row>)],
) -> anyhow::Result<()> {
    let mut readme = std::fs::read_to_string(path)?;
    for (section, rows) in tables {
        readme = splice(&readme, section, &render(section, stamp, rows))?;
    }
    for (section, _) in tables {
        let b = block_of(&readme, section)?;
        anyhow::ensure!(
            b.measurements == labels(section, opts),
            "the {section} table does not read back with its rows"
        );
    }
    std::fs::write(path, readme)?;
    Ok(())
}

/// One bench block of a README, as read back.
#[derive(Debug)]
// The stamp's fields are read by the README test.
#[cfg_attr(not(test), allow(dead_code))]
pub struct Block {
    pub section: String,
    /// The command line in the block's stamp.
    pub command: String,
    pub date: String,
    pub commit: String,
    pub cores: usize,
    pub heading: String,
    /// The first cell of every row.
    pub measurements: Vec<String>,
}

/// The bench block of `section` in `readme`.
fn block_of(readme: &str, section: &str) -> Result<Block, ReadmeError> {
    let (_, body) = block_span(readme, section)?;
    parse_block(section, &readme[body])
}

/// Every bench block of `readme`, in order.
#[cfg(test)]
pub fn blocks(readme: &str) -> Result<Vec<Block>, ReadmeError> {
    const BEGIN: &str = "<!-- bench ";
    readme
        .match_indices(BEGIN)
        .map(|(at, _)| {
            let rest = &readme[at + BEGIN.len()..];
            block_of(readme, rest.split(" -->").next().unwrap_or_default().trim())
        })
        .collect()
}

fn parse_block(section: &str, body: &str) -> Result<Block, ReadmeError> {
    let malformed = |what: &str| ReadmeError::Malformed {
        section: section.to_string(),
        what: what.to_string(),
    };
    let mut lines = body.lines().filter(|l| !l.trim().is_empty());
    let stamp = lines.next().ok_or_else(|| malformed("no stamp line"))?;
    // `<command>` on <date>, commit <commit>, <n> cores:
    let command = stamp
        .strip_prefix('`')
        .and_then(|s| s.split('`').next())
        .ok_or_else(|| malformed("the stamp does not start with the command in backticks"))?;
    let tail = stamp[command.len() + 2..]
        .strip_prefix(" on ")
        .and_then(|s| s.strip_suffix(" cores:"))
        .ok_or_else(|| malformed("the stamp is not `command` on DATE, commit C, N cores:"))?;
    let parts: Vec<&str> = tail.split(", ").collect();
    let [date, commit, cores] = parts[..] else {
        return Err(malformed("the stamp needs a date, a commit and the cores"));
    };
    let commit = commit
        .strip_prefix("commit ")
        .ok_or_else(|| malformed("no commit in the stamp"))?;
    let cores = cores
        .parse()
        .map_err(|_| malformed("the cores are not a number"))?;
    let heading = lines.next().ok_or_else(|| malformed("no table heading"))?;
    let heading = split_row(heading)
        .get(2)
        .cloned()
        .ok_or_else(|| malformed("the heading has fewer than three columns"))?;
    if lines.next() != Some("|---|---|---|") {
        return Err(malformed("the heading is not followed by |---|---|---|"));
    }
    let measurements = lines
        .map(|l| {
            let cells = split_row(l);
            (cells.len() == 3)
                .then(|| cells[0].clone())
                .ok_or_else(|| malformed(&format!("a row without three cells: {l}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Block {
        section: section.to_string(),
        command: command.to_string(),
        date: date.to_string(),
        commit: commit.to_string(),
        cores,
        heading,
        measurements,
    })
}

/// The cells of a table row (`\|` stays inside a cell).
fn split_row(line: &str) -> Vec<String> {
    let inner = line
        .trim()
        .strip_prefix('|')
        .and_then(|l| l.strip_suffix('|'))
        .unwrap_or_default();
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                if let Some(last) = cells.last_mut() {
                    last.push('|');
                }
            }
            '|' => cells.push(String::new()),
            c => {
                if let Some(last) = cells.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct BenchCommand {
        #[command(flatten)]
        opts: BenchOptions,
    }

    fn options_of(command: &str) -> BenchOptions {
        let words = command.split_whitespace();
        let args = std::iter::once("bench").chain(words.skip(2));
        match BenchCommand::try_parse_from(args) {
            Ok(c) => c.opts,
            Err(err) => panic!("the README's command `{command}` does not parse: {err}"),
        }
    }

    #[test]
    fn dates_are_counted_from_the_epoch() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(59), "1970-03-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_785), "2026-11-28");
    }

    #[test]
    fn a_rendered_block_reads_back_and_replaces_its_old_self() {
        let stamp = Stamp {
            date: "2026-11-27".into(),
            commit: "abc1234".into(),
            cores: 2,
            args: vec!["--seconds".into(), "3".into()],
        };
        let rows = vec![Row {
            measurement: "GET a|b".into(),
            ours: "1 req/s".into(),
            baseline: "2 req/s".into(),
        }];
        let block = render("serving", &stamp, &rows);
        let readme = format!("intro\n\n{}\n\nafter\n", render("serving", &stamp, &[]));
        let replaced = splice(&readme, "serving", &block).expect("block replaced");
        assert!(replaced.starts_with("intro\n\n") && replaced.ends_with("\n\nafter\n"));
        let read = blocks(&replaced).expect("blocks read");
        assert_eq!(read.len(), 1);
        assert_eq!(
            read[0].command,
            "platform-mesh bench --only serving --seconds 3"
        );
        assert_eq!(read[0].measurements, vec!["GET a|b".to_string()]);
        assert_eq!((read[0].cores, read[0].commit.as_str()), (2, "abc1234"));
        assert!(matches!(
            splice("no blocks", "kcp", &block),
            Err(ReadmeError::NoBlock(_))
        ));
    }

    /// A run writes its sections while others' blocks are still empty.
    #[test]
    fn a_run_fills_its_blocks_beside_empty_ones() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("README.md");
        std::fs::write(
            &path,
            "<!-- bench views -->\n<!-- /bench views -->\n\n<!-- bench kcp -->\n<!-- /bench kcp -->\n",
        )
        .expect("write");
        let opts = options_of("platform-mesh bench");
        let rows = labels("views", &opts)
            .into_iter()
            .map(|measurement| Row {
                measurement,
                ours: "1 ms".into(),
                baseline: "2 ms".into(),
            })
            .collect();
        let stamp = Stamp::now(Vec::new());
        check_readme(&path, &["views", "kcp"]).expect("markers found");
        write_readme(&path, &stamp, &opts, &[("views", rows)]).expect("written");
        let written = std::fs::read_to_string(&path).expect("read");
        let views = block_of(&written, "views").expect("views block");
        assert_eq!(views.measurements, labels("views", &opts));
        assert!(written.contains("<!-- bench kcp -->\n<!-- /bench kcp -->"));
        assert!(check_readme(&path, &["claims"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_and_the_readme_path_are_not_measured_arguments() {
        let args: Vec<String> = [
            "--only",
            "kcp",
            "--kcp-workspaces",
            "200",
            "--write-readme=R",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(measured_args(&args), vec!["--kcp-workspaces", "200"]);
    }

    /// Every section has a table in the README, and each table has exactly the rows the bench
    /// prints for its command, from a commit of this repository, stamped with date and cores.
    #[test]
    fn the_readme_has_the_tables_the_bench_prints() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).expect("README.md");
        let found = blocks(&readme).expect("README bench blocks");
        for section in crate::bench::SECTIONS {
            let n = found.iter().filter(|b| b.section == *section).count();
            assert_eq!(n, 1, "README: {n} tables of bench section {section}");
        }
        let in_repository = git(&["rev-parse", "--git-dir"]).is_some();
        for b in &found {
            let opts = options_of(&b.command);
            assert!(
                b.command
                    .starts_with(&format!("platform-mesh bench --only {} ", b.section))
                    || b.command == format!("platform-mesh bench --only {}", b.section),
                "README: the {} table's command is {}",
                b.section,
                b.command
            );
            assert_eq!(
                b.measurements,
                labels(&b.section, &opts),
                "README: the rows of the {} table are not the ones `{}` prints; rerun it with \
                 --write-readme README.md",
                b.section,
                b.command
            );
            assert_eq!(b.heading, baseline_heading(&b.section));
            let date_ok = b.date.len() == 10
                && b.date.chars().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        c == '-'
                    } else {
                        c.is_ascii_digit()
                    }
                });
            assert!(
                date_ok,
                "README: the {} table's date is {}",
                b.section, b.date
            );
            assert!(b.cores > 0);
            assert!(
                b.commit.len() >= 7 && b.commit.chars().all(|c| c.is_ascii_hexdigit()),
                "README: the {} table was measured at {}, not at a commit",
                b.section,
                b.commit
            );
            if in_repository {
                assert!(
                    git(&["cat-file", "-e", &format!("{}^{{commit}}", b.commit)]).is_some(),
                    "README: the {} table names commit {}, which this repository does not have",
                    b.section,
                    b.commit
                );
            }
        }
    }
}
