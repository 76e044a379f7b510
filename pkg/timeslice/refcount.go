package timeslice

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// Settings are what a claim needs applied to its GPU. They are per GPU:
// every claim on a GPU must want the same, since a GPU has one interval and
// either runs an MPS daemon or not.
type Settings struct {
	Strategy configapi.SharingStrategy   `json:"strategy"`
	Interval configapi.TimeSliceInterval `json:"interval,omitempty"`
}

// GPUSettings are the settings a time-sliced or shared GPU's node
// configuration gives it: TimeSlicing with its interval (defaulted), or MPS.
func GPUSettings(strategy configapi.SharingStrategy, interval configapi.TimeSliceInterval) Settings {
	if strategy == configapi.MPSStrategy {
		return Settings{Strategy: configapi.MPSStrategy}
	}
	return Settings{Strategy: configapi.TimeSlicingStrategy, Interval: interval.OrDefault()}
}

// String is how settings appear in errors.
func (s Settings) String() string {
	if s.Strategy == configapi.TimeSlicingStrategy {
		return fmt.Sprintf("%s (interval %s)", s.Strategy, s.Interval.OrDefault())
	}
	return string(s.Strategy)
}

// same compares settings with the interval defaulted.
func (s Settings) same(o Settings) bool {
	return s.Strategy == o.Strategy && s.Interval.OrDefault() == o.Interval.OrDefault()
}

// ErrConflict: the GPU is held with other settings.
var ErrConflict = errors.New("conflicting sharing settings")

// Backend changes a GPU's settings. Apply runs for the first holder,
// Ensure for each later one (e.g. an MPS daemon health check), Reset when
// the last holder is gone.
type Backend interface {
	Apply(ctx context.Context, gpu string, s Settings) error
	Ensure(ctx context.Context, gpu string, s Settings) error
	Reset(ctx context.Context, gpu string, s Settings) error
}

// gpuState is one GPU's settings in force and who holds them.
type gpuState struct {
	settings Settings
	holders  map[string]bool
}

// Manager reference-counts the settings of each GPU. Callers serialise
// calls for one GPU (the plugin's per-GPU lock); the map has its own lock
// so different GPUs proceed in parallel.
type Manager struct {
	backend Backend
	mu      sync.Mutex
	gpus    map[string]*gpuState
}

// NewManager returns a Manager with nothing held.
func NewManager(b Backend) *Manager { return &Manager{backend: b, gpus: map[string]*gpuState{}} }

func (m *Manager) state(gpu string) *gpuState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gpus[gpu]
}

func (m *Manager) set(gpu string, st *gpuState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st == nil {
		delete(m.gpus, gpu)
		return
	}
	m.gpus[gpu] = st
}

// Acquire makes holder a holder of s on gpu, applying s if it is the first.
// Holding twice is a no-op, so a retried prepare is safe.
func (m *Manager) Acquire(ctx context.Context, gpu, holder string, s Settings) error {
	st := m.state(gpu)
	if st == nil {
		if err := m.backend.Apply(ctx, gpu, s); err != nil {
			return fmt.Errorf("applying %s to GPU %s: %w", s, gpu, err)
		}
		m.set(gpu, &gpuState{settings: s, holders: map[string]bool{holder: true}})
		return nil
	}
	if !st.settings.same(s) {
		return fmt.Errorf("%w: GPU %s runs %s for %d claim(s) (%v); this claim asks for %s",
			ErrConflict, gpu, st.settings, len(st.holders), st.sortedHolders(), s)
	}
	if err := m.backend.Ensure(ctx, gpu, st.settings); err != nil {
		return fmt.Errorf("checking %s on GPU %s: %w", st.settings, gpu, err)
	}
	m.mu.Lock()
	st.holders[holder] = true
	m.mu.Unlock()
	return nil
}

// Release drops holder; the last holder resets the GPU. When the reset
// fails the holder stays, so a retried release tries again. Releasing a
// holder that holds nothing is a no-op.
func (m *Manager) Release(ctx context.Context, gpu, holder string) error {
	st := m.state(gpu)
	if st == nil || !st.holders[holder] {
		return nil
	}
	if len(st.holders) == 1 {
		if err := m.backend.Reset(ctx, gpu, st.settings); err != nil {
			return fmt.Errorf("resetting %s on GPU %s: %w", st.settings, gpu, err)
		}
		m.set(gpu, nil)
		return nil
	}
	m.mu.Lock()
	delete(st.holders, holder)
	m.mu.Unlock()
	return nil
}

// Adopt records a holder found in the checkpoint after a restart, without
// touching the GPU: its settings are still in force. The first adopted
// settings win; a conflicting record is reported.
func (m *Manager) Adopt(gpu, holder string, s Settings) error {
	st := m.state(gpu)
	if st == nil {
		m.set(gpu, &gpuState{settings: s, holders: map[string]bool{holder: true}})
		return nil
	}
	if !st.settings.same(s) {
		return fmt.Errorf("%w: checkpoint has %s and %s on GPU %s", ErrConflict, st.settings, s, gpu)
	}
	m.mu.Lock()
	st.holders[holder] = true
	m.mu.Unlock()
	return nil
}

// Holders returns the number of holders of gpu and the settings in force.
func (m *Manager) Holders(gpu string) (int, Settings) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.gpus[gpu]
	if st == nil {
		return 0, Settings{}
	}
	return len(st.holders), st.settings
}

func (st *gpuState) sortedHolders() []string {
	out := make([]string, 0, len(st.holders))
	for h := range st.holders {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}
