package shapes

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// TestOtherDriversAShapesClassesReach: a class reaches only the driver one
// of its selectors pins (`device.driver == "x"`, alone or in a
// conjunction, either way round); ours is not another driver; a class
// that pins none (a disjunction, a comparison of something else, no CEL)
// reaches every driver.
func TestOtherDriversAShapesClassesReach(t *testing.T) {
	class := func(exprs ...string) *resourceapi.DeviceClass {
		dc := &resourceapi.DeviceClass{}
		for _, e := range exprs {
			dc.Spec.Selectors = append(dc.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
		}
		return dc
	}
	for _, tc := range []struct {
		name string
		dc   *resourceapi.DeviceClass
		want []string
	}{
		{"alone", class(`device.driver == "nic.example.com"`), []string{"nic.example.com"}},
		{"conjunction", class(`device.attributes["nic.example.com"].speed > 100 && (true && "nic.example.com" == device.driver)`), []string{"nic.example.com"}},
		{"second selector", class(`device.attributes["x"].y == 1`, `device.driver == "nic.example.com"`), []string{"nic.example.com"}},
		{"ours", class(`device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`), []string{}},
		{"disjunction", class(`device.driver == "a.example.com" || device.driver == "b.example.com"`), []string{AnyDriver}},
		{"not the driver", class(`device.attributes["x"].driver == "nic.example.com"`), []string{AnyDriver}},
		{"inequality", class(`device.driver != "gpu.gpuaas.io"`), []string{AnyDriver}},
		{"no selectors", class(), []string{AnyDriver}},
		{"unparsable", class(`device.driver == `), []string{AnyDriver}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := otherDrivers(map[string]*resourceapi.DeviceClass{"c": tc.dc})
			if !got.Equal(sets.New(tc.want...)) {
				t.Errorf("reaches %q; want %q", sets.List(got), tc.want)
			}
		})
	}
}
