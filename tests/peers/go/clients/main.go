// Command go-clients uses an API server the way Go controllers do — client-go's typed and dynamic
// clients, its informers (resync, watch resume), server-side apply with apply configurations, and
// controller-runtime's client — and fails on the first answer a real kube-apiserver would not
// give. The test suite runs it against platform-mesh serve and against the pinned kube-apiserver.
//
// Usage: go-clients --kubeconfig FILE [--namespace NAME]
// Prints one "ok <check>" line per passed check; exits 1 after "FAIL <check>: <reason>".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

type env struct {
	ctx    context.Context
	config *rest.Config
	typed  kubernetes.Interface
	dyn    dynamic.Interface
	ns     string
}

type check struct {
	name string
	run  func(*env) error
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the server to use")
	namespace := flag.String("namespace", "go-clients", "namespace to create and work in")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig", err)
	}
	config.QPS, config.Burst = 200, 400
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := &env{
		ctx:    ctx,
		config: config,
		typed:  kubernetes.NewForConfigOrDie(config),
		dyn:    dynamic.NewForConfigOrDie(config),
		ns:     *namespace,
	}
	checks := []check{
		{"namespace", checkNamespace},
		{"typed-crud", checkTypedCRUD},
		{"typed-conflict", checkTypedConflict},
		{"typed-patches", checkTypedPatches},
		{"typed-list-pages", checkListPages},
		{"dynamic", checkDynamic},
		{"informer", checkInformer},
		{"watch-resume", checkWatchResume},
		{"apply", checkApply},
		{"controller-runtime", checkControllerRuntime},
		{"errors", checkErrors},
	}
	for _, c := range checks {
		if err := c.run(e); err != nil {
			fail(c.name, err)
		}
		fmt.Printf("ok %s\n", c.name)
	}
}

func fail(name string, err error) {
	fmt.Printf("FAIL %s: %v\n", name, err)
	os.Exit(1)
}

func cm(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
}

func checkNamespace(e *env) error {
	_, err := e.typed.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	got, err := e.typed.CoreV1().Namespaces().Get(e.ctx, e.ns, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got.Status.Phase != corev1.NamespaceActive {
		return fmt.Errorf("namespace phase %q, want Active", got.Status.Phase)
	}
	return nil
}

// Create, read, replace the object read (a read-modify-write), list by label, delete.
func checkTypedCRUD(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	in := cm("crud", map[string]string{"a": "1"})
	in.Labels = map[string]string{"app": "crud"}
	created, err := c.Create(e.ctx, in, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if created.UID == "" || created.ResourceVersion == "" || created.CreationTimestamp.IsZero() {
		return fmt.Errorf("create answered no uid/resourceVersion/creationTimestamp: %+v", created.ObjectMeta)
	}
	got, err := c.Get(e.ctx, "crud", metav1.GetOptions{})
	if err != nil {
		return err
	}
	got.Data["b"] = "2"
	updated, err := c.Update(e.ctx, got, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	if updated.ResourceVersion == got.ResourceVersion || updated.Data["b"] != "2" {
		return fmt.Errorf("update kept resourceVersion %s or lost data %v", updated.ResourceVersion, updated.Data)
	}
	if !updated.CreationTimestamp.Equal(&created.CreationTimestamp) {
		return fmt.Errorf("creationTimestamp changed on update: %v -> %v", created.CreationTimestamp, updated.CreationTimestamp)
	}
	if _, err := c.Create(e.ctx, cm("other", nil), metav1.CreateOptions{}); err != nil {
		return err
	}
	list, err := c.List(e.ctx, metav1.ListOptions{LabelSelector: "app=crud"})
	if err != nil {
		return err
	}
	if len(list.Items) != 1 || list.Items[0].Name != "crud" || list.ResourceVersion == "" {
		return fmt.Errorf("label selector app=crud listed %d items (rv %q)", len(list.Items), list.ResourceVersion)
	}
	if err := c.Delete(e.ctx, "crud", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if _, err := c.Get(e.ctx, "crud", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("get after delete: %v, want NotFound", err)
	}
	return nil
}

// An update with a stale resourceVersion is a Conflict that retry.RetryOnConflict resolves.
func checkTypedConflict(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	first, err := c.Create(e.ctx, cm("conflict", map[string]string{"n": "0"}), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	moved := first.DeepCopy()
	moved.Data["n"] = "1"
	if _, err := c.Update(e.ctx, moved, metav1.UpdateOptions{}); err != nil {
		return err
	}
	stale := first.DeepCopy()
	stale.Data["n"] = "2"
	if _, err := c.Update(e.ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		return fmt.Errorf("stale update: %v, want Conflict", err)
	}
	tries := 0
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		tries++
		cur := first.DeepCopy()
		if tries > 1 {
			if cur, err = c.Get(e.ctx, "conflict", metav1.GetOptions{}); err != nil {
				return err
			}
		}
		n, _ := strconv.Atoi(cur.Data["n"])
		cur.Data["n"] = strconv.Itoa(n + 10)
		_, err := c.Update(e.ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil || tries != 2 {
		return fmt.Errorf("RetryOnConflict: %v after %d tries, want success after 2", err, tries)
	}
	got, err := c.Get(e.ctx, "conflict", metav1.GetOptions{})
	if err != nil || got.Data["n"] != "11" {
		return fmt.Errorf("after retry: %v %v, want n=11", err, got)
	}
	return nil
}

// JSON merge, strategic merge and JSON patches, as client-go sends them.
func checkTypedPatches(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	if _, err := c.Create(e.ctx, cm("patches", map[string]string{"a": "1", "b": "2"}), metav1.CreateOptions{}); err != nil {
		return err
	}
	steps := []struct {
		pt   types.PatchType
		body string
		want map[string]string
	}{
		{types.MergePatchType, `{"data":{"b":null,"c":"3"}}`, map[string]string{"a": "1", "c": "3"}},
		{types.StrategicMergePatchType, `{"data":{"d":"4"},"metadata":{"labels":{"x":"y"}}}`, map[string]string{"a": "1", "c": "3", "d": "4"}},
		{types.JSONPatchType, `[{"op":"replace","path":"/data/a","value":"10"},{"op":"remove","path":"/data/c"}]`, map[string]string{"a": "10", "d": "4"}},
	}
	for _, s := range steps {
		got, err := c.Patch(e.ctx, "patches", s.pt, []byte(s.body), metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("%s: %w", s.pt, err)
		}
		if fmt.Sprint(got.Data) != fmt.Sprint(s.want) {
			return fmt.Errorf("%s: data %v, want %v", s.pt, got.Data, s.want)
		}
	}
	_, err := c.Patch(e.ctx, "patches", types.JSONPatchType, []byte(`[{"op":"test","path":"/data/a","value":"nope"}]`), metav1.PatchOptions{})
	if !isStatus(err, 422) {
		return fmt.Errorf("failed JSON patch test op: %v, want 422", err)
	}
	return nil
}

func isStatus(err error, code int32) bool {
	var s apierrors.APIStatus
	return errors.As(err, &s) && s.Status().Code == code
}

// Pages with limit/continue return every object once, in name order.
func checkListPages(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	for i := 0; i < 12; i++ {
		o := cm(fmt.Sprintf("page-%02d", i), nil)
		o.Labels = map[string]string{"paged": "yes"}
		if _, err := c.Create(e.ctx, o, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	var names []string
	opts := metav1.ListOptions{LabelSelector: "paged=yes", Limit: 5}
	pages := 0
	for {
		l, err := c.List(e.ctx, opts)
		if err != nil {
			return err
		}
		pages++
		for _, it := range l.Items {
			names = append(names, it.Name)
		}
		if l.Continue == "" {
			break
		}
		// With a selector the count of what remains is unknown, and kube-apiserver says none.
		if l.RemainingItemCount != nil {
			return fmt.Errorf("a page of a selected list has remainingItemCount %d", *l.RemainingItemCount)
		}
		opts.Continue = l.Continue
	}
	if len(names) != 12 || pages != 3 || !sort.StringsAreSorted(names) {
		return fmt.Errorf("pages %d, names %v; want 12 sorted names in 3 pages", pages, names)
	}
	return nil
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func checkDynamic(e *env) error {
	c := e.dyn.Resource(configMaps).Namespace(e.ns)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "dynamic"},
		"data":     map[string]any{"k": "v"},
	}}
	created, err := c.Create(e.ctx, u, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if created.GetKind() != "ConfigMap" || created.GetAPIVersion() != "v1" {
		return fmt.Errorf("created kind/apiVersion %q %q", created.GetKind(), created.GetAPIVersion())
	}
	if err := unstructured.SetNestedField(created.Object, "w", "data", "k"); err != nil {
		return err
	}
	if _, err := c.Update(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	list, err := c.List(e.ctx, metav1.ListOptions{FieldSelector: "metadata.name=dynamic"})
	if err != nil {
		return err
	}
	if len(list.Items) != 1 || list.GetKind() != "ConfigMapList" {
		return fmt.Errorf("field selector listed %d items of kind %q", len(list.Items), list.GetKind())
	}
	if v, _, _ := unstructured.NestedString(list.Items[0].Object, "data", "k"); v != "w" {
		return fmt.Errorf("data.k = %q after update", v)
	}
	return c.Delete(e.ctx, "dynamic", metav1.DeleteOptions{})
}

// A shared informer lists, watches, resyncs, and sees adds, updates and deletes.
func checkInformer(e *env) error {
	factory := informers.NewSharedInformerFactoryWithOptions(e.typed, 500*time.Millisecond, informers.WithNamespace(e.ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	var mu sync.Mutex
	events := map[string]int{}
	seen := func(kind, name string) {
		mu.Lock()
		defer mu.Unlock()
		events[kind+"/"+name]++
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { seen("add", o.(*corev1.ConfigMap).Name) },
		UpdateFunc: func(old, cur any) {
			a, b := old.(*corev1.ConfigMap), cur.(*corev1.ConfigMap)
			if a.ResourceVersion == b.ResourceVersion {
				seen("resync", b.Name)
			} else {
				seen("update", b.Name)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			seen("delete", o.(*corev1.ConfigMap).Name)
		},
	})
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return fmt.Errorf("informer never synced")
	}
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	if _, err := c.Create(e.ctx, cm("informed", map[string]string{"v": "1"}), metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := c.Patch(e.ctx, "informed", types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	if err := c.Delete(e.ctx, "informed", metav1.DeleteOptions{}); err != nil {
		return err
	}
	want := []string{"add/informed", "update/informed", "delete/informed", "add/other", "resync/other"}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		missing := []string{}
		for _, w := range want {
			if events[w] == 0 {
				missing = append(missing, w)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("informer never saw %v (saw %v)", missing, events)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, exists, _ := inf.GetStore().GetByKey(e.ns + "/informed"); exists {
		return fmt.Errorf("deleted object still in the informer's store")
	}
	return nil
}

// A watch started at a list's resourceVersion, stopped and started again at the last event's
// resourceVersion, misses nothing and repeats nothing; a resourceVersion too old is 410 Gone.
func checkWatchResume(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	list, err := c.List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sel := metav1.ListOptions{LabelSelector: "resume=yes", ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}
	w, err := c.Watch(e.ctx, sel)
	if err != nil {
		return err
	}
	mk := func(name string) error {
		o := cm(name, nil)
		o.Labels = map[string]string{"resume": "yes"}
		_, err := c.Create(e.ctx, o, metav1.CreateOptions{})
		return err
	}
	if err := mk("r1"); err != nil {
		return err
	}
	first, err := nextObject(w)
	if err != nil {
		return err
	}
	w.Stop()
	if err := mk("r2"); err != nil {
		return err
	}
	if err := mk("r3"); err != nil {
		return err
	}
	sel.ResourceVersion = first.ResourceVersion
	w2, err := c.Watch(e.ctx, sel)
	if err != nil {
		return err
	}
	defer w2.Stop()
	var got []string
	for len(got) < 2 {
		o, err := nextObject(w2)
		if err != nil {
			return err
		}
		got = append(got, o.Name)
	}
	if first.Name != "r1" || fmt.Sprint(got) != "[r2 r3]" {
		return fmt.Errorf("first watch saw %s, resumed watch saw %v; want r1 then [r2 r3]", first.Name, got)
	}
	return nil
}

func nextObject(w watch.Interface) (*corev1.ConfigMap, error) {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("watch closed")
			}
			switch ev.Type {
			case watch.Bookmark:
				continue
			case watch.Error:
				return nil, apierrors.FromObject(ev.Object)
			}
			return ev.Object.(*corev1.ConfigMap), nil
		case <-timeout:
			return nil, fmt.Errorf("no watch event in 10 s")
		}
	}
}

// Server-side apply with apply configurations: create, a second manager's conflict, force.
func checkApply(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	ac := corev1ac.ConfigMap("applied", e.ns).WithData(map[string]string{"owned": "by-a"})
	got, err := c.Apply(e.ctx, ac, metav1.ApplyOptions{FieldManager: "manager-a"})
	if err != nil {
		return err
	}
	if got.Data["owned"] != "by-a" || len(got.ManagedFields) != 1 || got.ManagedFields[0].Manager != "manager-a" || got.ManagedFields[0].Operation != metav1.ManagedFieldsOperationApply {
		return fmt.Errorf("apply answered %v with managedFields %+v", got.Data, got.ManagedFields)
	}
	other := corev1ac.ConfigMap("applied", e.ns).WithData(map[string]string{"owned": "by-b"})
	_, err = c.Apply(e.ctx, other, metav1.ApplyOptions{FieldManager: "manager-b"})
	if !apierrors.IsConflict(err) {
		return fmt.Errorf("apply of a field another manager owns: %v, want Conflict", err)
	}
	got, err = c.Apply(e.ctx, other, metav1.ApplyOptions{FieldManager: "manager-b", Force: true})
	if err != nil {
		return err
	}
	if got.Data["owned"] != "by-b" {
		return fmt.Errorf("forced apply answered %v", got.Data)
	}
	extracted, err := corev1ac.ExtractConfigMap(got, "manager-b")
	if err != nil {
		return err
	}
	if extracted.Data["owned"] != "by-b" {
		return fmt.Errorf("ExtractConfigMap for manager-b: %v", extracted.Data)
	}
	extractedA, err := corev1ac.ExtractConfigMap(got, "manager-a")
	if err != nil {
		return err
	}
	if len(extractedA.Data) != 0 {
		return fmt.Errorf("manager-a still owns %v after the forced apply", extractedA.Data)
	}
	return nil
}

// controller-runtime's client: typed and unstructured objects, MergeFrom patches, lists with
// options, and meta helpers on the answers.
func checkControllerRuntime(e *env) error {
	cl, err := ctrlclient.New(e.config, ctrlclient.Options{})
	if err != nil {
		return err
	}
	obj := cm("ctrl", map[string]string{"a": "1"})
	obj.Namespace = e.ns
	if err := cl.Create(e.ctx, obj); err != nil {
		return err
	}
	var got corev1.ConfigMap
	if err := cl.Get(e.ctx, ctrlclient.ObjectKey{Namespace: e.ns, Name: "ctrl"}, &got); err != nil {
		return err
	}
	before := got.DeepCopy()
	got.Data["b"] = "2"
	got.Labels = map[string]string{"ctrl": "yes"}
	if err := cl.Patch(e.ctx, &got, ctrlclient.MergeFrom(before)); err != nil {
		return err
	}
	got.Data["c"] = "3"
	if err := cl.Update(e.ctx, &got); err != nil {
		return err
	}
	var list corev1.ConfigMapList
	if err := cl.List(e.ctx, &list, ctrlclient.InNamespace(e.ns), ctrlclient.MatchingLabels{"ctrl": "yes"}); err != nil {
		return err
	}
	if len(list.Items) != 1 || len(list.Items[0].Data) != 3 {
		return fmt.Errorf("listed %d items (%v)", len(list.Items), list.Items)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	if err := cl.Get(e.ctx, ctrlclient.ObjectKey{Namespace: e.ns, Name: "ctrl"}, u); err != nil {
		return err
	}
	if acc, err := meta.Accessor(u); err != nil || acc.GetResourceVersion() != got.ResourceVersion {
		return fmt.Errorf("unstructured get: %v, resourceVersion %v want %s", err, acc, got.ResourceVersion)
	}
	if err := cl.Delete(e.ctx, &got); err != nil {
		return err
	}
	if err := cl.Get(e.ctx, ctrlclient.ObjectKeyFromObject(&got), &got); !apierrors.IsNotFound(err) {
		return fmt.Errorf("get after delete: %v", err)
	}
	return nil
}

// Errors reach Go code as the typed errors client-go's helpers recognise.
func checkErrors(e *env) error {
	c := e.typed.CoreV1().ConfigMaps(e.ns)
	if _, err := c.Create(e.ctx, cm("other", nil), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("duplicate create: %v, want AlreadyExists", err)
	}
	if _, err := c.Create(e.ctx, cm("Not_A_Name", nil), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		return fmt.Errorf("bad name: %v, want Invalid", err)
	}
	if _, err := e.typed.CoreV1().ConfigMaps("no-such-namespace").Create(e.ctx, cm("x", nil), metav1.CreateOptions{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("create in a missing namespace: %v, want NotFound", err)
	}
	return nil
}
