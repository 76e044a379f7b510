package posture_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
)

// The fixtures are what the plugin itself publishes for a mock DGX H100
// (pkg/plugin Discover + Resources), so the posture is computed from the
// real attribute names, counters and device names.

const node = "node-a"

// everyMode offers GPU 0 as dynamic MIG (a whole-GPU device and 25
// partitions over 8 memory slices), GPU 1 as 4 time-slice replicas, GPU 2
// shared, GPUs 3-7 whole.
func everyMode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}

func openMachine(t *testing.T) nvdev.Interface {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: node})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// publish is the node's pool as the plugin's slice controller writes it.
func publish(t *testing.T, lib nvdev.Interface, cfg *configapi.NodeConfig) []resourceapi.ResourceSlice {
	t.Helper()
	return publishInventory(inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg))
}

// publishInventory is the node's pool of inv as the plugin's slice
// controller writes it.
func publishInventory(inv inventory.Inventory) []resourceapi.ResourceSlice {
	pool := inventory.Resources(node, inv).Pools[node]
	out := make([]resourceapi.ResourceSlice, 0, len(pool.Slices))
	for i, s := range pool.Slices {
		out = append(out, resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-gpu.gpuaas.io-%d", node, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   posture.DriverName,
				NodeName: ptr.To(node),
				Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				Devices:  s.Devices, SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

func everyModeSlices(t *testing.T) []resourceapi.ResourceSlice {
	return publish(t, openMachine(t), everyMode())
}

// taint adds a taint to the devices pick selects, as the plugin's health
// monitor does.
func taint(slices []resourceapi.ResourceSlice, pick func(*resourceapi.Device) bool, t resourceapi.DeviceTaint) {
	for i := range slices {
		for j := range slices[i].Spec.Devices {
			if d := &slices[i].Spec.Devices[j]; pick(d) {
				d.Taints = append(d.Taints, t)
			}
		}
	}
}

func ofGPU(index int64) func(*resourceapi.Device) bool {
	return func(d *resourceapi.Device) bool {
		a := d.Attributes["index"]
		return a.IntValue != nil && *a.IntValue == index
	}
}

func named(name string) func(*resourceapi.Device) bool {
	return func(d *resourceapi.Device) bool { return d.Name == name }
}

func fault(kind, value string, effect resourceapi.DeviceTaintEffect) resourceapi.DeviceTaint {
	f := health.Fault{Kind: kind, Value: value, Effect: effect}
	return f.Taint()
}

var seq int

// claim allocates devices of node's pool to team-a/<name>.
func claim(name string, devices ...string) resourceapi.ResourceClaim {
	seq++
	c := resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(fmt.Sprintf("uid-%d", seq))},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: posture.DriverName, Pool: node, Device: d})
	}
	return c
}

// share is a claim on a share of the shared GPU 2; memory "" records no
// consumed capacity.
func share(name, memory string) resourceapi.ResourceClaim {
	c := claim(name, "gpu-2-shared")
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID("share-" + name))
	if memory != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}
	}
	return c
}

func rule(name string, sel *resourceapi.DeviceTaintSelector, effect resourceapi.DeviceTaintEffect) resourceapi.DeviceTaintRule {
	return resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: sel,
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Value: "kernel", Effect: effect},
		},
	}
}

func gpuOf(t *testing.T, np posture.NodePosture, index int) posture.GPU {
	t.Helper()
	for _, g := range np.GPUs {
		if g.Index == index {
			return g
		}
	}
	t.Fatalf("no GPU %d in %+v", index, np.GPUs)
	return posture.GPU{}
}

// gpu0Devices is how many devices dynamic-MIG GPU 0 is published as.
const gpu0Devices = 26

func TestGPUPosture(t *testing.T) {
	for name, tc := range map[string]struct {
		claims []resourceapi.ResourceClaim
		rules  []resourceapi.DeviceTaintRule
		taint  func([]resourceapi.ResourceSlice)
		gpu    int
		want   gpuaas.Posture
		reason string
	}{
		// Nothing allocated, per mode.
		"whole free":       {gpu: 3, want: gpuaas.PostureAvailable, reason: "whole GPU free"},
		"replicas free":    {gpu: 1, want: gpuaas.PostureAvailable, reason: "4 replicas free"},
		"dynamic MIG free": {gpu: 0, want: gpuaas.PostureAvailable, reason: "nothing allocated: 8 of 8 memory slices free"},
		"shared free":      {gpu: 2, want: gpuaas.PostureAvailable, reason: "80Gi of 80Gi memory free"},

		// Whole GPUs.
		"whole allocated": {
			claims: []resourceapi.ResourceClaim{claim("train", "gpu-3")},
			gpu:    3, want: gpuaas.PostureAllocatedWhole, reason: "whole GPU gpu-3 allocated to team-a/train",
		},
		"dynamic MIG GPU allocated whole": {
			claims: []resourceapi.ResourceClaim{claim("big", "gpu-0")},
			gpu:    0, want: gpuaas.PostureAllocatedWhole, reason: "whole GPU gpu-0 allocated to team-a/big",
		},

		// Time-slicing.
		"3 of 4 replicas": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-1-ts-0", "gpu-1-ts-1"), claim("b", "gpu-1-ts-3")},
			gpu:    1, want: gpuaas.PosturePartiallyAllocated, reason: "3 of 4 replicas allocated",
		},
		"4 of 4 replicas": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-1-ts-0", "gpu-1-ts-1"), claim("b", "gpu-1-ts-2", "gpu-1-ts-3")},
			gpu:    1, want: gpuaas.PostureFullyAllocated, reason: "4 of 4 replicas allocated",
		},

		// Dynamic MIG: full when no partition left fits the counters.
		"one 1g partition": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-1g10gb-6")},
			gpu:    0, want: gpuaas.PosturePartiallyAllocated, reason: "1g.10gb@6 allocated: 7 of 8 memory slices free",
		},
		"3g and 2g partitions leave room for a 1g": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-3g40gb-0"), claim("b", "gpu-0-mig-2g20gb-4")},
			gpu:    0, want: gpuaas.PosturePartiallyAllocated, reason: "2g.20gb@4, 3g.40gb@0 allocated: 2 of 8 memory slices free",
		},
		"partitions covering the GPU": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-3g40gb-4"), claim("b", "gpu-0-mig-2g20gb-0", "gpu-0-mig-1g10gb-2"), claim("c", "gpu-0-mig-1g10gb-3")},
			gpu:    0, want: gpuaas.PostureFullyAllocated, reason: "1g.10gb@2, 1g.10gb@3, 2g.20gb@0, 3g.40gb@4 allocated: 0 of 8 memory slices free",
		},
		"two 3g partitions take all GPU memory": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-3g40gb-0"), claim("b", "gpu-0-mig-3g40gb-4")},
			gpu:    0, want: gpuaas.PostureFullyAllocated, reason: "3g.40gb@0, 3g.40gb@4 allocated: 0 of 8 memory slices free",
		},
		"7g partition": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-7g80gb-0")},
			gpu:    0, want: gpuaas.PostureFullyAllocated, reason: "7g.80gb@0 allocated: 0 of 8 memory slices free",
		},
		// No partition starts at memory slice 7 but 1g.20gb@6, which
		// slice 6 blocks: the last slice is free and useless.
		"a memory slice free but no partition fits in it": {
			claims: []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-3g40gb-0"), claim("b", "gpu-0-mig-2g20gb-4"), claim("c", "gpu-0-mig-1g10gb-6")},
			gpu:    0, want: gpuaas.PostureFullyAllocated,
			reason: "1g.10gb@6, 2g.20gb@4, 3g.40gb@0 allocated: 1 of 8 memory slices free, but no partition fits in them",
		},

		// Shared GPU: full when the memory left is below the smallest share.
		"two shares": {
			claims: []resourceapi.ResourceClaim{share("a", "10Gi"), share("b", "30Gi")},
			gpu:    2, want: gpuaas.PosturePartiallyAllocated, reason: "2 shares allocated: 40Gi of 80Gi memory free",
		},
		"share without recorded capacity takes the default": {
			claims: []resourceapi.ResourceClaim{share("a", "")},
			gpu:    2, want: gpuaas.PosturePartiallyAllocated, reason: "1 share allocated: 79Gi of 80Gi memory free",
		},
		"shares taking all memory": {
			claims: []resourceapi.ResourceClaim{share("a", "40Gi"), share("b", "40Gi")},
			gpu:    2, want: gpuaas.PostureFullyAllocated, reason: "2 shares allocated: 0 of 80Gi memory free, less than the smallest share",
		},

		// What does not count as allocated.
		"admin access": {
			claims: []resourceapi.ResourceClaim{func() resourceapi.ResourceClaim {
				c := claim("monitor", "gpu-4")
				c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
				return c
			}()},
			gpu: 4, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"another node's pool": {
			claims: []resourceapi.ResourceClaim{func() resourceapi.ResourceClaim {
				c := claim("elsewhere", "gpu-4")
				c.Status.Allocation.Devices.Results[0].Pool = "node-b"
				return c
			}()},
			gpu: 4, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"another driver": {
			claims: []resourceapi.ResourceClaim{func() resourceapi.ResourceClaim {
				c := claim("nic", "gpu-4")
				c.Status.Allocation.Devices.Results[0].Driver = "nic.example.com"
				return c
			}()},
			gpu: 4, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"unallocated claim": {
			claims: []resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pending"}}},
			gpu:    4, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},

		// Plugin health taints.
		"XID on the GPU": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, ofGPU(0), fault(health.KindXID, "79", resourceapi.DeviceTaintEffectNoSchedule))
			},
			gpu: 0, want: gpuaas.PostureUnhealthy, reason: fmt.Sprintf("gpu.gpuaas.io/xid=79:NoSchedule on all %d devices", gpu0Devices),
		},
		"XID on one MIG partition": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-0-mig-1g10gb-6"), fault(health.KindXID, "48", resourceapi.DeviceTaintEffectNoSchedule))
			},
			gpu: 0, want: gpuaas.PostureUnhealthy,
			reason: fmt.Sprintf("gpu.gpuaas.io/xid=48:NoSchedule on gpu-0-mig-1g10gb-6 (1 of %d devices)", gpu0Devices),
		},
		"ECC on an allocated whole GPU": {
			claims: []resourceapi.ResourceClaim{claim("train", "gpu-5")},
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-5"), fault(health.KindECC, "double-bit", resourceapi.DeviceTaintEffectNoExecute))
			},
			gpu: 5, want: gpuaas.PostureUnhealthy, reason: "gpu.gpuaas.io/ecc=double-bit:NoExecute on gpu-5; 1 device still allocated",
		},
		"cleanup blocked": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-0-mig-3g40gb-4"), fault(health.KindCleanupBlocked, "mig-destroy", resourceapi.DeviceTaintEffectNoSchedule))
			},
			gpu: 0, want: gpuaas.PostureCleanupBlocked,
			reason: fmt.Sprintf("gpu.gpuaas.io/cleanup-blocked=mig-destroy:NoSchedule on gpu-0-mig-3g40gb-4 (1 of %d devices)", gpu0Devices),
		},
		"lost GPU beats cleanup blocked": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-0-mig-3g40gb-4"), fault(health.KindCleanupBlocked, "mig-destroy", resourceapi.DeviceTaintEffectNoSchedule))
				taint(s, ofGPU(0), fault(health.KindGPULost, "not-answering", resourceapi.DeviceTaintEffectNoExecute))
			},
			gpu: 0, want: gpuaas.PostureUnhealthy, reason: fmt.Sprintf("gpu.gpuaas.io/gpu-lost=not-answering:NoExecute on all %d devices", gpu0Devices),
		},
		"unmonitored is informational": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-3"), fault(health.KindUnmonitored, "no-xid-events", resourceapi.DeviceTaintEffectNone))
			},
			gpu: 3, want: gpuaas.PostureAvailable, reason: "whole GPU free; informational: gpu.gpuaas.io/unmonitored=no-xid-events:None on gpu-3",
		},

		// Admins' drains.
		"rule on one device": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{
				Driver: ptr.To(posture.DriverName), Pool: ptr.To(node), Device: ptr.To("gpu-5")}, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu: 5, want: gpuaas.PostureDraining, reason: "DeviceTaintRule maint (example.com/maintenance=kernel:NoSchedule) on gpu-5",
		},
		"rule on the pool": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Pool: ptr.To(node)}, resourceapi.DeviceTaintEffectNoExecute)},
			gpu:   1, want: gpuaas.PostureDraining, reason: "DeviceTaintRule maint (example.com/maintenance=kernel:NoExecute) on all 4 devices",
		},
		"rule on the whole-GPU device of a MIG GPU": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-0")}, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu:   0, want: gpuaas.PostureDraining,
			reason: fmt.Sprintf("DeviceTaintRule maint (example.com/maintenance=kernel:NoSchedule) on gpu-0 (1 of %d devices)", gpu0Devices),
		},
		"draining an allocated GPU": {
			claims: []resourceapi.ResourceClaim{claim("train", "gpu-3")},
			rules:  []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-3")}, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu:    3, want: gpuaas.PostureDraining,
			reason: "DeviceTaintRule maint (example.com/maintenance=kernel:NoSchedule) on gpu-3; 1 device still allocated",
		},
		"rule on another pool": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Pool: ptr.To("node-b")}, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu:   5, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"rule of another driver": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")}, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu:   5, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"rule without a selector selects nothing": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", nil, resourceapi.DeviceTaintEffectNoSchedule)},
			gpu:   5, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"rule with effect None": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{}, resourceapi.DeviceTaintEffectNone)},
			gpu:   5, want: gpuaas.PostureAvailable, reason: "whole GPU free",
		},
		"foreign taint on the slice": {
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-6"), resourceapi.DeviceTaint{Key: "example.com/maintenance", Value: "kernel", Effect: resourceapi.DeviceTaintEffectNoSchedule})
			},
			gpu: 6, want: gpuaas.PostureDraining, reason: "taint example.com/maintenance=kernel:NoSchedule on gpu-6",
		},
		"fault beats drain": {
			rules: []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{}, resourceapi.DeviceTaintEffectNoSchedule)},
			taint: func(s []resourceapi.ResourceSlice) {
				taint(s, named("gpu-7"), fault(health.KindXID, "79", resourceapi.DeviceTaintEffectNoSchedule))
			},
			gpu: 7, want: gpuaas.PostureUnhealthy, reason: "gpu.gpuaas.io/xid=79:NoSchedule on gpu-7",
		},
	} {
		t.Run(name, func(t *testing.T) {
			slices := everyModeSlices(t)
			if tc.taint != nil {
				tc.taint(slices)
			}
			g := gpuOf(t, posture.Compute(node, slices, tc.claims, tc.rules), tc.gpu)
			if g.Posture != tc.want || g.Reason != tc.reason {
				t.Errorf("GPU %d: %s %q\nwant   %s %q", tc.gpu, g.Posture, g.Reason, tc.want, tc.reason)
			}
		})
	}
}

func TestGPUIdentity(t *testing.T) {
	lib := openMachine(t)
	np := posture.Compute(node, publish(t, lib, everyMode()), []resourceapi.ResourceClaim{
		claim("a", "gpu-1-ts-2"), claim("b", "gpu-1-ts-0"), claim("a", "gpu-3"),
	}, nil)
	modes := []gpuaas.GpuMode{gpuaas.GpuModeMigDynamic, gpuaas.GpuModeTimeSliced, gpuaas.GpuModeShared, gpuaas.GpuModeWhole}
	devices := []int{gpu0Devices, 4, 1, 1}
	if len(np.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(np.GPUs))
	}
	for i, g := range np.GPUs {
		want := lib.GPUs()[i]
		if g.Index != i || g.UUID != want.UUID || g.ProductName != want.ProductName {
			t.Errorf("GPU %d = index %d uuid %q product %q, want %q %q", i, g.Index, g.UUID, g.ProductName, want.UUID, want.ProductName)
		}
		if wantMode, wantDevices := modes[min(i, 3)], devices[min(i, 3)]; g.Mode != wantMode || len(g.Devices) != wantDevices {
			t.Errorf("GPU %d: mode %s with %d devices, want %s with %d", i, g.Mode, len(g.Devices), wantMode, wantDevices)
		}
	}
	ts := np.GPUs[1]
	if got := strings.Join(ts.Allocated, ","); got != "gpu-1-ts-0,gpu-1-ts-2" {
		t.Errorf("GPU 1 allocated devices = %s", got)
	}
	if got := strings.Join(ts.Claims, ","); got != "team-a/a,team-a/b" {
		t.Errorf("GPU 1 claims = %s", got)
	}
}

func TestStaticMIG(t *testing.T) {
	lib := openMachine(t)
	dev, err := lib.DeviceByUUID(lib.GPUs()[6].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	profiles, err := mig.Profiles(dev)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := mig.ProfileByName(profiles, "3g.40gb")
	var names []string
	for _, pl := range p.Placements {
		inst, err := mig.Create(dev, p, pl)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, mig.StaticDeviceName(6, p, inst))
	}
	lib.GPUs()[6].MigEnabled = true // as after the admin's mode change
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{6}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}}}}
	slices := publish(t, lib, cfg)

	for _, tc := range []struct {
		claims []resourceapi.ResourceClaim
		want   gpuaas.Posture
		reason string
	}{
		{nil, gpuaas.PostureAvailable, "2 MIG devices free"},
		{[]resourceapi.ResourceClaim{claim("a", names[0])}, gpuaas.PosturePartiallyAllocated,
			fmt.Sprintf("3g.40gb (%s) allocated: 1 of 2 MIG devices free", names[0])},
		{[]resourceapi.ResourceClaim{claim("a", names[0]), claim("b", names[1])}, gpuaas.PostureFullyAllocated,
			fmt.Sprintf("3g.40gb (%s), 3g.40gb (%s) allocated: 0 of 2 MIG devices free", names[0], names[1])},
	} {
		g := gpuOf(t, posture.Compute(node, slices, tc.claims, nil), 6)
		if g.Mode != gpuaas.GpuModeMigStatic || g.Posture != tc.want || g.Reason != tc.reason {
			t.Errorf("GPU 6: %s %s %q\nwant   %s %s %q", g.Mode, g.Posture, g.Reason, gpuaas.GpuModeMigStatic, tc.want, tc.reason)
		}
		if g.UUID != lib.GPUs()[6].UUID {
			t.Errorf("GPU 6 uuid %q is not the GPU's %q (a MIG device's own?)", g.UUID, lib.GPUs()[6].UUID)
		}
	}
}

func TestWithheldMemorySlices(t *testing.T) {
	slices := everyModeSlices(t)
	for i := range slices {
		for j := range slices[i].Spec.SharedCounters {
			// What the plugin publishes while a MIG instance no claim
			// holds still sits on slice 6.
			slices[i].Spec.SharedCounters[j].Counters[mig.MemorySliceCounter(6)] = resourceapi.Counter{Value: resource.MustParse("0")}
		}
	}
	g := gpuOf(t, posture.Compute(node, slices, nil, nil), 0)
	if want := "nothing allocated: 7 of 8 memory slices free (1 withheld by the plugin)"; g.Posture != gpuaas.PostureAvailable || g.Reason != want {
		t.Errorf("GPU 0: %s %q, want Available %q", g.Posture, g.Reason, want)
	}
	g = gpuOf(t, posture.Compute(node, slices, []resourceapi.ResourceClaim{claim("a", "gpu-0-mig-3g40gb-0"), claim("b", "gpu-0-mig-1g10gb-4")}, nil), 0)
	if want := "1g.10gb@4, 3g.40gb@0 allocated: 2 of 8 memory slices free (1 withheld by the plugin)"; g.Posture != gpuaas.PosturePartiallyAllocated || g.Reason != want {
		t.Errorf("GPU 0: %s %q, want PartiallyAllocated %q", g.Posture, g.Reason, want)
	}
}

func wholeOnly(t *testing.T) []resourceapi.ResourceSlice {
	return publish(t, openMachine(t), &configapi.NodeConfig{})
}

// lease is a claim whose request (or firstAvailable subrequest "req/sub")
// with allocationMode All holds the whole-GPU devices gpu-0..gpu-(n-1).
func lease(name, request string, n int) resourceapi.ResourceClaim {
	var devices []string
	for i := range n {
		devices = append(devices, fmt.Sprintf("gpu-%d", i))
	}
	c := claim(name, devices...)
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].Request = request
	}
	req, sub, isSub := strings.Cut(request, "/")
	all := resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io", AllocationMode: resourceapi.DeviceAllocationModeAll}
	if isSub {
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: req, FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: sub, DeviceClassName: all.DeviceClassName, AllocationMode: all.AllocationMode},
		}}}
	} else {
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: req, Exactly: &all}}
	}
	return c
}

func allWhole(except ...int) []resourceapi.ResourceClaim {
	var out []resourceapi.ResourceClaim
	for i := range 8 {
		if !containsInt(except, i) {
			out = append(out, claim(fmt.Sprintf("c%d", i), fmt.Sprintf("gpu-%d", i)))
		}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestNodePosture(t *testing.T) {
	xidOn := func(index int64) func([]resourceapi.ResourceSlice) {
		return func(s []resourceapi.ResourceSlice) {
			taint(s, ofGPU(index), fault(health.KindXID, "79", resourceapi.DeviceTaintEffectNoSchedule))
		}
	}
	drainAll := []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Pool: ptr.To(node)}, resourceapi.DeviceTaintEffectNoExecute)}
	for name, tc := range map[string]struct {
		slices func(*testing.T) []resourceapi.ResourceSlice
		claims []resourceapi.ResourceClaim
		rules  []resourceapi.DeviceTaintRule
		taint  func([]resourceapi.ResourceSlice)
		want   gpuaas.Posture
		reason string
	}{
		"all free": {
			slices: everyModeSlices, want: gpuaas.PostureAvailable, reason: "8 GPUs: 8 Available",
		},
		"something allocated": {
			slices: everyModeSlices, claims: []resourceapi.ResourceClaim{claim("a", "gpu-1-ts-0"), claim("b", "gpu-4")},
			want: gpuaas.PosturePartiallyAllocated, reason: "8 GPUs: 6 Available, 1 PartiallyAllocated, 1 AllocatedWhole",
		},
		"one GPU unhealthy": {
			slices: everyModeSlices, taint: xidOn(0),
			want:   gpuaas.PostureDegraded,
			reason: fmt.Sprintf("8 GPUs: 7 Available, 1 Unhealthy; GPU 0 Unhealthy: gpu.gpuaas.io/xid=79:NoSchedule on all %d devices", gpu0Devices),
		},
		"every GPU draining": {
			slices: everyModeSlices, rules: drainAll, want: gpuaas.PostureDraining,
			reason: "8 GPUs: 8 Draining; " +
				fmt.Sprintf("GPU 0 Draining: DeviceTaintRule maint (example.com/maintenance=kernel:NoExecute) on all %d devices; ", gpu0Devices) +
				"GPU 1 Draining: DeviceTaintRule maint (example.com/maintenance=kernel:NoExecute) on all 4 devices; " +
				"GPU 2 Draining: DeviceTaintRule maint (example.com/maintenance=kernel:NoExecute) on gpu-2-shared; and 5 more",
		},
		"draining with one GPU unhealthy": {
			slices: wholeOnly, rules: drainAll, taint: xidOn(7), want: gpuaas.PostureUnhealthy,
		},
		"every GPU allocated whole": {
			slices: wholeOnly, claims: allWhole(), want: gpuaas.PostureAllocatedWhole, reason: "8 GPUs: 8 AllocatedWhole",
		},
		"leased whole by one claim with allocationMode All": {
			slices: wholeOnly, claims: []resourceapi.ResourceClaim{lease("lease", "gpu", 8)},
			want: gpuaas.PostureExclusivelyAllocated, reason: "8 GPUs leased to team-a/lease (allocationMode All); 8 GPUs: 8 AllocatedWhole",
		},
		"leased whole through a firstAvailable subrequest": {
			slices: wholeOnly, claims: []resourceapi.ResourceClaim{lease("lease", "gpu/node", 8)},
			want: gpuaas.PostureExclusivelyAllocated, reason: "8 GPUs leased to team-a/lease (allocationMode All); 8 GPUs: 8 AllocatedWhole",
		},
		"every GPU held by one claim counting them": {
			slices: wholeOnly, claims: []resourceapi.ResourceClaim{claim("eight", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7")},
			want: gpuaas.PostureAllocatedWhole, reason: "8 GPUs: 8 AllocatedWhole",
		},
		"a lease of part of the node": {
			slices: wholeOnly, claims: append(allWhole(0, 1, 2, 3, 4, 5), lease("lease", "gpu", 6)),
			want: gpuaas.PostureAllocatedWhole, reason: "8 GPUs: 8 AllocatedWhole",
		},
		"leased whole with one GPU unhealthy": {
			slices: wholeOnly, claims: []resourceapi.ResourceClaim{lease("lease", "gpu", 8)}, taint: xidOn(7),
			want:   gpuaas.PostureFullyAllocated,
			reason: "8 GPUs: 7 AllocatedWhole, 1 Unhealthy; GPU 7 Unhealthy: gpu.gpuaas.io/xid=79:NoSchedule on gpu-7; 1 device still allocated",
		},
		"no room left": {
			slices: everyModeSlices, claims: append(allWhole(0, 1, 2),
				claim("m", "gpu-0-mig-7g80gb-0"), claim("ts", "gpu-1-ts-0", "gpu-1-ts-1", "gpu-1-ts-2", "gpu-1-ts-3"), share("s", "80Gi")),
			want: gpuaas.PostureFullyAllocated, reason: "8 GPUs: 3 FullyAllocated, 5 AllocatedWhole",
		},
		"full but for an unhealthy GPU": {
			slices: wholeOnly, claims: allWhole(7), taint: xidOn(7), want: gpuaas.PostureFullyAllocated,
			reason: "8 GPUs: 7 AllocatedWhole, 1 Unhealthy; GPU 7 Unhealthy: gpu.gpuaas.io/xid=79:NoSchedule on gpu-7",
		},
		"driver up, no GPUs": {
			slices: func(*testing.T) []resourceapi.ResourceSlice {
				return []resourceapi.ResourceSlice{{Spec: resourceapi.ResourceSliceSpec{
					Driver: posture.DriverName, Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}}
			},
			want: gpuaas.PostureEmpty, reason: "the driver publishes no GPU on this node",
		},
		"no slices": {
			slices: func(*testing.T) []resourceapi.ResourceSlice { return nil },
			want:   gpuaas.PostureEmpty, reason: "the driver publishes no GPU on this node",
		},
	} {
		t.Run(name, func(t *testing.T) {
			slices := tc.slices(t)
			if tc.taint != nil {
				tc.taint(slices)
			}
			np := posture.Compute(node, slices, tc.claims, tc.rules)
			if np.Posture != tc.want || (tc.reason != "" && np.Reason != tc.reason) {
				t.Errorf("node: %s %q\nwant  %s %q", np.Posture, np.Reason, tc.want, tc.reason)
			}
		})
	}
}

// TestOnlyTheNewestGenerationOfTheNodesPool: a republish in progress
// leaves older slices behind; other nodes' and drivers' slices are not the
// node's.
func TestOnlyTheNewestGenerationOfTheNodesPool(t *testing.T) {
	slices := wholeOnly(t)
	for i := range slices {
		slices[i].Spec.Pool.Generation = 2
	}
	stale := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: posture.DriverName, Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "gpu-8", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To("gpu")}, "index": {IntValue: ptr.To(int64(8))}}}},
	}}
	other := *stale.DeepCopy()
	other.Spec.Pool = resourceapi.ResourcePool{Name: "node-b", Generation: 5, ResourceSliceCount: 1}
	foreign := *stale.DeepCopy()
	foreign.Spec.Driver = "nic.example.com"
	foreign.Spec.Pool.Generation = 9
	np := posture.Compute(node, append(slices, stale, other, foreign), nil, nil)
	if len(np.GPUs) != 8 || np.GPUs[7].Index != 7 {
		t.Fatalf("GPUs = %+v, want gpu-0..7 only", np.GPUs)
	}
}

// TestQualifiedAttributes: the API lets a driver publish its attributes
// with its domain spelled out.
func TestQualifiedAttributes(t *testing.T) {
	slices := everyModeSlices(t)
	for i := range slices {
		for j := range slices[i].Spec.Devices {
			d := &slices[i].Spec.Devices[j]
			qualified := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
			for k, v := range d.Attributes {
				if !strings.Contains(string(k), "/") {
					k = resourceapi.QualifiedName(posture.DriverName + "/" + string(k))
				}
				qualified[k] = v
			}
			d.Attributes = qualified
		}
	}
	np := posture.Compute(node, slices, []resourceapi.ResourceClaim{claim("a", "gpu-1-ts-0")}, nil)
	if g := gpuOf(t, np, 1); len(np.GPUs) != 8 || g.Mode != gpuaas.GpuModeTimeSliced || g.Reason != "1 of 4 replicas allocated" {
		t.Errorf("with qualified attributes: %d GPUs, GPU 1 %s %q", len(np.GPUs), g.Mode, g.Reason)
	}
}

func TestStatus(t *testing.T) {
	slices := everyModeSlices(t)
	taint(slices, ofGPU(7), fault(health.KindXID, "79", resourceapi.DeviceTaintEffectNoSchedule))
	taint(slices, ofGPU(6), fault(health.KindCleanupBlocked, "mig-destroy", resourceapi.DeviceTaintEffectNoSchedule))
	np := posture.Compute(node, slices, []resourceapi.ResourceClaim{
		claim("a", "gpu-3"), claim("b", "gpu-0-mig-7g80gb-0"), claim("c", "gpu-1-ts-0"),
	}, []resourceapi.DeviceTaintRule{rule("maint", &resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-5")}, resourceapi.DeviceTaintEffectNoSchedule)})
	s := np.Status()
	want := gpuaas.PostureSummary{
		GPUs: 8, Available: 2, PartiallyAllocated: 1, AllocatedWhole: 1, FullyAllocated: 1, Allocated: 2,
		Draining: 1, CleanupBlocked: 1, Unhealthy: 1, Faulty: 2,
	}
	if s.Summary != want {
		t.Errorf("summary = %+v\nwant      %+v", s.Summary, want)
	}
	if s.Posture != gpuaas.PostureDegraded || len(s.GPUs) != 8 {
		t.Errorf("status posture %s with %d GPUs", s.Posture, len(s.GPUs))
	}
	g := s.GPUs[3]
	if g.Index != 3 || g.Posture != gpuaas.PostureAllocatedWhole || g.Devices != 1 || len(g.AllocatedDevices) != 1 || g.Claims[0] != "team-a/a" {
		t.Errorf("GPU 3 status = %+v", g)
	}
}

// TestNamesMatchThePlugin: the names this package repeats (it must not
// link NVML) are the plugin's.
func TestNamesMatchThePlugin(t *testing.T) {
	if posture.PluginTaintPrefix != health.TaintKeyPrefix ||
		posture.TaintCleanupBlocked != health.TaintKeyPrefix+health.KindCleanupBlocked ||
		posture.TaintUnmonitored != health.TaintKeyPrefix+health.KindUnmonitored {
		t.Errorf("taint keys differ from pkg/health's")
	}
	if mig.MemorySliceCounter(3) != posture.MemorySliceCounterPrefix+"3" {
		t.Errorf("memory-slice counter %q does not start with %q", mig.MemorySliceCounter(3), posture.MemorySliceCounterPrefix)
	}
	if posture.CounterGPUMilliunits != mig.CounterGPUMilliunits {
		t.Errorf("GPU milliunits counter %q, pkg/mig names it %q", posture.CounterGPUMilliunits, mig.CounterGPUMilliunits)
	}
	if string(mig.AttrProfile) != "profile" || string(mig.AttrParentUUID) != "parentUUID" || string(mig.AttrType) != "type" || string(mig.AttrUUID) != "uuid" {
		t.Errorf("MIG attribute names differ")
	}
	// Every attribute read is on the devices that should carry it.
	for _, s := range everyModeSlices(t) {
		for _, d := range s.Spec.Devices {
			for _, a := range posture.Attributes {
				_, ok := d.Attributes[resourceapi.QualifiedName(a)]
				typ := *d.Attributes["type"].StringValue
				needed := a == "type" || a == "index" || a == "productName" ||
					(a == "profile" && typ == "mig") || (a == "parentUUID" && typ != "gpu") || (a == "uuid" && typ == "gpu")
				if needed && !ok {
					t.Errorf("device %s (%s) has no attribute %q", d.Name, typ, a)
				}
			}
		}
	}
}
