package deviceweight

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

const driver = "gpu.gpuaas.io"

func device(typ string, ints map[string]int64, memory string) *resourceapi.Device {
	d := &resourceapi.Device{Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrType: {StringValue: ptr.To(typ)}}}
	for k, v := range ints {
		d.Attributes[resourceapi.QualifiedName(driver+"/"+k)] = resourceapi.DeviceAttribute{IntValue: ptr.To(v)}
	}
	if memory != "" {
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapacityMemory: {Value: resource.MustParse(memory)}}
	}
	return d
}

func TestHeld(t *testing.T) {
	for _, c := range []struct {
		name     string
		d        *resourceapi.Device
		consumed int64
		want     Fraction
	}{
		{"whole GPU", device(TypeGPU, nil, ""), 0, Fraction{1, 1}},
		{"replica of four (qualified attribute)", device(TypeTimeSlice, map[string]int64{AttrReplicas: 4}, ""), 0, Fraction{1, 4}},
		{"replica without replicas", device(TypeTimeSlice, nil, ""), 0, Fraction{1, 1}},
		{"MIG 3 of 7", device(TypeMIG, map[string]int64{AttrComputeSlices: 3, AttrTotalComputeSlices: 7}, ""), 0, Fraction{3, 7}},
		{"MIG without a total", device(TypeMIG, map[string]int64{AttrComputeSlices: 3}, ""), 0, Fraction{1, 1}},
		{"share of 20Gi of 80Gi", device(TypeShared, nil, "80Gi"), 20 << 30, Fraction{20 << 30, 80 << 30}},
		{"share with nothing consumed", device(TypeShared, nil, "80Gi"), 0, Fraction{1, 1}},
		{"unknown type", device("nic", nil, ""), 0, Fraction{1, 1}},
	} {
		if got := Held(c.d, driver, c.consumed); got.Float64() != c.want.Float64() {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
