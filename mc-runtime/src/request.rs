//! What a reconciler is asked to do: a `(cluster, namespace, name)` request, the answer it gives
//! back (`Action`), and the typed description of a watched resource kind.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kube::api::ApiResource;
use kube::core::NamespaceResourceScope;

/// The name of an engaged cluster: a logical-cluster name, a file or Secret name for kubeconfig
/// clusters.
///
/// ```
/// use mc_runtime::ClusterName;
/// let c = ClusterName::from("root");
/// assert_eq!(c.as_str(), "root");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// Wraps a name.
    pub fn new(name: impl AsRef<str>) -> Self {
        ClusterName(Arc::from(name.as_ref()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ClusterName {
    fn from(s: &str) -> Self {
        ClusterName::new(s)
    }
}

impl From<String> for ClusterName {
    fn from(s: String) -> Self {
        ClusterName(Arc::from(s))
    }
}

impl AsRef<str> for ClusterName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// One unit of work: reconcile the object `namespace/name` in `cluster`.
///
/// ```
/// use mc_runtime::Request;
/// let r = Request::namespaced("a", "default", "cm");
/// assert_eq!(r.to_string(), "a|default/cm");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// The cluster the object lives in.
    pub cluster: ClusterName,
    /// The namespace, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl Request {
    /// A request for a namespaced object.
    pub fn namespaced(
        cluster: impl Into<ClusterName>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Request {
            cluster: cluster.into(),
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// A request for a cluster-scoped object.
    pub fn cluster_scoped(cluster: impl Into<ClusterName>, name: impl Into<String>) -> Self {
        Request {
            cluster: cluster.into(),
            namespace: None,
            name: name.into(),
        }
    }
}

impl fmt::Display for Request {
    /// Formats like multi-cluster informer keys: `<cluster>|<namespace>/<name>` or
    /// `<cluster>|<name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}|{}/{}", self.cluster, ns, self.name),
            None => write!(f, "{}|{}", self.cluster, self.name),
        }
    }
}

/// What the runtime does after a successful reconcile.
///
/// ```
/// use std::time::Duration;
/// use mc_runtime::Action;
/// assert_eq!(Action::requeue_after(Duration::from_secs(5)).requeue, Some(Duration::from_secs(5)));
/// assert_eq!(Action::await_change().requeue, None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Action {
    /// Reconcile the same request again after this delay, even without a change.
    pub requeue: Option<Duration>,
}

impl Action {
    /// Reconcile again after `delay`.
    pub fn requeue_after(delay: Duration) -> Self {
        Action {
            requeue: Some(delay),
        }
    }

    /// Nothing more to do until something changes.
    pub fn await_change() -> Self {
        Action { requeue: None }
    }
}

/// A resource kind the runtime watches: its API coordinates and whether it is namespaced.
///
/// ```
/// use mc_runtime::ResourceKind;
/// use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
/// assert!(ResourceKind::of::<ConfigMap>().namespaced);
/// assert!(!ResourceKind::of::<Namespace>().namespaced);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceKind {
    /// Group, version, kind and plural.
    pub api: ApiResource,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether watches of this kind carry only the objects' metadata (lists and watches as
    /// `PartialObjectMetadata`): for a kind a controller only maps to requests, so that its
    /// cache does not hold every object's content (a watch on every ConfigMap, say).
    pub metadata_only: bool,
}

impl ResourceKind {
    /// The kind of a typed resource.
    pub fn of<K>() -> Self
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        ResourceKind {
            api: ApiResource::erase::<K>(&()),
            namespaced: TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>(),
            metadata_only: false,
        }
    }

    /// A kind known only at run time.
    pub fn dynamic(api: ApiResource, namespaced: bool) -> Self {
        ResourceKind {
            api,
            namespaced,
            metadata_only: false,
        }
    }

    /// The same kind, watched for its objects' metadata only (see
    /// [`ResourceKind::metadata_only`]); the cached objects then have no content.
    pub fn with_metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// `<plural>.<group>/<version>`, for logs and cache keys.
    pub fn gvr(&self) -> String {
        if self.api.group.is_empty() {
            format!("{}/{}", self.api.plural, self.api.version)
        } else {
            format!(
                "{}.{}/{}",
                self.api.plural, self.api.group, self.api.version
            )
        }
    }
}
