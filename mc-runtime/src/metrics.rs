//! Prometheus metrics of the runtime: reconciles and their duration per controller, work-queue
//! depth/adds/retries per controller, engaged clusters, and requests dropped for gone clusters.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::queue::QueueMetrics;

/// Labels of per-controller metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller's name.
    pub controller: String,
}

/// Labels of the reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The controller's name.
    pub controller: String,
    /// `success`, `error`, `requeue_after` or `panic`.
    pub result: String,
}

/// Labels of work-queue metrics (client-go names the queue after its controller).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The queue's name.
    pub name: String,
}

type HistogramFamily = Family<ControllerLabels, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    // 5 ms to ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Every metric of the runtime. Cheap to clone: clones share the same values.
///
/// ```
/// use mc_runtime::Metrics;
/// let metrics = Metrics::default();
/// let mut registry = prometheus_client::registry::Registry::default();
/// metrics.register(&mut registry);
/// metrics.reconciled("configmaps", "success", 0.01);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"controller_runtime_reconcile_total{controller="configmaps",result="success"} 1"#));
/// ```
#[derive(Clone, Debug)]
pub struct Metrics {
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: HistogramFamily,
    dropped_requests: Family<ControllerLabels, Counter>,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_adds: Family<QueueLabels, Counter>,
    queue_retries: Family<QueueLabels, Counter>,
    engaged_clusters: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_histogram),
            dropped_requests: Family::default(),
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            engaged_clusters: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Metrics for another manager of the same process: its reconciles and queues count in
    /// the same families (told apart by controller name), its engaged clusters in a gauge of
    /// its own that is not registered (`multicluster_engaged_clusters` is this manager's).
    pub fn sharing(&self) -> Metrics {
        Metrics {
            engaged_clusters: Gauge::default(),
            ..self.clone()
        }
    }

    /// Registers every metric under the names controller-runtime uses
    /// (`controller_runtime_*`, `workqueue_*`) plus `multicluster_engaged_clusters`.
    pub fn register(&self, registry: &mut Registry) {
        let cr = registry.sub_registry_with_prefix("controller_runtime");
        cr.register(
            "reconcile",
            "Reconciles per controller and result",
            self.reconcile_total.clone(),
        );
        cr.register(
            "reconcile_errors",
            "Reconciles that returned an error, per controller",
            self.reconcile_errors.clone(),
        );
        cr.register(
            "reconcile_time_seconds",
            "Time spent in reconcile, per controller",
            self.reconcile_time.clone(),
        );
        cr.register(
            "dropped_requests",
            "Requests dropped because their cluster is no longer engaged",
            self.dropped_requests.clone(),
        );
        let wq = registry.sub_registry_with_prefix("workqueue");
        wq.register(
            "depth",
            "Items waiting in the work queue",
            self.queue_depth.clone(),
        );
        wq.register("adds", "Adds to the work queue", self.queue_adds.clone());
        wq.register(
            "retries",
            "Rate-limited re-adds to the work queue",
            self.queue_retries.clone(),
        );
        registry.register(
            "multicluster_engaged_clusters",
            "Clusters currently engaged by the manager",
            self.engaged_clusters.clone(),
        );
    }

    /// The metric handles of one controller's queue.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let labels = QueueLabels {
            name: name.to_string(),
        };
        QueueMetrics {
            depth: self.queue_depth.get_or_create(&labels).clone(),
            adds: self.queue_adds.get_or_create(&labels).clone(),
            retries: self.queue_retries.get_or_create(&labels).clone(),
        }
    }

    /// A controller starts: its reconcile counters by result and its errors at zero, and its
    /// time histogram empty, as controller-runtime registers them when a controller starts, so
    /// that a rate over them is defined before the first reconcile.
    pub fn started(&self, controller: &str) {
        for result in ["success", "error", "requeue", "requeue_after"] {
            let _ = self.reconcile_total.get_or_create(&ResultLabels {
                controller: controller.to_string(),
                result: result.to_string(),
            });
        }
        let c = ControllerLabels {
            controller: controller.to_string(),
        };
        let _ = self.reconcile_errors.get_or_create(&c);
        let _ = self.reconcile_time.get_or_create(&c);
    }

    /// Records one reconcile of `controller` with `result` taking `seconds`.
    pub fn reconciled(&self, controller: &str, result: &str, seconds: f64) {
        let c = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconcile_total
            .get_or_create(&ResultLabels {
                controller: controller.to_string(),
                result: result.to_string(),
            })
            .inc();
        if result == "error" || result == "panic" {
            self.reconcile_errors.get_or_create(&c).inc();
        }
        self.reconcile_time.get_or_create(&c).observe(seconds);
    }

    /// Records a request dropped because its cluster is gone.
    pub fn dropped(&self, controller: &str) {
        self.dropped_requests
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .inc();
    }

    /// Sets the number of engaged clusters.
    pub fn set_engaged_clusters(&self, n: usize) {
        self.engaged_clusters.set(n as i64);
    }

    /// The number of engaged clusters last recorded.
    pub fn engaged_clusters(&self) -> i64 {
        self.engaged_clusters.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn every_metric_is_exposed_with_its_labels() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.reconciled("cm", "success", 0.002);
        m.reconciled("cm", "error", 0.2);
        m.dropped("cm");
        let q = m.queue("cm");
        q.adds.inc();
        q.depth.set(3);
        q.retries.inc();
        m.set_engaged_clusters(2);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            r#"controller_runtime_reconcile_total{controller="cm",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="cm",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="cm"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="cm"} 2"#,
            r#"controller_runtime_dropped_requests_total{controller="cm"} 1"#,
            r#"workqueue_depth{name="cm"} 3"#,
            r#"workqueue_adds_total{name="cm"} 1"#,
            r#"workqueue_retries_total{name="cm"} 1"#,
            "multicluster_engaged_clusters 2",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_started_controller_counts_from_zero() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.started("idle");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            r#"controller_runtime_reconcile_total{controller="idle",result="success"} 0"#,
            r#"controller_runtime_reconcile_total{controller="idle",result="error"} 0"#,
            r#"controller_runtime_reconcile_total{controller="idle",result="requeue"} 0"#,
            r#"controller_runtime_reconcile_total{controller="idle",result="requeue_after"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="idle"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="idle"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
