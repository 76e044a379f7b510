package admission

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func foreignClassObj(name string, expr string) *resourceapi.DeviceClass {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if expr != "" {
		dc.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
	}
	return dc
}

// The list is what the quota pricing calls someone else's, and nothing the
// pricing charges for is on it.
func TestForeignClassesFollowThePricer(t *testing.T) {
	labelled := foreignClassObj("labelled", `device.driver == "other.example.com"`)
	labelled.Labels = map[string]string{gpuaas.ProfileLabel: "labelled"}
	deleting := foreignClassObj("deleting.example.com", `device.driver == "nic.example.com"`)
	deleting.Finalizers = []string{"example.com/keep"}
	objs := append(world(t),
		foreignClassObj("nic.example.com", `device.driver == "nic.example.com"`),
		foreignClassObj("fpga.example.com", `device.attributes["fpga.example.com"].model == "x"`),
		foreignClassObj("everything", ""),
		foreignClassObj("names-our-driver", `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`),
		foreignClassObj("matches-our-devices", `device.driver.startsWith("gpu.")`),
		labelled, deleting,
		gpuProfile("conflict", gpuaas.ProfileSelector{Type: "gpu"}),
		foreignClassObj("conflict", `device.driver == "nic.example.com"`), // a profile's name, someone else's class
	)
	acct, c := newAccountant(t, objs...)
	if err := c.Delete(ctx(t), deleting); err != nil {
		t.Fatal(err)
	}
	got, err := acct.ForeignClasses(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"fpga.example.com", "nic.example.com"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("foreign classes %v, want %v", got, want)
	}
	var classes resourceapi.DeviceClassList
	if err := c.List(ctx(t), &classes); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, n := range got {
		listed[n] = true
	}
	for _, dc := range append(classes.Items, *foreignClassObj("unknown", "")) {
		adm, err := acct.Admit(ctx(t), claim("team-a", "probe-"+dc.Name, dc.Name, 1), true)
		if err != nil {
			t.Fatal(err)
		}
		if listed[dc.Name] && !adm.Cost.IsZero() {
			t.Errorf("class %s is listed as foreign but a claim for it costs %s", dc.Name, adm.Cost.String())
		}
		acct.mu.Lock()
		cat, err := acct.catalogLocked(ctx(t))
		acct.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if cat.pricer.ClassIsOurs(&dc) && adm.Cost.IsZero() {
			t.Errorf("class %s is taken for ours without pricing, but a claim for it costs nothing", dc.Name)
		}
	}
}

// Issue 36, route 6: the backstop needs, per class, the profiles whose
// devices a claim naming it can get; a catch-all class reaches every
// profile, a profile's class at least itself, a NIC class none.
func TestProfilesReachedFollowThePublishedDevices(t *testing.T) {
	objs := append(world(t),
		foreignClassObj("any-gpu", `device.driver == "gpu.gpuaas.io"`),
		foreignClassObj("nic.example.com", `device.driver == "nic.example.com"`),
		foreignClassObj("gpu-only", `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`),
	)
	acct, _ := newAccountant(t, objs...)
	got, err := acct.ProfilesReached(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"any-gpu": "h100,mig-1g", "gpu-only": "h100", "nic.example.com": "",
		"h100": "h100", "mig-1g": "mig-1g",
	}
	if len(got) != len(want) {
		t.Errorf("classes %v, want %v", got, want)
	}
	for class, profiles := range want {
		if strings.Join(got[class], ",") != profiles {
			t.Errorf("class %s reaches %v, want %q", class, got[class], profiles)
		}
	}
}
