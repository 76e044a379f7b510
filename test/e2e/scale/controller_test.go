package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// otherDriver is the driver of the slices no replica of ours should cache:
// the reproduction used 500 of its slices, 32 devices each.
const otherDriver = "gpu.example.com"

// cachedSlicesMetric is the controller's count of the ResourceSlices its
// cache holds, by driver (pkg/controller/cachemetrics.go).
const cachedSlicesMetric = "gpuaas_controller_cached_resourceslices"

// chartMemoryLimit is the chart's controller memory limit (values.yaml,
// controller.resources.limits.memory), passed as the chart passes it.
const chartMemoryLimit = 512 << 20

// TestControllerCachesOnlyOurSlices (issue 52): the dra-controller binary,
// run with the chart's flags (one replica, leader election), on a control
// plane holding 500 ResourceSlices of another driver and the slices our
// plugin's code publishes for kwok nodes, caches our slices only: its own
// count of what its cache holds (read from its metrics endpoint) has every
// slice of ours and none of the other driver's. The process's RSS is read
// from /proc and logged (not asserted: it is a measurement).
func TestControllerCachesOnlyOurSlices(t *testing.T) {
	const nodes, others = 8, 500
	ctx := framework.Context(t, 10*time.Minute)
	f := startFleet(t, fleet.Options{Client: scaleClient(), Nodes: nodes, Prefix: "cache", Config: decodeConfig(t, wholeConfig)})
	createOtherSlices(t, ctx, "cache-other", others, 32)
	ctrl := startChartController(t, ctx, buildController(t, ctx))
	// Ours are the fleet's and any an earlier test of the package left.
	stored, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + configapi.DriverName})
	if err != nil {
		t.Fatal(err)
	}
	ours := float64(len(stored.Items))
	var counts map[string]float64
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if counts, err = ctrl.metrics(ctx, cachedSlicesMetric, "driver"); err != nil {
			return false, nil // not serving yet
		}
		return counts[configapi.DriverName] >= ours, nil
	})
	if err != nil {
		t.Fatalf("the controller's cache never held our %.0f slices (its count by driver: %v): %v", ours, counts, err)
	}
	if n := counts[otherDriver]; n != 0 {
		t.Errorf("the controller caches %.0f ResourceSlices of %s, which it never prices; want none", n, otherDriver)
	}
	if got := counts[configapi.DriverName]; got != ours {
		t.Errorf("the controller caches %.0f slices of ours, the API server stores %.0f", got, ours)
	}
	rss, peak := ctrl.rss(t)
	t.Logf("dra-controller with %d nodes of ours (%d slices) and %d slices of %s: cached by driver %v; RSS %.1f MB, peak %.1f MB",
		nodes, f.Slices(), others, otherDriver, counts, rss, peak)
}

// controller is a dra-controller process and its metrics endpoint.
type controller struct {
	proc      *framework.Process
	pprofAddr string // "" unless FLEET_PPROF_DIR asks for heap profiles
	// metricsURL is the controller's plain-HTTP /metrics.
	metricsURL string
	metrics    func(ctx context.Context, name, label string) (map[string]float64, error)
}

// buildController builds cmd/dra-controller of this tree, or returns
// $DRA_CONTROLLER_BIN, a binary built beforehand (of this tree or, to see
// a test fail before a fix, of another).
func buildController(tb testing.TB, ctx context.Context) string {
	if bin := os.Getenv("DRA_CONTROLLER_BIN"); bin != "" {
		return bin
	}
	bin, err := framework.Build(ctx, tb.TempDir(), "cmd/dra-controller")
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// startChartController runs bin as the chart runs the controller (its
// flags with the chart's default values, leader election, the memory limit
// passed as GPUAAS_MEMORY_LIMIT), but for what a process outside a pod
// needs: addresses on 127.0.0.1, the Lease and ledger in "default", and
// metrics over plain HTTP so the test can read them.
func startChartController(tb testing.TB, ctx context.Context, bin string) *controller {
	ports, err := framework.FreePorts(2)
	if err != nil {
		tb.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	// The process inherits the test's environment (framework.Process).
	tb.Setenv("GPUAAS_MEMORY_LIMIT", strconv.Itoa(chartMemoryLimit))
	pprofAddr := ""
	if os.Getenv("FLEET_PPROF_DIR") != "" {
		// --pprof-addr defaults to $PPROF_ADDR: set, not a flag, so a
		// baseline build without the flag still starts.
		pprofAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
		tb.Setenv("PPROF_ADDR", pprofAddr)
	}
	p, err := cp.StartController(ctx, bin,
		"--leader-elect", "--leader-elect-id=gpuaas-dra-controller", "--leader-elect-namespace=default",
		"--quota-ledger-namespace=default", "--metrics-addr="+addr, "--metrics-secure=false",
		"--quota-backstop=true", "--reclaim-unallocated-after=10m", "--idle-policy=true", "--billing-currency=USD", "--billing-retention-months=13")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Stop() })
	url := "http://" + addr + "/metrics"
	return &controller{proc: p, pprofAddr: pprofAddr, metricsURL: url, metrics: func(ctx context.Context, name, label string) (map[string]float64, error) {
		return scrape(ctx, url, name, label)
	}}
}

// heapProfile writes the process's heap profile, after a GC, to
// $FLEET_PPROF_DIR/<name>.heap and logs its top in-use entries, flat and
// cumulative; it does nothing unless FLEET_PPROF_DIR is set.
func (c *controller) heapProfile(tb testing.TB, ctx context.Context, name string) {
	dir := os.Getenv("FLEET_PPROF_DIR")
	if dir == "" || c.pprofAddr == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("making %s: %v", dir, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.pprofAddr+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Errorf("fetching the controller's heap profile: %v", err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Errorf("fetching the controller's heap profile: %s, %v", resp.Status, err)
		return
	}
	path := filepath.Join(dir, name+".heap")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		tb.Fatalf("writing %s: %v", path, err)
	}
	for _, order := range [][]string{nil, {"-cum"}} {
		args := append([]string{"tool", "pprof", "-top", "-nodecount=25", "-inuse_space"}, order...)
		out, err := exec.CommandContext(ctx, "go", append(args, path)...).CombinedOutput()
		tb.Logf("go %s: %v\n%s", strings.Join(append(args, path), " "), err, out)
	}
}

// rss is the process's resident memory now and at its peak (VmRSS,
// VmHWM), in MB.
func (c *controller) rss(tb testing.TB) (now, peak float64) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.proc.Pid()), "status"))
	if err != nil {
		tb.Fatalf("reading the controller's memory: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			now = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return now, peak
}

// scrape reads the samples of one metric from a Prometheus text endpoint,
// by the value of one label ("" for a metric without labels).
func scrape(ctx context.Context, url, name, label string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		key := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			key = labelValue(rest[1:end], label)
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // another metric whose name starts with this one
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		out[key] += v
	}
	return out, sc.Err()
}

// labelValue is the value of label in a sample's labels (a="x",b="y").
func labelValue(labels, label string) string {
	for kv := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == label {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// createOtherSlices creates n ResourceSlices of another driver, devices
// GPUs each, as such a driver publishes them: one pool per node, each
// device with a product name, a UUID and its memory.
func createOtherSlices(tb testing.TB, ctx context.Context, prefix string, n, devices int) []string {
	client := scaleClient()
	names := make([]string, n)
	err := parallelDo(n, func(i int) error {
		s := otherSlice(prefix, i, devices)
		names[i] = s.Name
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, s, createOpts)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		tb.Fatalf("creating %d slices of %s: %v", n, otherDriver, err)
	}
	tb.Cleanup(func() { //nolint:contextcheck // the test helpers clean up after the test, past its context
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_ = parallelDo(len(names), func(i int) error {
			return client.ResourceV1().ResourceSlices().Delete(ctx, names[i], metav1.DeleteOptions{})
		})
	})
	return names
}

func otherSlice(prefix string, i, devices int) *resourceapi.ResourceSlice {
	node := fmt.Sprintf("%s-node-%d", prefix, i)
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + strings.ReplaceAll(otherDriver, ".", "-")},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   otherDriver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		},
	}
	for d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", d),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"productName": {StringValue: ptr.To("Example Accelerator 80GB")},
				"uuid":        {StringValue: ptr.To(fmt.Sprintf("GPU-%08x-%04x-%04x", i, d, i^d))},
				"index":       {IntValue: ptr.To(int64(d))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi")},
			},
		})
	}
	return s
}

// parallelDo runs do(0..n-1), 32 at a time, and returns an error of one.
func parallelDo(n int, do func(i int) error) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- do(i)
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
