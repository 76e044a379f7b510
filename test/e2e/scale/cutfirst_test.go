package scale

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// cutFirstPrefix names the nodes of BenchmarkMIGCutFirst's fleet; its pods
// select them by the fleet label, so that nodes an earlier benchmark of the
// same run left behind take none of them.
const cutFirstPrefix = "cutfirst"

// BenchmarkMIGCutFirst asks whether the scheduler puts a 1g MIG claim on a
// node whose GPUs are already cut rather than on an empty one (issue 29
// item 3). Every node of a fleet of $SCALE_NODES (default 100) offers every
// GPU as dynamic MIG; half of them (the even ones) run a pod holding a 1g
// on GPU 0, allocated through the API. Then one 1g pod at a time (half as
// many pods as nodes) is created and bound, and each is classed by where it
// landed: on a node that had a cut GPU then, and on a GPU already cut.
// Packing would put every one of them on a cut GPU and cut no new one.
//
// Two cases: "cut-nodes-busier", where the cut nodes run the only pods
// (as GPU workloads make a node busier), and "equal-pods", where every
// other node runs one plain pod too. The pods have no CPU or memory
// requests, so in both the scheduler's scores tie (blindChance) and only a
// view of the GPUs could tell the nodes apart.
//
//	E2E_REQUIRED=1 go test ./test/e2e/scale -run '^$' -bench MIGCutFirst -benchtime 1x -v
func BenchmarkMIGCutFirst(b *testing.B) {
	for _, n := range envInts(b, "SCALE_NODES", []int{100}) {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := startCutFirst(b, n)
			for _, equal := range []bool{false, true} {
				name := "cut-nodes-busier"
				if equal {
					name = "equal-pods"
				}
				b.Run(name, func(b *testing.B) {
					var res cutFirstResult
					for b.Loop() {
						res = c.run(b, equal)
					}
					b.ReportMetric(float64(res.onCutNode), "on-cut-node")
					b.ReportMetric(res.ifBlind, "on-cut-node-if-blind")
					b.ReportMetric(float64(res.newGPUs), "gpus-newly-cut")
					b.Logf("%s: %d 1g pods one at a time on %d nodes (%d with GPU 0 cut at the start): %d landed on a node with a cut GPU (%.1f expected if blind to GPUs), %d on an already cut GPU; %d GPUs newly cut (0 if packed); %d nodes cut at the end",
						name, res.pods, n, n/2, res.onCutNode, res.ifBlind, res.onCutGPU, res.newGPUs, res.cutNodesAfter)
				})
			}
		})
	}
}

type cutFirst struct {
	client kubernetes.Interface
	fleet  *fleet.Fleet
	// first1g is GPU 0's 1g.10gb device at its highest placement, the one
	// first fit gives the first 1g claim of an empty node.
	first1g string
}

type cutFirstResult struct {
	pods, onCutNode, onCutGPU, newGPUs, cutNodesAfter int
	ifBlind                                           float64
}

func startCutFirst(tb testing.TB, n int) *cutFirst {
	ctx := framework.Context(tb, 10*time.Minute)
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 5000, 10000
	client := kubernetes.NewForConfigOrDie(&cfg)
	f, err := fleet.Start(tb.Context(), fleet.Options{Client: client, Nodes: n, Prefix: cutFirstPrefix, Config: decodeConfig(tb, dynamicConfig)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.Stop)
	if _, err := f.WaitPublished(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := waitNodesReady(ctx, client, f.Names()); err != nil {
		tb.Fatal(err)
	}
	c := &cutFirst{client: client, fleet: f}
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + f.Names()[0]})
	if err != nil {
		tb.Fatal(err)
	}
	// Within a GPU the plugin lists each profile's highest placement first
	// (pkg/mig Layout), so that is the device first fit takes.
	best := -1
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			start, err := strconv.Atoi(strings.TrimPrefix(d.Name, "gpu-0-mig-1g10gb-"))
			if err == nil && strings.HasPrefix(d.Name, "gpu-0-mig-1g10gb-") && start > best {
				best, c.first1g = start, d.Name
			}
		}
	}
	if c.first1g == "" {
		tb.Fatalf("node %s publishes no 1g.10gb device of GPU 0", f.Names()[0])
	}
	return c
}

// run places the pods of one case and classes them.
func (c *cutFirst) run(tb testing.TB, equal bool) cutFirstResult {
	ctx := framework.Context(tb, 15*time.Minute)
	ns := cp.CreateNamespace(tb, "scale-cutfirst")
	names := c.fleet.Names()
	// cut[node] are the GPUs of the node with a MIG device allocated.
	cut := map[string]map[int]bool{}
	for i, node := range names {
		switch {
		case i%2 == 0:
			if err := c.prefill1g(ctx, ns, node); err != nil {
				tb.Fatal(err)
			}
			cut[node] = map[int]bool{0: true}
		case equal:
			pod := podFor(ns, "plain-"+node, "", 0, 0)
			pod.Spec.NodeName = node
			if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, createOpts); err != nil {
				tb.Fatal(err)
			}
		}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-0", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{exactly("mig-1g.10gb.gpuaas.io")},
		}}},
	}
	if _, err := c.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, createOpts); err != nil {
		tb.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the scheduler's informers see the prefilled claims
	res := cutFirstResult{pods: len(names) / 2}
	for i := range res.pods {
		pod := podFor(ns, fmt.Sprintf("one-%d", i), "one", 0, 1)
		pod.Spec.NodeSelector = map[string]string{fleet.FleetLabel: cutFirstPrefix}
		if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, createOpts); err != nil {
			tb.Fatal(err)
		}
		node, gpu, err := c.waitPlaced(ctx, ns, pod.Name)
		if err != nil {
			tb.Fatal(err)
		}
		res.ifBlind += blindChance(names, cut)
		switch {
		case cut[node][gpu]:
			res.onCutNode++
			res.onCutGPU++
		case cut[node] != nil:
			res.onCutNode++
			res.newGPUs++
		default:
			res.newGPUs++
			cut[node] = map[int]bool{}
		}
		cut[node][gpu] = true
	}
	res.cutNodesAfter = len(cut)
	checkAllocations(tb, c.client, ns, false)
	if err := cp.DeleteNamespace(ctx, ns); err != nil {
		tb.Fatal(err)
	}
	waitNoClaims(tb, c.client, ns)
	return res
}

// blindChance is the chance that a scheduler blind to GPUs puts the next
// pod on a cut node: the share of cut nodes. Its CPU and memory scores tie
// here (pods without requests: BalancedAllocation skips them, and
// LeastAllocated's integer score of a 32-CPU node is the same for 0 to 3
// of them), and the scheduler picks among tied nodes at random.
func blindChance(names []string, cut map[string]map[int]bool) float64 {
	return float64(len(cut)) / float64(len(names))
}

// prefill1g gives the node a pod, bound by name, holding GPU 0's first 1g
// device through a claim allocated through the API, as the scheduler would
// have written it.
func (c *cutFirst) prefill1g(ctx context.Context, ns, node string) error {
	return createAllocatedPod(ctx, c.client, ns, "cut-"+node, node, exactly("mig-1g.10gb.gpuaas.io"), []string{c.first1g})
}

// waitPlaced waits until the pod is bound and returns its node and the GPU
// index of its claim's device.
func (c *cutFirst) waitPlaced(ctx context.Context, ns, name string) (string, int, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Spec.NodeName != "" && len(pod.Status.ResourceClaimStatuses) == 1, nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("pod %s not bound: %w", name, err)
	}
	claimName := pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	if claimName == nil {
		return "", 0, fmt.Errorf("pod %s has no claim", name)
	}
	claim, err := c.client.ResourceV1().ResourceClaims(ns).Get(ctx, *claimName, metav1.GetOptions{})
	if err != nil {
		return "", 0, err
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		return "", 0, fmt.Errorf("claim %s of bound pod %s not allocated one device", *claimName, name)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	if r.Pool != pod.Spec.NodeName {
		return "", 0, fmt.Errorf("pod %s on %s got device %s of pool %s", name, pod.Spec.NodeName, r.Device, r.Pool)
	}
	// Device names start gpu-<index>- (mig.DeviceName).
	idx, err := strconv.Atoi(strings.SplitN(r.Device, "-", 3)[1])
	if err != nil {
		return "", 0, fmt.Errorf("device %s: no GPU index in its name", r.Device)
	}
	return pod.Spec.NodeName, idx, nil
}
