package quota

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Issue 26: "is this class ours?" was decided by the pricer and, again,
// by the matchCondition syncer. ClassIsOurs is the one rule, without
// looking at a device: a GpuProfile's name or label, or a selector naming
// our driver; everything else is priced by what it selects. The pricer's
// own isOurs agrees with it on every class it knows.
func TestClassIsOursWithoutDevices(t *testing.T) {
	p := testPricer()
	labelled := class("renamed", `device.attributes["example.com"].x == "y"`)
	labelled.Labels = map[string]string{gpuaas.ProfileLabel: "h100"}
	for _, tc := range []struct {
		dc   *resourceapi.DeviceClass
		ours bool
	}{
		{p.classes["h100"], true},                                     // a profile's, and a selector naming our driver
		{p.classes["any"], true},                                      // a selector naming our driver
		{p.classes["nic"], false},                                     // another driver's
		{class("future", `device.driver == "nic.example.com"`), true}, // a profile's name, whatever it selects
		{class("by-attribute", typeIs("gpu")), true},                  // our driver's attribute domain
		{labelled, true},                                              // the label of the classes profiles render
		{class("everything"), false},                                  // no selector: priced by what it selects
	} {
		if got := p.ClassIsOurs(tc.dc); got != tc.ours {
			t.Errorf("ClassIsOurs(%s) = %v, want %v", tc.dc.Name, got, tc.ours)
		}
		if p.classes[tc.dc.Name] == tc.dc {
			if got := p.isOurs(tc.dc.Name); got != tc.ours {
				t.Errorf("isOurs(%s) = %v, ClassIsOurs %v", tc.dc.Name, got, tc.ours)
			}
		}
	}
}
