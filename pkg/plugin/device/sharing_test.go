package device

import (
	"strings"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

func TestSharingOnMIGRefused(t *testing.T) {
	p := Planned{Device: &AllocatableDevice{Kind: staticMIG{}},
		Config: &configapi.MigConfig{Sharing: &configapi.Sharing{Strategy: configapi.TimeSlicingStrategy}}}
	if _, err := p.Device.Kind.PlanSharing(p); err == nil || !strings.Contains(err.Error(), "not supported on MIG devices") {
		t.Errorf("err = %v", err)
	}
}
