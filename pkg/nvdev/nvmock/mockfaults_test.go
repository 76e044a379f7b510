package nvmock_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

const (
	xidTypes = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError
	whole    = nvmock.WholeGPU
)

// eventSet makes an event set on lib and registers the given GPUs on it
// for the given event types.
func eventSet(t *testing.T, lib nvdev.Interface, types uint64, gpus ...int) nvml.EventSet {
	t.Helper()
	set, ret := lib.NVML().EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	t.Cleanup(func() { _ = set.Free() })
	for _, i := range gpus {
		if ret := gpu(t, lib, i).RegisterEvents(types, set); ret != nvml.SUCCESS {
			t.Fatalf("registering GPU %d: %v", i, ret)
		}
	}
	return set
}

func inject(t *testing.T, dir, gpu string, eventType, data uint64, gi, ci uint32) {
	t.Helper()
	if err := nvmock.InjectEvent(dir, gpu, eventType, data, gi, ci); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for the next event, failing the test if there is none.
func waitEvent(t *testing.T, set nvml.EventSet) nvml.EventData {
	t.Helper()
	data, ret := set.Wait(2000)
	if ret != nvml.SUCCESS {
		t.Fatalf("waiting for an event: %v", ret)
	}
	return data
}

// waitNone checks that no event comes within a short timeout, and that
// Wait really waits that long.
func waitNone(t *testing.T, set nvml.EventSet) {
	t.Helper()
	start := time.Now()
	data, ret := set.Wait(120)
	if ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait = %+v, %v; want ERROR_TIMEOUT", data, ret)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("Wait timed out after %v, before its 120ms", waited)
	}
}

// checkEvent checks an event. Its device is the raw handle RegisterEvents
// was called on, as on real NVML (not go-nvlib's wrapper that nvdev
// caches), so it is checked by the UUID it tells.
func checkEvent(t *testing.T, got nvml.EventData, uuid string, eventType, data uint64, gi, ci uint32) {
	t.Helper()
	if got.Device == nil {
		t.Fatalf("event %+v has no device", got)
	}
	if id, ret := got.Device.GetUUID(); ret != nvml.SUCCESS || id != uuid {
		t.Errorf("event of device %s (%v), want %s", id, ret, uuid)
	}
	got.Device = nil
	want := nvml.EventData{EventType: eventType, EventData: data, GpuInstanceId: gi, ComputeInstanceId: ci}
	if got != want {
		t.Errorf("event %+v, want %+v", got, want)
	}
}

// An event set delivers the events logged after its devices registered,
// for those devices and event types only, in order; then it times out.
func TestMockEventsDelivered(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	inject(t, dir, "0", nvml.EventTypeXidCriticalError, 13, whole, whole) // before the set: never delivered
	set := eventSet(t, lib, xidTypes, 0)
	if ret := gpu(t, lib, 1).RegisterEvents(nvml.EventTypeSingleBitEccError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	inject(t, dir, "2", nvml.EventTypeXidCriticalError, 79, whole, whole) // GPU not registered
	inject(t, dir, "1", nvml.EventTypeDoubleBitEccError, 0, whole, whole) // type not registered for it
	inst := makeMIG(t, gpu(t, lib, 0), "1g.10gb", 0)
	gi, ci := uint32(inst.GIID), uint32(inst.CIID)
	inject(t, dir, lib.GPUs()[0].UUID, nvml.EventTypeXidCriticalError, 48, gi, ci) // on a MIG device
	inject(t, dir, "0", nvml.EventTypeDoubleBitEccError, 0, whole, whole)
	inject(t, dir, "1", nvml.EventTypeSingleBitEccError, 0, whole, whole)

	ev := waitEvent(t, set)
	checkEvent(t, ev, lib.GPUs()[0].UUID, nvml.EventTypeXidCriticalError, 48, gi, ci)
	// The health monitor finds the MIG device from the event's handle.
	if _, ret := ev.Device.GetGpuInstanceById(inst.GIID); ret != nvml.SUCCESS {
		t.Errorf("GPU instance %d of the event's device: %v", inst.GIID, ret)
	}
	checkEvent(t, waitEvent(t, set), lib.GPUs()[0].UUID, nvml.EventTypeDoubleBitEccError, 0, whole, whole)
	checkEvent(t, waitEvent(t, set), lib.GPUs()[1].UUID, nvml.EventTypeSingleBitEccError, 0, whole, whole)
	waitNone(t, set)

	// An event logged while Wait polls is delivered when it comes.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = nvmock.InjectEvent(dir, "0", nvml.EventTypeXidCriticalError, 31, whole, whole)
	}()
	checkEvent(t, waitEvent(t, set), lib.GPUs()[0].UUID, nvml.EventTypeXidCriticalError, 31, whole, whole)

	if ret := set.Free(); ret != nvml.SUCCESS {
		t.Fatalf("Free: %v", ret)
	}
	if _, ret := set.Wait(0); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("Wait after Free: %v, want ERROR_UNINITIALIZED", ret)
	}
}

// A device delivers only what is logged after it registered, even on a set
// made earlier.
func TestMockEventsAfterRegistration(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	set := eventSet(t, lib, xidTypes)
	inject(t, dir, "4", nvml.EventTypeXidCriticalError, 43, whole, whole)
	if ret := gpu(t, lib, 4).RegisterEvents(xidTypes, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	waitNone(t, set)
}

// RegisterEvents refuses what NVML refuses; GetSupportedEventTypes says
// what a data-center GPU supports.
func TestMockRegisterEventsRefusals(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	dev := gpu(t, lib, 0)
	supported, ret := dev.GetSupportedEventTypes()
	if want := uint64(xidTypes | nvml.EventTypeSingleBitEccError); ret != nvml.SUCCESS || supported != want {
		t.Errorf("GetSupportedEventTypes = %#x, %v; want %#x", supported, ret, want)
	}
	freed, _ := lib.NVML().EventSetCreate()
	if ret := freed.Free(); ret != nvml.SUCCESS {
		t.Fatalf("Free = %v", ret)
	}
	for name, tc := range map[string]struct {
		types uint64
		set   nvml.EventSet
		want  nvml.Return
	}{
		"another library's set": {xidTypes, &mock.EventSet{}, nvml.ERROR_INVALID_ARGUMENT},
		"no set":                {xidTypes, nil, nvml.ERROR_INVALID_ARGUMENT},
		"a freed set":           {xidTypes, freed, nvml.ERROR_INVALID_ARGUMENT},
		"an unsupported type":   {nvml.EventTypePState, eventSet(t, lib, 0), nvml.ERROR_NOT_SUPPORTED},
	} {
		if ret := dev.RegisterEvents(tc.types, tc.set); ret != tc.want {
			t.Errorf("%s: RegisterEvents = %v, want %v", name, ret, tc.want)
		}
	}
}

// Every process on the machine gets an injected event, whichever process
// injects it: here another OS process, as mocknvml is.
func TestMockEventFromAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	first, second := openOn(t, "dgxh100", dir), openOn(t, "dgxh100", dir)
	sets := []nvml.EventSet{eventSet(t, first, xidTypes, 6), eventSet(t, second, xidTypes, 6)}

	cmd := exec.Command(os.Args[0], "-test.run=^TestMockFaultsHelperProcess$")
	cmd.Env = append(os.Environ(), "NVDEV_INJECT_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("injecting from another process: %v\n%s", err, out)
	}
	for i, lib := range []nvdev.Interface{first, second} {
		checkEvent(t, waitEvent(t, sets[i]), lib.GPUs()[6].UUID, nvml.EventTypeXidCriticalError, 94, whole, whole)
	}
}

// TestMockFaultsHelperProcess is the other process of
// TestMockEventFromAnotherProcess.
func TestMockFaultsHelperProcess(t *testing.T) {
	dir := os.Getenv("NVDEV_INJECT_DIR")
	if dir == "" {
		t.Skip("run by TestMockEventFromAnotherProcess")
	}
	inject(t, dir, "6", nvml.EventTypeXidCriticalError, 94, whole, whole)
}

// A lost GPU answers the health probe with ERROR_GPU_IS_LOST and reports
// XID 79; it still tells its UUID. Recovering it, or clearing all faults,
// makes it answer again.
func TestMockGPULost(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	set := eventSet(t, lib, xidTypes, 5)
	dev := gpu(t, lib, 5)
	checkAnswers(t, dev, nvml.SUCCESS)

	if err := nvmock.SetGPULost(dir, "5", true); err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, dev, nvml.ERROR_GPU_IS_LOST)
	checkAnswers(t, gpu(t, lib, 4), nvml.SUCCESS)
	if uuid, ret := dev.GetUUID(); ret != nvml.SUCCESS || uuid != lib.GPUs()[5].UUID {
		t.Errorf("GetUUID of the lost GPU = %q, %v", uuid, ret)
	}
	checkEvent(t, waitEvent(t, set), lib.GPUs()[5].UUID, nvml.EventTypeXidCriticalError, 79, whole, whole)
	if ret := dev.RegisterEvents(xidTypes, eventSet(t, lib, 0)); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("registering the lost GPU: %v, want ERROR_GPU_IS_LOST", ret)
	}
	// Marking it lost again reports nothing new: it fell off once.
	if err := nvmock.SetGPULost(dir, lib.GPUs()[5].UUID, true); err != nil {
		t.Fatal(err)
	}
	waitNone(t, set)

	if err := nvmock.SetGPULost(dir, "5", false); err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, dev, nvml.SUCCESS)
	if err := nvmock.SetGPULost(dir, "5", true); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.ClearFaults(dir); err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, dev, nvml.SUCCESS)
}

// checkAnswers checks what the GPU's probes answer.
func checkAnswers(t *testing.T, dev nvml.Device, want nvml.Return) {
	t.Helper()
	if _, ret := dev.GetMemoryInfo(); ret != want {
		t.Errorf("GetMemoryInfo: %v, want %v", ret, want)
	}
	temp, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU)
	if ret != want || (want == nvml.SUCCESS && temp == 0) {
		t.Errorf("GetTemperature = %d, %v; want a temperature and %v", temp, ret, want)
	}
}

// A MIG device of a lost GPU is lost with it.
func TestMockGPULostMIG(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	inst := makeMIG(t, gpu(t, lib, 2), "1g.10gb", 0)
	if err := nvmock.SetGPULost(dir, "2", true); err != nil {
		t.Fatal(err)
	}
	migDev, err := lib.DeviceByUUID(inst.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ret := migDev.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("GetMemoryInfo of a MIG device of the lost GPU: %v, want ERROR_GPU_IS_LOST", ret)
	}
}

// While MIG teardown fails, neither compute nor GPU instances can be
// destroyed, whichever process made them and whichever tries; nothing
// changes. Once it no longer fails, they are destroyed.
func TestMockMigDestroyFails(t *testing.T) {
	dir := t.TempDir()
	first := openOn(t, "dgxh100", dir)
	inst := makeMIG(t, gpu(t, first, 3), "3g.40gb", 4)
	bare := bareGI(t, gpu(t, first, 3), "1g.10gb", 0) // a GPU instance without compute instance
	if err := nvmock.SetMigDestroyFails(dir, "3", true); err != nil {
		t.Fatal(err)
	}
	second := openOn(t, "dgxh100", dir) // restores both instances from the state file

	if ret := bare.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroying a GPU instance: %v, want ERROR_IN_USE", ret)
	}
	for name, lib := range map[string]nvdev.Interface{"first": first, "second": second} {
		if err := mig.Destroy(gpu(t, lib, 3), inst); !errors.Is(err, nvml.ERROR_IN_USE) {
			t.Errorf("%s process destroying %s: %v, want ERROR_IN_USE", name, inst.UUID, err)
		}
	}
	for name, lib := range map[string]nvdev.Interface{"first": first, "second": second} {
		if n := len(listMIG(t, gpu(t, lib, 3))); n != 1 {
			t.Errorf("%s process sees %d MIG devices, want the one it could not destroy", name, n)
		}
		if n := gpuInstances(t, gpu(t, lib, 3)); n != 2 {
			t.Errorf("%s process sees %d GPU instances, want 2", name, n)
		}
	}
	// Other GPUs are not affected.
	other := makeMIG(t, gpu(t, second, 1), "1g.10gb", 0)
	if err := mig.Destroy(gpu(t, second, 1), other); err != nil {
		t.Errorf("destroying a MIG device of another GPU: %v", err)
	}

	if err := nvmock.SetMigDestroyFails(dir, first.GPUs()[3].UUID, false); err != nil {
		t.Fatal(err)
	}
	if err := mig.Destroy(gpu(t, second, 3), inst); err != nil {
		t.Fatal(err)
	}
	if ret := bare.Destroy(); ret != nvml.SUCCESS {
		t.Errorf("destroying a GPU instance: %v", ret)
	}
	if n := gpuInstances(t, gpu(t, first, 3)); n != 0 {
		t.Errorf("%d GPU instances left, want none", n)
	}
}

// bareGI makes a GPU instance only, as a plugin killed between the two
// creations leaves it.
func bareGI(t *testing.T, dev nvml.Device, name string, start int) nvml.GpuInstance {
	t.Helper()
	p := profile(t, dev, name)
	info, ret := dev.GetGpuInstanceProfileInfo(p.GIProfileID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemorySlices)})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return gi
}

// The log keeps the last 256 events and never reuses a number, not even
// across ClearFaults.
func TestMockFaultsLog(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxh100", dir)
	path := nvmock.FaultsPath(dir, "dgxh100")
	// A log already full, as a long test run leaves it.
	var events []string
	for seq := 745; seq <= 1000; seq++ {
		events = append(events, fmt.Sprintf(`{"seq": %d, "gpu": %q, "eventType": 8, "data": 13, "gpuInstanceID": 4294967295, "computeInstanceID": 4294967295, "time": "2025-01-01T00:00:00Z"}`, seq, lib.GPUs()[0].UUID))
	}
	full := fmt.Sprintf(`{"version": 1, "machine": "dgxh100", "lastSeq": 1000, "events": [%s]}`, strings.Join(events, ","))
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	set := eventSet(t, lib, xidTypes, 0)
	if err := nvmock.ClearFaults(dir); err != nil {
		t.Fatal(err)
	}
	inject(t, dir, "0", nvml.EventTypeXidCriticalError, 48, whole, whole)
	checkEvent(t, waitEvent(t, set), lib.GPUs()[0].UUID, nvml.EventTypeXidCriticalError, 48, whole, whole)

	var log struct {
		LastSeq uint64 `json:"lastSeq"`
		Events  []struct {
			Seq  uint64 `json:"seq"`
			Data uint64 `json:"data"`
		} `json:"events"`
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &log); err != nil {
		t.Fatal(err)
	}
	last := log.Events[len(log.Events)-1]
	if log.LastSeq != 1001 || len(log.Events) != 256 || log.Events[0].Seq != 746 || last.Seq != 1001 || last.Data != 48 {
		t.Errorf("log after one more event: lastSeq %d, %d events, seq %d to %d; want 1001, 256, 746 to 1001",
			log.LastSeq, len(log.Events), log.Events[0].Seq, last.Seq)
	}
	if temps := tempFiles(t, dir); len(temps) != 0 {
		t.Errorf("temporary files left: %v", temps)
	}
}

// Faults are refused, with a reason, for what is not a GPU of a machine.
func TestMockFaultsErrors(t *testing.T) {
	dir := t.TempDir()
	openOn(t, "dgxh100", dir)
	twoMachines := t.TempDir()
	openOn(t, "dgxh100", twoMachines)
	openOn(t, "dgxa100", twoMachines)
	for name, tc := range map[string]struct {
		dir, gpu  string
		eventType uint64
		want      string
	}{
		"index out of range":       {dir, "8", nvml.EventTypeXidCriticalError, "no GPU 8"},
		"negative index":           {dir, "-1", nvml.EventTypeXidCriticalError, "no GPU -1"},
		"unknown UUID":             {dir, "GPU-nope", nvml.EventTypeXidCriticalError, `no GPU "GPU-nope"`},
		"empty directory":          {t.TempDir(), "0", nvml.EventTypeXidCriticalError, "no mock machine"},
		"no directory":             {dir + "/nope", "0", nvml.EventTypeXidCriticalError, "no such file"},
		"index among two machines": {twoMachines, "0", nvml.EventTypeXidCriticalError, "name the GPU by UUID"},
		"unsupported event type":   {dir, "0", nvml.EventTypePState, "not one of the event types"},
		"two event types":          {dir, "0", xidTypes, "not one of the event types"},
	} {
		err := nvmock.InjectEvent(tc.dir, tc.gpu, tc.eventType, 0, whole, whole)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	if err := nvmock.SetGPULost(dir, "9", true); err == nil {
		t.Error("losing GPU 9 of 8: no error")
	}
	if err := nvmock.ClearFaults(t.TempDir()); err == nil {
		t.Error("clearing the faults of an empty directory: no error")
	}
	if err := os.WriteFile(nvmock.FaultsPath(dir, "dgxh100"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetMigDestroyFails(dir, "0", true); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("with a damaged faults file: %v, want an error saying so", err)
	}
}
