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

// ErrPendingReset is returned when the driver accepted a MIG mode change
// but left it pending a GPU reset (NVML's activation status, or GetMigMode's
// pending differing from current), as in pass-through VMs. The change is
// undone before the error is returned: the GPU keeps its mode.
var ErrPendingReset = errors.New("the MIG mode change was left pending a GPU reset, which the plugin never does; the previous mode was put back")

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
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting architecture: %w", ret)
	}
	if current == want {
		if pending != want && togglesWithoutReset[arch] {
			// Where the plugin switches the mode, a change left pending is
			// its own, from a process killed before putting it back: were it
			// left, the next reset would switch the GPU under this claim.
			return cancelPending(dev, want)
		}
		return nil // usable now; on Ampere a pending change is the admin's
	}
	if !togglesWithoutReset[arch] {
		return fmt.Errorf("%w: MIG mode is %s (pending %s) and this architecture cannot switch it to %s without one; the admin must set it",
			ErrNeedsAdmin, modeName(current), modeName(pending), modeName(want))
	}
	return apply(dev, current, want)
}

// apply switches the mode and checks that it took effect now; otherwise it
// puts the previous mode back so nothing waits for a reset. A GPU another
// process holds refuses the switch (ERROR_IN_USE): an *InUseError, which
// RetryInUse waits out.
func apply(dev nvml.Device, previous, want int) error {
	activation, ret := dev.SetMigMode(want)
	if ret == nvml.ERROR_IN_USE {
		return &InUseError{GPU: uuidOf(dev), Mode: modeName(want)}
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("setting MIG mode %s: %w", modeName(want), ret)
	}
	current, pending, ret := dev.GetMigMode()
	var err error
	switch {
	case activation != nvml.SUCCESS:
		err = fmt.Errorf("%w: MIG mode %s did not take effect (%w)", ErrPendingReset, modeName(want), activation)
	case ret != nvml.SUCCESS:
		err = fmt.Errorf("checking MIG mode %s: %w", modeName(want), ret)
	case current != want:
		err = fmt.Errorf("%w: MIG mode %s did not take effect (current %s, pending %s)", ErrPendingReset, modeName(want), modeName(current), modeName(pending))
	default:
		return nil
	}
	if rerr := restore(dev, previous); rerr != nil {
		return errors.Join(err, rerr) // never retried: the GPU is not as before
	}
	if activation == nvml.ERROR_IN_USE {
		// Left pending because the GPU is held; undone, it is a refusal.
		return &InUseError{GPU: uuidOf(dev), Mode: modeName(want)}
	}
	return err
}

// cancelPending asks for the current mode, which cancels a change left
// pending. A GPU another process holds refuses that too; the refusal
// changes nothing, so it is an *InUseError that RetryInUse waits out.
func cancelPending(dev nvml.Device, current int) error {
	err := restore(dev, current)
	if errors.Is(err, nvml.ERROR_IN_USE) {
		return &InUseError{GPU: uuidOf(dev), Mode: modeName(current)}
	}
	return err
}

// restore puts the previous mode back after a change that did not take
// effect, and checks that nothing is left pending: a GPU waiting for a
// reset would switch mode under its next claims at the next reset.
func restore(dev nvml.Device, previous int) error {
	if _, ret := dev.SetMigMode(previous); ret != nvml.SUCCESS {
		return fmt.Errorf("putting MIG mode %s back: %w; the GPU may switch mode at its next reset", modeName(previous), ret)
	}
	current, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("checking MIG mode after putting %s back: %w", modeName(previous), ret)
	}
	if current != previous || pending != previous {
		return fmt.Errorf("putting MIG mode %s back left it %s, pending %s; the GPU may switch mode at its next reset",
			modeName(previous), modeName(current), modeName(pending))
	}
	return nil
}

func uuidOf(dev nvml.Device) string {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return "(UUID unknown)"
	}
	return uuid
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
