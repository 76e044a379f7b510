package nvmock_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// openOn opens a mock machine kept in dir, as one plugin process does. Not
// shutting it down is how a test kills that process.
func openOn(t *testing.T, machine, dir string) nvdev.Interface {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + machine, MockSeed: "node-a", MockStateDir: dir})
	if err != nil {
		t.Fatalf("opening %s on %s: %v", machine, dir, err)
	}
	return lib
}

func gpu(t *testing.T, lib nvdev.Interface, index int) nvml.Device {
	t.Helper()
	dev, err := lib.DeviceByUUID(lib.GPUs()[index].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

func profile(t *testing.T, dev nvml.Device, name string) mig.Profile {
	t.Helper()
	profiles, err := mig.Profiles(dev)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := mig.ProfileByName(profiles, name)
	if !ok {
		t.Fatalf("no profile %s", name)
	}
	return p
}

// makeMIG makes a MIG device as the plugin does, MIG mode first.
func makeMIG(t *testing.T, dev nvml.Device, name string, start int) mig.Instance {
	t.Helper()
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	p := profile(t, dev, name)
	inst, err := mig.Create(dev, p, mig.Placement{Start: start, Size: p.MemorySlices})
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func listMIG(t *testing.T, dev nvml.Device) []mig.Instance {
	t.Helper()
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

func computeMode(t *testing.T, dev nvml.Device) nvml.ComputeMode {
	t.Helper()
	mode, ret := dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return mode
}

func migMode(t *testing.T, dev nvml.Device) int {
	t.Helper()
	mode, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return mode
}

// A MIG device and a setting made by one process are found, the same, by
// the next process on the same state directory; changes either makes are
// seen by the other, and instance IDs (so MIG UUIDs) are not reused.
func TestPersistentMockOutlivesProcess(t *testing.T) {
	dir := t.TempDir()
	first := openOn(t, "dgxh100", dir)
	made := []mig.Instance{makeMIG(t, gpu(t, first, 3), "3g.40gb", 4), makeMIG(t, gpu(t, first, 3), "1g.10gb", 0)}
	if ret := gpu(t, first, 1).SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	second := openOn(t, "dgxh100", dir) // the first is killed: never shut down
	for i, g := range second.GPUs() {
		if g.UUID != first.GPUs()[i].UUID {
			t.Fatalf("GPU %d is %s after the restart, was %s", i, g.UUID, first.GPUs()[i].UUID)
		}
	}
	if !second.GPUs()[3].MigEnabled || second.GPUs()[2].MigEnabled {
		t.Errorf("MIG mode after restart: GPU 3 %v, GPU 2 %v; want on, off", second.GPUs()[3].MigEnabled, second.GPUs()[2].MigEnabled)
	}
	found := listMIG(t, gpu(t, second, 3))
	if len(found) != 2 || found[0] != made[0] || found[1] != made[1] {
		t.Fatalf("after restart: %+v\nwant %+v", found, made)
	}
	if m := computeMode(t, gpu(t, second, 1)); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode after restart: %d", m)
	}
	// The device is the same one: found by its UUID and destroyed.
	if _, err := second.DeviceByUUID(made[0].UUID); err != nil {
		t.Errorf("MIG device %s not found by UUID after restart: %v", made[0].UUID, err)
	}
	if err := mig.Destroy(gpu(t, second, 3), made[0]); err != nil {
		t.Fatal(err)
	}
	// The first process, were it alive, sees that: one machine, not two.
	if left := listMIG(t, gpu(t, first, 3)); len(left) != 1 || left[0] != made[1] {
		t.Errorf("the other process sees %+v, want only %+v", left, made[1])
	}
	again := makeMIG(t, gpu(t, second, 3), "3g.40gb", 4)
	if again.GIID <= made[1].GIID || again.UUID == made[0].UUID {
		t.Errorf("new instance %+v reuses an ID or UUID of %+v", again, made)
	}
}

// Two processes changing the machine at once lose none of each other's
// changes: each change is made on the latest state, under the flock.
func TestPersistentMockConcurrentProcesses(t *testing.T) {
	dir := t.TempDir()
	libs := []nvdev.Interface{openOn(t, "dgxh100", dir), openOn(t, "dgxh100", dir)}
	for i := range libs[0].GPUs() {
		if err := mig.EnableMigMode(gpu(t, libs[0], i)); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	made := 0
	var wg sync.WaitGroup
	for _, lib := range libs {
		for i := range lib.GPUs() {
			dev := gpu(t, lib, i)
			wg.Go(func() {
				n := fillWith1g(dev)
				mu.Lock()
				made += n
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	third := openOn(t, "dgxh100", dir)
	total := 0
	for i := range third.GPUs() {
		insts := listMIG(t, gpu(t, third, i))
		if len(insts) != 7 {
			t.Errorf("GPU %d has %d 1g.10gb devices, want 7", i, len(insts))
		}
		total += len(insts)
	}
	if total != made {
		t.Errorf("the two processes made %d MIG devices, the machine has %d", made, total)
	}
}

// fillWith1g makes 1g.10gb devices, at whatever placement is free, until
// the GPU is full; it returns how many it made.
func fillWith1g(dev nvml.Device) int {
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		return 0
	}
	n := 0
	for {
		gi, ret := dev.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			return n
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			return n
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			return n
		}
		n++
	}
}

var errKilled = errors.New("killed")

// A process killed between writing the new state and renaming it over the
// old leaves the old state readable, and its temporary file is cleaned up.
func TestPersistentMockKilledMidWrite(t *testing.T) {
	dir := t.TempDir()
	first := openOn(t, "dgxh100", dir)
	kept := makeMIG(t, gpu(t, first, 0), "2g.20gb", 0)
	restore := nvmock.SetBeforeStateRename(func() { panic(errKilled) })
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, errKilled) {
				t.Fatalf("the write was not killed: %v", err)
			}
		}()
		makeMIG(t, gpu(t, first, 0), "2g.20gb", 2)
	}()
	restore()
	// A second, hand-made leftover: a write cut short mid-file.
	if err := os.WriteFile(filepath.Join(dir, ".tmp-mock-dgxh100.json-1"), []byte(`{"version": 1, "gpus": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if temps := tempFiles(t, dir); len(temps) != 2 {
		t.Fatalf("temporary files before restart: %v, want the killed write's and the hand-made one", temps)
	}

	second := openOn(t, "dgxh100", dir)
	if found := listMIG(t, gpu(t, second, 0)); len(found) != 1 || found[0] != kept {
		t.Errorf("after restart: %+v, want only the device recorded before the kill, %+v", found, kept)
	}
	if temps := tempFiles(t, dir); len(temps) != 0 {
		t.Errorf("temporary files left after restart: %v", temps)
	}
	// The placement the killed call had taken is free again.
	makeMIG(t, gpu(t, second, 0), "2g.20gb", 2)
}

func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// A simulated reboot clears MIG devices and the compute mode, keeps MIG
// mode only where a real GPU does (Ampere), and changes the boot ID; a
// process still running sees it at its next call.
func TestRebootMock(t *testing.T) {
	for machine, keepsMIGMode := range map[string]bool{"dgxa100": true, "dgxh100": false} {
		t.Run(machine, func(t *testing.T) {
			dir := t.TempDir()
			bootID := filepath.Join(t.TempDir(), "boot_id")
			if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			before := openOn(t, machine, dir)
			dev := gpu(t, before, 2)
			// As the admin would (nvidia-smi -mig 1), on any architecture.
			if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			inst := makeMIG(t, dev, "1g."+map[bool]string{true: "5gb", false: "10gb"}[keepsMIGMode], 0)
			if ret := gpu(t, before, 5).SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}

			id, err := nvmock.Reboot(dir, bootID)
			if err != nil {
				t.Fatal(err)
			}
			if data, _ := os.ReadFile(bootID); strings.TrimSpace(string(data)) != id || id == "boot-1" {
				t.Errorf("boot ID file holds %q, Reboot returned %q; want a new ID in the file", data, id)
			}
			after := openOn(t, machine, dir)
			checkRebooted(t, after, keepsMIGMode)
			checkRebooted(t, before, keepsMIGMode)
			if _, err := after.DeviceByUUID(inst.UUID); err == nil {
				t.Errorf("MIG device %s still found after the reboot", inst.UUID)
			}
		})
	}
}

func checkRebooted(t *testing.T, lib nvdev.Interface, keepsMIGMode bool) {
	t.Helper()
	dev := gpu(t, lib, 2)
	if n := gpuInstances(t, dev); n != 0 {
		t.Errorf("%d GPU instances after the reboot", n)
	}
	wantMode := map[bool]int{true: nvml.DEVICE_MIG_ENABLE, false: nvml.DEVICE_MIG_DISABLE}[keepsMIGMode]
	if m := migMode(t, dev); m != wantMode {
		t.Errorf("MIG mode after the reboot: %d, want %d", m, wantMode)
	}
	if m := computeMode(t, gpu(t, lib, 5)); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode after the reboot: %d, want default", m)
	}
}

// gpuInstances counts a GPU's GPU instances whatever its MIG mode says.
func gpuInstances(t *testing.T, dev nvml.Device) int {
	t.Helper()
	n := 0
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		n += len(gis)
	}
	return n
}

func TestLayoutMockMIGOutlivesTheLayoutProcess(t *testing.T) {
	dir := t.TempDir()
	if _, err := nvmock.LayoutMIG(dir, "", "", 0, []string{"1g.10gb"}); err == nil {
		t.Fatal("a layout on an empty directory without machine and seed succeeded")
	}
	made, err := nvmock.LayoutMIG(dir, "dgxh100", "node-a", 2, []string{"3g.40gb", "3g.40gb"})
	if err != nil || len(made) != 2 {
		t.Fatalf("layout: %v, %d made", err, len(made))
	}
	lib := openOn(t, "dgxh100", dir) // the plugin starting after the admin
	if got := listMIG(t, gpu(t, lib, 2)); len(got) != 2 || got[0].Profile != "3g.40gb" {
		t.Fatalf("the plugin finds %+v, want the two 3g.40gb devices laid out", got)
	}
	if got := migMode(t, gpu(t, lib, 2)); got != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d after the layout", got)
	}
	if _, err := nvmock.LayoutMIG(dir, "dgxa100", "", 1, nil); err == nil {
		t.Fatal("a layout naming another machine than the directory's succeeded")
	}
}
