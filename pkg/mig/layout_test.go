package mig_test

import (
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

func TestApplyLayoutPlacesEachProfileWhereItFits(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	migOn(t, d)
	made, err := mig.ApplyLayout(d, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	listed, err := mig.List(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 4 || len(listed) != 4 {
		t.Fatalf("made %d, listed %d MIG devices, want 4", len(made), len(listed))
	}
	for i, a := range made {
		for _, b := range made[i+1:] {
			if a.Placement.Overlaps(b.Placement) {
				t.Errorf("%s@%v overlaps %s@%v", a.Profile, a.Placement, b.Profile, b.Placement)
			}
		}
	}
	// The GPU is full: one more 1g does not fit, and nothing is lost.
	if _, err := mig.ApplyLayout(d, []string{"3g.40gb"}); err == nil {
		t.Error("a 3g.40gb fitted on a full GPU")
	}
	if _, err := mig.ApplyLayout(d, []string{"9g.1tb"}); err == nil {
		t.Error("an unknown profile was accepted")
	}
	if again, _ := mig.List(d); len(again) != 4 {
		t.Errorf("%d MIG devices after failed layouts, want 4", len(again))
	}
}
