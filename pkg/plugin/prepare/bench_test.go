package prepare

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// BenchmarkPrepareUnprepare measures one whole-GPU claim's prepare followed
// by its unprepare, on the mock H100 machine, with real files (CDI spec and
// checkpoint record, both fsynced) in a temporary directory.
func BenchmarkPrepareUnprepare(b *testing.B) {
	e := newTestEnv(b, "dgxh100")
	benchPrepareUnprepare(b, e, "gpu-0")
}

// BenchmarkPrepareUnprepareWithDriver is BenchmarkPrepareUnprepare on a
// node with a driver installed: each claim's spec carries the driver's
// files and NVIDIA's hooks (nvidia-cdi-hook), as on a GPU node.
func BenchmarkPrepareUnprepareWithDriver(b *testing.B) {
	e := newTestEnv(b, "dgxh100")
	e.DriverRoot = cditest.NewDriverRoot(b, e.Lib.System().DriverVersion).Root
	e.CDIHook = "/var/lib/kubelet/plugins/gpu.gpuaas.io/bin/nvidia-cdi-hook"
	e.state = e.newState(b)
	benchPrepareUnprepare(b, e, "gpu-0")
}

// benchPrepareUnprepare runs prepare+unprepare of one claim on device and
// reports the p99 latency next to the mean (ns/op).
func benchPrepareUnprepare(b *testing.B, e *testEnv, device string) {
	benchClaims(b, e, func(uid string) *resourceapi.ResourceClaim {
		return preparetest.NewClaim(uid).Device("gpu", device).Build()
	})
}

// benchClaims prepares and unprepares one claim per iteration.
func benchClaims(b *testing.B, e *testEnv, claim func(uid string) *resourceapi.ResourceClaim) {
	var lat []time.Duration
	var prepSyncs, unprepSyncs int64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		uid := fmt.Sprintf("claim-%d", i)
		before := atomicfile.Syncs()
		if _, err := e.state.Prepare(e.Ctx, claim(uid)); err != nil {
			b.Fatal(err)
		}
		middle := atomicfile.Syncs()
		if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		prepSyncs += middle - before
		unprepSyncs += atomicfile.Syncs() - middle
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	// The durable writes are what a prepare costs on a real disk.
	b.ReportMetric(float64(prepSyncs)/float64(len(lat)), "fsyncs/prepare")
	b.ReportMetric(float64(unprepSyncs)/float64(len(lat)), "fsyncs/unprepare")
}

// BenchmarkPrepareWithPrepared measures one prepare (and its unprepare, to
// keep the device free) with N other claims already prepared. Admin access
// lets every background claim sit on the same 8 GPUs, as many shared claims
// would. The cost must not grow with N.
func BenchmarkPrepareWithPrepared(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("prepared=%d", n), func(b *testing.B) {
			e := newTestEnv(b, "dgxh100")
			for i := range n {
				claim := preparetest.NewClaim(fmt.Sprintf("bg-%d", i)).AdminDevice("gpu", fmt.Sprintf("gpu-%d", i%8)).Build()
				if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
					b.Fatal(err)
				}
			}
			// Let the filesystem finish writing the setup back first: the
			// claims were prepared earlier, not during the measurement.
			syscall.Sync()
			benchPrepareUnprepare(b, e, "gpu-7")
		})
	}
}

// BenchmarkPrepareUnprepareDynamicMIG measures one claim on a dynamic MIG
// device: MIG mode check, GPU + compute instance creation and destruction
// on the mock NVML, CDI spec and checkpoint records (four fsynced writes:
// PrepareStarted, the intent, the created instance, PrepareCompleted).
func BenchmarkPrepareUnprepareDynamicMIG(b *testing.B) {
	e := newTestEnvWith(b, "dgxh100", preparetest.DynamicAll())
	var name string
	for _, d := range e.Devices {
		if d.Partition() != nil && d.Partition().Profile.Name == "1g.10gb" {
			name = d.Name()
			break
		}
	}
	benchPrepareUnprepare(b, e, name)
}

// BenchmarkPublishDynamicMIGNode measures what the plugin does to publish an
// 8 x H100 node in dynamic MIG mode: reading MIG profiles from NVML, building
// every device and counter set, and cutting them into slices.
func BenchmarkPublishDynamicMIGNode(b *testing.B) {
	e := newTestEnv(b, "dgxh100")
	logger := klog.Background()
	b.ResetTimer()
	for b.Loop() {
		inv := inventory.Discover(logger, e.Lib, preparetest.DynamicAll())
		// 1 of counter sets, 1 per GPU, 1 of the GPUs' deferred lower 3g
		// placements (mig.Layout.Deferred).
		if n := len(inventory.Resources(testNode, inv).Pools[testNode].Slices); n != 10 {
			b.Fatalf("%d slices", n)
		}
	}
}
