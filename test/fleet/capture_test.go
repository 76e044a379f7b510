package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// stored is two slices of a pool as the API server returns them: one of
// devices that consume a counter set, one of the counter set.
func stored(driver string) []resourceapi.ResourceSlice {
	pool := resourceapi.ResourcePool{Name: "peer-node", Generation: 3, ResourceSliceCount: 2}
	return []resourceapi.ResourceSlice{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, Pool: pool, NodeName: ptr.To("peer-node"),
			Devices: []resourceapi.Device{{Name: "gpu-0", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-units"}}}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, Pool: pool, NodeName: ptr.To("peer-node"),
			SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0-units"}},
		}},
	}
}

func TestCaptureReplaysEachSliceOnTheNode(t *testing.T) {
	dir := t.TempDir()
	for _, driver := range []string{"gpu.nvidia.com", "gpu.gpuaas.io"} {
		if err := WriteCapture(dir, driver, stored(driver)); err != nil {
			t.Fatal(err)
		}
	}
	captures, err := ReadCaptures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(captures) != 2 || captures[0].Driver != "gpu.gpuaas.io" || captures[1].Driver != "gpu.nvidia.com" {
		t.Fatalf("captures %+v, want gpu.gpuaas.io then gpu.nvidia.com", captures)
	}
	res := replayResources("kwok-7", captures[1].Slices)
	if len(res.Pools) != 1 {
		t.Fatalf("pools %v, want the node's own only", res.Pools)
	}
	got := res.Pools["kwok-7"].Slices
	if len(got) != 2 || len(got[0].Devices) != 1 || got[0].Devices[0].Name != "gpu-0" ||
		len(got[0].Devices[0].ConsumesCounters) != 1 || len(got[1].SharedCounters) != 1 || len(got[1].Devices) != 0 {
		t.Errorf("replayed slices %+v, want the device slice and the counter set's slice as captured", got)
	}
}

func TestReadCapturesRefusesWhatItCannotReplay(t *testing.T) {
	if _, err := ReadCaptures(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no captured slices") {
		t.Errorf("an empty directory: %v, want no captured slices", err)
	}
	dir := t.TempDir()
	if err := WriteCapture(dir, "gpu.nvidia.com", stored("gpu.nvidia.com")); err != nil {
		t.Fatal(err)
	}
	// A file renamed to another driver's: its slices are not that driver's.
	if err := os.Rename(filepath.Join(dir, "gpu.nvidia.com"+captureSuffix), filepath.Join(dir, "gpu.gpuaas.io"+captureSuffix)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCaptures(dir); err == nil || !strings.Contains(err.Error(), `want driver "gpu.gpuaas.io"`) {
		t.Errorf("a capture under another driver's name: %v, want it refused", err)
	}
	empty := t.TempDir()
	if err := WriteCapture(empty, "gpu.nvidia.com", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCaptures(empty); err == nil || !strings.Contains(err.Error(), "at least one slice") {
		t.Errorf("a capture without slices: %v, want it refused", err)
	}
}
