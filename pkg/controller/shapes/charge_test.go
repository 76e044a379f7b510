package shapes_test

import (
	"maps"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// TestShapeChargedSumOfParts (issue 38 item 5): the claim a shape renders
// is charged what its parts cost claimed one by one, in GPU units, memory
// and devices per profile: the quota webhook prices a claim request by
// request, so a shape needs no pricing of its own. Another driver's NIC
// costs nothing; a whole-node lease costs the largest node's GPUs.
func TestShapeChargedSumOfParts(t *testing.T) {
	var slices []*resourceapi.ResourceSlice
	classes := map[string]*resourceapi.DeviceClass{"nic": nicClass()}
	for _, o := range testworld.World(t) {
		switch o := o.(type) {
		case *resourceapi.ResourceSlice:
			slices = append(slices, o)
		case *resourceapi.DeviceClass:
			classes[o.Name] = o
		}
	}
	pricer := quota.NewPricer(quota.NewInventory(quota.DriverName, slices), classes, map[string]bool{"h100": true, "mig-1g": true})
	cost := func(spec resourceapi.ResourceClaimSpec) quota.Charge { return pricer.ClaimCost(t.Context(), &spec) }
	part := func(r gpuaas.ShapeRequest) quota.Charge {
		return cost(shape.ClaimSpec(&gpuaas.GpuShape{Spec: gpuaas.GpuShapeSpec{Requests: []gpuaas.ShapeRequest{r}}}))
	}
	for _, tc := range []struct {
		name  string
		shape gpuaas.GpuShapeSpec
		want  quota.Charge
	}{
		{
			name:  "GPU + NIC on one PCIe root",
			shape: gpuaas.GpuShapeSpec{Alignment: gpuaas.AlignPCIeRoot, Requests: []gpuaas.ShapeRequest{{Name: "gpu", Profile: "h100"}, {Name: "nic", DeviceClassName: "nic"}}},
			want:  quota.Charge{Units: quota.WholeUnits(1), Memory: 80 << 30, Devices: map[string]int64{"h100": 1}},
		},
		{
			name: "2 GPUs and 3 MIG slices on one NUMA node",
			shape: gpuaas.GpuShapeSpec{Alignment: gpuaas.AlignNUMANode, Requests: []gpuaas.ShapeRequest{
				{Name: "gpus", Profile: "h100", Count: ptr.To[int64](2)}, {Name: "migs", Profile: "mig-1g", Count: ptr.To[int64](3)}}},
			want: quota.Charge{Units: quota.WholeUnits(2).Add(quota.NewUnits(3, 7)), Memory: 160<<30 + 30<<30, Devices: map[string]int64{"h100": 2, "mig-1g": 3}},
		},
		{
			name:  "whole-node lease: the largest node's GPUs",
			shape: gpuaas.GpuShapeSpec{Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: "h100", AllocationMode: gpuaas.ShapeAll}}},
			want:  quota.Charge{Units: quota.WholeUnits(4), Memory: 320 << 30, Devices: map[string]int64{"h100": 4}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: tc.shape}
			got := cost(shape.ClaimSpec(s))
			sum := quota.Charge{}
			for _, r := range tc.shape.Requests {
				sum = sum.Add(part(r))
			}
			if !sameCharge(got, sum) {
				t.Errorf("shape charged %+v, its parts one by one %+v", got, sum)
			}
			if !sameCharge(got, tc.want) {
				t.Errorf("shape charged %+v, want %+v", got, tc.want)
			}
		})
	}
}

func sameCharge(a, b quota.Charge) bool {
	return a.Units.Cmp(b.Units) == 0 && a.Memory == b.Memory && maps.Equal(a.Devices, b.Devices)
}
