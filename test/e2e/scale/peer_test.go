package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// envPeerSlices is the directory of the slices each plugin published in
// test/e2e/peer's BenchmarkPeer (PEER_SLICES_OUT there): a directory per
// slice shape.
const envPeerSlices = "PEER_SLICES_DIR"

// peerShape is one slice shape BenchmarkPeer keeps, and the device its
// pods ask each driver for, by a class of the same form for both drivers:
// the driver, the device's type and, for MIG, its profile (NVIDIA's own
// gpu.nvidia.com and mig.nvidia.com classes select so too).
type peerShape struct {
	dir      string
	selector string // CEL; %[1]q is the driver
}

var peerShapes = []peerShape{
	{dir: fleet.ShapeWholeGPU, selector: `device.driver == %[1]q && device.attributes[%[1]q].type == "gpu"`},
	{dir: fleet.ShapeDynamicMIG, selector: `device.driver == %[1]q && device.attributes[%[1]q].type == "mig" && device.attributes[%[1]q].profile == "1g.10gb"`},
}

// BenchmarkPeerShapes measures the real kube-scheduler placing one-device
// pods on kwok nodes that publish the slices NVIDIA's plugin and ours
// published for one simulated 8 x H100 in BenchmarkPeer (issue 37), both
// drivers on every node as in that run, at each node count of $SCALE_NODES
// (default 100): whole GPUs, and 1g MIG devices where both plugins offer
// every GPU as dynamic MIG. The runs of one shape differ in the slices
// only: how the devices are cut into slices, their attributes,
// capacities and counters. `make bench-peer` runs it after BenchmarkPeer;
// on its own:
//
//	PEER_SLICES_DIR=_output/peer/slices E2E_REQUIRED=1 go test ./test/e2e/scale -run '^$' -bench PeerShapes -benchtime 1x -v
func BenchmarkPeerShapes(b *testing.B) {
	dir := os.Getenv(envPeerSlices)
	if dir == "" {
		b.Skipf("%s is not set: no captured slices (make bench-peer keeps them)", envPeerSlices)
	}
	for _, n := range envInts(b, "SCALE_NODES", []int{100}) {
		for _, shape := range peerShapes {
			captures, err := fleet.ReadCaptures(filepath.Join(dir, shape.dir))
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("nodes=%d/%s", n, shape.dir), func(b *testing.B) {
				results := runPeerShape(b, n, shape, captures)
				b.Logf("%s, %d nodes x 8 GPUs, each publishing both drivers' slices, %d pods per driver:\n%s%s",
					shape.dir, n, podsFor(b, n), table(results), peerRatios(results))
			})
		}
	}
}

// runPeerShape starts a fleet per captured driver on the same n nodes,
// measures each driver's pods in turn, and deletes the nodes.
func runPeerShape(b *testing.B, n int, shape peerShape, captures []fleet.Capture) []result {
	client := scaleClient()
	var runners []*runner
	var ms []mode
	for _, c := range captures {
		f := startFleet(b, fleet.Options{Client: client, Nodes: n, Prefix: "peer-" + shape.dir, Driver: c.Driver, Replay: c.Slices})
		runners = append(runners, &runner{client: client, fleet: f, nodes: n, pods: podsFor(b, n), config: wholeConfig})
		class := peerClass(b, shape, c.Driver)
		// The mode's name names its namespace: no dots.
		ms = append(ms, mode{name: strings.ReplaceAll(c.Driver, ".", "-") + "-" + shape.dir, claims: []resourceapi.DeviceRequest{exactly(class)}})
	}
	var results []result
	for i, r := range runners {
		b.Run(ms[i].name, func(b *testing.B) {
			var res result
			for b.Loop() {
				res = r.run(b, ms[i])
			}
			report(b, res)
			results = append(results, res)
		})
	}
	ctx := framework.Context(b, 10*time.Minute)
	for _, r := range runners {
		if err := r.fleet.Delete(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return results
}

// peerClass creates (once) the class of the shape's pods of driver and
// returns its name.
func peerClass(tb testing.TB, shape peerShape, driver string) string {
	name := "peer-" + shape.dir + "." + driver
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(shape.selector, driver),
		}}}},
	}
	ctx := framework.Context(tb, time.Minute)
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, class, createOpts); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatalf("creating DeviceClass %s: %v", name, err)
	}
	return name
}

// peerRatios says each result's pods/s over the first's (ours: captures
// are read in driver name order, gpu.gpuaas.io first).
func peerRatios(results []result) string {
	var sb strings.Builder
	for _, r := range results[min(1, len(results)):] {
		if results[0].podsPerSec > 0 {
			fmt.Fprintf(&sb, "%s / %s: %.2fx pods/s\n", r.mode, results[0].mode, r.podsPerSec/results[0].podsPerSec)
		}
	}
	return sb.String()
}
