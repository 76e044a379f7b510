package plugin

import (
	"fmt"
	"sync"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"k8s.io/apimachinery/pkg/types"
)

// claimIndex is the in-memory view of the prepared claims: which claim holds
// which device. Every operation is O(devices of one claim).
type claimIndex struct {
	mu       sync.Mutex
	claims   map[types.UID]*checkpoint.Claim
	owner    map[string]types.UID // device -> the claim holding it exclusively
	reserved map[string]types.UID // devices of claims being prepared
	devices  int
}

func newClaimIndex() *claimIndex {
	return &claimIndex{
		claims:   map[types.UID]*checkpoint.Claim{},
		owner:    map[string]types.UID{},
		reserved: map[string]types.UID{},
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
func (x *claimIndex) reserve(uid types.UID, plan []plannedDevice) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range plan {
		if !p.exclusive() {
			continue
		}
		name := p.device.Name()
		if other, ok := x.owner[name]; ok && other != uid {
			return fmt.Errorf("device %s is already prepared for claim %s", name, x.describe(other))
		}
		if other, ok := x.reserved[name]; ok && other != uid {
			return fmt.Errorf("device %s is being prepared for claim %s", name, other)
		}
	}
	for _, p := range plan {
		if p.exclusive() {
			x.reserved[p.device.Name()] = uid
		}
	}
	return nil
}

func (x *claimIndex) describe(uid types.UID) string {
	if c := x.claims[uid]; c != nil {
		return fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, uid)
	}
	return string(uid)
}

func (x *claimIndex) release(uid types.UID, plan []plannedDevice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range plan {
		if x.reserved[p.device.Name()] == uid {
			delete(x.reserved, p.device.Name())
		}
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
