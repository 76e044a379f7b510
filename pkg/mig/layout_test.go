package mig_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// placed is a layout's instances as "profile@start", in the order made.
func placed(insts []mig.Instance) []string {
	out := make([]string, len(insts))
	for i, inst := range insts {
		out[i] = fmt.Sprintf("%s@%d", inst.Profile, inst.Placement.Start)
	}
	return out
}

func listed(t *testing.T, d *server.Device) []string {
	t.Helper()
	insts, err := mig.List(d)
	if err != nil {
		t.Fatal(err)
	}
	out := placed(insts)
	slices.Sort(out)
	return out
}

// A real H100 holds 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb, but only with
// the 3g in the upper half: taking each profile's first free placement
// (3g@0, 2g@4, 1g@6) leaves the second 1g only slice 7, where no 1g.10gb
// may start.
func TestApplyLayoutPlacesWhatFitsARealH100(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	migOn(t, d)
	made, err := mig.ApplyLayout(d, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"3g.40gb@4", "2g.20gb@0", "1g.10gb@2", "1g.10gb@3"}
	if got := placed(made); !slices.Equal(got, want) {
		t.Errorf("made %v, want %v", got, want)
	}
	if got := listed(t, d); len(got) != 4 {
		t.Errorf("GPU lists %v, want the 4 made", got)
	}
}

// A layout is placed beside the MIG devices already on the GPU, and the
// whole GPU's memory slices can be used.
func TestApplyLayoutAddsBesideWhatExists(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	migOn(t, d)
	if _, err := mig.ApplyLayout(d, []string{"1g.20gb"}); err != nil {
		t.Fatal(err)
	}
	made, err := mig.ApplyLayout(d, []string{"1g.10gb+me", "3g.40gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"3g.40gb@4", "1g.10gb@2", "1g.10gb+me@3"}
	if got := placed(made); !slices.Equal(got, want) {
		t.Errorf("made %v beside 1g.20gb@0, want %v", got, want)
	}
}

// A layout that no placement fits is refused before anything is made, with
// an error naming the layout, the GPU and what was already on it.
func TestApplyLayoutRefusesWhatCannotFit(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	migOn(t, d)
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for _, tc := range []struct {
		layout []string
		want   string
	}{
		// Two 4g.40gb would fit the memory slices, not the one 4g placement.
		{[]string{"4g.40gb", "4g.40gb"}, "MIG layout [4g.40gb 4g.40gb] does not fit GPU " + uuid + ": 4g.40gb: 2 asked, the GPU allows 1"},
		// Seven compute slices, but nine memory slices.
		{[]string{"3g.40gb", "1g.10gb", "3g.40gb"}, "MIG layout [3g.40gb 1g.10gb 3g.40gb] does not fit GPU " + uuid + ": no placement"},
		// Only one media-engine instance per GPU.
		{[]string{"1g.10gb+me", "1g.10gb+me"}, "1g.10gb+me: 2 asked, the GPU allows 1"},
		{slices.Repeat([]string{"1g.10gb"}, 8), "1g.10gb: 8 asked, the GPU allows 7"},
		{[]string{"4g.40gb", "3g.40gb", "1g.10gb"}, "8 compute slices asked, the GPU has 7"},
		{[]string{"9g.1tb"}, `unknown MIG profile "9g.1tb"`},
	} {
		made, err := mig.ApplyLayout(d, tc.layout)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("layout %v: error %v, want one saying %q", tc.layout, err, tc.want)
		}
		if len(made) != 0 {
			t.Errorf("layout %v: made %v before refusing", tc.layout, placed(made))
		}
	}
	if got := listed(t, d); len(got) != 0 {
		t.Errorf("refused layouts left %v on the GPU", got)
	}
	// Beside a full GPU nothing fits, and the error says what is there.
	if _, err := mig.ApplyLayout(d, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	_, err := mig.ApplyLayout(d, []string{"1g.10gb"})
	if want := "beside 1g.10gb@2, 1g.10gb@3, 2g.20gb@0, 3g.40gb@4"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("1g.10gb on a full GPU: error %v, want one saying %q", err, want)
	}
	if got := listed(t, d); len(got) != 4 {
		t.Errorf("after a refused layout the GPU lists %v, want the 4 made", got)
	}
}
