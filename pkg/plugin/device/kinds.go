package device

import (
	"context"
	"strings"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// Kind is what one kind of published device does, from its claim's
// plan to its teardown: a whole GPU (wholegpu.go), a static MIG device
// (staticmig.go), a dynamic MIG device or the whole GPU of a dynamic-MIG
// GPU (dynamicmig.go), a time-slice replica (timeslicereplica.go) or a
// memory share (memoryshare.go). Time-slicing and MPS are sharing settings
// that the whole GPU, replica and share kinds hold (sharingplan.go), not
// kinds of their own.
//
// The generic prepare and unprepare (State: locks, record, stage, undo,
// CDI spec, save) never ask which kind a device is; they call these.
type Kind interface {
	// Type is the device's `type` attribute.
	Type() DeviceType
	// ModeName is its GPU's mode as the checkpoint records it
	// (checkpoint.Device.GPUMode), so that a restart keeps a busy GPU's
	// mode (PinModes) and knows how to tear the device down (RecordedKind):
	// "" whole, "static"/"dynamic" MIG, "timeSlicing/<replicas>",
	// "shared", with "/MPS" or "/<interval>" when the GPU's sharing
	// settings are not the default.
	ModeName() string
	// PlanSharing resolves the claim's config to the GPU settings the
	// device needs; nil for none. Every refusal names what to change.
	// Admin access never gets here: it changes no GPU.
	PlanSharing(p Planned) (*sharingPlan, error)
	// ChangesGPU reports whether setting p up may change its GPU, which the
	// record must then say (staged) before it happens.
	ChangesGPU(p Planned) bool
	// SetUp makes p's GPU ready for it, p being device i of rec: creates
	// its MIG device, switches MIG mode, applies its sharing settings. It
	// records in rec what an undo must know, and may replace p.Device with
	// the device as it is now (a re-bound GPU, an observed MIG device).
	SetUp(ctx context.Context, e *Env, p *Planned, rec *checkpoint.Claim, i int) error
	// CDIDevice is p's CDI device: the UUID and nodes a container gets,
	// and its environment and mounts; d is p's record after set-up.
	CDIDevice(e *Env, p Planned, d *checkpoint.Device) (cdi.Device, error)
	// TearDown undoes what SetUp made for device i of rec, as recorded:
	// after a restart only the record is known (see RecordedKind).
	TearDown(ctx context.Context, e *Env, rec *checkpoint.Claim, i int) error
	// Adopt counts again what device d of the claim uid holds on its GPU
	// (after a restart, or after another process changed it).
	Adopt(e *Env, uid string, d *checkpoint.Device) error
	// MIGScope is the MIG device the device stands for, nil for others.
	MIGScope() *health.MIGScope
}

// RecordedKind is the kind a recorded device was prepared as, as far as
// undoing and counting it needs: read from the mode the record names.
// A record that names a MIG device the plugin made (or was about to make)
// is a dynamic MIG device's, whatever else it says. A dynamic-MIG record
// that names none made nothing on the GPU, and is torn down as the whole
// GPU's, which undoes no more than the sharing settings it records.
func RecordedKind(d *checkpoint.Device) Kind {
	switch kind, _, _ := strings.Cut(d.GPUMode, "/"); {
	case d.CreatedMIG != nil || d.MIGIntent != nil:
		return dynamicMIG{}
	case kind == string(configapi.MigStatic):
		return staticMIG{}
	case kind == string(configapi.MigDynamic):
		return dynamicWholeGPU{}
	case kind == modeTimeSlicing:
		return timeSliceReplica{}
	case kind == modeShared:
		return memoryShare{}
	}
	return wholeGPU{}
}

// gpuCDIDevice is the CDI device of a device that is its whole GPU, as a
// container sees it: the GPU's UUID and /dev/nvidia<minor>.
func gpuCDIDevice(p Planned) cdi.Device {
	return cdi.Device{Name: p.Device.Name(), UUID: p.Device.GPU.UUID, Minor: p.Device.GPU.Minor}
}

// The kinds discovery gives the devices it finds; the whole GPU's is
// WholeGPUDevice's, and ReplicaOf and SharedGPU give the sharing kinds.

// StaticMIG is the kind of an existing MIG device inst.
func StaticMIG(inst *mig.Instance) Kind { return staticMIG{inst: inst} }

// DynamicMIG is the kind of a MIG device prepare creates at part.
func DynamicMIG(part *mig.Partition) Kind { return dynamicMIG{part: part} }

// DynamicWholeGPU is the kind of a dynamic-MIG GPU offered whole.
func DynamicWholeGPU() Kind { return dynamicWholeGPU{} }
