package device

import (
	"path/filepath"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// A record that names a MIG device the plugin made is torn down by
// destroying it, whatever mode it records (records of any version).
func TestRecordNamingAMIGDeviceIsDynamicMIG(t *testing.T) {
	for _, mode := range []string{"", "dynamic", "static", "timeSlicing/2"} {
		if k := RecordedKind(&checkpoint.Device{GPUMode: mode, MIGIntent: &mig.Intent{}}); k != (dynamicMIG{}) {
			t.Errorf("record of mode %q with a MIG intent is a %T", mode, k)
		}
	}
}

// What each kind gives a container: its GPU's or MIG device's UUID, the
// GPU's minor, and an MPS client's daemon.
func TestKindCDIDevices(t *testing.T) {
	e := &Env{MigCaps: filepath.Join(t.TempDir(), "absent"), Sharing: NewSharing(SharingOptions{MPSDir: "/mps"})}
	gpu := nvdev.GPU{UUID: "GPU-1", Minor: 3}
	inst := &mig.Instance{UUID: "MIG-1"}
	limits := &mps.Limits{MemoryBytes: 1 << 30, ThreadPercentage: 50}
	mpsShare := &sharingPlan{settings: timeslice.Settings{Strategy: configapi.MPSStrategy}, limits: limits}
	for name, tc := range map[string]struct {
		kind    Kind
		sharing *sharingPlan
		rec     checkpoint.Device
		want    cdi.Device
	}{
		"whole":         {kind: wholeGPU{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"static MIG":    {kind: staticMIG{inst: inst}, want: cdi.Device{UUID: "MIG-1", Minor: 3}},
		"dynamic MIG":   {kind: dynamicMIG{}, rec: checkpoint.Device{CreatedMIG: inst}, want: cdi.Device{UUID: "MIG-1", Minor: 3}},
		"dynamic whole": {kind: dynamicWholeGPU{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"time-sliced":   {kind: timeSliceReplica{}, sharing: &sharingPlan{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"MPS replica": {kind: timeSliceReplica{}, sharing: mpsShare, want: cdi.Device{UUID: "GPU-1", Minor: 3,
			Env:    e.Sharing.mps.ClientEnv("GPU-1", *limits),
			Mounts: []cdi.Mount{{HostPath: e.Sharing.mps.PipeDir("GPU-1"), ContainerPath: e.Sharing.mps.PipeDir("GPU-1")}, {HostPath: e.Sharing.mps.ShmDir("GPU-1"), ContainerPath: mps.ShmContainerPath}}}},
	} {
		p := Planned{Device: &AllocatableDevice{GPU: gpu, API: resourceapi.Device{Name: "d"}, Kind: tc.kind}, Sharing: tc.sharing}
		got, err := tc.kind.CDIDevice(e, p, &tc.rec)
		tc.want.Name = "d"
		if err != nil || !equality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("%s: CDI device %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
}
