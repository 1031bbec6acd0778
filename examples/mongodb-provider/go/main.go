// Command mongodb-provider-go is the MongoDB provider's controller written in Go, the way a
// Platform Mesh provider author writes one: controller-runtime with multicluster-runtime and kcp's
// multicluster-provider (the apiexport provider). It engages every workspace bound to the
// `mongodb` APIExport through the export's virtual workspace, projects each consumer's
// MongoDBCommunity into a downstream cluster where the MongoDB community operator runs, and
// brings the operator's status and a connection Secret back to the consumer.
//
// It follows the same contract as the Rust controller (examples/mongodb-provider/provider); see
// examples/mongodb-provider/README.md for the walkthrough and CONTRACT.md for the contract.
//
//	mongodb-provider-go provider --kubeconfig FILE [--export mongodb] --downstream-kubeconfig FILE
package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	"github.com/kcp-dev/multicluster-provider/apiexport"
)

func init() {
	// The apiexport provider watches APIBindings through the virtual workspace.
	utilruntime.Must(apisv1alpha1.AddToScheme(scheme.Scheme))
}

const (
	finalizer = "mongodb.platform-mesh.io/downstream"
	// The labels on each downstream object say which consumer object it projects; the
	// downstream watch maps events back through them (never through anything a consumer wrote).
	clusterLabel    = "mongodb.platform-mesh.io/cluster"
	namespaceLabel  = "mongodb.platform-mesh.io/namespace"
	nameLabel       = "mongodb.platform-mesh.io/name"
	connectionLabel = "mongodb.platform-mesh.io/connection"
)

// MongoDBCommunity is the same kind on both sides: the consumer-facing API the export publishes
// and the MongoDB community operator's CRD downstream. Unstructured objects are enough here.
var mongoDB = schema.GroupVersionKind{Group: "mongodbcommunity.mongodb.com", Version: "v1", Kind: "MongoDBCommunity"}

func newMongoDB() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mongoDB)
	return u
}

func main() {
	log.SetLogger(zap.New()) // to stderr
	if len(os.Args) < 2 || os.Args[1] != "provider" {
		fmt.Fprintln(os.Stderr, "usage: mongodb-provider-go provider --kubeconfig FILE [--export mongodb] --downstream-kubeconfig FILE")
		os.Exit(2)
	}
	flags := pflag.NewFlagSet("provider", pflag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the provider workspace (root:mongodb)")
	export := flags.String("export", "mongodb", "the APIExport (and its APIExportEndpointSlice) to serve")
	downstreamKubeconfig := flags.String("downstream-kubeconfig", "", "kubeconfig of the cluster the MongoDB operator runs in")
	_ = flags.Parse(os.Args[2:])
	if *kubeconfig == "" || *downstreamKubeconfig == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig and --downstream-kubeconfig are required")
		os.Exit(2)
	}

	ctx := signals.SetupSignalHandler()
	if err := run(ctx, *kubeconfig, *export, *downstreamKubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, export, downstreamKubeconfig string) error {
	setupLog := log.Log.WithName("setup")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	downstreamCfg, err := clientcmd.BuildConfigFromFlags("", downstreamKubeconfig)
	if err != nil {
		return fmt.Errorf("--downstream-kubeconfig: %w", err)
	}
	// client-go's default client-side limit (5 requests a second, bursts of 10) would make
	// every consumer wait behind the others: one object takes several requests. A provider
	// serving many workspaces raises it, as here.
	for _, c := range []*rest.Config{cfg, downstreamCfg} {
		c.QPS, c.Burst = 500, 1000
	}

	// The provider talks to the export's virtual workspace, whose URL the endpoint slice has.
	vwCfg, err := virtualWorkspaceConfig(ctx, cfg, export)
	if err != nil {
		if ctx.Err() != nil {
			return nil // a signal while waiting
		}
		return err
	}
	setupLog.Info("using the virtual workspace", "url", vwCfg.Host)

	provider, err := apiexport.New(vwCfg, apiexport.Options{})
	if err != nil {
		return fmt.Errorf("the apiexport provider: %w", err)
	}
	mgr, err := mcmanager.New(vwCfg, provider, manager.Options{
		Metrics: metricsserver.Options{BindAddress: "0"}, // no metrics endpoint in the example
	})
	if err != nil {
		return fmt.Errorf("the manager: %w", err)
	}

	// The downstream cluster is an ordinary controller-runtime cluster, run by the manager.
	downstream, err := cluster.New(downstreamCfg)
	if err != nil {
		return fmt.Errorf("the downstream cluster: %w", err)
	}
	if err := mgr.GetLocalManager().Add(downstream); err != nil {
		return fmt.Errorf("the downstream cluster: %w", err)
	}

	r := &reconciler{mgr: mgr, downstream: downstream.GetClient()}
	err = mcbuilder.ControllerManagedBy(mgr).
		Named("mongodb-provider").
		// Consumer objects, in every engaged (bound) workspace.
		For(newMongoDB()).
		// Downstream objects: the operator's status changes wake the consumer object they
		// project, found through the downstream object's labels.
		WatchesRawSource(source.TypedKind(downstream.GetCache(), client.Object(newMongoDB()),
			handler.TypedEnqueueRequestsFromMapFunc(consumerOf))).
		Complete(r)
	if err != nil {
		return fmt.Errorf("the controller: %w", err)
	}

	go func() {
		if err := provider.Run(ctx, mgr); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "the apiexport provider stopped:", err)
			os.Exit(1)
		}
	}()
	return mgr.Start(ctx) // nil once a signal cancels ctx
}

// virtualWorkspaceConfig reads the APIExportEndpointSlice named after the export in the
// provider's workspace and returns cfg pointed at its first endpoint, waiting until the slice
// has one.
func virtualWorkspaceConfig(ctx context.Context, cfg *rest.Config, export string) (*rest.Config, error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, err
	}
	for {
		slice := &apisv1alpha1.APIExportEndpointSlice{}
		err := c.Get(ctx, types.NamespacedName{Name: export}, slice)
		switch {
		case err == nil && len(slice.Status.APIExportEndpoints) > 0:
			vw := rest.CopyConfig(cfg)
			vw.Host = slice.Status.APIExportEndpoints[0].URL
			return vw, nil
		case err == nil:
			log.Log.Info("waiting for the APIExportEndpointSlice to have an endpoint", "name", export)
		default:
			log.Log.Info("waiting for the APIExportEndpointSlice", "name", export, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// consumerOf maps a downstream object back to the consumer object it projects.
func consumerOf(_ context.Context, obj client.Object) []mcreconcile.Request {
	l := obj.GetLabels()
	if l[clusterLabel] == "" || l[namespaceLabel] == "" || l[nameLabel] == "" {
		return nil // not one of ours
	}
	return []mcreconcile.Request{{
		ClusterName: l[clusterLabel],
		Request:     ctrl.Request{NamespacedName: types.NamespacedName{Namespace: l[namespaceLabel], Name: l[nameLabel]}},
	}}
}

type reconciler struct {
	mgr        mcmanager.Manager
	downstream client.Client
}

func (r *reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	cl, err := r.mgr.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return ctrl.Result{}, err
	}
	consumer := cl.GetClient() // the consumer's workspace, through the virtual workspace

	db := newMongoDB()
	if err := consumer.Get(ctx, req.NamespacedName, db); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	// Where the consumer object lives downstream: a namespace per consumer workspace, and a
	// name that cannot collide (a namespace has no dots).
	downNamespace := "consumer-" + req.ClusterName
	downName := req.Namespace + "." + req.Name
	down := newMongoDB()
	down.SetNamespace(downNamespace)
	down.SetName(downName)

	// 1. Deleting: delete downstream, then the connection Secret, then let go.
	if db.GetDeletionTimestamp() != nil {
		if !controllerutil.ContainsFinalizer(db, finalizer) {
			return ctrl.Result{}, nil
		}
		if err := r.downstream.Delete(ctx, down); err == nil {
			// Not gone yet: the downstream watch wakes us when it is.
			logger.Info("deleting downstream", "object", downNamespace+"/"+downName)
			return ctrl.Result{}, nil
		} else if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		secret := connectionSecret(req.Namespace, req.Name)
		if err := consumer.Delete(ctx, secret); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		patch := client.MergeFromWithOptions(db.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(db, finalizer)
		return ctrl.Result{}, consumer.Patch(ctx, db, patch)
	}

	// 2. The finalizer first, so nothing downstream outlives the consumer object.
	if !controllerutil.ContainsFinalizer(db, finalizer) {
		patch := client.MergeFromWithOptions(db.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(db, finalizer)
		if err := consumer.Patch(ctx, db, patch); err != nil {
			return ctrl.Result{}, err
		}
	}

	// 3. Project the spec downstream.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: downNamespace}}
	if err := r.downstream.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrl.Result{}, err
	}
	op, err := controllerutil.CreateOrUpdate(ctx, r.downstream, down, func() error {
		labels := down.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[clusterLabel] = req.ClusterName
		labels[namespaceLabel] = req.Namespace
		labels[nameLabel] = req.Name
		down.SetLabels(labels)
		down.Object["spec"] = runtime.DeepCopyJSONValue(db.Object["spec"])
		return nil
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if op != controllerutil.OperationResultNone {
		logger.Info("projected downstream", "object", downNamespace+"/"+downName, "operation", op)
	}

	// 4. The operator's status back to the consumer, when it differs.
	phase, _, _ := unstructured.NestedString(down.Object, "status", "phase")
	status := map[string]any{}
	for _, field := range []string{"phase", "version", "message"} {
		if v, _, _ := unstructured.NestedString(down.Object, "status", field); v != "" {
			status[field] = v
		}
	}
	current, _, _ := unstructured.NestedMap(db.Object, "status")
	if !equality.Semantic.DeepEqual(current, status) { // nil and empty compare equal
		patch := client.MergeFrom(db.DeepCopy())
		db.Object["status"] = status
		if err := consumer.Status().Patch(ctx, db, patch); err != nil {
			return ctrl.Result{}, err
		}
		logger.Info("status", "phase", phase)
	}

	// 5. Once running, the connection Secret in the consumer's namespace, owned by the consumer
	// object, written through the same virtual workspace (the export's claim on Secrets).
	if phase != "Running" {
		return ctrl.Result{}, nil
	}
	secret := connectionSecret(req.Namespace, req.Name)
	connection := fmt.Sprintf("mongodb://%s-0.%s.%s.%s.svc:27017/?replicaSet=%s",
		req.Name, req.Namespace, req.Name, downNamespace, downName)
	op, err = controllerutil.CreateOrUpdate(ctx, consumer, secret, func() error {
		labels := secret.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[connectionLabel] = "true"
		secret.SetLabels(labels)
		// data rather than stringData, so that an unchanged Secret compares equal.
		secret.Object["type"] = string(corev1.SecretTypeOpaque)
		if err := unstructured.SetNestedField(secret.Object,
			base64.StdEncoding.EncodeToString([]byte(connection)), "data", "connectionString"); err != nil {
			return err
		}
		return controllerutil.SetControllerReference(db, secret, scheme.Scheme)
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if op != controllerutil.OperationResultNone {
		logger.Info("connection Secret", "name", secret.GetName(), "operation", op)
	}
	return ctrl.Result{}, nil
}

// connectionSecret is the consumer's connection Secret, unstructured so that reading it goes to
// the virtual workspace rather than starting a wildcard Secret informer.
func connectionSecret(namespace, name string) *unstructured.Unstructured {
	s := &unstructured.Unstructured{}
	s.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	s.SetNamespace(namespace)
	s.SetName(name + "-connection")
	return s
}
