//! The log, as kube components keep theirs: a verbosity (`-v N`) instead of levels, one line per
//! request only from `-v 3` on (kube-apiserver's own request lines start there too), and a
//! warning said once per cause rather than every time the cause is met again.
//!
//! | `-v` | what is written |
//! |------|-----------------|
//! | 0–2  | info, warnings and errors; each repeated warning once an hour |
//! | 3    | and one line per request (the `apiserver::requests` target) |
//! | 4–5  | and debug lines of this project's crates; repeats are no longer held back |
//! | 6+   | everything at trace, dependencies included |
//!
//! `RUST_LOG`, when set, replaces the verbosity's filter (`RUST_LOG=info,apiserver=debug`).
//! `--log-format json` writes every line as one JSON object, the start banner included.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Log line formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The format chosen at start, for the few lines written outside the subscriber's reach.
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// This project's crates, which `-v 4` and `-v 5` open to debug (their dependencies stay at
/// info: hyper's, h2's and rustls's debug lines are per frame).
const OWN_CRATES: &[&str] = &[
    "platform_mesh",
    "apiserver",
    "controllers",
    "mc_runtime",
    "api",
    "certs",
    "gotemplate",
];

/// The filter a verbosity names.
pub fn directives(verbosity: u8) -> String {
    match verbosity {
        0..=2 => format!(
            "info,{}=off",
            apiserver::endpoints::filters::REQUESTS_TARGET
        ),
        3 => "info".to_string(),
        4 | 5 => {
            let mut d = String::from("info");
            for c in OWN_CRATES {
                let _ = write!(d, ",{c}=debug");
            }
            d
        }
        _ => "trace".to_string(),
    }
}

/// Installs the subscriber: RUST_LOG when set, else the filter `verbosity` names; below `-v 4`
/// a warning or error is written once per cause an hour.
pub fn init(format: LogFormat, verbosity: u8) {
    use std::io::IsTerminal as _;
    let _ = FORMAT.set(format);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives(verbosity)));
    let repeats = (verbosity < 4).then(|| Repeats::new(REPEAT_WINDOW, MAX_CAUSES));
    // The verbosity's filter is the outer one: its level is the process's maximum, so that
    // the debug and trace call sites of every crate stay off at no cost (an outer filter without
    // a level, as `Repeats` is, would leave them all to be asked).
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(repeats)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => layer
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(repeats)
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry().with(layer).init();
}

/// A line for whoever started the process (where it serves, what to run next): as it is on a
/// terminal's text log, as a JSON line's message (with `fields`) in a JSON log.
pub fn announce(text: &str, fields: &[(&str, &str)]) {
    line("INFO", text, fields);
}

/// The error a command ends with: anyhow's report (`Error: …` with its causes) on a text log,
/// one JSON line at level ERROR in a JSON log.
pub fn fail(error: &anyhow::Error) {
    match FORMAT.get().copied().unwrap_or(LogFormat::Text) {
        LogFormat::Text => eprintln!("Error: {error:?}"),
        LogFormat::Json => line("ERROR", &format!("{error:#}"), &[]),
    }
}

fn line(level: &str, text: &str, fields: &[(&str, &str)]) {
    match FORMAT.get().copied().unwrap_or(LogFormat::Text) {
        LogFormat::Text => eprintln!("{text}"),
        LogFormat::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert(
                "timestamp".into(),
                time::OffsetDateTime::now_utc()
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
                    .into(),
            );
            obj.insert("level".into(), level.into());
            let mut f = serde_json::Map::new();
            f.insert(
                "message".into(),
                text.lines().next().unwrap_or_default().into(),
            );
            for (k, v) in fields {
                f.insert((*k).into(), (*v).into());
            }
            obj.insert("fields".into(), f.into());
            obj.insert("target".into(), "platform_mesh".into());
            eprintln!("{}", serde_json::Value::Object(obj));
        }
    }
}

/// How long a cause stays said.
const REPEAT_WINDOW: Duration = Duration::from_secs(3600);
/// How many causes are remembered (the oldest is forgotten first): a bound on what a stream of
/// distinct causes, such as one per tenant, can cost.
const MAX_CAUSES: usize = 4096;

/// Holds back a warning or error already written within the window: the same place in the
/// code with the same fields is the same cause. Info and below pass (they are said once by
/// the code that writes them, or are the request lines `-v 3` asks for).
struct Repeats {
    window: Duration,
    max: usize,
    seen: Mutex<HashMap<(&'static str, String), Instant>>,
}

impl Repeats {
    fn new(window: Duration, max: usize) -> Self {
        Repeats {
            window,
            max,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a cause is new (or its window is over), remembering it.
    fn first(&self, key: (&'static str, String), now: Instant) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = seen.get(&key) {
            if now.duration_since(*at) < self.window {
                return false;
            }
        }
        if seen.len() >= self.max && !seen.contains_key(&key) {
            let window = self.window;
            seen.retain(|_, at| now.duration_since(*at) < window);
            if seen.len() >= self.max {
                if let Some(oldest) = seen
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| k.clone())
                {
                    seen.remove(&oldest);
                }
            }
        }
        seen.insert(key, now);
        true
    }
}

/// The fields of an event as one string (the cause's second half).
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?};", field.name(), value);
    }
}

impl<S: Subscriber> Filter<S> for Repeats {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        if *event.metadata().level() > Level::WARN {
            return true;
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        // An event's name is its place in the code (`event src/x.rs:12`).
        self.first((event.metadata().name(), fields.0), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_start_at_three_and_debug_at_four() {
        assert!(directives(0).contains("apiserver::requests=off"));
        assert!(directives(2).contains("apiserver::requests=off"));
        assert_eq!(directives(3), "info");
        assert!(directives(4).contains("apiserver=debug"));
        assert!(
            !directives(4).starts_with("debug"),
            "dependencies stay at info"
        );
        assert_eq!(directives(9), "trace");
        for v in 0..10 {
            EnvFilter::try_new(directives(v)).expect("a valid filter");
        }
    }

    #[test]
    fn a_cause_is_said_once_per_window_and_the_causes_kept_are_bounded() {
        let repeats = Repeats::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let key = |s: &str| ("event src/x.rs:1", s.to_string());
        assert!(repeats.first(key("error=x"), t0));
        assert!(!repeats.first(key("error=x"), t0 + Duration::from_secs(59)));
        assert!(repeats.first(key("error=y"), t0), "another cause is said");
        assert!(repeats.first(key("error=x"), t0 + Duration::from_secs(61)));
        for i in 0..10 {
            assert!(repeats.first(key(&format!("tenant={i}")), t0 + Duration::from_secs(62)));
        }
        assert!(repeats.seen.lock().expect("lock").len() <= 3);
    }
}
