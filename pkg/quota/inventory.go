package quota

import (
	resourceapi "k8s.io/api/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// DriverName is the DRA driver whose devices are charged.
const DriverName = "gpu.gpuaas.io"

// DeviceID names a published device.
type DeviceID struct {
	Driver, Pool, Device string
}

// Device is a published device of our driver, with its weight worked out
// once when the inventory is built.
type Device struct {
	ID         DeviceID
	Type       string
	Basic      resourceapi.Device
	Units      Units  // weight of the whole device (a share of a shared device is priced per request)
	Memory     int64  // memory capacity in bytes
	WeightNote string // how Units was found, for logs and tests
}

// Inventory is the set of devices our driver publishes, indexed for
// pricing. It is built from one consistent list of ResourceSlices and never
// changes afterwards.
type Inventory struct {
	driver    string
	devices   map[DeviceID]*Device
	pools     map[string][]*Device // pool (= node) name -> its devices, in slice order
	poolNames []string
	list      []*Device
	maxMemory int64
}

// NewInventory indexes the devices of driver in slices. Of each pool only
// the slices of its newest generation count: older ones are leftovers of a
// republish in progress.
func NewInventory(driver string, slices []*resourceapi.ResourceSlice) *Inventory {
	inv := &Inventory{driver: driver, devices: map[DeviceID]*Device{}, pools: map[string][]*Device{}}
	newest := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == driver && s.Spec.Pool.Generation > newest[s.Spec.Pool.Name] {
			newest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	for _, s := range slices {
		if s.Spec.Driver != driver || s.Spec.Pool.Generation < newest[s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			inv.add(s.Spec.Pool.Name, &s.Spec.Devices[i])
		}
	}
	return inv
}

func (inv *Inventory) add(pool string, d *resourceapi.Device) {
	dev := &Device{ID: DeviceID{Driver: inv.driver, Pool: pool, Device: d.Name}, Basic: *d}
	dev.Type = stringAttr(d, inv.driver, AttrType)
	dev.Units, dev.WeightNote = deviceUnits(d, inv.driver)
	dev.Memory = capacityBytes(d, inv.driver, CapacityMemory)
	if _, seen := inv.devices[dev.ID]; seen {
		return // the same device in two slices is an invalid pool; count it once
	}
	inv.devices[dev.ID] = dev
	if _, ok := inv.pools[pool]; !ok {
		inv.poolNames = append(inv.poolNames, pool)
	}
	inv.pools[pool] = append(inv.pools[pool], dev)
	inv.list = append(inv.list, dev)
	inv.maxMemory = max(inv.maxMemory, dev.Memory)
}

// Driver is the driver the inventory holds devices of.
func (inv *Inventory) Driver() string { return inv.driver }

// Get returns a device, or nil when it is not published.
func (inv *Inventory) Get(id DeviceID) *Device { return inv.devices[id] }

// Devices lists all devices.
func (inv *Inventory) Devices() []*Device { return inv.list }

// Pools lists the pool names in the order first seen.
func (inv *Inventory) Pools() []string { return inv.poolNames }

// Pool lists the devices of one pool.
func (inv *Inventory) Pool(name string) []*Device { return inv.pools[name] }

// MaxMemory is the largest memory capacity of any device: the most one
// device can cost in memory when nothing else is known.
func (inv *Inventory) MaxMemory() int64 { return inv.maxMemory }

// Len is the number of devices.
func (inv *Inventory) Len() int { return len(inv.list) }

// MaxGPUsPerNode is the most whole GPUs one pool (node) publishes: what an
// allocationMode All request can take at most when its class matches
// nothing yet.
func (inv *Inventory) MaxGPUsPerNode() int64 {
	var most int64
	for _, devices := range inv.pools {
		var n int64
		for _, d := range devices {
			if d.Type == string(gpuaas.DeviceTypeGPU) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}
