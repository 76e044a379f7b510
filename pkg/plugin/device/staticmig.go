package device

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// staticMIG is a MIG device that exists: the admin's, in static mode
// (mig-manager made it), or the one another claim made, which admin access
// to a dynamic MIG device observes (observedPartition). Preparing it
// changes nothing on the GPU; its container gets it by its own UUID and
// capability nodes.
type staticMIG struct{ inst *mig.Instance }

func (staticMIG) Type() DeviceType { return TypeMIG }

func (staticMIG) ModeName() string { return string(configapi.MigStatic) }

func (staticMIG) PlanSharing(p Planned) (*sharingPlan, error) { return migSharing(p) }

func (staticMIG) ChangesGPU(Planned) bool { return false }

func (staticMIG) SetUp(context.Context, *Env, *Planned, *checkpoint.Claim, int) error {
	return nil
}

func (k staticMIG) CDIDevice(e *Env, p Planned, _ *checkpoint.Device) (cdi.Device, error) {
	return e.migCDIDevice(p, k.inst)
}

func (staticMIG) TearDown(context.Context, *Env, *checkpoint.Claim, int) error { return nil }

func (staticMIG) Adopt(*Env, string, *checkpoint.Device) error { return nil }

func (k staticMIG) MIGScope() *health.MIGScope {
	return &health.MIGScope{GIProfileID: k.inst.GIProfileID, Placement: k.inst.Placement, GIID: k.inst.GIID}
}

// migSharing refuses sharing settings on a MIG device: a MIG device is
// one claim's, and its GPU's settings would apply to its siblings.
func migSharing(p Planned) (*sharingPlan, error) {
	if strategy := p.Config.SharingStrategy(); strategy != configapi.ExclusiveStrategy {
		return nil, fmt.Errorf("sharing strategy %s is not supported on MIG devices", strategy)
	}
	return nil, nil
}

// migCDIDevice is the CDI device of a MIG device: named by its own UUID,
// with the capability nodes that grant access to it.
func (e *Env) migCDIDevice(p Planned, inst *mig.Instance) (cdi.Device, error) {
	d := gpuCDIDevice(p)
	nodes, err := e.capNodes(p.Device.GPU.Minor, inst)
	if err != nil {
		return cdi.Device{}, err
	}
	d.UUID, d.ExtraNodes = inst.UUID, nodes
	return d, nil
}

// capNodes returns the /dev/nvidia-caps nodes that grant access to a MIG
// device. Without the driver's minors file (simulated GPUs) there are none.
func (e *Env) capNodes(gpuMinor int, inst *mig.Instance) ([]mig.CapNode, error) {
	nodes, err := mig.CapDeviceNodes(e.MigCaps, gpuMinor, inst.GIID, inst.CIID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("MIG capability nodes of %s: %w", inst.UUID, err)
	}
	return nodes, nil
}
