package nvmock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// LayoutMIG lays out MIG devices on GPU gpu (an index) of the
// persistent mock machine in dir, as an admin does with mig-parted before
// the plugin offers the GPU as static MIG: MIG mode enabled, then the
// profiles where they all fit (mig.ApplyLayout). The machine is the one
// dir holds; on a fresh dir, machine and seed (the plugin's
// --nvml=mock:<machine> and its node name) create it.
func LayoutMIG(dir, machine, seed string, gpu int, profiles []string) ([]mig.Instance, error) {
	machine, seed, err := mockMachineFor(dir, machine, seed)
	if err != nil {
		return nil, err
	}
	lib, err := open(machine, nvdev.Options{MockSeed: seed, MockStateDir: dir})
	if err != nil {
		return nil, err
	}
	defer func() { _ = lib.Shutdown() }()
	gpus := lib.GPUs()
	if gpu < 0 || gpu >= len(gpus) {
		return nil, fmt.Errorf("GPU %d: the machine has GPUs 0-%d", gpu, len(gpus)-1)
	}
	dev, err := lib.DeviceByUUID(gpus[gpu].UUID)
	if err != nil {
		return nil, err
	}
	if err := mig.EnableMigMode(dev); err != nil {
		return nil, fmt.Errorf("enabling MIG mode on GPU %d: %w", gpu, err)
	}
	return mig.ApplyLayout(dev, profiles)
}

// mockMachineFor is the machine and seed of the state in dir; on a dir
// without one, those given, which must then be set.
func mockMachineFor(dir, machine, seed string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", "", fmt.Errorf("mock NVML state directory: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(dir, mockStatePrefix+"*"+mockStateSuffix))
	if err != nil || len(paths) == 0 {
		if machine == "" || seed == "" {
			return "", "", errors.New("no mock machine in the state directory yet: give its machine and seed (the plugin's node name)")
		}
		return machine, seed, nil
	}
	states, err := mockMachineStates(dir)
	if err != nil {
		return "", "", err
	}
	if len(states) != 1 {
		return "", "", fmt.Errorf("%d mock machines in %s, want one", len(states), dir)
	}
	st := states[0]
	if (machine != "" && machine != st.Machine) || (seed != "" && seed != st.Seed) {
		return "", "", fmt.Errorf("%s holds machine %s of seed %q, not %s of %q", dir, st.Machine, st.Seed, machine, seed)
	}
	return st.Machine, st.Seed, nil
}
