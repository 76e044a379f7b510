package e2e

// The soak (issue 39, make soak): the real node under steady churn of
// pods of every kind for SOAK_DURATION, with faults now and then, a
// plugin restart and a controller leader change in the middle, sampled
// every minute for leaks.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	// soakDurationEnv sets how long the soak churns (a Go duration); the
	// soak runs only when it is set.
	soakDurationEnv = "SOAK_DURATION"
	// soakReportEnv names a file for the soak's report (markdown).
	soakReportEnv = "SOAK_REPORT"
	// soakCycle is the churn's pace: one pod of every kind created, run
	// and deleted per cycle, a cycle begun at most this often.
	soakCycle = 30 * time.Second
	// soakSampleEvery is how often the processes and objects are sampled.
	soakSampleEvery = time.Minute
	// soakWarmUp is the time after which (and after a process's second
	// sample) growth counts: caches, pools and the Go heap settle first.
	soakWarmUp = 5 * time.Minute
	// soakXIDEvery is how often a transient XID hits a free whole GPU.
	soakXIDEvery = 4 * time.Minute
)

// The growth a process may show after its warm-up sample. A leak of one
// goroutine, descriptor or a few hundred KiB per pod churned exceeds them
// within the soak's hundreds of pods.
const (
	soakRSSGrowth        = 1.5 // times the warm-up sample
	soakRSSSlack         = 16 << 20
	soakGoroutinesGrowth = 50
	soakFDsGrowth        = 20
	// soakEventsPerPod bounds the events per pod churned: the scheduler's
	// and the kubelet's few per pod, and ours; a loop that writes events
	// without end exceeds it.
	soakEventsPerPod = 20
)

// TestRealNodeSoak churns pods of every kind (whole GPU, dynamic MIG,
// time-slice replica, MPS memory share) on the real node for
// SOAK_DURATION, one pod of each kind kept running throughout. Now and
// then a transient XID hits a free whole GPU, and once a GPU falls off
// the bus and comes back; in the middle the plugin's pod is deleted and
// the controller's leader pod too. Every minute it samples the plugin's
// and the controller's RSS, goroutines and open descriptors, and the
// API objects. It passes when nothing leaks (no claim, record, CDI spec,
// MIG device or compute mode is left; the kept pods are untouched) and
// no process grows past its bound after the warm-up.
func TestRealNodeSoak(t *testing.T) {
	duration := soakDuration(t)
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	s := &soak{
		e: &nodeEvents{n: n, h: newHealthRun(t, n), views: map[string]podView{},
			recordsDir: filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "claims")},
		start: time.Now(),
		token: serviceAccountToken(t, framework.Context(t, time.Minute), scraperAccount, metricsReaderRole),
	}
	ctx := framework.Context(t, duration+20*time.Minute)
	s.e.keep(t, ctx, s.e.create(t, ctx, "kept", allKinds()))
	sampling, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Go(func() { s.sample(sampling) })

	s.churn(t, ctx, duration)

	stopSampling()
	sampler.Wait()
	s.e.checkUntouched(t, ctx, "after the soak")
	testNothingLeftOver(t, s.e)
	s.waitSettled(ctx)
	s.sampleOnce(ctx)
	s.report(t)
}

// waitSettled waits (a minute at most: what is left then is reported)
// until no claim is left and the MPS daemons have ended with their claims.
func (s *soak) waitSettled(ctx context.Context) {
	_ = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		objects := map[string]int{}
		err := countObjects(ctx, objects)
		return err == nil && objects["resourceclaims"] == 0 && objects["release pods"] <= 2, nil
	})
}

// soakDuration is SOAK_DURATION, or a skip: make soak sets it.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(soakDurationEnv)
	if v == "" {
		t.Skip(soakDurationEnv + " not set: make soak runs the soak")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < soakWarmUp {
		t.Fatalf("%s=%q: want a duration of at least %v", soakDurationEnv, v, soakWarmUp)
	}
	return d
}

// soak is one soak run: its node, what it did, and its samples.
type soak struct {
	e     *nodeEvents
	start time.Time
	token string // the controller's metrics reader

	cycles, pods int
	faults       []string // what was injected, when

	mu      sync.Mutex
	samples []soakSample
}

// soakSample is one minute's look at the processes and the API objects.
type soakSample struct {
	at        time.Duration
	processes map[string]processSample // by component/pod
	objects   map[string]int           // by kind
	err       string                   // what could not be read
}

// processSample is what a process's /metrics says of itself (the Go and
// process collectors of client_golang, which both binaries register).
type processSample struct {
	rss, goroutines, fds float64
	born                 time.Duration // the soak's time of the pod's first sample
}

// churn runs cycles until the duration is over, with the faults on
// their schedule between cycles.
func (s *soak) churn(t *testing.T, ctx context.Context, duration time.Duration) {
	rng := rand.New(rand.NewPCG(uint64(s.start.UnixNano()), 39)) //nolint:gosec // which GPU a fault hits
	nextXID := soakXIDEvery / 2
	faults := []struct {
		at  time.Duration
		run func(*testing.T, context.Context, *rand.Rand)
	}{
		{duration * 3 / 10, s.loseGPU},
		{duration / 2, s.restartPlugin},
		{duration * 6 / 10, s.changeLeader},
	}
	for s.elapsed() < duration {
		began := time.Now()
		if s.elapsed() >= nextXID {
			s.transientXID(t, ctx, rng)
			nextXID += soakXIDEvery
		}
		for len(faults) > 0 && s.elapsed() >= faults[0].at {
			faults[0].run(t, ctx, rng)
			faults = faults[1:]
		}
		s.cycle(t, ctx)
		if t.Failed() {
			t.Fatalf("cycle %d failed at %v", s.cycles, s.elapsed().Round(time.Second))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(soakCycle - time.Since(began)):
		}
	}
}

func (s *soak) elapsed() time.Duration { return time.Since(s.start) }

// cycle creates one pod of every kind, checks what each container saw,
// and deletes them, waiting until pods and claims are gone.
func (s *soak) cycle(t *testing.T, ctx context.Context) {
	t.Helper()
	s.cycles++
	names := s.e.create(t, ctx, fmt.Sprintf("c%d", s.cycles), allKinds())
	s.e.waitRunning(t, ctx, names, nil, "")
	s.e.deletePods(t, ctx, names)
	s.pods += len(names)
}

// freeWholeGPU is a whole GPU (0-3) that no kept pod holds.
func (s *soak) freeWholeGPU(t *testing.T, ctx context.Context, rng *rand.Rand) string {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, realNodeName)
	if err != nil {
		t.Fatal(err)
	}
	held := s.e.views["kept-whole-gpu"].uuids
	var free []string
	for _, d := range devices {
		if i, ok := intAttr(d, "index"); ok && i < 4 && stringAttr(d, "type") == "gpu" && !held.Has(stringAttr(d, "uuid")) {
			free = append(free, strconv.FormatInt(i, 10))
		}
	}
	if len(free) == 0 {
		t.Fatal("no whole GPU of 0-3 is published and free")
	}
	slices.Sort(free)
	return free[rng.IntN(len(free))]
}

// transientXID logs XID 62 on a free whole GPU and waits until its device
// is tainted; the taint clears after the node's quiet period, while the
// churn goes on.
func (s *soak) transientXID(t *testing.T, ctx context.Context, rng *rand.Rand) {
	t.Helper()
	gpu := s.freeWholeGPU(t, ctx, rng)
	if err := nvmock.InjectEvent(s.e.h.stateDir, gpu, nvml.EventTypeXidCriticalError, 62, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	dev := "gpu-" + gpu
	took := waitTaints(t, ctx, "gpu.gpuaas.io/xid", dev+" tainted by XID 62", func(got map[string]bool) bool { return got[dev] })
	s.fault(t, "XID 62 on GPU %s, tainted after %v", gpu, took.Round(time.Millisecond))
}

// loseGPU makes a free whole GPU fall off the bus (XID 79, GPU_IS_LOST),
// waits until its device is tainted, brings it back as a reset does, and
// waits until the taints are gone.
func (s *soak) loseGPU(t *testing.T, ctx context.Context, rng *rand.Rand) {
	t.Helper()
	gpu := s.freeWholeGPU(t, ctx, rng)
	dev := "gpu-" + gpu
	if err := nvmock.SetGPULost(s.e.h.stateDir, gpu, true); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, ctx, "gpu.gpuaas.io/gpu-lost", dev+" tainted as lost", func(got map[string]bool) bool { return got[dev] })
	if err := nvmock.SetGPULost(s.e.h.stateDir, gpu, false); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"gpu.gpuaas.io/gpu-lost", "gpu.gpuaas.io/xid"} {
		waitTaints(t, ctx, key, dev+" answering again", func(got map[string]bool) bool { return !got[dev] })
	}
	s.fault(t, "GPU %s lost (XID 79) and found again", gpu)
}

// restartPlugin deletes the plugin's pod; the DaemonSet starts another,
// and the next cycle's pods wait for it.
func (s *soak) restartPlugin(t *testing.T, ctx context.Context, _ *rand.Rand) {
	t.Helper()
	old := waitForPluginPod(t, ctx, "")
	if err := cp.Client.CoreV1().Pods(releaseNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitForPluginPod(t, ctx, old.UID)
	s.fault(t, "plugin pod %s deleted, %s ready", old.Name, pod.Name)
}

// changeLeader has a new process lead the chart's controller
// (replaceChartLeader).
func (s *soak) changeLeader(t *testing.T, ctx context.Context, _ *rand.Rand) {
	t.Helper()
	was, leader, lease := replaceChartLeader(t, ctx, time.Second)
	s.fault(t, "controller pod %s (Lease holder %s) deleted, %s leads", leader, was, *lease.Spec.HolderIdentity)
}

func (s *soak) fault(t *testing.T, format string, args ...any) {
	t.Helper()
	what := fmt.Sprintf("%v: ", s.elapsed().Round(time.Second)) + fmt.Sprintf(format, args...)
	s.faults = append(s.faults, what)
	t.Log(what)
}

// sample takes a sample every soakSampleEvery until ctx ends.
func (s *soak) sample(ctx context.Context) {
	s.sampleOnce(ctx)
	tick := time.NewTicker(soakSampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.sampleOnce(ctx)
		}
	}
}

// sampleOnce reads the components' /metrics and counts the API objects.
// What it cannot read (a pod restarting) is noted, not fatal.
func (s *soak) sampleOnce(ctx context.Context) {
	sm := soakSample{at: s.elapsed(), processes: map[string]processSample{}, objects: map[string]int{}}
	var errs []string
	for _, c := range []string{"kubelet-plugin", "controller"} {
		if err := s.sampleComponent(ctx, c, &sm); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := countObjects(ctx, sm.objects); err != nil {
		errs = append(errs, err.Error())
	}
	sm.err = strings.Join(errs, "; ")
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, p := range sm.processes {
		p.born = sm.at
		for _, prev := range s.samples {
			if was, ok := prev.processes[key]; ok {
				p.born = was.born
				break
			}
		}
		sm.processes[key] = p
	}
	s.samples = append(s.samples, sm)
}

// sampleComponent scrapes each ready pod of a chart component: the
// plugin's plain HTTP port, the controller's HTTPS one with the reader's
// token; both on the node's network.
func (s *soak) sampleComponent(ctx context.Context, component string, sm *soakSample) error {
	pods, err := cp.ComponentPods(ctx, releaseNamespace, component)
	if err != nil {
		return err
	}
	for i := range pods {
		p := &pods[i]
		if !podReady(p) || p.DeletionTimestamp != nil {
			continue
		}
		body, err := scrapeComponent(ctx, p, component, s.token)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", component, p.Name, err)
		}
		ps, err := parseProcessMetrics(body)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", component, p.Name, err)
		}
		sm.processes[component+"/"+p.Name] = ps
	}
	return nil
}

func scrapeComponent(ctx context.Context, p *v1.Pod, component, token string) (string, error) {
	port := metricsPortOf(p)
	if port == 0 {
		return "", fmt.Errorf("no metrics port (a port named metrics, or METRICS_ADDR)")
	}
	if component == "controller" {
		code, body, err := scrapeMetrics(ctx, port, token)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("HTTP %d", code)
		}
		return body, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return "", err
	}
	code, body, err := httpGet(&http.Client{Timeout: 10 * time.Second}, req)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d", code)
	}
	return body, err
}

// metricsPortOf is the port named metrics of a pod's container or, where
// the plugin declares none (on the host network a declared port is a host
// port), its METRICS_ADDR.
func metricsPortOf(p *v1.Pod) int {
	c := p.Spec.Containers[0]
	for _, port := range c.Ports {
		if port.Name == "metrics" {
			return int(port.ContainerPort)
		}
	}
	for _, e := range c.Env {
		if e.Name == "METRICS_ADDR" {
			port, _ := strconv.Atoi(strings.TrimPrefix(e.Value, ":"))
			return port
		}
	}
	return 0
}

// parseProcessMetrics reads the three self-describing series of the Go
// and process collectors.
func parseProcessMetrics(body string) (processSample, error) {
	var ps processSample
	want := map[string]*float64{"process_resident_memory_bytes": &ps.rss, "go_goroutines": &ps.goroutines, "process_open_fds": &ps.fds}
	found := 0
	for _, line := range strings.Split(body, "\n") {
		name, value, ok := strings.Cut(line, " ")
		if dst := want[name]; ok && dst != nil {
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return ps, fmt.Errorf("%s: %w", line, err)
			}
			*dst = v
			found++
		}
	}
	if found != len(want) {
		return ps, fmt.Errorf("found %d of the series %v", found, slices.Sorted(func(yield func(string) bool) {
			for k := range want {
				if !yield(k) {
					return
				}
			}
		}))
	}
	return ps, nil
}

// countObjects counts what a leak in the plugin or the controller would
// pile up in the API.
func countObjects(ctx context.Context, into map[string]int) error {
	c := cp.Client
	slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claims, err := c.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	events, err := c.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	configMaps, err := c.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := c.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	into["resourceslices"], into["resourceclaims"], into["events"] = len(slices.Items), len(claims.Items), len(events.Items)
	into["configmaps"], into["release pods"] = len(configMaps.Items), len(pods.Items)
	return nil
}
