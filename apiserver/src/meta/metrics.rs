//! Prometheus metrics of the API server (`/metrics`).

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    verb: String,
    resource: String,
}

/// Request counters and latency histograms, labelled like kube-apiserver's.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<DurationLabels, Histogram>,
    resident: Gauge,
    cpu: Counter<f64, std::sync::atomic::AtomicU64>,
}

/// Metrics a caller adds to `/metrics`, e.g. the co-located controllers' leader election.
#[derive(Clone)]
pub struct ExtraMetrics(Arc<dyn Fn(&mut Registry) + Send + Sync>);

impl ExtraMetrics {
    /// `register` is called once, when the server's registry is built.
    pub fn new(register: impl Fn(&mut Registry) + Send + Sync + 'static) -> Self {
        ExtraMetrics(Arc::new(register))
    }

    /// Registers these metrics with `registry`.
    pub fn register(&self, registry: &mut Registry) {
        (self.0)(registry)
    }
}

impl std::fmt::Debug for ExtraMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtraMetrics")
    }
}

/// The CPU time (user and system) process `pid` has used, in seconds (Linux `/proc`; 0 where it
/// cannot be read).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // utime and stime are fields 14 and 15, in USER_HZ ticks (100 per second on Linux).
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The resident memory of process `pid` in bytes (Linux `/proc`; 0 where it cannot be read).
pub fn resident_memory_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn new_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
    ])
}

impl Metrics {
    /// The server's own metrics, with nothing extra registered.
    pub fn new() -> Self {
        Self::with_extra(None)
    }

    /// The server's metrics and those `extra` registers.
    pub fn with_extra(extra: Option<&ExtraMetrics>) -> Self {
        let mut registry = Registry::default();
        if let Some(ExtraMetrics(register)) = extra {
            register(&mut registry);
        }
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(
            new_histogram as fn() -> Histogram,
        );
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out by verb, resource and HTTP response code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds by verb and resource",
            durations.clone(),
        );
        let resident = Gauge::default();
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            resident.clone(),
        );
        let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            cpu.clone(),
        );
        Metrics {
            registry,
            requests,
            durations,
            resident,
            cpu,
        }
    }

    /// Records one finished request.
    pub fn observe(&self, verb: &str, resource: &str, code: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                code: code.to_string(),
            })
            .inc();
        self.durations
            .get_or_create(&DurationLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
            })
            .observe(seconds);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let rss = resident_memory_bytes(std::process::id());
        self.resident.set(i64::try_from(rss).unwrap_or(i64::MAX));
        let used = cpu_seconds(std::process::id());
        self.cpu.inc_by((used - self.cpu.get()).max(0.0));
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_request_total() {
        let m = Metrics::new();
        m.observe("get", "configmaps", 200, 0.01);
        let text = m.render();
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"get\",resource=\"configmaps\",code=\"200\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("apiserver_request_duration_seconds_bucket"),
            "{text}"
        );
    }

    /// The value of the unlabelled sample `name` in an exposition.
    fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    #[test]
    fn renders_the_resident_memory() {
        let rss = sample(&Metrics::new().render(), "process_resident_memory_bytes");
        assert!(rss > f64::from(1 << 20), "{rss}");
    }

    #[test]
    fn renders_the_cpu_time_used() {
        // Work until the process has used CPU time the kernel accounts (whatever else the
        // machine does meanwhile), then the metric shows at least that much.
        let before = cpu_seconds(std::process::id());
        let mut x = 0u64;
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while cpu_seconds(std::process::id()) < before + 0.05 && std::time::Instant::now() < give_up
        {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
        let cpu = sample(&Metrics::new().render(), "process_cpu_seconds_total");
        assert!(cpu >= before + 0.05, "{cpu} after {before}");
        assert!((cpu - cpu_seconds(std::process::id())).abs() < 1.0, "{cpu}");
    }
}
