package mig

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNeedsAdmin is returned when changing a GPU's MIG mode would need a GPU
// reset, which the driver never does: on Ampere the admin sets the mode in
// the node configuration (nvidia-smi -mig, mig-parted) before the plugin
// offers the GPU.
var ErrNeedsAdmin = errors.New("changing MIG mode of this GPU needs a GPU reset")

// togglesWithoutReset are the architectures that switch MIG mode at once.
// Unknown future ones are refused until checked: a GPU left waiting for a
// reset is lost to every claim.
var togglesWithoutReset = map[nvml.DeviceArchitecture]bool{
	nvml.DEVICE_ARCH_HOPPER:    true,
	nvml.DEVICE_ARCH_BLACKWELL: true,
	nvml.DEVICE_ARCH_RUBIN:     true,
}

// TogglesWithoutReset reports whether the GPU can switch MIG mode at once
// (Hopper and newer); otherwise only the admin changes it.
func TogglesWithoutReset(dev nvml.Device) (bool, error) {
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("getting architecture: %w", ret)
	}
	return togglesWithoutReset[arch], nil
}

// EnableMigMode turns MIG mode on where that needs no reset (Hopper and
// newer). A GPU already in MIG mode is left as is. On Ampere it returns
// ErrNeedsAdmin. If the driver leaves the change pending a reset, the change
// is undone and an error returned.
func EnableMigMode(dev nvml.Device) error {
	return setMigMode(dev, nvml.DEVICE_MIG_ENABLE)
}

// DisableMigMode turns MIG mode off, for a whole-GPU claim in dynamic mode,
// under the same rules as EnableMigMode. It refuses while any MIG instance
// exists, so it never destroys someone's MIG device.
func DisableMigMode(dev nvml.Device) error {
	insts, err := List(dev)
	if err != nil {
		return err
	}
	if len(insts) > 0 {
		return fmt.Errorf("not disabling MIG mode: %d MIG devices exist (first: %s, GPU instance %d)",
			len(insts), insts[0].Profile, insts[0].GIID)
	}
	return setMigMode(dev, nvml.DEVICE_MIG_DISABLE)
}

func setMigMode(dev nvml.Device, want int) error {
	current, pending, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return ErrNotMigCapable
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting MIG mode: %w", ret)
	}
	if current == want {
		return nil // usable now; a pending change is the admin's
	}
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting architecture: %w", ret)
	}
	if !togglesWithoutReset[arch] {
		return fmt.Errorf("%w: MIG mode is %s (pending %s) and this architecture cannot switch it to %s without one; the admin must set it",
			ErrNeedsAdmin, modeName(current), modeName(pending), modeName(want))
	}
	return apply(dev, current, want)
}

// apply switches the mode and checks that it took effect now; otherwise it
// puts the previous mode back so nothing waits for a reset.
func apply(dev nvml.Device, previous, want int) error {
	activation, ret := dev.SetMigMode(want)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("setting MIG mode %s: %w", modeName(want), ret)
	}
	current, _, ret := dev.GetMigMode()
	var err error
	switch {
	case activation != nvml.SUCCESS:
		err = fmt.Errorf("MIG mode %s did not take effect: %w", modeName(want), activation)
	case ret != nvml.SUCCESS:
		err = fmt.Errorf("checking MIG mode %s: %w", modeName(want), ret)
	case current != want:
		err = fmt.Errorf("MIG mode %s did not take effect", modeName(want))
	default:
		return nil
	}
	if _, ret := dev.SetMigMode(previous); ret != nvml.SUCCESS {
		return errors.Join(err, fmt.Errorf("restoring MIG mode %s: %w", modeName(previous), ret))
	}
	return err
}

// migDisabled tells whether MIG mode is known to be off.
func migDisabled(dev nvml.Device) bool {
	mode, _, ret := dev.GetMigMode()
	return ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && mode == nvml.DEVICE_MIG_DISABLE)
}

func modeName(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}
	return "disabled"
}
