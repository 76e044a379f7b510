package nvmock

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// A GPU the driver re-binds (after a MIG mode change, mockmigmode.go, or
// from outside, as mig-manager does: RebindGPU) is, to NVML, a device that
// went away and came back. What a handle a process obtained before then
// answers, NVML does not document: nvmlDeviceSetMigMode only says the
// caller "is expected to query such attributes again". The mock takes the
// pessimistic model:
//   - every call on a handle obtained before the re-bind answers
//     staleHandleAnswer, until the process looks the GPU up again (by UUID
//     or index), which hands out a handle of the new binding;
//   - an event registration made before the re-bind no longer delivers the
//     GPU's events; a registration made afresh after it does.
//
// Handles are per binding, so a process that never sees a re-bind sees
// every call answered as before. Only whole GPUs' handles are modelled: MIG
// devices do not outlive a MIG mode change, and the handles the mock hands
// out inside its own answers (an event's device, a MIG device's parent)
// are always current.

// staleHandleAnswer is what a stale handle answers. ERROR_GPU_IS_LOST
// rather than ERROR_INVALID_ARGUMENT: it is the answer that misleads most
// (a caller that takes it at its word taints a healthy GPU as fallen off
// the bus and evicts its pods), so a plugin that survives it survives the
// other too; nvdev treats both alike.
const staleHandleAnswer = nvml.ERROR_GPU_IS_LOST

// wrapHandles makes the machine hand out handles of whole GPUs per binding.
// It wraps the lookups outermost, after mockMachine's and mockFaults'.
func (m *mockMachine) wrapHandles(lookupByUUID *func(string) (nvml.Device, nvml.Return), lookupByIndex *func(int) (nvml.Device, nvml.Return)) {
	byUUID, byIndex := *lookupByUUID, *lookupByIndex
	*lookupByUUID = func(id string) (nvml.Device, nvml.Return) { return m.handleOf(byUUID(id)) }
	*lookupByIndex = func(i int) (nvml.Device, nvml.Return) { return m.handleOf(byIndex(i)) }
	m.faults.bindingOf = m.bindingOf
}

// handleOf is the handle this process hands out for a looked-up device:
// the current binding's for a whole GPU, the device itself otherwise.
func (m *mockMachine) handleOf(dev nvml.Device, ret nvml.Return) (nvml.Device, nvml.Return) {
	if ret != nvml.SUCCESS {
		return dev, ret
	}
	i := slices.IndexFunc(m.gpus, func(g *mockGPU) bool { return nvml.Device(g.d) == dev })
	if i < 0 {
		return dev, ret
	}
	g := m.gpus[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return nil, nvml.ERROR_UNKNOWN
	}
	if g.handle == nil || g.handleBinding != g.binding {
		g.handle, g.handleBinding = m.newHandle(g, g.binding), g.binding
	}
	return g.handle, nvml.SUCCESS
}

// bindingOf is a GPU's binding as the state file holds it now; -1 for a
// GPU the machine does not have or a file it cannot read.
func (m *mockMachine) bindingOf(uuid string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return -1
	}
	for _, g := range m.gpus {
		if g.d.UUID == uuid {
			return g.binding
		}
	}
	return -1
}

// stale tells whether a handle of binding is from before g's last re-bind.
// A state that cannot be read leaves the handle working: the call itself
// then answers what the wrapped functions answer for it.
func (m *mockMachine) stale(g *mockGPU, binding int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return false
	}
	return g.binding != binding
}

// newHandle makes the handle of one binding of g: a go-nvml mock device
// each of whose functions calls g's own method while the binding is the
// GPU's, and answers staleHandleAnswer (with zero values) after. It is
// built over every function the mock device has, so no call slips past.
func (m *mockMachine) newHandle(g *mockGPU, binding int) nvml.Device {
	h := &mock.Device{}
	hv := reflect.ValueOf(h).Elem()
	dv := reflect.ValueOf(g.d)
	for i := range hv.NumField() {
		field := hv.Type().Field(i)
		name, ok := strings.CutSuffix(field.Name, "Func")
		method := dv.MethodByName(name)
		if !ok || field.Type.Kind() != reflect.Func || !method.IsValid() {
			continue
		}
		stale, hasReturn := staleResults(field.Type)
		variadic := field.Type.IsVariadic()
		hv.Field(i).Set(reflect.MakeFunc(field.Type, func(args []reflect.Value) []reflect.Value {
			if hasReturn && m.stale(g, binding) {
				return stale
			}
			if variadic {
				return method.CallSlice(args)
			}
			return method.Call(args)
		}))
	}
	return h
}

var returnType = reflect.TypeFor[nvml.Return]()

// staleResults are what a function of type fn answers on a stale handle:
// zero values, staleHandleAnswer for its nvml.Return. false for a function
// that answers no nvml.Return, which cannot tell a caller so and is
// called through.
func staleResults(fn reflect.Type) ([]reflect.Value, bool) {
	out := make([]reflect.Value, fn.NumOut())
	found := false
	for i := range out {
		t := fn.Out(i)
		out[i] = reflect.Zero(t)
		if t == returnType {
			out[i], found = reflect.ValueOf(staleHandleAnswer), true
		}
	}
	return out, found
}

// RebindGPU re-binds a GPU of the persistent mock machine in dir now, as
// the driver does when mig-manager (or an admin) re-binds it: a new minor
// number, the handles and event registrations of every process made
// before stale. Running plugins see it at their next NVML call.
func RebindGPU(dir, gpu string) error {
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return rewriteMockState(StatePath(dir, ref.machine), func(st *mockState) error {
		at := slices.IndexFunc(st.GPUs, func(g mockGPUState) bool { return g.UUID == ref.uuid })
		if at < 0 {
			return fmt.Errorf("no GPU %s in the state", ref.uuid)
		}
		minors := make([]int, len(st.GPUs))
		for i, g := range st.GPUs {
			minors[i] = i // the machine's first minors are the GPUs' indexes
			if g.Minor != nil {
				minors[i] = *g.Minor
			}
		}
		minor := nextMinor(minors, at)
		st.GPUs[at].Minor = &minor
		st.GPUs[at].Binding++
		return nil
	})
}
