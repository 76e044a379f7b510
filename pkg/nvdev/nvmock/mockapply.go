package nvmock

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// apply makes the machine in memory what a state says, changing only what
// differs: instances that stay keep their objects, so handles the plugin
// holds stay valid, and those another process destroyed answer NOT_FOUND
// from then on, as a real GPU's would.
func (m *mockMachine) apply(st *mockState) error {
	if len(st.GPUs) != len(m.gpus) {
		return fmt.Errorf("mock machine state %s has %d GPUs, the machine %d", m.path, len(st.GPUs), len(m.gpus))
	}
	for i, g := range m.gpus {
		if err := m.applyGPU(g, st.GPUs[i]); err != nil {
			return fmt.Errorf("restoring GPU %d (%s) from %s: %w", i, g.d.UUID, m.path, err)
		}
	}
	return nil
}

func (m *mockMachine) applyGPU(g *mockGPU, st mockGPUState) error {
	if st.UUID != g.d.UUID {
		return fmt.Errorf("the state names GPU %s here", st.UUID)
	}
	kept := m.dropGIs(g.d, st.GIs)
	// Set directly: SetMigMode refuses to disable MIG while instances
	// exist, and here the state already says which exist.
	g.d.Lock()
	g.d.MigMode = st.MigMode
	g.d.Minor = g.d.Index
	if st.Minor != nil {
		g.d.Minor = *st.Minor
	}
	g.d.Unlock()
	g.pending, g.binding, g.memoryLimits = st.PendingMigMode, st.Binding, st.MemoryLimits
	g.use, g.procs = st.Use, st.Processes
	if ret := g.setComputeMode(st.ComputeMode); ret != nvml.SUCCESS {
		return fmt.Errorf("setting compute mode %d: %w", st.ComputeMode, ret)
	}
	for _, gst := range st.GIs {
		gi, ok := kept[gst.ID]
		if !ok {
			var err error
			if gi, err = m.restoreGI(g, gst); err != nil {
				return err
			}
		}
		m.giOf(gi).use = gst.Use
		if err := m.applyCIs(m.giOf(gi), gst); err != nil {
			return fmt.Errorf("GPU instance %d: %w", gst.ID, err)
		}
	}
	g.d.Lock()
	g.d.GpuInstanceCounter = st.NextGIID
	g.d.Unlock()
	return nil
}

// giOf returns a GPU instance with its unwrapped functions, wrapping one
// made past the wrappers (by a test on the mock's own functions).
func (m *mockMachine) giOf(gi *server.GpuInstance) *mockGI {
	if g, ok := m.gis[gi]; ok {
		return g
	}
	return m.adoptGI(gi)
}

// dropGIs removes the GPU instances the state does not name and returns
// the others by ID.
func (m *mockMachine) dropGIs(d *server.Device, want []mockGIState) map[uint32]*server.GpuInstance {
	byID := map[uint32]mockGIState{}
	for _, st := range want {
		byID[st.ID] = st
	}
	kept := map[uint32]*server.GpuInstance{}
	d.Lock()
	defer d.Unlock()
	for gi := range d.GpuInstances {
		if st, ok := byID[gi.Info.Id]; ok && sameGI(gi, st) {
			kept[gi.Info.Id] = gi
			continue
		}
		delete(d.GpuInstances, gi)
		delete(m.gis, gi)
	}
	return kept
}

// restoreGI makes a GPU instance again with its recorded ID, through the
// mock's own creation (and migtest's checks), by setting the ID counter
// that creation takes its ID from. The caller holds m.mu, which every
// creation in this process takes, so nothing else moves the counter.
func (m *mockMachine) restoreGI(g *mockGPU, st mockGIState) (*server.GpuInstance, error) {
	info, ok := g.d.Config.MIGProfiles.GpuInstanceProfiles[int(st.ProfileID)]
	if !ok {
		return nil, fmt.Errorf("GPU instance %d has profile %d, which this GPU does not have", st.ID, st.ProfileID)
	}
	g.d.Lock()
	g.d.GpuInstanceCounter = st.ID
	g.d.Unlock()
	pl := nvml.GpuInstancePlacement{Start: st.Start, Size: st.Size}
	gi, ret := g.createGIAt(&info, &pl)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("recreating GPU instance %d (profile %d at memory slice %d): %w", st.ID, st.ProfileID, st.Start, ret)
	}
	sgi := gi.(*server.GpuInstance)
	m.adoptGI(sgi)
	return sgi, nil
}

func (m *mockMachine) applyCIs(g *mockGI, st mockGIState) error {
	kept := dropCIs(g.gi, st.CIs)
	for _, cst := range st.CIs {
		if kept[cst.ID] {
			continue
		}
		if err := m.restoreCI(g, cst); err != nil {
			return err
		}
	}
	g.gi.Lock()
	g.gi.ComputeInstanceCounter = st.NextCIID
	g.gi.Unlock()
	return nil
}

func dropCIs(gi *server.GpuInstance, want []mockCIState) map[uint32]bool {
	profiles := map[uint32]uint32{}
	for _, st := range want {
		profiles[st.ID] = st.ProfileID
	}
	kept := map[uint32]bool{}
	gi.Lock()
	defer gi.Unlock()
	for ci := range gi.ComputeInstances {
		if p, ok := profiles[ci.Info.Id]; ok && p == ci.Info.ProfileId {
			kept[ci.Info.Id] = true
			continue
		}
		delete(gi.ComputeInstances, ci)
	}
	return kept
}

func (m *mockMachine) restoreCI(g *mockGI, st mockCIState) error {
	info, ok := g.gi.MIGProfiles.ComputeInstanceProfiles[int(g.gi.Info.ProfileId)][int(st.ProfileID)]
	if !ok {
		return fmt.Errorf("compute instance %d has profile %d, which its GPU instance does not have", st.ID, st.ProfileID)
	}
	g.gi.Lock()
	g.gi.ComputeInstanceCounter = st.ID
	g.gi.Unlock()
	ci, ret := g.createCI(&info)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("recreating compute instance %d (profile %d): %w", st.ID, st.ProfileID, ret)
	}
	m.adoptCI(ci.(*server.ComputeInstance))
	return nil
}
