package nvmock

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Per-cgroup device-memory limits, as NVIDIA's driver r615 and later keep
// them (nvmlDeviceSetMemoryLimits_v1, nvml.h): per GPU and cgroup, while
// the driver is loaded, set by root only, refused on MIG handles
// (migtest's MIG handles answer NOT_SUPPORTED) and on older drivers. A
// persistent machine keeps them in its state file (mockGPUState), so the
// limit NVIDIA's hook sets in its own process is read back by another.

// memoryLimitDriver is the first driver branch with per-cgroup limits.
const memoryLimitDriver = 615

// mockMemoryLimit is one cgroup's limits on one GPU, in bytes.
type mockMemoryLimit struct {
	Cgroup string `json:"cgroup"`
	Soft   uint64 `json:"soft"`
	Hard   uint64 `json:"hard"`
}

// mockIsRoot tells whether the caller may set limits; tests replace it.
var mockIsRoot = func() bool { return os.Geteuid() == 0 }

// setMemoryLimit applies one SetMemoryLimits_v1 call to limits (one GPU's,
// sorted by cgroup) as the driver checks it, and returns the new limits.
func setMemoryLimit(limits []mockMemoryLimit, driver string, total uint64, cgroup string, soft, hard uint64) ([]mockMemoryLimit, nvml.Return) {
	if ret := memoryLimitsSupported(driver, cgroup); ret != nvml.SUCCESS {
		return limits, ret
	}
	if !mockIsRoot() {
		return limits, nvml.ERROR_NO_PERMISSION
	}
	clearing := soft == 0 && hard == nvml.DEVICE_MEMORY_LIMIT_MAX
	if !clearing && (soft > hard || soft > total || (hard > total && hard != nvml.DEVICE_MEMORY_LIMIT_MAX)) {
		return limits, nvml.ERROR_INVALID_ARGUMENT
	}
	out := slices.DeleteFunc(slices.Clone(limits), func(l mockMemoryLimit) bool { return l.Cgroup == cgroup })
	if !clearing {
		out = append(out, mockMemoryLimit{Cgroup: cgroup, Soft: soft, Hard: hard})
		slices.SortFunc(out, func(a, b mockMemoryLimit) int { return cmp.Compare(a.Cgroup, b.Cgroup) })
	}
	return out, nvml.SUCCESS
}

// getMemoryLimit answers GetMemoryLimits_v1 from one GPU's limits: none
// used (no process of the mock allocates).
func getMemoryLimit(limits []mockMemoryLimit, driver, cgroup string) (nvml.MemoryLimits_v1, nvml.Return) {
	if ret := memoryLimitsSupported(driver, cgroup); ret != nvml.SUCCESS {
		return nvml.MemoryLimits_v1{}, ret
	}
	at := slices.IndexFunc(limits, func(l mockMemoryLimit) bool { return l.Cgroup == cgroup })
	if at < 0 {
		return nvml.MemoryLimits_v1{}, nvml.ERROR_NOT_FOUND
	}
	return nvml.MemoryLimits_v1{NameSpace: cgroup, SoftLimit: limits[at].Soft, HardLimit: limits[at].Hard}, nvml.SUCCESS
}

// memoryLimitsSupported is what both calls check first: the driver's
// branch, then the cgroup (a directory the driver opens).
func memoryLimitsSupported(driver, cgroup string) nvml.Return {
	major, _, _ := strings.Cut(driver, ".")
	if n, err := strconv.Atoi(major); err != nil || n < memoryLimitDriver {
		return nvml.ERROR_NOT_SUPPORTED
	}
	if cgroup == "" || !filepath.IsAbs(cgroup) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if st, err := os.Stat(cgroup); err != nil || !st.IsDir() {
		return nvml.ERROR_OPERATING_SYSTEM
	}
	return nvml.SUCCESS
}

// completeMemoryLimits gives a machine kept in memory the calls, each GPU
// keeping its limits in memory. A persistent machine replaces them
// (wrapMemoryLimits).
func completeMemoryLimits(s *server.Server) {
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		var mu sync.Mutex
		var limits []mockMemoryLimit
		d.SetMemoryLimits_v1Func = func(cgroup string, soft, hard uint64) nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			var ret nvml.Return
			limits, ret = setMemoryLimit(limits, s.DriverVersion, d.MemoryInfo.Total, cgroup, soft, hard)
			return ret
		}
		d.GetMemoryLimits_v1Func = func(cgroup string) (nvml.MemoryLimits_v1, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return getMemoryLimit(limits, s.DriverVersion, cgroup)
		}
	}
}

// wrapMemoryLimits keeps g's limits as machine state: set under the state
// file's lock and recorded before the call returns, read from the state
// as another process may have set them.
func (m *mockMachine) wrapMemoryLimits(s *server.Server, g *mockGPU) {
	d := g.d
	d.SetMemoryLimits_v1Func = func(cgroup string, soft, hard uint64) nvml.Return {
		return m.change(func() nvml.Return {
			var ret nvml.Return
			g.memoryLimits, ret = setMemoryLimit(g.memoryLimits, s.DriverVersion, d.MemoryInfo.Total, cgroup, soft, hard)
			return ret
		})
	}
	d.GetMemoryLimits_v1Func = func(cgroup string) (nvml.MemoryLimits_v1, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if err := m.syncLocked(); err != nil {
			m.report(err)
			return nvml.MemoryLimits_v1{}, nvml.ERROR_UNKNOWN
		}
		return getMemoryLimit(g.memoryLimits, s.DriverVersion, cgroup)
	}
}
