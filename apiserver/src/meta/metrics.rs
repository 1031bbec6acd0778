//! Prometheus metrics of the API server (`/metrics`).

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// What kube-apiserver's request metrics say of one request: its labels but the code, with
/// kube's values (`LIST`, `POST`, `APPLY`; scope `resource`, `namespace` or `cluster`). Every
/// value comes from the server's own routes, never from the path as sent: a request for a type
/// that is not served is not recorded, so a client cannot add series.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct RequestLabels {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`.
    pub verb: &'static str,
    /// `All` for a dry run, `invalid` for a dryRun value kube refuses, else empty.
    pub dry_run: &'static str,
    /// The API group (empty for the core group and non-resource paths).
    pub group: String,
    /// The API version.
    pub version: String,
    /// The resource.
    pub resource: String,
    /// The subresource; for a non-resource path, the path as kube names it (`apis`, `/readyz`).
    pub subresource: String,
    /// `resource`, `namespace`, `cluster`, or empty for a non-resource path.
    pub scope: &'static str,
    /// `apiserver`, or empty for the health and OpenAPI v3 paths (as kube-apiserver).
    pub component: &'static str,
}

/// The labels of the SLI histogram; the others add to them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SliLabels {
    component: String,
    group: String,
    resource: String,
    scope: String,
    subresource: String,
    verb: String,
    version: String,
}

/// The labels of the duration histogram: the SLI's and `dry_run`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    dry_run: String,
    #[prometheus(flatten)]
    sli: SliLabels,
}

/// The labels of the request counter: the duration's and `code`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TotalLabels {
    code: String,
    #[prometheus(flatten)]
    duration: DurationLabels,
}

/// Request counters and latency histograms with kube-apiserver's names, labels and buckets, so
/// its dashboards and SLO alerts read them unchanged.
pub struct Metrics {
    registry: Registry,
    requests: Family<TotalLabels, Counter>,
    durations: Family<DurationLabels, Histogram>,
    sli: Family<SliLabels, Histogram>,
    resident: Gauge,
    cpu: Counter<f64, std::sync::atomic::AtomicU64>,
}

/// The media type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

/// kube-apiserver's buckets of `apiserver_request_duration_seconds`.
const DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// kube-apiserver's buckets of `apiserver_request_sli_duration_seconds`.
const SLI_BUCKETS: [f64; 21] = [
    0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
    30.0, 45.0, 60.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn sli_histogram() -> Histogram {
    Histogram::new(SLI_BUCKETS)
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
        let requests = Family::<TotalLabels, Counter>::default();
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        let sli = Family::<SliLabels, Histogram>::new_with_constructor(
            sli_histogram as fn() -> Histogram,
        );
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
            durations.clone(),
        );
        registry.register(
            "apiserver_request_sli_duration_seconds",
            "Response latency distribution (not counting webhook duration and priority & fairness queue wait times) in seconds for each verb, group, version, resource, subresource, scope and component.",
            sli.clone(),
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
            sli,
            resident,
            cpu,
        }
    }

    /// Records one request answered `code` after `seconds`; a long-running one (a watch) has
    /// no SLI, as kube-apiserver's.
    pub fn observe(&self, labels: RequestLabels, code: u16, seconds: f64, long_running: bool) {
        let l = labels;
        let sli = SliLabels {
            component: l.component.into(),
            group: l.group,
            resource: l.resource,
            scope: l.scope.into(),
            subresource: l.subresource,
            verb: l.verb.into(),
            version: l.version,
        };
        let duration = DurationLabels {
            dry_run: l.dry_run.into(),
            sli,
        };
        if !long_running {
            self.sli.get_or_create(&duration.sli).observe(seconds);
        }
        self.durations.get_or_create(&duration).observe(seconds);
        self.requests
            .get_or_create(&TotalLabels {
                code: code.to_string(),
                duration,
            })
            .inc();
    }

    /// The exposition, in the OpenMetrics text format ([`CONTENT_TYPE`]).
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
    fn renders_kubes_request_metrics() {
        let m = Metrics::new();
        let labels = RequestLabels {
            verb: "LIST",
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            scope: "namespace",
            component: "apiserver",
            ..RequestLabels::default()
        };
        m.observe(labels.clone(), 200, 0.01, false);
        m.observe(
            RequestLabels {
                verb: "WATCH",
                ..labels.clone()
            },
            200,
            0.01,
            true,
        );
        let text = m.render();
        let sli = "component=\"apiserver\",group=\"apps\",resource=\"deployments\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\"";
        assert!(
            text.contains(&format!(
                "apiserver_request_total{{code=\"200\",dry_run=\"\",{sli}}} 1"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apiserver_request_duration_seconds_bucket{{le=\"1.25\",dry_run=\"\",{sli}}} 1"
            )),
            "{text}"
        );
        assert!(
            // (the bucket bound comes first; Prometheus reads labels in any order)
            text.contains(&format!(
                "apiserver_request_sli_duration_seconds_bucket{{le=\"0.05\",{sli}}} 1"
            )),
            "{text}"
        );
        assert!(
            !text.contains("apiserver_request_sli_duration_seconds_count{component=\"apiserver\",group=\"apps\",resource=\"deployments\",scope=\"namespace\",subresource=\"\",verb=\"WATCH\""),
            "a watch has no SLI: {text}"
        );
        assert!(
            text.ends_with("# EOF\n"),
            "OpenMetrics, as CONTENT_TYPE says"
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
