package scale

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// bindRecorder notes when each pod of a namespace whose name starts with
// its prefix is first seen bound,
// through one watch (listing thousands of pods in a loop would load the
// apiserver under measurement).
type bindRecorder struct {
	prefix string
	mu     sync.Mutex
	bound  map[string]time.Time
	last   time.Time
}

func watchBinds(tb testing.TB, client kubernetes.Interface, ns, prefix string) *bindRecorder {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	r := &bindRecorder{prefix: prefix + "-", bound: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.see,
		UpdateFunc: func(_, obj any) { r.see(obj) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("pod informer did not sync")
	}
	return r
}

func (r *bindRecorder) see(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" || !strings.HasPrefix(pod.Name, r.prefix) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.bound[pod.Name]; !seen {
		r.bound[pod.Name] = now
		r.last = now
	}
}

func (r *bindRecorder) count() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bound), r.last
}

// waitAll waits until n pods are bound and returns when the last was. Pods
// that stay unbound fail the test with the scheduler's reason for one.
func (r *bindRecorder) waitAll(tb testing.TB, n int) time.Time {
	tb.Helper()
	// Generous: 2 pods/s would be an order of magnitude below any figure.
	ctx := framework.Context(tb, 2*time.Minute+time.Duration(n)*500*time.Millisecond)
	var last time.Time
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		var got int
		got, last = r.count()
		return got >= n, nil
	})
	if err != nil {
		got, _ := r.count()
		tb.Fatalf("%d of %d pods bound: %v", got, n, err)
	}
	return last
}

// latencies are the median and 99th percentile of creation-to-bind.
func (r *bindRecorder) latencies(created map[string]time.Time) (p50, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d []time.Duration
	for name, sent := range created {
		if bound, ok := r.bound[name]; ok {
			d = append(d, bound.Sub(sent))
		}
	}
	slices.Sort(d)
	return percentile(d, 0.50), percentile(d, 0.99)
}

// checkAllocations checks what the scheduler decided, so a fast run that
// allocated wrongly cannot pass: every claim is allocated, on the node of
// its pod's pool, and no device is given twice unless the mode shares it.
func checkAllocations(tb testing.TB, client kubernetes.Interface, ns string, shared bool) {
	tb.Helper()
	ctx := framework.Context(tb, time.Minute)
	claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	taken := map[string]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			tb.Errorf("claim %s is not allocated", c.Name)
			continue
		}
		for _, d := range c.Status.Allocation.Devices.Results {
			id := d.Pool + "/" + d.Device
			if other, dup := taken[id]; dup && !shared {
				tb.Errorf("device %s allocated to both %s and %s", id, other, c.Name)
			}
			taken[id] = c.Name
			if !nodeSelectorNames(c.Status.Allocation.NodeSelector, d.Pool) {
				tb.Errorf("claim %s: device of pool %s, but allocated for another node", c.Name, d.Pool)
			}
		}
	}
}

// nodeSelectorNames: a node-local allocation's selector names its node,
// whose pool has the node's name.
func nodeSelectorNames(sel *corev1.NodeSelector, node string) bool {
	if sel == nil {
		return false
	}
	for _, term := range sel.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			for _, v := range f.Values {
				if f.Key == "metadata.name" && v == node {
					return true
				}
			}
		}
	}
	return false
}

// waitNoClaims waits until the claims of the deleted pods are gone, so the
// next mode finds every device free.
func waitNoClaims(tb testing.TB, client kubernetes.Interface, ns string) {
	tb.Helper()
	ctx := framework.Context(tb, 5*time.Minute)
	var left int
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return false, err
		}
		left = len(list.Items)
		return left == 0, nil
	})
	if err != nil {
		tb.Fatal(fmt.Errorf("claims of namespace %s not gone: %w", ns, err))
	}
}
