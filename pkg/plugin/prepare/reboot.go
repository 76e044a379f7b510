package prepare

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// DefaultBootIDPath is where Linux gives the ID of the current boot.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// ErrLostInReboot: a claim's devices were lost in a node reboot and could
// not be set up again.
var ErrLostInReboot = errors.New("what the claim was prepared with was lost in a node reboot and could not be set up again")

func readBootID(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// fromOtherBoot reports whether a record's MIG devices, sharing settings
// and CDI spec were made in an earlier boot: a reboot took them all (the
// spec only where the CDI root is a tmpfs, but it names MIG devices that
// are gone). A record or a boot ID that is not known counts as this boot,
// so that nothing in force is made twice.
func (s *State) fromOtherBoot(rec *checkpoint.Claim) bool {
	return s.bootID != "" && rec.BootID != "" && rec.BootID != s.bootID
}

// forgetReboot drops from the records of an earlier boot what the reboot
// took, and returns the records whose promises are to be made good again
// (see reestablishAll): those completed in an earlier boot, now recorded
// as ReestablishStarted in this one, and those a re-establishment cut
// short in this boot left. An interrupted prepare of an earlier boot keeps
// nothing to undo but its files.
func (s *State) forgetReboot(ctx context.Context, records []*checkpoint.Claim) []*checkpoint.Claim {
	var out []*checkpoint.Claim
	for _, rec := range records {
		switch {
		case rec.State == checkpoint.ReestablishStarted && !s.fromOtherBoot(rec):
			out = append(out, rec)
		case !s.fromOtherBoot(rec) || rec.State == checkpoint.PrepareLost:
		case rec.State == checkpoint.PrepareStarted:
			forgetVolatile(rec, true)
		default:
			forgetVolatile(rec, false)
			rec.State, rec.BootID = checkpoint.ReestablishStarted, s.bootID
			if err := s.env.Store.Save(rec); err != nil {
				klog.FromContext(ctx).Error(err, "Recording a claim prepared before the node rebooted", "claimUID", rec.UID)
				continue
			}
			out = append(out, rec)
		}
	}
	return out
}

// forgetVolatile drops the MIG devices a record names, and its sharing
// settings if it is not to apply them again: the reboot destroyed the
// devices and reset the settings, and none of it is to be undone.
func forgetVolatile(rec *checkpoint.Claim, sharing bool) {
	for i := range rec.Devices {
		d := &rec.Devices[i]
		d.CreatedMIG, d.MIGIntent = nil, nil
		if sharing {
			d.Sharing, d.MPSLimits = nil, nil
		}
	}
}

// reestablishAll makes good again what the records promise: their MIG
// devices, sharing settings and CDI specs, through the code that prepared
// them, so that the kubelet's re-prepare, or a container it restarts from
// the CDI device IDs it kept, gets working devices. A claim that cannot be
// set up again loses its promise (dropPromise). What an interrupted
// re-establishment made is torn down first, for every record before any is
// set up, so that no GPU still counts a holder when its settings are
// applied again.
func (s *State) reestablishAll(ctx context.Context, records []*checkpoint.Claim) {
	logger := klog.FromContext(ctx)
	var ready []*checkpoint.Claim
	for _, rec := range records {
		if err := s.tearDown(ctx, rec); err != nil {
			logger.Error(err, "Undoing an interrupted re-establishment; tried again at the next start", "claimUID", rec.UID)
			continue
		}
		ready = append(ready, rec)
	}
	// Admin access observes the MIG devices that other claims make.
	slices.SortStableFunc(ready, func(a, b *checkpoint.Claim) int {
		return cmp.Compare(adminCount(a), adminCount(b))
	})
	for i, rec := range ready {
		s.steps.Step(ctx, fmt.Sprintf("re-establishing prepared claim %d of %d after a reboot", i+1, len(ready)))
		if err := s.reestablish(ctx, rec); err != nil {
			s.dropPromise(ctx, rec, err)
		}
	}
}

func adminCount(rec *checkpoint.Claim) int {
	n := 0
	for _, d := range rec.Devices {
		if d.AdminAccess {
			n++
		}
	}
	return n
}

// reestablish sets a recorded claim up again as prepare did: MIG devices
// made at their recorded placements, sharing settings applied, CDI spec
// written (with the same device IDs, which the kubelet keeps).
func (s *State) reestablish(ctx context.Context, rec *checkpoint.Claim) error {
	plan, err := s.planFromRecord(rec)
	if err != nil {
		return err
	}
	if err := s.setUpAll(ctx, plan, rec); err != nil {
		return err
	}
	if err := s.writeSpec(plan, rec); err != nil {
		return err
	}
	rec.State = checkpoint.PrepareCompleted
	if err := s.env.Store.Save(rec); err != nil {
		return err
	}
	s.index.add(rec)
	klog.FromContext(ctx).Info("Set up a claim again after the node rebooted", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", rec.UID)
	return nil
}

// planFromRecord is the plan a record was prepared from, as far as setting
// it up needs: each device as this node offers it now (its name is stable
// across restarts, and a busy GPU keeps its mode), with its recorded
// sharing settings.
func (s *State) planFromRecord(rec *checkpoint.Claim) ([]device.Planned, error) {
	plan := make([]device.Planned, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		dev, ok := s.DeviceMap()[d.Device]
		if !ok {
			return nil, fmt.Errorf("device %s is no longer offered by this node", d.Device)
		}
		if dev.GPU.UUID != d.GPUUUID {
			return nil, fmt.Errorf("device %s is now on GPU %s, not %s", d.Device, dev.GPU.UUID, d.GPUUUID)
		}
		plan = append(plan, device.Planned{Device: dev, Result: resourceapi.DeviceRequestAllocationResult{
			Pool: d.Pool, Device: d.Device, AdminAccess: ptr.To(d.AdminAccess),
		}, Sharing: device.RecordedSharing(&d)})
	}
	return plan, nil
}

// dropPromise gives up on a claim that cannot be set up again: what the
// attempt made is torn down and the CDI spec deleted (a container started
// from it would get a device that is gone, or none), and the record says
// why, so that the claim's next prepare fails saying so. A teardown that
// fails keeps the record as it is, for the next start.
func (s *State) dropPromise(ctx context.Context, rec *checkpoint.Claim, cause error) {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", rec.UID)
	logger.Error(cause, "A claim's devices were lost in the node reboot and cannot be set up again; its next prepare fails")
	if err := s.tearDown(ctx, rec); err != nil {
		logger.Error(err, "Undoing the attempt to set the claim up again")
		return
	}
	if err := s.cdi.DeleteClaimSpec(rec.UID); err != nil {
		logger.Error(err, "Deleting the CDI spec of a claim lost in the reboot")
	}
	forgetVolatile(rec, true)
	rec.State, rec.Lost = checkpoint.PrepareLost, cause.Error()
	if err := s.env.Store.Save(rec); err != nil {
		logger.Error(err, "Recording a claim lost in the reboot")
		return
	}
	s.index.add(rec)
}
