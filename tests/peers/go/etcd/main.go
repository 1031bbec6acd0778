// Command etcd is the etcd server the pinned kube-apiserver expects (the etcd release
// k8s.io/kubernetes v1.34 is built and tested with), built from its module rather than
// downloaded.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
