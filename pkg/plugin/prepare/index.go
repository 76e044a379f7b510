package prepare

import (
	"fmt"
	"sync"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"k8s.io/apimachinery/pkg/types"
)

// claimIndex is the in-memory view of the prepared claims: which claim holds
// which device. Every operation is O(devices of one claim).
type claimIndex struct {
	mu       sync.Mutex
	claims   map[types.UID]*checkpoint.Claim
	owner    map[string]types.UID // device -> the claim holding it exclusively
	reserved map[string]types.UID // devices of claims being prepared
	// modes are the claims holding (or being prepared on) each GPU, by the
	// GPU's mode they hold it in: GPU UUID -> mode -> claim -> a device.
	// Admin access (monitoring) is not a hold.
	modes   map[string]map[string]map[types.UID]string
	devices int
}

func newClaimIndex() *claimIndex {
	return &claimIndex{
		claims:   map[types.UID]*checkpoint.Claim{},
		owner:    map[string]types.UID{},
		reserved: map[string]types.UID{},
		modes:    map[string]map[string]map[types.UID]string{},
	}
}

func (x *claimIndex) get(uid types.UID) *checkpoint.Claim {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.claims[uid]
}

// reserve refuses a device that another claim holds: Kubernetes should never
// allocate it twice, and the driver is the last line of defence. Admin
// access (monitoring) and multi-allocatable devices (shares) are exempt.
// It also refuses a device of a GPU that another claim holds in another
// mode (whole gpu-3 and replica gpu-3-ts-0 are one GPU): during a
// node-config rollout the old instance may prepare a name the new one no
// longer publishes, and a replacement claim may come while the record of
// the claim it replaces still holds the GPU.
func (x *claimIndex) reserve(uid types.UID, plan []device.Planned) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range plan {
		if err := x.otherMode(uid, p); err != nil {
			return err
		}
		if !p.Exclusive() {
			continue
		}
		name := p.Device.Name()
		if other, ok := x.owner[name]; ok && other != uid {
			return fmt.Errorf("device %s is already prepared for claim %s", name, x.describe(other))
		}
		if other, ok := x.reserved[name]; ok && other != uid {
			return fmt.Errorf("device %s is being prepared for claim %s", name, other)
		}
	}
	for _, p := range plan {
		if p.Exclusive() {
			x.reserved[p.Device.Name()] = uid
		}
		if !p.AdminAccess() {
			x.hold(p.Device.GPU.UUID, p.Device.Kind.ModeName(), uid, p.Device.Name())
		}
	}
	return nil
}

// otherMode refuses p when another claim holds p's GPU in another mode.
func (x *claimIndex) otherMode(uid types.UID, p device.Planned) error {
	if p.AdminAccess() {
		return nil
	}
	mine := p.Device.Kind.ModeName()
	for mode, holders := range x.modes[p.Device.GPU.UUID] {
		if mode == mine {
			continue
		}
		for other, dev := range holders {
			if other != uid {
				return fmt.Errorf("GPU %d is held by claim %s as device %s (%s); device %s (%s) of this claim is another mode of it: "+
					"a GPU has one owner, so this claim is refused until that one is unprepared",
					p.Device.GPU.Index, x.describe(other), dev, modeLabel(mode), p.Device.Name(), modeLabel(mine))
			}
		}
	}
	return nil
}

// modeLabel names a recorded GPU mode in a message.
func modeLabel(mode string) string {
	if mode == "" {
		return "whole GPU"
	}
	return mode
}

// hold records that claim uid holds device dev of the GPU in mode.
func (x *claimIndex) hold(gpu, mode string, uid types.UID, dev string) {
	byMode := x.modes[gpu]
	if byMode == nil {
		byMode = map[string]map[types.UID]string{}
		x.modes[gpu] = byMode
	}
	if byMode[mode] == nil {
		byMode[mode] = map[types.UID]string{}
	}
	byMode[mode][uid] = dev
}

// unhold forgets claim uid's hold of the GPU in mode.
func (x *claimIndex) unhold(gpu, mode string, uid types.UID) {
	byMode := x.modes[gpu]
	delete(byMode[mode], uid)
	if len(byMode[mode]) == 0 {
		delete(byMode, mode)
	}
	if len(byMode) == 0 {
		delete(x.modes, gpu)
	}
}

func (x *claimIndex) describe(uid types.UID) string {
	if c := x.claims[uid]; c != nil {
		return fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, uid)
	}
	return string(uid)
}

func (x *claimIndex) release(uid types.UID, plan []device.Planned) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range plan {
		if x.reserved[p.Device.Name()] == uid {
			delete(x.reserved, p.Device.Name())
		}
		x.unhold(p.Device.GPU.UUID, p.Device.Kind.ModeName(), uid)
	}
}

// add records a prepared claim, turning its reservations into ownership.
func (x *claimIndex) add(c *checkpoint.Claim) {
	x.mu.Lock()
	defer x.mu.Unlock()
	uid := types.UID(c.UID)
	x.claims[uid] = c
	x.devices += len(c.Devices)
	for _, d := range c.Devices {
		if x.reserved[d.Device] == uid {
			delete(x.reserved, d.Device)
		}
		if !d.AdminAccess && !d.Shared {
			x.owner[d.Device] = uid
		}
		if !d.AdminAccess {
			x.hold(d.GPUUUID, d.GPUMode, uid, d.Device)
		}
	}
}

func (x *claimIndex) remove(c *checkpoint.Claim) {
	x.mu.Lock()
	defer x.mu.Unlock()
	uid := types.UID(c.UID)
	if _, ok := x.claims[uid]; !ok {
		return
	}
	delete(x.claims, uid)
	x.devices -= len(c.Devices)
	for _, d := range c.Devices {
		if x.owner[d.Device] == uid {
			delete(x.owner, d.Device)
		}
		x.unhold(d.GPUUUID, d.GPUMode, uid)
	}
}

func (x *claimIndex) counts() (claims, devices int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.claims), x.devices
}

func (x *claimIndex) list() []*checkpoint.Claim {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*checkpoint.Claim, 0, len(x.claims))
	for _, c := range x.claims {
		out = append(out, c)
	}
	return out
}

// reload replaces what the index knows of the given GPUs by the records
// on them it keeps (see indexed), after another process changed their
// claims.
func (x *claimIndex) reload(gpus []string, records []*checkpoint.Claim) {
	on := toSet(gpus)
	for _, c := range x.list() {
		if touches(c, on) {
			x.remove(c)
		}
	}
	for _, c := range records {
		if indexed(c) && touches(c, on) {
			x.add(c)
		}
	}
}

// indexed reports whether the index keeps a record: a prepared claim, or
// one lost in a reboot, which still holds its devices in the cluster's
// eyes until it is unprepared (and is cleaned up if deleted meanwhile).
func indexed(c *checkpoint.Claim) bool {
	return c.State == checkpoint.PrepareCompleted || c.State == checkpoint.PrepareLost
}

// touches reports whether a claim has a device on one of the GPUs.
func touches(c *checkpoint.Claim, gpus map[string]bool) bool {
	for _, d := range c.Devices {
		if gpus[d.GPUUUID] {
			return true
		}
	}
	return false
}

func toSet(keys []string) map[string]bool {
	out := make(map[string]bool, len(keys))
	for _, k := range keys {
		out[k] = true
	}
	return out
}
