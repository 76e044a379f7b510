package plugin

import (
	"slices"
	"sync"
)

// gpuLocks hands out one mutex per GPU, so claims on different GPUs are
// prepared in parallel and claims on the same GPU never interleave.
type gpuLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func newGPULocks() *gpuLocks { return &gpuLocks{locks: map[string]*sync.Mutex{}} }

func (l *gpuLocks) get(uuid string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.locks[uuid]
	if !ok {
		m = &sync.Mutex{}
		l.locks[uuid] = m
	}
	return m
}

// lock takes the locks of all given GPUs in a fixed (sorted) order, which
// rules out deadlock between claims spanning several GPUs, and returns the
// function that releases them.
func (l *gpuLocks) lock(uuids []string) (unlock func()) {
	keys := slices.Clone(uuids)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*sync.Mutex, 0, len(keys))
	for _, k := range keys {
		m := l.get(k)
		m.Lock()
		held = append(held, m)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
	}
}
