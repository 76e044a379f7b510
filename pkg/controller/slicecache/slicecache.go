// Package slicecache is the form in which the controller's caches hold
// ResourceSlices (issue 52): the objects the API server sent, less their
// managedFields, with every part that repeats across devices and nodes
// held once.
//
// Decoded, a slice of 8 whole GPUs takes about ten times its protobuf
// size and a dynamic-MIG one about 160 KB, nearly all of it maps and
// strings that are the same on every node of a model: the capacity of a
// GPU, the counters a MIG placement consumes, attribute names and values.
// Pricing (pkg/quota), posture (pkg/posture) and the GpuNodes read every
// field a tenant's CEL selector or a placement may name, so nothing is
// dropped; what is identical is shared instead.
//
// Shared parts are read-only, as everything in an informer's cache is
// (the controller reads it with UnsafeDisableDeepCopy): a reader that
// must change one takes a DeepCopy, which copies the shared part too.
package slicecache

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// maxSharedParts bounds the table of shared parts. A fleet has a few
// hundred distinct ones (one per model, MIG profile and placement); the
// bound only matters if slices name ever new contents, and then a full
// table is cleared: later slices share less, and nothing is wrong.
const maxSharedParts = 1 << 14

// maxSharedStrings bounds the table of strings. Names repeat on every
// node; UUIDs and serials do not, so the table holds about one string per
// GPU of the fleet besides the names: 8,000 nodes of 8 GPUs fit.
const maxSharedStrings = 1 << 16

// Transform is the caches' transform for ResourceSlices: managedFields
// stripped, identical parts shared. Other objects pass unchanged but for
// their managedFields.
func Transform(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	if err != nil {
		return obj, err
	}
	if s, ok := obj.(*resourceapi.ResourceSlice); ok {
		shared.slice(s)
	}
	return obj, nil
}

var stripManagedFields = cache.TransformStripManagedFields()

// shared is the process's tables: every cache of slices shares through
// them, so a foreign driver's cache and ours hold one copy of what they
// share.
var shared = sharer{parts: newTable[any](maxSharedParts), strings: newTable[string](maxSharedStrings)}

// sharer holds the tables of the parts and strings slices share.
type sharer struct {
	parts   *table[any]
	strings *table[string]
}

// table holds one instance of each content it has seen, keyed by a
// canonical encoding of that content. It holds them strongly: the
// standard library's unique package holds a string only while a Handle
// to it lives, so a value taken from a Handle dropped at once is shared
// only until the next garbage collection.
type table[V any] struct {
	mu    sync.Mutex
	held  map[string]V
	limit int
}

func newTable[V any](limit int) *table[V] {
	return &table[V]{held: map[string]V{}, limit: limit}
}

// share returns the instance held for key, holding part as it when there
// is none yet.
func (t *table[V]) share(key string, part V) V {
	t.mu.Lock()
	defer t.mu.Unlock()
	if held, ok := t.held[key]; ok {
		return held
	}
	if len(t.held) >= t.limit {
		clear(t.held)
	}
	t.held[key] = part
	return part
}

// len is how many parts are held (tests).
func (t *table[V]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}

// intern returns s with the one backing array the process holds for its
// content.
func (sh sharer) intern(s string) string {
	if s == "" {
		return s
	}
	return sh.strings.share(s, s)
}
