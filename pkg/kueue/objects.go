package kueue

import (
	"cmp"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// API is the Kueue API the controller reads and writes. Kueue is
// optional: its objects are handled as unstructured, and a cluster without
// its kinds is one where nothing is Kueue's.
var API = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}

// Object is an empty Kueue object (or list) of a kind.
func Object(kind string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(API.WithKind(kind))
	return obj
}

// ChargedAs is the Kueue resource a profile's class is charged as in
// the mappings the controller renders; false when it renders none: the
// profile is off or going, or a share of a shared GPU, which consumes no
// gpu-milliunits (docs/kueue.md), so Kueue would refuse every workload
// asking for one.
func ChargedAs(p *gpuaas.GpuProfile) (string, bool) {
	if !p.IsEnabled() || !p.DeletionTimestamp.IsZero() || p.Spec.Selector.Type == "shared" {
		return "", false
	}
	return cmp.Or(ptr.Deref(p.Spec.KueueResource, ""), DefaultResource), true
}

// ShapeCharges are the charges of the DeviceClasses that shapes name
// besides profiles (a profile's class is mapped by ChargedAs), once each
// and none that profiles already map: a class of ours (ours reports it)
// in GPU units, as our admission prices it, so a shape naming our devices
// by class costs in Kueue what they are worth; any other by count as
// OtherDevicesResource. ours may be nil: no class is ours.
func ShapeCharges(shapes []gpuaas.GpuShape, profiles map[string]bool, ours func(class string) bool) []Charge {
	var out []Charge
	seen := map[string]bool{}
	for i := range shapes {
		for _, r := range shapes[i].Spec.Requests {
			c := r.DeviceClassName
			if r.Profile != "" || c == "" || profiles[c] || seen[c] {
				continue
			}
			seen[c] = true
			res := OtherDevicesResource
			if ours != nil && ours(c) {
				res = DefaultResource
			}
			out = append(out, Charge{DeviceClass: c, Resource: res})
		}
	}
	return out
}
