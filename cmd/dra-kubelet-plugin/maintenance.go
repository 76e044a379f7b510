package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
)

// maintenanceWait bounds how long --release-gpus and --reacquire-gpus wait
// for the plugin's answer: a release waits for the prepares in flight.
const maintenanceWait = 2 * time.Minute

// requestMaintenance asks the running plugin to release or reacquire the
// GPUs and waits for its answer; it returns the exit code.
func requestMaintenance(f flags) int {
	if f.releaseGPUs && f.reacquireGPUs {
		fmt.Fprintln(os.Stderr, "--release-gpus and --reacquire-gpus: one at a time")
		return 2
	}
	action, want := maintenance.ActionRelease, []string{maintenance.StateReleased}
	if f.reacquireGPUs {
		action, want = maintenance.ActionReacquire, []string{maintenance.StateServing, maintenance.StateRestarting}
	}
	dir := maintenance.Dir(f.pluginDataDir)
	id, err := maintenance.Request(dir, action)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), maintenanceWait)
	defer cancel()
	st, err := maintenance.Wait(ctx, dir, id, want...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "the plugin did not %s the GPUs: %v (state %q, driver %s)\n", action, err, st.State, st.DriverVersion)
		return 1
	}
	switch st.State {
	case maintenance.StateReleased:
		fmt.Printf("GPUs released: the plugin has shut NVML down; reset the GPUs or upgrade the driver, then run --reacquire-gpus (a new driver version is taken up on its own)\n")
	case maintenance.StateRestarting:
		fmt.Printf("a new driver is installed: the plugin is starting again to load it (ready once the driver is loaded)\n")
	default:
		fmt.Printf("GPUs reacquired: driver %s\n", st.DriverVersion)
	}
	return 0
}
