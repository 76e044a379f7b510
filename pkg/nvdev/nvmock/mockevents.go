package nvmock

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Event sets of a persistent mock machine: NVML's event delivery (XIDs,
// ECC errors) over the faults file's event log, which mocknvml appends to
// from outside the plugin.

// mockEventSet is one event set: the devices registered on it and how far
// it has read the log.
type mockEventSet struct {
	faults *mockFaults

	mu    sync.Mutex // guards below
	read  uint64     // the seq of the last logged event this set has looked at
	regs  []mockRegistration
	freed bool
}

// mockRegistration is one RegisterEvents call: the device gets the events
// of those types logged after it (after: the log's last seq then), while
// the GPU keeps the binding it had then (mockhandle.go).
type mockRegistration struct {
	dev     nvml.Device
	uuid    string
	types   uint64
	after   uint64
	binding int
}

// createEventSet makes a set that delivers only what is logged from now
// on, as NVML reports only events that happen after registration.
func (f *mockFaults) createEventSet() (nvml.EventSet, nvml.Return) {
	st, err := f.current()
	if err != nil {
		f.report(err)
		return nil, nvml.ERROR_UNKNOWN
	}
	es := &mockEventSet{faults: f, read: st.LastSeq}
	set := &mock.EventSet{WaitFunc: es.wait}
	set.FreeFunc = func() nvml.Return { return f.free(set, es) }
	f.mu.Lock()
	f.sets[set] = es
	f.mu.Unlock()
	return set, nvml.SUCCESS
}

func (f *mockFaults) free(set *mock.EventSet, es *mockEventSet) nvml.Return {
	f.mu.Lock()
	delete(f.sets, set)
	f.mu.Unlock()
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed {
		return nvml.ERROR_UNINITIALIZED
	}
	es.freed = true
	return nvml.SUCCESS
}

// register is a device's RegisterEvents. As NVML: a set this machine did
// not make (or freed) is an invalid argument, an event type the GPU does
// not support is refused, and a lost GPU cannot be registered.
func (f *mockFaults) register(d *server.Device, types uint64, set nvml.EventSet) nvml.Return {
	ms, _ := set.(*mock.EventSet)
	f.mu.Lock()
	es := f.sets[ms]
	f.mu.Unlock()
	if es == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if types&^uint64(mockEventTypes) != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	st, err := f.current()
	if err != nil {
		f.report(err)
		return nvml.ERROR_UNKNOWN
	}
	if st.GPUs[d.UUID].Lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return es.register(mockRegistration{dev: d, uuid: d.UUID, types: types, after: st.LastSeq, binding: f.binding(d.UUID)})
}

// binding is a GPU's binding now; 0 on a machine that models none.
func (f *mockFaults) binding(uuid string) int {
	if f.bindingOf == nil {
		return 0
	}
	return f.bindingOf(uuid)
}

func (es *mockEventSet) register(r mockRegistration) nvml.Return {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	es.regs = append(es.regs, r)
	return nvml.SUCCESS
}

// wait is the set's Wait: the next event for it, rereading the file every
// mockEventPoll until one is logged or the timeout passes.
func (es *mockEventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		if data, ret := es.next(); ret != nvml.ERROR_TIMEOUT {
			return data, ret
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
		time.Sleep(min(mockEventPoll, left))
	}
}

// next takes the next logged event for this set, ERROR_TIMEOUT if there is
// none yet. Events for no device of the set are passed over for good.
func (es *mockEventSet) next() (nvml.EventData, nvml.Return) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed {
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	}
	st, err := es.faults.current()
	if err != nil {
		es.faults.report(err)
		return nvml.EventData{}, nvml.ERROR_UNKNOWN
	}
	if st.LastSeq < es.read {
		es.restartLocked() // the file was deleted and begun again
	}
	for _, ev := range st.Events {
		if ev.Seq <= es.read {
			continue
		}
		es.read = ev.Seq
		if dev := es.receiverLocked(ev); dev != nil {
			return nvml.EventData{Device: dev, EventType: ev.EventType, EventData: ev.Data,
				GpuInstanceId: ev.GpuInstanceID, ComputeInstanceId: ev.ComputeInstanceID}, nvml.SUCCESS
		}
	}
	return nvml.EventData{}, nvml.ERROR_TIMEOUT
}

// restartLocked follows a log that starts again from seq 1: everything in
// it was logged after this set's registrations.
func (es *mockEventSet) restartLocked() {
	es.read = 0
	for i := range es.regs {
		es.regs[i].after = 0
	}
}

// receiverLocked is the registered device an event is for, nil if none.
// A registration made before its GPU was re-bound receives nothing.
func (es *mockEventSet) receiverLocked(ev mockEvent) nvml.Device {
	for _, r := range es.regs {
		if r.uuid == ev.GPU && r.types&ev.EventType != 0 && ev.Seq > r.after && es.faults.binding(r.uuid) == r.binding {
			return r.dev
		}
	}
	return nil
}
