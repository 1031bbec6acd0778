//go:build tools

// Package peers pins the Go programs the test suite builds and runs beside platform-mesh:
// the real kube-apiserver and etcd of one Kubernetes release.
package peers

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "sigs.k8s.io/controller-runtime/pkg/client"
)
