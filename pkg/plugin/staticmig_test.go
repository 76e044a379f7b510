package plugin

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// Issue 25 item 5: GPU 0 is offered as static MIG, but mig-manager makes
// its MIG devices only after the plugin started (at boot both start
// together). At start the GPU, MIG mode off, is offered whole; the plugin
// then reads the layout again on a period and publishes the MIG devices
// in its place, which claims can then be prepared on. They were never
// published until the plugin restarted.
func TestStaticMIGMadeAfterStartIsPublished(t *testing.T) {
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}}}}
	e := newTestEnvIn(t, "dgxh100", cfg, t.TempDir())
	d, pub := testDriver(t, e, cfg)
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	if err := d.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := publishedOnGPU(t, pub, e.Lib.GPUs()[0].UUID); !slices.Equal(got, []string{"gpu-0"}) {
		t.Fatalf("at start GPU 0 (MIG mode off) publishes %v, want it whole", got)
	}
	d.watchStaticMIG(ctx, e.Lib, cfg, 20*time.Millisecond)

	made, err := nvmock.LayoutMIG(e.MockStateDir, "dgxh100", testNode, 0, []string{"3g.40gb", "2g.20gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = publishedOnGPU(t, pub, e.Lib.GPUs()[0].UUID); len(got) == len(made) {
			break
		}
	}
	if len(got) != len(made) || slices.Contains(got, "gpu-0") {
		t.Fatalf("after mig-manager made %d MIG devices GPU 0 publishes %v", len(made), got)
	}
	var small string
	for _, name := range got {
		if strings.Contains(name, "1g10gb") {
			small = name
		}
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("s").Device("mig", small).Build()); err != nil {
		t.Fatalf("preparing a claim on %s, published after start: %v", small, err)
	}
	if others := len(pub.last(t).Slices); others == 0 {
		t.Fatal("nothing published")
	}
}

// publishedOnGPU lists the last published devices of a GPU, by name.
func publishedOnGPU(t *testing.T, pub *capturePublisher, uuid string) []string {
	t.Helper()
	var out []string
	for _, s := range pub.last(t).Slices {
		for _, d := range s.Devices {
			for name, a := range d.Attributes {
				if (name == "uuid" || name == "parentUUID") && a.StringValue != nil && *a.StringValue == uuid {
					out = append(out, d.Name)
					break
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
