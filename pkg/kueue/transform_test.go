package kueue

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestTransformationsChargeExtendedResourcesInMilliunits(t *testing.T) {
	got := Transformations([]ExtendedPrice{
		{ExtendedResource: "nvidia.com/gpu", Milliunits: 1000},
		{ExtendedResource: "gpuaas.io/shared-gpu", Milliunits: 250},
		{ExtendedResource: "gpuaas.io/a100-slice", Resource: "gpu.gpuaas.io/a100-milliunits", Milliunits: 142},
	})
	want := []Transformation{
		{Input: "gpuaas.io/a100-slice", Strategy: "Replace", Outputs: map[string]string{"gpu.gpuaas.io/a100-milliunits": "142"}},
		{Input: "gpuaas.io/shared-gpu", Strategy: "Replace", Outputs: map[string]string{DefaultResource: "250"}},
		{Input: "nvidia.com/gpu", Strategy: "Replace", Outputs: map[string]string{DefaultResource: "1000"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Transformations = %+v\nwant %+v", got, want)
	}
}

func TestResourcesListTransformationsOnlyWhenPriced(t *testing.T) {
	if _, ok := Resources([]Charge{{DeviceClass: "h100"}})["transformations"]; ok {
		t.Error("no extended resource priced, yet the resources section has transformations")
	}
	r := Resources([]Charge{{DeviceClass: "h100"}}, ExtendedPrice{ExtendedResource: "nvidia.com/gpu", Milliunits: 1000})
	if tr, ok := r["transformations"].([]Transformation); !ok || len(tr) != 1 {
		t.Errorf("transformations = %#v, want the one priced", r["transformations"])
	}
}

func TestDeviceMilliunitsReadsTheCounterKueueCharges(t *testing.T) {
	replica := resourceapi.Device{Name: "gpu-0-ts-1", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
		CounterSet: "gpu-0-units",
		Counters:   map[string]resourceapi.Counter{CounterName: {Value: resource.MustParse("250")}},
	}}}
	if got, ok := DeviceMilliunits(&replica); !ok || got != 250 {
		t.Errorf("replica of 4: %d, %v; want 250", got, ok)
	}
	share := resourceapi.Device{Name: "gpu-5-shared"}
	if _, ok := DeviceMilliunits(&share); ok {
		t.Error("a device that consumes no gpu-milliunits has no Kueue price")
	}
}
