package plugin

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestPublishedWholeGPUs(t *testing.T) {
	tests := []struct {
		machine, product, arch, cc string
		memory                     string
		sms                        int64
	}{
		{"dgxa100", "Mock NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40Gi", 108},
		{"dgxh100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", 132},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			e := newTestEnv(t, tc.machine)
			res := Resources(testNode, Inventory{Devices: e.devices})
			pool, ok := res.Pools[testNode]
			if !ok || len(res.Pools) != 1 {
				t.Fatalf("pools = %v, want one named %q", res.Pools, testNode)
			}
			if len(pool.Slices) != 1 || len(pool.Slices[0].Devices) != 8 {
				t.Fatalf("want one slice of 8 devices, got %d slices", len(pool.Slices))
			}
			for i, d := range pool.Slices[0].Devices {
				gpu := e.lib.GPUs()[i]
				checkWholeGPU(t, d, gpu, i, tc.product, tc.arch, tc.cc, tc.memory, tc.sms)
			}
		})
	}
}

func checkWholeGPU(t *testing.T, d resourceapi.Device, gpu nvdev.GPU, i int, product, arch, cc, memory string, sms int64) {
	t.Helper()
	if d.Name != fmt.Sprintf("gpu-%d", i) || len(validation.IsDNS1123Label(d.Name)) != 0 {
		t.Errorf("device %d name %q", i, d.Name)
	}
	str := func(n resourceapi.QualifiedName) string {
		if v := d.Attributes[n].StringValue; v != nil {
			return *v
		}
		return "<unset>"
	}
	ver := func(n resourceapi.QualifiedName) string {
		if v := d.Attributes[n].VersionValue; v != nil {
			return *v
		}
		return "<unset>"
	}
	wantStr := map[resourceapi.QualifiedName]string{
		"type": "gpu", "uuid": gpu.UUID, "productName": product, "brand": "Nvidia", "architecture": arch,
		"resource.kubernetes.io/pciBusID": gpu.PCIBusID, "resource.kubernetes.io/pcieRoot": gpu.PCIeRoot,
	}
	for n, want := range wantStr {
		if got := str(n); got != want {
			t.Errorf("%s: attribute %s = %q, want %q", d.Name, n, got, want)
		}
	}
	for n, want := range map[resourceapi.QualifiedName]string{
		"cudaComputeCapability": cc, "driverVersion": "550.54.15", "cudaDriverVersion": "12.4.0",
	} {
		if got := ver(n); got != want {
			t.Errorf("%s: version %s = %q, want %q", d.Name, n, got, want)
		}
	}
	if v := d.Attributes["index"].IntValue; v == nil || *v != int64(i) {
		t.Errorf("%s: index %v", d.Name, v)
	}
	if v := d.Attributes["resource.kubernetes.io/numaNode"].IntValue; v == nil || *v != int64(i/4) {
		t.Errorf("%s: numaNode %v", d.Name, v)
	}
	if v := d.Attributes["migCapable"].BoolValue; v == nil || !*v {
		t.Errorf("%s: migCapable %v", d.Name, v)
	}
	if got := d.Capacity["memory"].Value; got.Cmp(resource.MustParse(memory)) != 0 {
		t.Errorf("%s: memory %s, want %s", d.Name, got.String(), memory)
	}
	if got := d.Capacity["multiprocessors"].Value; got.Value() != sms {
		t.Errorf("%s: multiprocessors %s, want %d", d.Name, got.String(), sms)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%s: %d attributes and capacities, over the API limit", d.Name, n)
	}
}

func TestSlicesHoldAtMost64Devices(t *testing.T) {
	var devices []AllocatableDevice
	for i := range 130 {
		devices = append(devices, AllocatableDevice{API: resourceapi.Device{Name: fmt.Sprintf("d-%d", i)}})
	}
	pool := Resources("n", Inventory{Devices: devices}).Pools["n"]
	sizes := []int{}
	for _, s := range pool.Slices {
		sizes = append(sizes, len(s.Devices))
	}
	if fmt.Sprint(sizes) != "[64 64 2]" {
		t.Errorf("slice sizes = %v, want [64 64 2]", sizes)
	}
	// Order is kept: the allocator is first-fit.
	if pool.Slices[1].Devices[0].Name != "d-64" {
		t.Errorf("second slice starts with %s", pool.Slices[1].Devices[0].Name)
	}
	if empty := Resources("n", Inventory{}).Pools["n"]; len(empty.Slices) != 1 || len(empty.Slices[0].Devices) != 0 {
		t.Errorf("no devices: want one empty slice, got %+v", empty)
	}
}

func TestSemver(t *testing.T) {
	re := regexp.MustCompile(`^\d+\.\d+\.\d+$`)
	for in, want := range map[string]string{"9.0": "9.0.0", "12.4": "12.4.0", "535.104.05": "535.104.5", "550.54.15": "550.54.15", "10": "10.0.0"} {
		if got := semver(in); got != want || !re.MatchString(got) {
			t.Errorf("semver(%q) = %q, want %q", in, got, want)
		}
	}
}
