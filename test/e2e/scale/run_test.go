package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// result is one mode's figures.
type result struct {
	mode string
	pods int
	// podsPerSec is pods over the time from the first creation to the last
	// bind; p50 and p99 are of each pod's creation-to-bind time.
	podsPerSec float64
	p50, p99   time.Duration
	// slices is what the fleet publishes in this mode, converged in
	// publish after the nodes' configuration changed (0: unchanged).
	slices  int
	publish time.Duration
}

// runner runs modes on one fleet of nodes.
type runner struct {
	client kubernetes.Interface
	fleet  *fleet.Fleet
	nodes  int
	pods   int
	// config is the nodes' configuration now.
	config string
}

// startRunner starts a fleet of n nodes (whole GPUs) and waits until kwok
// has them Ready and their slices are published.
func startRunner(tb testing.TB, n, pods int) *runner {
	client := scaleClient()
	f := startFleet(tb, fleet.Options{Client: client, Nodes: n, Prefix: "scale", Config: decodeConfig(tb, wholeConfig)})
	return &runner{client: client, fleet: f, nodes: n, pods: pods, config: wholeConfig}
}

// scaleClient is an API client that the benchmark's own rate never
// throttles.
func scaleClient() kubernetes.Interface {
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 5000, 10000
	return kubernetes.NewForConfigOrDie(&cfg)
}

// startFleet starts a fleet and waits until kwok has its nodes Ready and
// their slices are published.
func startFleet(tb testing.TB, opts fleet.Options) *fleet.Fleet {
	// The publishers live as long as the benchmark: a deadline here once
	// stopped them mid-run, and a later mode measured stale slices.
	live := tb.Context()
	// SCALE_READY_MINUTES: how long kwok may take to get the fleet Ready
	// (default 10), for a machine that can hold a larger fleet: on 2 cores
	// 5,000 nodes never are (kwok's heartbeats fall behind; at most 3,285
	// were Ready, then fewer).
	ctx := framework.Context(tb, time.Duration(envInt(tb, "SCALE_READY_MINUTES", 10))*time.Minute)
	start := time.Now()
	f, err := fleet.Start(live, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.Stop)
	if _, err := f.WaitPublished(ctx); err != nil {
		tb.Fatal(err)
	}
	took := time.Since(start)
	if err := waitNodesReady(ctx, opts.Client, f.Names()); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%d nodes created and their %d slices published in %.1fs", opts.Nodes, f.Slices(), took.Seconds())
	return f
}

func decodeConfig(tb testing.TB, body string) *configapi.NodeConfig {
	tb.Helper()
	cfg, err := configapi.DecodeNodeConfig([]byte("apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\n" + body))
	if err != nil {
		tb.Fatalf("node configuration %q: %v", body, err)
	}
	return cfg
}

// configure republishes every node's slices for a configuration, as plugins
// restarted with a new --node-config would, and returns how long the
// cluster took to converge. It waits for the scheduler's informer to catch
// up too (no API says when; 2 s is ample at 500 nodes on this machine).
func (r *runner) configure(tb testing.TB, config string) time.Duration {
	if config == r.config {
		return 0
	}
	ctx := framework.Context(tb, 10*time.Minute)
	r.fleet.Reconfigure(ctx, decodeConfig(tb, config))
	took, err := r.fleet.WaitPublished(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	r.config = config
	time.Sleep(2 * time.Second)
	return took
}

// run measures one mode: its pods are created by 8 workers (as fast as the
// apiserver takes them), and each pod's bind is seen through a watch.
func (r *runner) run(tb testing.TB, m mode) result {
	publish := r.configure(tb, m.config)
	ctx := framework.Context(tb, 30*time.Minute)
	ns := cp.CreateNamespace(tb, "scale-"+m.name)
	if m.prefillGPUs > 0 {
		r.prefillWholeGPUs(tb, ns, m.prefillGPUs)
	}
	templates := m.templates()
	r.createTemplates(tb, ns, "claim", templates)
	rec := watchBinds(tb, r.client, ns, "claim")
	profiled := profileScheduler(tb, fmt.Sprintf("nodes=%d-%s", r.nodes, m.name))
	pods := max(1, r.pods/m.podsDivisor())
	start := time.Now()
	created := r.createPods(tb, ns, "claim", pods, len(templates))
	last := rec.waitAll(tb, pods)
	profiled()
	res := result{mode: m.name, pods: pods, podsPerSec: float64(pods) / last.Sub(start).Seconds(),
		slices: r.fleet.Slices(), publish: publish}
	res.p50, res.p99 = rec.latencies(created)
	if len(templates) > 0 {
		checkAllocations(tb, r.client, ns, m.name == "memory-share")
	}
	if err := cp.DeleteNamespace(ctx, ns); err != nil {
		tb.Fatal(err)
	}
	waitNoClaims(tb, r.client, ns)
	return res
}

// createTemplates makes one ResourceClaimTemplate per spec, named
// prefix-0, prefix-1, ...
func (r *runner) createTemplates(tb testing.TB, ns, prefix string, specs []resourceapi.ResourceClaimSpec) {
	ctx := framework.Context(tb, time.Minute)
	for i, spec := range specs {
		tmpl := &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: ns},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
		}
		if _, err := r.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, createOpts); err != nil {
			tb.Fatalf("creating ResourceClaimTemplate: %v", err)
		}
	}
}

// createPods creates n pods named prefix-<i>, 8 at a time, pod i with a
// claim from template prefix-<i % templates> (none when templates is 0),
// and returns when each creation was sent, by pod name.
func (r *runner) createPods(tb testing.TB, ns, prefix string, n, templates int) map[string]time.Time {
	ctx := framework.Context(tb, 10*time.Minute)
	sent := make([]time.Time, n)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			sent[i] = time.Now()
			pod := podFor(ns, fmt.Sprintf("%s-%d", prefix, i), prefix, i, templates)
			if _, err := r.client.CoreV1().Pods(ns).Create(ctx, pod, createOpts); err != nil {
				return fmt.Errorf("creating pod %s: %w", pod.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]time.Time, n)
	for i, t := range sent {
		out[fmt.Sprintf("%s-%d", prefix, i)] = t
	}
	return out
}

func podFor(ns, name, prefix string, i, templates int) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "ctr", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if templates == 0 {
		return pod
	}
	tmpl := fmt.Sprintf("%s-%d", prefix, i%templates)
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
	return pod
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func waitNodesReady(ctx context.Context, client kubernetes.Interface, names []string) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var ready int
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: fleet.FleetLabel})
		if err != nil {
			return false, err
		}
		ready = 0
		for _, n := range list.Items {
			if want[n.Name] && nodeReady(&n) {
				ready++
			}
		}
		return ready == len(want), nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d nodes Ready (is kwok running?): %w", ready, len(want), err)
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// restart restarts every node's publisher, as a rolling restart of the
// plugin DaemonSet would, and returns how long starting them all took and
// how many slice writes they made in the 5 s after: unchanged slices must
// not be written again.
func (r *runner) restart(tb testing.TB) (time.Duration, int64) {
	start := time.Now()
	if err := r.fleet.Restart(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(5 * time.Second)
	return took, r.fleet.Writes()
}

// profileScheduler, when $SCALE_PROFILE_DIR is set, takes a 20 s CPU
// profile of the scheduler from now into <dir>/<name>.pprof; the function
// it returns waits for it.
func profileScheduler(tb testing.TB, name string) func() {
	dir := os.Getenv("SCALE_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		prof, err := cp.SchedulerProfile(ctx, 20*time.Second)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pprof"), prof, 0o600)
		}
		if err != nil {
			tb.Errorf("profiling the scheduler: %v", err)
		}
	}()
	return func() { <-done }
}
