package nvmock

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// Reboot simulates a node reboot for every persistent mock machine in
// stateDir, doing to each GPU what a real reboot does, and gives the node a
// new boot ID, written to bootIDPath unless that is empty (the plugin's
// --boot-id-path on a simulated node). It returns the new boot ID.
//
// A reboot loses what the driver keeps only while it is loaded: GPU and
// compute instances (and so MIG devices), the compute mode, and every
// process with the use (mockuse.go). MIG mode
// survives on Ampere, where NVIDIA's MIG user guide says the setting is
// kept across reboots (in the InfoROM, like ECC mode) until changed; from
// Hopper on, the guide says it lasts only while the driver is loaded, so it
// comes back disabled. A mode left pending a reset is current after it
// (Ampere) or lost with the rest (Hopper on); minor numbers are the first
// ones again. Instance IDs start again from 0, as after a driver
// load.
//
// Plugins still running on the machine (there are none after a real
// reboot) see the cleared state at their next NVML call.
func Reboot(stateDir, bootIDPath string) (string, error) {
	if _, err := os.Stat(stateDir); err != nil {
		return "", fmt.Errorf("mock NVML state directory: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(stateDir, mockStatePrefix+"*"+mockStateSuffix))
	if err != nil {
		return "", fmt.Errorf("listing mock machines in %s: %w", stateDir, err)
	}
	for _, p := range paths {
		if err := withStateLock(p, func() error { return rebootMachine(p) }); err != nil {
			return "", fmt.Errorf("rebooting mock machine %s: %w", p, err)
		}
	}
	// A reboot resets every GPU: one that fell off the bus answers again,
	// and a MIG teardown that was refused is moot.
	if err := ClearFaults(stateDir); err != nil {
		return "", fmt.Errorf("clearing injected faults: %w", err)
	}
	// The driver is loaded at boot: an unload before it does not outlive it.
	if err := LoadDriver(stateDir); err != nil {
		return "", fmt.Errorf("loading the driver at boot: %w", err)
	}
	id := uuid.NewString()
	if bootIDPath == "" {
		return id, nil
	}
	f, err := writeFileAtomic(bootIDPath, []byte(id+"\n"))
	if err != nil {
		return "", fmt.Errorf("writing the new boot ID: %w", err)
	}
	return id, f.Close()
}

// rebootMachine clears one state file's volatile state; the caller holds
// its lock.
func rebootMachine(path string) error {
	return rewriteMockStateLocked(path, clearVolatile)
}

// rewriteMockState changes a state file from outside every plugin, under
// its lock; running plugins see the change at their next call.
func rewriteMockState(path string, change func(*mockState) error) error {
	return withStateLock(path, func() error { return rewriteMockStateLocked(path, change) })
}

func rewriteMockStateLocked(path string, change func(*mockState) error) error {
	if err := removeMockTemps(path); err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading mock machine state: %w", err)
	}
	st, err := decodeMockState(path, data)
	if err != nil {
		return err
	}
	if err := change(st); err != nil {
		return err
	}
	if data, err = encodeMockState(st); err != nil {
		return err
	}
	f, err := writeFileAtomic(path, data)
	if err != nil {
		return err
	}
	return f.Close()
}

func clearVolatile(st *mockState) error {
	newServer, ok := mockMachines[st.Machine]
	if !ok {
		return fmt.Errorf("unknown mock machine %q", st.Machine)
	}
	devices := newServer().Devices
	if len(devices) != len(st.GPUs) {
		return fmt.Errorf("machine %s has %d GPUs, its state %d", st.Machine, len(devices), len(st.GPUs))
	}
	for i := range st.GPUs {
		g := &st.GPUs[i]
		g.GIs, g.NextGIID, g.ComputeMode = nil, 0, nvml.COMPUTEMODE_DEFAULT
		// Nothing runs on a GPU that has just booted.
		g.Use, g.Processes = nil, nil
		// The reset a reboot is applies a pending mode; the driver probes
		// the GPUs again in bus order, with their first minors.
		if g.PendingMigMode != nil {
			g.MigMode = *g.PendingMigMode
		}
		g.PendingMigMode, g.Minor = nil, nil
		if !migModeSurvivesReboot(devices[i].(*server.Device).Config.Architecture) {
			g.MigMode = nvml.DEVICE_MIG_DISABLE
		}
	}
	return nil
}

// migModeSurvivesReboot: only Ampere keeps MIG mode across reboots (see
// Reboot).
func migModeSurvivesReboot(arch nvml.DeviceArchitecture) bool {
	return arch == nvml.DEVICE_ARCH_AMPERE
}
