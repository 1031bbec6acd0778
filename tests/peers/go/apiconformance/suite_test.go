// Package apiconformance runs Kubernetes' own conformance specs of API machinery and of
// authentication and authorization (the packages test/e2e/apimachinery and test/e2e/auth of
// the k8s.io/kubernetes release go.mod pins) against the API server of a kubeconfig.
//
// It is kube's e2e.test with its suite setup cut down to what an API server without nodes
// serves: e2e.test first waits for schedulable nodes and for kube-system's pods, and reads the
// `kubernetes` Service for the cluster's IP family, none of which a control plane without nodes
// (kcp, platform-mesh serve) has. The specs and the framework each spec runs in (a namespace of
// its own, its default ServiceAccount, the cleanup after it) are kube's, unchanged. The checks
// e2e.test adds after every spec that its nodes are still ready are left out for the same
// reason. Both sides, platform-mesh serve and the kube-apiserver control, run this same binary.
package apiconformance

import (
	"context"
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/auth"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// The suite's start: the server answers, and says which version it is (some specs depend on
// it). The cluster's IP family is IPv4: no Service says otherwise here.
var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	v, err := c.Discovery().ServerVersion()
	framework.ExpectNoError(err, "reading the server's version")
	framework.Logf("server version: %s", v.GitVersion)
	return nil
}, func(ctx context.Context, _ []byte) {
	framework.TestContext.IPFamily = "ipv4"
})

func TestConformance(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes API conformance", suiteConfig, reporterConfig)
}
