package nvdev

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:18:00.0":     "0000:18:00.0",
		"3b:00.0":          "3b:00.0",
	} {
		if got := normalizeBusID(in); got != want {
			t.Errorf("normalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// What a node with a driver but no kernel module shows at start: NVML's
// answer and what to do, in one error.
func TestInitFailureSaysWhatToDo(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	_, err := open(lib, sysfsTopology{})
	if !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) || !strings.Contains(err.Error(), "kernel module") {
		t.Fatalf("open = %v, want NVML's answer and a hint about the kernel module", err)
	}
}
