package mig_test

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestDeviceNamesGolden(t *testing.T) {
	ps := profiles(t, gpu(machine(t, h100_80), 0))
	for _, tc := range []struct {
		gpu     int
		profile string
		start   int
		want    string
	}{
		{0, "1g.10gb", 6, "gpu-0-mig-1g10gb-6"},
		{3, "1g.10gb+me", 0, "gpu-3-mig-1g10gbme-0"},
		{7, "7g.80gb", 0, "gpu-7-mig-7g80gb-0"},
		{0, "1c.3g.40gb", 4, "gpu-0-mig-1c3g40gb-4"},
	} {
		p := profileNamed(t, ps, tc.profile)
		if got := mig.DeviceName(tc.gpu, p, mig.Placement{Start: tc.start, Size: p.MemorySlices}); got != tc.want {
			t.Errorf("DeviceName(%d, %s, %d) = %q, want %q", tc.gpu, tc.profile, tc.start, got, tc.want)
		}
	}
	if got := mig.CounterSetName(5); got != "gpu-5-counters" {
		t.Errorf("CounterSetName(5) = %q", got)
	}
}

// Every dynamic device of a node has a valid, unique name, and building
// the node again (a plugin restart) gives the same names in the same order.
func TestDeviceNamesValidUniqueStable(t *testing.T) {
	for _, product := range products {
		s := machine(t, product)
		seen := map[string]bool{}
		for i := range s.Devices {
			first, again := layout(t, gpu(s, i)), layout(t, gpu(s, i))
			if !slices.Equal(names(first.Partitions), names(again.Partitions)) {
				t.Errorf("%s GPU %d: names changed between builds", product, i)
			}
			for _, p := range first.Partitions {
				if errs := validation.IsDNS1123Label(p.Device.Name); len(errs) > 0 {
					t.Errorf("%s: %q: %v", product, p.Device.Name, errs)
				}
				if seen[p.Device.Name] {
					t.Errorf("%s: %q twice", product, p.Device.Name)
				}
				seen[p.Device.Name] = true
				if got, ok := first.Find(p.Device.Name); !ok || got.Placement != p.Placement || got.Profile.Name != p.Profile.Name {
					t.Errorf("%s: Find(%q) = %v, %v", product, p.Device.Name, got.Profile.Name, ok)
				}
			}
		}
	}
}

// Names stay valid labels for any profile NVIDIA's scheme can produce, and
// "+attr" and "-attr" never collide.
func TestDeviceNamesOddProfiles(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"1g.10gb+me", "1g.10gb-me", "1g.10gb", "1g.24gb+gfx", "2g.48gb+me.all", "1c.7g.180gb+me,gfx", "4g.96gb"} {
		got := mig.DeviceName(999, mig.Profile{Name: name}, mig.Placement{Start: 15})
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("%s -> %q: %v", name, got, errs)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s both named %q", name, other, got)
		}
		seen[got] = name
	}
}
