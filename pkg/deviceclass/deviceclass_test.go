package deviceclass

import (
	"context"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func profile(name string, sel gpuaas.ProfileSelector, mutate ...func(*gpuaas.GpuProfile)) *gpuaas.GpuProfile {
	p := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "uid-" + "1"}, Spec: gpuaas.GpuProfileSpec{Selector: sel}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func withConfig(raw string) func(*gpuaas.GpuProfile) {
	return func(p *gpuaas.GpuProfile) { p.Spec.Config = &runtime.RawExtension{Raw: []byte(raw)} }
}

func TestBuild(t *testing.T) {
	p := profile("mig-1g", gpuaas.ProfileSelector{MigProfile: "1g.10gb", ProductName: "NVIDIA H100 80GB HBM3"},
		withConfig(`{"apiVersion": "gpu.gpuaas.io/v1alpha1", "kind": "MigConfig"}`),
		func(p *gpuaas.GpuProfile) {
			p.Spec.DisplayName = "Small MIG slice"
			p.Spec.ExtendedResourceName = ptr.To("gpuaas.io/mig-1g")
		})
	dc, err := Build(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`device.driver == "gpu.gpuaas.io"`,
		`"type" in device.attributes["gpu.gpuaas.io"] && device.attributes["gpu.gpuaas.io"].type == "mig"`,
		`"productName" in device.attributes["gpu.gpuaas.io"] && device.attributes["gpu.gpuaas.io"].productName == "NVIDIA H100 80GB HBM3"`,
		`"profile" in device.attributes["gpu.gpuaas.io"] && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`,
	}
	var got []string
	for _, s := range dc.Spec.Selectors {
		got = append(got, s.CEL.Expression)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("selectors:\n got %q\nwant %q", got, want)
	}
	if dc.Name != "mig-1g" || dc.Labels[gpuaas.ProfileLabel] != "mig-1g" || dc.Annotations[DisplayNameAnnotation] != "Small MIG slice" {
		t.Errorf("metadata = %+v", dc.ObjectMeta)
	}
	if len(dc.OwnerReferences) != 1 || !ptr.Deref(dc.OwnerReferences[0].Controller, false) || dc.OwnerReferences[0].Kind != "GpuProfile" {
		t.Errorf("owner references = %+v", dc.OwnerReferences)
	}
	if len(dc.Spec.Config) != 1 || dc.Spec.Config[0].Opaque.Driver != DriverName ||
		string(dc.Spec.Config[0].Opaque.Parameters.Raw) != `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig"}` {
		t.Errorf("config = %+v", dc.Spec.Config)
	}
	if ptr.Deref(dc.Spec.ExtendedResourceName, "") != "gpuaas.io/mig-1g" {
		t.Errorf("extendedResourceName = %v", dc.Spec.ExtendedResourceName)
	}
}

func TestBuildEmptySelectorSelectsTheDriver(t *testing.T) {
	dc, err := Build(profile("any-gpu", gpuaas.ProfileSelector{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(dc.Spec.Selectors) != 1 || dc.Spec.Config != nil || dc.Annotations != nil {
		t.Errorf("class = %+v", dc.Spec)
	}
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func device(attrs map[string]string, memory string) cel.Device {
	d := cel.Device{Driver: DriverName, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	for k, v := range attrs {
		d.Attributes[resourceapi.QualifiedName(k)] = str(v)
	}
	if memory != "" {
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(memory)}}
	}
	return d
}

// The rendered selectors run in the scheduler's CEL environment: they must
// select the intended devices and never fail on a device that lacks an
// attribute (that would fail the whole allocation).
func TestSelectorsMatch(t *testing.T) {
	h100 := device(map[string]string{"type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "architecture": "Hopper"}, "80Gi")
	a100 := device(map[string]string{"type": "gpu", "productName": "NVIDIA A100-SXM4-40GB", "architecture": "Ampere"}, "40Gi")
	mig1g := device(map[string]string{"type": "mig", "profile": "1g.10gb"}, "10Gi")
	bare := device(nil, "")
	other := device(map[string]string{"type": "gpu"}, "80Gi")
	other.Driver = "other.example.com"

	tests := []struct {
		name  string
		sel   gpuaas.ProfileSelector
		match []cel.Device
		miss  []cel.Device
	}{
		{"whole H100", gpuaas.ProfileSelector{Type: "gpu", ProductName: "NVIDIA H100 80GB HBM3"}, []cel.Device{h100}, []cel.Device{a100, mig1g, bare, other}},
		{"by architecture", gpuaas.ProfileSelector{Architecture: "Ampere"}, []cel.Device{a100}, []cel.Device{h100, bare}},
		{"MIG profile implies type mig", gpuaas.ProfileSelector{MigProfile: "1g.10gb"}, []cel.Device{mig1g}, []cel.Device{h100, bare}},
		{"minimum memory", gpuaas.ProfileSelector{MinMemory: ptr.To(resource.MustParse("64Gi"))}, []cel.Device{h100}, []cel.Device{a100, mig1g, bare}},
		{"raw CEL", gpuaas.ProfileSelector{CEL: `device.attributes["gpu.gpuaas.io"].architecture == "Hopper"`}, []cel.Device{h100}, nil},
		{"empty: every device of the driver", gpuaas.ProfileSelector{}, []cel.Device{h100, a100, mig1g, bare}, []cel.Device{other}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exprs := Selectors(&tt.sel)
			for _, d := range tt.match {
				if ok, err := matchAll(exprs, d); !ok || err != nil {
					t.Errorf("%v does not match %v: %v", exprs, d.Attributes, err)
				}
			}
			for _, d := range tt.miss {
				if ok, err := matchAll(exprs, d); ok || err != nil {
					t.Errorf("%v matches %v (err %v)", exprs, d.Attributes, err)
				}
			}
		})
	}
}

func matchAll(exprs []string, d cel.Device) (bool, error) {
	for _, e := range exprs {
		res := compiler.CompileCELExpression(e, cel.Options{})
		if res.Error != nil {
			return false, res.Error
		}
		ok, _, err := res.DeviceMatches(context.Background(), d)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		p    *gpuaas.GpuProfile
		// want is empty for a valid profile, else parts of the error
		want []string
	}{
		{"valid MIG profile", profile("p", gpuaas.ProfileSelector{MigProfile: "3g.40gb"}), nil},
		{"valid compute-instance profile", profile("p", gpuaas.ProfileSelector{MigProfile: "1c.3g.40gb"}), nil},
		{"invalid CEL", profile("p", gpuaas.ProfileSelector{CEL: `device.attributes["gpu.gpuaas.io"].type ==`}),
			[]string{"spec.selector.cel", "compilation failed"}},
		{"CEL that is not boolean", profile("p", gpuaas.ProfileSelector{CEL: `device.driver`}),
			[]string{"spec.selector.cel", "must evaluate to bool"}},
		{"CEL with an unknown variable", profile("p", gpuaas.ProfileSelector{CEL: `gpu.memory > 10`}),
			[]string{"spec.selector.cel", "undeclared reference"}},
		{"unknown MIG profile", profile("p", gpuaas.ProfileSelector{MigProfile: "1g.11gb"}),
			[]string{"spec.selector.migProfile", `"1g.11gb"`, "no supported GPU has this MIG profile", "1g.10gb"}},
		{"malformed MIG profile", profile("p", gpuaas.ProfileSelector{MigProfile: "small"}),
			[]string{"spec.selector.migProfile", "not a MIG profile name"}},
		{"MIG profile on a whole-GPU type", profile("p", gpuaas.ProfileSelector{Type: "gpu", MigProfile: "1g.10gb"}),
			[]string{"needs type mig"}},
		{"unknown type", profile("p", gpuaas.ProfileSelector{Type: "vgpu"}), []string{"spec.selector.type", "vgpu"}},
		{"non-positive minimum memory", profile("p", gpuaas.ProfileSelector{MinMemory: ptr.To(resource.MustParse("0"))}),
			[]string{"spec.selector.minMemory", "must be positive"}},
		{"config with an unknown field", profile("p", gpuaas.ProfileSelector{Type: "gpu"},
			withConfig(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharring":{}}`)),
			[]string{"spec.config", "sharring"}},
		{"config of an unknown kind", profile("p", gpuaas.ProfileSelector{Type: "gpu"},
			withConfig(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"TpuConfig"}`)),
			[]string{"spec.config", "TpuConfig"}},
		{"MigConfig on whole GPUs", profile("p", gpuaas.ProfileSelector{Type: "gpu"},
			withConfig(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig"}`)),
			[]string{"spec.config.kind", "MigConfig applies to MIG devices"}},
		{"GpuConfig on MIG devices", profile("p", gpuaas.ProfileSelector{MigProfile: "1g.10gb"},
			withConfig(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig"}`)),
			[]string{"MIG devices are configured with MigConfig"}},
		{"extended resource name without domain", profile("p", gpuaas.ProfileSelector{},
			func(p *gpuaas.GpuProfile) { p.Spec.ExtendedResourceName = ptr.To("shared-gpu") }),
			[]string{"spec.extendedResourceName", "domain prefix"}},
		{"extended resource name in kubernetes.io", profile("p", gpuaas.ProfileSelector{},
			func(p *gpuaas.GpuProfile) { p.Spec.ExtendedResourceName = ptr.To("kubernetes.io/gpu") }),
			[]string{"reserved"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := Validate(tt.p, nil)
			if len(tt.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("unexpected errors: %v", errs)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatal("no error")
			}
			msg := errs.ToAggregate().Error()
			for _, part := range tt.want {
				if !strings.Contains(msg, part) {
					t.Errorf("error %q lacks %q", msg, part)
				}
			}
			if _, err := Build(tt.p, nil); err == nil {
				t.Error("Build accepted an invalid profile")
			}
		})
	}
}

func TestPublishedMigProfileIsAccepted(t *testing.T) {
	p := profile("p", gpuaas.ProfileSelector{MigProfile: "2g.66gb"})
	if errs := Validate(p, nil); len(errs) == 0 {
		t.Fatal("2g.66gb accepted without being published")
	}
	if errs := Validate(p, map[string]bool{"2g.66gb": true}); len(errs) > 0 {
		t.Fatalf("published profile refused: %v", errs)
	}
}
