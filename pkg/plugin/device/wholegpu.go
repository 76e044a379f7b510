package device

import (
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// wholeGPU is a GPU offered whole (WholeGPUDevice). Set-up changes nothing
// but the sharing settings its claim's config asks for: a whole GPU is one
// claim's, so its settings are the claim's.
type wholeGPU struct{ holdsSetting }

func (wholeGPU) Type() DeviceType { return TypeGPU }

func (wholeGPU) ModeName() string { return "" }

func (wholeGPU) PlanSharing(p Planned) (*sharingPlan, error) {
	switch strategy := p.Config.SharingStrategy(); strategy {
	case configapi.ExclusiveStrategy:
		return nil, nil
	case configapi.MPSStrategy:
		return planMPS(p, int64(p.Device.GPU.MemoryBytes))
	default:
		return &sharingPlan{settings: timeslice.Settings{Strategy: strategy, Interval: claimInterval(p.Config)}}, nil
	}
}
