package nvmock

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// wrapServer wraps every mock function that reads or changes what the
// state file keeps. Functions that only delegate to wrapped ones (the
// mock's CreateGpuInstance tries CreateGpuInstanceWithPlacement) are left
// alone: wrapping both would take the machine's lock twice.
func (m *mockMachine) wrapServer(s *server.Server) {
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		g := &mockGPU{d: d, createGIAt: d.CreateGpuInstanceWithPlacementFunc,
			getComputeMode: d.GetComputeModeFunc, setComputeMode: d.SetComputeModeFunc, setMigMode: d.SetMigModeFunc}
		m.gpus = append(m.gpus, g)
		m.wrapDeviceChanges(g)
		m.wrapDeviceReads(g)
		m.wrapMemoryLimits(s, g)
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byUUID(id) // MIG devices another process made are found too
	}
	shutdown := s.ShutdownFunc
	s.ShutdownFunc = func() nvml.Return {
		m.shutdown()
		return shutdown()
	}
	m.faults.wrapServer(s)
	completeUse(s, m, m.faults)
	m.wrapHandles(&s.DeviceGetHandleByUUIDFunc, &s.DeviceGetHandleByIndexFunc)
}

func (m *mockMachine) wrapDeviceChanges(g *mockGPU) {
	d := g.d
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) { return m.setMigMode(g, mode) }
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		var gi nvml.GpuInstance
		ret := m.change(func() nvml.Return {
			var r nvml.Return
			if gi, r = g.createGIAt(info, pl); r == nvml.SUCCESS {
				m.adoptGI(gi.(*server.GpuInstance))
			}
			return r
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return gi, ret
	}
	d.SetComputeModeFunc = func(mode nvml.ComputeMode) nvml.Return {
		return m.change(func() nvml.Return { return g.setComputeMode(mode) })
	}
}

func (m *mockMachine) wrapDeviceReads(g *mockGPU) {
	d := g.d
	d.GetMigModeFunc = func() (int, int, nvml.Return) { return m.migMode(g) }
	d.GetMinorNumberFunc = func() (int, nvml.Return) {
		if !m.fresh() {
			return 0, nvml.ERROR_UNKNOWN
		}
		d.RLock()
		defer d.RUnlock()
		return d.Minor, nvml.SUCCESS
	}
	getCompute := d.GetComputeModeFunc
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		if !m.fresh() {
			return 0, nvml.ERROR_UNKNOWN
		}
		return getCompute()
	}
	getGIs := d.GetGpuInstancesFunc
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return getGIs(info)
	}
	giByID := d.GetGpuInstanceByIdFunc
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return giByID(id)
	}
	migByIndex := d.GetMigDeviceHandleByIndexFunc
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return migByIndex(i)
	}
}

// adoptGI wraps a GPU instance made in this process, by a call or from the
// state file. The caller holds m.mu.
func (m *mockMachine) adoptGI(gi *server.GpuInstance) *mockGI {
	g := &mockGI{gi: gi, createCI: gi.CreateComputeInstanceFunc}
	m.gis[gi] = g
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		var ci nvml.ComputeInstance
		ret := m.change(func() nvml.Return {
			var r nvml.Return
			if ci, r = g.createCI(info); r == nvml.SUCCESS {
				m.adoptCI(ci.(*server.ComputeInstance))
			}
			return r
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return ci, ret
	}
	destroy := gi.DestroyFunc
	gi.DestroyFunc = func() nvml.Return {
		return m.change(func() nvml.Return {
			r := destroy()
			if r == nvml.SUCCESS {
				delete(m.gis, gi)
			}
			return r
		})
	}
	m.wrapGIReads(gi)
	m.faults.guardDestroy(gi.Info.Device, &gi.DestroyFunc)
	return g
}

func (m *mockMachine) wrapGIReads(gi *server.GpuInstance) {
	getCIs := gi.GetComputeInstancesFunc
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return getCIs(info)
	}
	ciByID := gi.GetComputeInstanceByIdFunc
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		if !m.fresh() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return ciByID(id)
	}
}

// adoptCI wraps a compute instance made in this process. The caller holds
// m.mu.
func (m *mockMachine) adoptCI(ci *server.ComputeInstance) {
	destroy := ci.DestroyFunc
	ci.DestroyFunc = func() nvml.Return { return m.change(destroy) }
	m.faults.guardDestroy(ci.Info.Device, &ci.DestroyFunc)
}
