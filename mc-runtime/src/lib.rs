//! A multi-cluster controller runtime in the spirit of multicluster-runtime: providers engage
//! clusters, the manager runs controllers over them with shared caches, queues and metrics.
//!
//! Nothing here knows a particular control plane: a provider says which clusters exist and how
//! to reach them (see [`providers`] for the plain-Kubernetes ones), and a cluster whose objects
//! come from a watch shared with other clusters names the annotation that tells them apart.

pub mod cache;
pub mod client;
pub mod cluster;
pub mod controller;
pub mod error;
pub mod events;
pub mod leader;
pub mod lease;
pub mod manager;
pub mod mapping;
pub mod metrics;
pub mod provider;
pub mod providers;
pub mod queue;
pub mod rate_limit;
pub mod request;
pub mod sharding;

pub use cache::{CacheError, CacheEvent, CacheRegistry, SharedCache};
pub use cluster::{CacheSource, Cluster, ClusterContext, ReconcileGuard};
pub use controller::{Controller, ControllerError, Reconciler};
pub use error::{kube_error_is_transient, ReconcileError};
pub use manager::{Manager, ManagerError, ManagerOptions};
pub use metrics::Metrics;
pub use provider::{ClusterEvent, ClusterProvider, ClusterSink, DisengageAck, ProviderError};
pub use queue::{QueueMetrics, WorkQueue};
pub use rate_limit::{
    default_controller_rate_limiter, ItemExponentialBackoff, MaxOfRateLimiter, RateLimiter,
    TokenBucket,
};
pub use request::{Action, ClusterName, Request, ResourceKind};
