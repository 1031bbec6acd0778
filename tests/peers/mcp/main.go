// Command mcp-widgets is a Go controller written as Platform Mesh's providers write theirs
// (multicluster-runtime with kcp's multicluster-provider): it engages every workspace bound to
// an APIExport through the export's virtual workspace (--server) and marks each Widget there
// with status.observedBy, through the same virtual workspace. The tests run it against
// platform-mesh serve.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	"github.com/kcp-dev/multicluster-provider/apiexport"
)

func init() {
	runtime.Must(apisv1alpha1.AddToScheme(scheme.Scheme))
}

var widget = schema.GroupVersionKind{Group: "example.platform-mesh.io", Version: "v1", Kind: "Widget"}

func main() {
	log.SetLogger(zap.New(zap.UseDevMode(true)))
	ctx := signals.SetupSignalHandler()
	var server string
	pflag.StringVar(&server, "server", "", "the APIExport's virtual-workspace URL")
	pflag.Parse()
	cfg := rest.CopyConfig(ctrl.GetConfigOrDie())
	if server != "" {
		cfg.Host = server
	}
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg *rest.Config) error {
	provider, err := apiexport.New(cfg, apiexport.Options{})
	if err != nil {
		return fmt.Errorf("the apiexport provider: %w", err)
	}
	mgr, err := mcmanager.New(cfg, provider, manager.Options{})
	if err != nil {
		return fmt.Errorf("the manager: %w", err)
	}
	watched := &unstructured.Unstructured{}
	watched.SetGroupVersionKind(widget)
	err = mcbuilder.ControllerManagedBy(mgr).
		Named("widgets").
		For(watched).
		Complete(mcreconcile.Func(func(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
			cl, err := mgr.GetCluster(ctx, req.ClusterName)
			if err != nil {
				return ctrl.Result{}, fmt.Errorf("cluster %s: %w", req.ClusterName, err)
			}
			w := &unstructured.Unstructured{}
			w.SetGroupVersionKind(widget)
			if err := cl.GetClient().Get(ctx, req.NamespacedName, w); err != nil {
				if apierrors.IsNotFound(err) {
					return ctrl.Result{}, nil
				}
				return ctrl.Result{}, err
			}
			if observed, _, _ := unstructured.NestedString(w.Object, "status", "observedBy"); observed != "" {
				return ctrl.Result{}, nil
			}
			patch := client.MergeFrom(w.DeepCopy())
			if err := unstructured.SetNestedField(w.Object, "multicluster-runtime/"+req.ClusterName, "status", "observedBy"); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, cl.GetClient().Status().Patch(ctx, w, patch)
		}))
	if err != nil {
		return fmt.Errorf("the controller: %w", err)
	}
	go func() {
		if err := provider.Run(ctx, mgr); err != nil {
			fmt.Fprintln(os.Stderr, "the provider stopped:", err)
			os.Exit(1)
		}
	}()
	return mgr.Start(ctx)
}
