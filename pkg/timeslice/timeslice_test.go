package timeslice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
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
	if err := (SMI{Runner: r, DriverRoot: root}).SetInterval(ctx, "GPU-1; rm -rf /", configapi.LongTimeSlice); err == nil {
		t.Error("a non-UUID went into a command line")
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
