package timeslice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

type fakeBackend struct{ calls []string }

func (f *fakeBackend) Apply(_ context.Context, gpu string, s Settings) error {
	f.calls = append(f.calls, "apply "+gpu+" "+s.String())
	return nil
}

func (f *fakeBackend) Ensure(_ context.Context, gpu string, _ Settings) error {
	f.calls = append(f.calls, "ensure "+gpu)
	return nil
}

func (f *fakeBackend) Reset(_ context.Context, gpu string, _ Settings) error {
	f.calls = append(f.calls, "reset "+gpu)
	return nil
}

func TestManagerCountsHolders(t *testing.T) {
	b := &fakeBackend{}
	m := NewManager(b)
	ctx := context.Background()
	long := Settings{Strategy: configapi.TimeSlicingStrategy, Interval: configapi.LongTimeSlice}
	for _, h := range []string{"a", "b", "a"} {
		if err := m.Acquire(ctx, "GPU-1", h, long); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := m.Holders("GPU-1"); n != 2 {
		t.Errorf("holders = %d", n)
	}
	err := m.Acquire(ctx, "GPU-1", "c", Settings{Strategy: configapi.MPSStrategy})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "[a b]") {
		t.Errorf("conflict err = %v", err)
	}
	for _, h := range []string{"a", "a", "unknown", "b"} {
		if err := m.Release(ctx, "GPU-1", h); err != nil {
			t.Fatal(err)
		}
	}
	want := "apply GPU-1 TimeSlicing (interval Long),ensure GPU-1,ensure GPU-1,reset GPU-1"
	if got := strings.Join(b.calls, ","); got != want {
		t.Errorf("calls = %s\nwant    %s", got, want)
	}
	if err := m.Adopt("GPU-2", "x", long); err != nil || m.Adopt("GPU-2", "y", Settings{Strategy: configapi.MPSStrategy}) == nil {
		t.Errorf("adopt: %v", err)
	}
}

func TestSMIFindsToolAndPassesFixedArgs(t *testing.T) {
	ctx := context.Background()
	if err := (SMI{}).SetInterval(ctx, "GPU-12345678-aaaa", configapi.ShortTimeSlice); !errors.Is(err, ErrNoBinary) {
		t.Errorf("no driver root: %v", err)
	}
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "bin", NvidiaSMI)
	_ = os.MkdirAll(filepath.Dir(bin), 0o755)
	_ = os.WriteFile(bin, nil, 0o755)
	var got Cmd
	r := runnerFunc(func(c Cmd) error { got = c; return nil })
	if err := (SMI{Runner: r, DriverRoot: root}).SetInterval(ctx, "GPU-12345678-aaaa", configapi.MediumTimeSlice); err != nil {
		t.Fatal(err)
	}
	if got.Path != bin || strings.Join(got.Args, " ") != "compute-policy -i GPU-12345678-aaaa --set-timeslice=2" {
		t.Errorf("cmd = %v", got)
	}
	// Without a driver library there is nothing to preload.
	if len(got.Env) != 0 {
		t.Errorf("env %v with no libnvidia-ml in the driver root", got.Env)
	}
	if err := (SMI{Runner: r, DriverRoot: root}).SetInterval(ctx, "GPU-1; rm -rf /", configapi.LongTimeSlice); err == nil {
		t.Error("a non-UUID went into a command line")
	}
}

// nvidia-smi gets the driver root's NVML preloaded and nothing else of it:
// a library path over the root's directories (where a host install keeps
// libc.so.6 too) ran it with the host's libc under this image's loader.
func TestSMILoadsOnlyTheDriversNVML(t *testing.T) {
	root := t.TempDir()
	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for _, f := range []string{"usr/bin/" + NvidiaSMI, "usr/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755)
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var got Cmd
	r := runnerFunc(func(c Cmd) error { got = c; return nil })
	if err := (SMI{Runner: r, DriverRoot: root}).SetInterval(context.Background(), "GPU-12345678-aaaa", configapi.LongTimeSlice); err != nil {
		t.Fatal(err)
	}
	if want := []string{"LD_PRELOAD=" + filepath.Join(libDir, "libnvidia-ml.so.1")}; !slices.Equal(got.Env, want) {
		t.Errorf("nvidia-smi env %v, want only %v", got.Env, want)
	}
}

type runnerFunc func(Cmd) error

func (f runnerFunc) Run(_ context.Context, c Cmd) ([]byte, error) { return nil, f(c) }

func TestReplicaMemoryNeverOvercommits(t *testing.T) {
	for _, n := range []int{1, 3, 7, 64} {
		if got := ReplicaMemory(80<<30+1, n) * uint64(n); got > 80<<30+1 {
			t.Errorf("%d replicas add up to %d", n, got)
		}
	}
}

// N replicas' shares of the GPU's 1000 milliunits never add up to more
// than 1000 (so a counter of them refuses no replica), and lose less than
// one milliunit each to rounding.
func TestReplicaShareNeverOvercommits(t *testing.T) {
	for n := 1; n <= 16; n++ {
		share := ReplicaShare(1000, n)
		if sum := share * int64(n); sum > 1000 || sum <= 1000-int64(n) {
			t.Errorf("%d replicas of %d add up to %d", n, share, sum)
		}
	}
	if got := ReplicaShare(1000, 3); got != 333 {
		t.Errorf("a third of 1000 = %d, want 333", got)
	}
	if got := ReplicaShare(1000, 0); got != 0 {
		t.Errorf("no replicas: share %d", got)
	}
}

// Every replica consumes what it is given, each its own copy.
func TestReplicaDevicesConsume(t *testing.T) {
	p := Parent{Index: 2, UUID: "GPU-1", MemoryBytes: 80 << 30, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	units := []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-2-counters",
		Counters: map[string]resourceapi.Counter{"gpu-milliunits": {Value: resource.MustParse("333")}}}}
	devs := ReplicaDevices(p, configapi.TimeSlicingMode{Replicas: 3}, units)
	if len(devs) != 3 {
		t.Fatalf("%d replicas", len(devs))
	}
	devs[0].ConsumesCounters[0].Counters["gpu-milliunits"] = resourceapi.Counter{Value: resource.MustParse("1")}
	for _, d := range devs[1:] {
		got := d.ConsumesCounters[0].Counters["gpu-milliunits"]
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != "gpu-2-counters" || got.Value.Value() != 333 {
			t.Errorf("%s consumes %v", d.Name, d.ConsumesCounters)
		}
	}
	if v := units[0].Counters["gpu-milliunits"]; v.Value.Value() != 333 {
		t.Error("a replica shares the consumption it was given")
	}
	for _, d := range ReplicaDevices(p, configapi.TimeSlicingMode{Replicas: 2}, nil) {
		if d.ConsumesCounters != nil {
			t.Errorf("%s consumes %v, given nothing", d.Name, d.ConsumesCounters)
		}
	}
}
