//! The log backend (`--audit-log-path` and its size, backup and age limits): one JSON object per
//! line from a dedicated thread fed by a bounded channel, and rotation as kube-apiserver's
//! (lumberjack's) does it.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};
use tokio::sync::{mpsc, oneshot};

use super::*;

/// Where and how the log backend writes (kube-apiserver's `--audit-log-*` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// The log file (`--audit-log-path`); `-` is standard output.
    pub path: PathBuf,
    /// Rotate the file before it grows beyond this many megabytes (`--audit-log-maxsize`);
    /// 0 never rotates.
    pub max_size_mb: u64,
    /// Rotated files to keep, the newest (`--audit-log-maxbackup`); 0 keeps all.
    pub max_backups: usize,
    /// Days to keep rotated files, by the time in their name (`--audit-log-maxage`); 0 keeps
    /// all.
    pub max_age_days: u64,
    /// Events that may wait for the writer thread; beyond that [`LogWriter::send`] waits.
    pub buffer_size: usize,
}

impl LogConfig {
    /// Events waiting for the writer thread, by default.
    pub const DEFAULT_BUFFER_SIZE: usize = 1024;

    /// Writes to `path` without rotation.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogConfig {
            path: path.into(),
            max_size_mb: 0,
            max_backups: 0,
            max_age_days: 0,
            buffer_size: LogConfig::DEFAULT_BUFFER_SIZE,
        }
    }

    /// Whether the log goes to standard output.
    pub fn is_stdout(&self) -> bool {
        self.path.as_os_str() == "-"
    }
}

/// Why the log backend did not start.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file (or its directory) cannot be created or opened.
    #[error(
        "audit log {}: cannot open it for appending: {source}; make sure its directory can be \
         created and written, or pass `-` to log to standard output",
        .path.display()
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the audit log writer thread: {0}")]
    Spawn(#[source] io::Error),
}

enum Command {
    Event(Box<Event>),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The log backend: writes events as JSON lines from a dedicated thread, with rotation.
///
/// Clones share the writer; the thread ends when every clone is dropped or on
/// [`close`](Self::close), after writing what was sent before.
#[derive(Clone, Debug)]
pub struct LogWriter {
    tx: mpsc::Sender<Command>,
    closed_warned: Arc<AtomicBool>,
}

impl LogWriter {
    /// Opens the log (creating the file and its directory) and starts the writer thread. Call
    /// it at startup: opening the file blocks.
    pub fn open(config: LogConfig) -> Result<LogWriter, LogError> {
        let output = if config.is_stdout() {
            Output::Stdout
        } else {
            let mut file = RotatingFile::new(&config);
            file.open_append().map_err(|source| LogError::Open {
                path: config.path.clone(),
                source,
            })?;
            Output::File(Box::new(file))
        };
        let (tx, rx) = mpsc::channel(config.buffer_size.max(1));
        std::thread::Builder::new()
            .name("audit-log".to_string())
            .spawn(move || run_writer(output, rx))
            .map_err(LogError::Spawn)?;
        Ok(LogWriter {
            tx,
            closed_warned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Queues an event, waiting while the queue is full. After [`close`](Self::close) the event
    /// is dropped (with one warning).
    pub async fn send(&self, event: Event) {
        if self.tx.send(Command::Event(Box::new(event))).await.is_err() {
            self.warn_closed();
        }
    }

    /// Waits until every event sent before is written out to the file (or stdout).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Writes every event sent before, closes the file and ends the writer thread; events sent
    /// afterwards are dropped. Waits until that is done.
    pub async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Close(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    fn warn_closed(&self) {
        if !self.closed_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("the audit log is closed; audit events are dropped");
        }
    }
}

fn run_writer(mut output: Output, mut rx: mpsc::Receiver<Command>) {
    let mut warned = Warned::default();
    while let Some(first) = rx.blocking_recv() {
        let mut next = Some(first);
        while let Some(command) = next.take() {
            match command {
                Command::Event(event) => output.write_event(&event, &mut warned),
                Command::Flush(ack) => {
                    output.flush(&mut warned);
                    let _ = ack.send(());
                }
                Command::Close(ack) => {
                    // No new sends; write what is already queued, then stop.
                    rx.close();
                    let mut acks = vec![ack];
                    while let Ok(command) = rx.try_recv() {
                        match command {
                            Command::Event(event) => output.write_event(&event, &mut warned),
                            Command::Flush(ack) | Command::Close(ack) => acks.push(ack),
                        }
                    }
                    output.flush(&mut warned);
                    drop(output);
                    for ack in acks {
                        let _ = ack.send(());
                    }
                    return;
                }
            }
            next = rx.try_recv().ok();
        }
        // The queue is empty: hand the batch to the OS.
        output.flush(&mut warned);
    }
    output.flush(&mut warned);
}

/// The kinds of failure the writer reports, each once until it recovers.
#[derive(Clone, Copy, Debug)]
enum Failure {
    Open = 0,
    Write,
    Flush,
    Rotate,
    Prune,
    Encode,
}

#[derive(Default)]
struct Warned {
    kinds: [bool; 6],
    lost: u64,
}

impl Warned {
    fn fail(&mut self, kind: Failure, path: &Path, error: &dyn fmt::Display) {
        let seen = &mut self.kinds[kind as usize];
        if !*seen {
            *seen = true;
            let what = match kind {
                Failure::Open => "cannot open the audit log; events are lost until it opens",
                Failure::Write => "cannot write the audit log; events are lost until it works",
                Failure::Flush => "cannot flush the audit log",
                Failure::Rotate => "cannot rotate the audit log; appending to the current file",
                Failure::Prune => "cannot remove an old rotated audit log",
                Failure::Encode => "cannot encode an audit event; it is dropped",
            };
            tracing::warn!(path = %path.display(), error = %error, "{what}");
        }
    }

    fn ok(&mut self, kind: Failure) {
        self.kinds[kind as usize] = false;
    }

    fn written(&mut self, path: &Path) {
        self.ok(Failure::Open);
        self.ok(Failure::Write);
        if self.lost > 0 {
            tracing::warn!(
                path = %path.display(),
                lost = self.lost,
                "the audit log is written again; events were lost meanwhile"
            );
            self.lost = 0;
        }
    }
}

enum Output {
    Stdout,
    File(Box<RotatingFile>),
}

impl Output {
    fn path(&self) -> &Path {
        match self {
            Output::Stdout => Path::new("-"),
            Output::File(f) => &f.path,
        }
    }

    fn write_event(&mut self, event: &Event, warned: &mut Warned) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(e) => {
                warned.fail(Failure::Encode, self.path(), &e);
                return;
            }
        };
        line.push(b'\n');
        match self {
            Output::Stdout => match io::stdout().lock().write_all(&line) {
                Ok(()) => warned.written(Path::new("-")),
                Err(e) => {
                    warned.lost += 1;
                    warned.fail(Failure::Write, Path::new("-"), &e);
                }
            },
            Output::File(file) => file.write_line(&line, warned),
        }
    }

    fn flush(&mut self, warned: &mut Warned) {
        let (result, path) = match self {
            Output::Stdout => (io::stdout().lock().flush(), Path::new("-")),
            Output::File(file) => (file.flush(), file.path.as_path()),
        };
        match result {
            Ok(()) => warned.ok(Failure::Flush),
            Err(e) => warned.fail(Failure::Flush, path, &e),
        }
    }
}

const MEGABYTE: u64 = 1024 * 1024;

const BACKUP_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]-[minute]-[second].[subsecond digits:3]");

/// The log file with lumberjack's rotation: before a write would take the file beyond the
/// maximum size, it is renamed to `<name>-<UTC time>.<ext>` and a new one started; then rotated
/// files beyond the count or age limits are removed.
struct RotatingFile {
    path: PathBuf,
    /// In bytes; 0: never rotate.
    max_size: u64,
    max_backups: usize,
    max_age: Option<time::Duration>,
    file: Option<BufWriter<File>>,
    size: u64,
}

impl RotatingFile {
    fn new(config: &LogConfig) -> Self {
        // Beyond this the cutoff would fall before year 1 anyway.
        const MAX_DAYS: u64 = 3_000_000;
        RotatingFile {
            path: config.path.clone(),
            max_size: config.max_size_mb.saturating_mul(MEGABYTE),
            max_backups: config.max_backups,
            max_age: (config.max_age_days > 0)
                .then(|| time::Duration::days(config.max_age_days.min(MAX_DAYS) as i64)),
            file: None,
            size: 0,
        }
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    fn options(truncate: bool) -> OpenOptions {
        let mut options = OpenOptions::new();
        options.create(true);
        if truncate {
            options.write(true).truncate(true);
        } else {
            options.append(true);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        options
    }

    /// Opens the file for appending, creating it and its directory.
    fn open_append(&mut self) -> io::Result<()> {
        fs::create_dir_all(self.dir())?;
        let file = RotatingFile::options(false).open(&self.path)?;
        self.size = file.metadata()?.len();
        self.file = Some(BufWriter::new(file));
        Ok(())
    }

    fn write_line(&mut self, line: &[u8], warned: &mut Warned) {
        if self.file.is_none() {
            if let Err(e) = self.open_append() {
                warned.lost += 1;
                warned.fail(Failure::Open, &self.path, &e);
                return;
            }
        }
        let len = line.len() as u64;
        // A line larger than the maximum gets a file of its own rather than being lost.
        if self.max_size > 0 && self.size > 0 && self.size.saturating_add(len) > self.max_size {
            self.rotate(warned);
        }
        let Some(file) = self.file.as_mut() else {
            warned.lost += 1;
            return;
        };
        match file.write_all(line) {
            Ok(()) => {
                self.size += len;
                warned.written(&self.path);
            }
            Err(e) => {
                warned.lost += 1;
                warned.fail(Failure::Write, &self.path, &e);
                // Reopen on the next event (the file may have been removed).
                self.file = None;
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }

    /// `<name>-` and `.<ext>` of rotated files (Go's `filepath.Ext`: from the last dot).
    fn backup_parts(&self) -> (String, String) {
        let base = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (stem, ext) = match base.rfind('.') {
            Some(i) => base.split_at(i),
            None => (base.as_str(), ""),
        };
        (format!("{stem}-"), ext.to_string())
    }

    fn backup_path(&self, at: OffsetDateTime) -> PathBuf {
        let (prefix, ext) = self.backup_parts();
        let stamp = at
            .to_offset(UtcOffset::UTC)
            .format(BACKUP_TIME)
            .unwrap_or_default();
        self.dir().join(format!("{prefix}{stamp}{ext}"))
    }

    fn rotate(&mut self, warned: &mut Warned) {
        if let Err(e) = self.flush() {
            warned.fail(Failure::Flush, &self.path, &e);
        }
        self.file = None;
        // Rotations within one millisecond get the next free millisecond.
        let mut at = OffsetDateTime::now_utc();
        let mut target = self.backup_path(at);
        for _ in 0..1000 {
            if !target.exists() {
                break;
            }
            at += time::Duration::milliseconds(1);
            target = self.backup_path(at);
        }
        let renamed = match fs::rename(&self.path, &target) {
            Ok(()) => {
                warned.ok(Failure::Rotate);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => {
                warned.fail(Failure::Rotate, &self.path, &e);
                false
            }
        };
        let opened = if renamed {
            fs::create_dir_all(self.dir())
                .and_then(|()| RotatingFile::options(true).open(&self.path))
                .map(|file| {
                    self.size = 0;
                    self.file = Some(BufWriter::new(file));
                })
        } else {
            self.open_append()
        };
        if let Err(e) = opened {
            warned.fail(Failure::Open, &self.path, &e);
        }
        if renamed {
            self.prune(warned);
        }
    }

    /// Removes rotated files beyond `max_backups` (oldest first) and older than `max_age`.
    fn prune(&self, warned: &mut Warned) {
        if self.max_backups == 0 && self.max_age.is_none() {
            return;
        }
        let dir = self.dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                warned.fail(Failure::Prune, &dir, &e);
                return;
            }
        };
        let (prefix, ext) = self.backup_parts();
        let mut backups: Vec<(OffsetDateTime, PathBuf)> = entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let stamp = name.strip_prefix(&prefix)?.strip_suffix(&ext)?;
                let at = PrimitiveDateTime::parse(stamp, BACKUP_TIME).ok()?;
                Some((at.assume_utc(), entry.path()))
            })
            .collect();
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let mut remove = Vec::new();
        if self.max_backups > 0 && backups.len() > self.max_backups {
            remove = backups.split_off(self.max_backups);
        }
        if let Some(cutoff) = self
            .max_age
            .and_then(|age| OffsetDateTime::now_utc().checked_sub(age))
        {
            remove.extend(backups.into_iter().filter(|(at, _)| *at < cutoff));
        }
        for (_, path) in remove {
            match fs::remove_file(&path) {
                Ok(()) => warned.ok(Failure::Prune),
                Err(e) => warned.fail(Failure::Prune, &path, &e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::audit::fixtures::{decision, resource};
    use serde_json::json;
    use serde_json::Value;
    use time::macros::datetime;

    // --- log writer ---

    fn event_with_body(id: usize, body_len: usize) -> Event {
        let attrs = resource("create", "", "configmaps", "", "default", "");
        let mut b = EventBuilder::new(
            decision(Level::Request),
            &attrs,
            format!("id-{id}"),
            "/api/v1/namespaces/default/configmaps",
        );
        b.set_request_object(&json!({"data": {"x": "a".repeat(body_len)}}));
        b.response_complete(201).unwrap()
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn is_backup_name(name: &str) -> bool {
        name.strip_prefix("audit-")
            .and_then(|r| r.strip_suffix(".log"))
            .is_some_and(|stamp| PrimitiveDateTime::parse(stamp, BACKUP_TIME).is_ok())
    }

    #[tokio::test]
    async fn log_writer_writes_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/audit.log");
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        for i in 0..3 {
            w.send(event_with_body(i, 3)).await;
        }
        w.flush().await;
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2]["auditID"], "id-2");
        assert_eq!(lines[0]["kind"], "Event");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        w.close().await;
        // After close, events are dropped, not written, and nothing hangs.
        w.send(event_with_body(9, 3)).await;
        w.flush().await;
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 3);
    }

    #[tokio::test]
    async fn log_writer_appends_to_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        fs::write(&path, "{\"earlier\":true}\n").unwrap();
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        w.send(event_with_body(0, 1)).await;
        w.close().await;
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.starts_with("{\"earlier\":true}\n"));
    }

    #[tokio::test]
    async fn log_writer_rotates_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = LogConfig {
            max_size_mb: 1,
            max_backups: 2,
            buffer_size: 2,
            ..LogConfig::new(&path)
        };
        let w = LogWriter::open(config).unwrap();
        // ~400 KB per event: two fit in 1 MB, the third starts a new file.
        for i in 0..9 {
            w.send(event_with_body(i, 400 * 1024)).await;
        }
        w.close().await;
        let names = files_in(dir.path());
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains(&"audit.log".to_string()), "{names:?}");
        let backups: Vec<&String> = names.iter().filter(|n| n.as_str() != "audit.log").collect();
        assert!(backups.iter().all(|n| is_backup_name(n)), "{names:?}");
        // Every file stays within the limit; the newest backups hold the latest events.
        for name in &names {
            let len = fs::metadata(dir.path().join(name)).unwrap().len();
            assert!(len <= MEGABYTE, "{name}: {len}");
        }
        let current = fs::read_to_string(&path).unwrap();
        let ids: Vec<String> = current
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["auditID"].to_string())
            .collect();
        assert_eq!(ids, vec!["\"id-8\""]);
        let newest = fs::read_to_string(dir.path().join(backups[1])).unwrap();
        assert!(newest.contains("\"id-6\"") && newest.contains("\"id-7\""));
    }

    #[tokio::test]
    async fn log_writer_without_max_size_never_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let w = LogWriter::open(LogConfig::new(&path)).unwrap();
        for i in 0..4 {
            w.send(event_with_body(i, 400 * 1024)).await;
        }
        w.close().await;
        assert_eq!(files_in(dir.path()), vec!["audit.log"]);
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 4);
    }

    #[test]
    fn rotation_prunes_by_age_and_keeps_all_without_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let old = "audit-2000-01-01T00-00-00.000.log";
        fs::write(dir.path().join(old), "old\n").unwrap();
        fs::write(dir.path().join("audit-notes.log"), "not a backup\n").unwrap();
        fs::write(dir.path().join("other-2000-01-01T00-00-00.000.log"), "x\n").unwrap();

        // No limits: rotation keeps every backup.
        let mut warned = Warned::default();
        {
            let mut file = RotatingFile::new(&LogConfig::new(&path));
            file.max_size = 10;
            file.write_line(b"0123456789\n", &mut warned);
            file.write_line(b"0123456789\n", &mut warned);
        }
        assert!(dir.path().join(old).exists());

        // Max age one day: the year-2000 backup goes, the fresh one and unrelated files stay.
        let config = LogConfig {
            max_age_days: 1,
            ..LogConfig::new(&path)
        };
        let mut file = RotatingFile::new(&config);
        file.max_size = 10;
        file.write_line(b"0123456789\n", &mut warned);
        file.flush().unwrap();
        let names = files_in(dir.path());
        assert!(!names.contains(&old.to_string()), "{names:?}");
        assert!(names.contains(&"audit-notes.log".to_string()));
        assert!(names.contains(&"other-2000-01-01T00-00-00.000.log".to_string()));
        assert_eq!(
            names.iter().filter(|n| is_backup_name(n)).count(),
            2,
            "{names:?}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "0123456789\n");
    }

    #[test]
    fn backup_names_follow_lumberjack() {
        let at = datetime!(2026-01-02 03:04:05.678901 UTC);
        let file = RotatingFile::new(&LogConfig::new("/var/log/audit.log"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("/var/log/audit-2026-01-02T03-04-05.678.log")
        );
        let file = RotatingFile::new(&LogConfig::new("/var/log/audit.json.log"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("/var/log/audit.json-2026-01-02T03-04-05.678.log")
        );
        let file = RotatingFile::new(&LogConfig::new("audit"));
        assert_eq!(
            file.backup_path(at),
            PathBuf::from("./audit-2026-01-02T03-04-05.678")
        );
    }

    #[test]
    fn log_writer_open_reports_unusable_paths() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = LogWriter::open(LogConfig::new(blocker.join("audit.log"))).unwrap_err();
        assert!(matches!(err, LogError::Open { .. }), "{err}");
        assert!(err.to_string().contains("audit.log"), "{err}");
    }

    #[test]
    fn level_and_stage_names_round_trip() {
        for level in Level::ALL {
            assert_eq!(Level::parse(level.as_str()), Some(level));
        }
        for stage in Stage::ALL {
            assert_eq!(Stage::parse(stage.as_str()), Some(stage));
        }
        assert!(Level::Metadata < Level::Request);
        assert_eq!(Level::parse("metadata"), None);
    }
}
