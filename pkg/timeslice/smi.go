package timeslice

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// NvidiaSMI is the binary that sets the time-slice interval: go-nvml has
// no public setter for it.
const NvidiaSMI = "nvidia-smi"

// SMI sets time-slice intervals through nvidia-smi.
type SMI struct {
	Runner Runner
	// DriverRoot is where nvidia-smi is looked up, at each use, so a tool
	// installed later is found without a restart.
	DriverRoot string
}

// SetInterval runs `nvidia-smi compute-policy -i <uuid> --set-timeslice=<n>`.
func (s SMI) SetInterval(ctx context.Context, uuid string, interval configapi.TimeSliceInterval) error {
	n := slices.Index(configapi.TimeSliceIntervals, interval.OrDefault())
	if n < 0 {
		return fmt.Errorf("unknown time-slice interval %q", interval)
	}
	if err := ValidateUUID(uuid); err != nil {
		return err
	}
	bin, err := FindBinary(s.DriverRoot, NvidiaSMI)
	if err != nil {
		return fmt.Errorf("setting time-slice interval %s: %w", interval, err)
	}
	cmd := Cmd{Path: bin, Args: []string{"compute-policy", "-i", uuid, "--set-timeslice=" + strconv.Itoa(n)}, Env: SMIEnv(s.DriverRoot)}
	if _, err := s.Runner.Run(ctx, cmd); err != nil {
		return fmt.Errorf("setting time-slice interval %s on %s: %w", interval, uuid, err)
	}
	return nil
}
