//go:build !k8s138

package preparetest

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// SchedulerSlices are ResourceSlices as the scheduler's allocator
// (structured.NewAllocator) takes them. On the 0.37 libraries that is the
// API's own type: the allocator converts them itself. The 0.38 libraries
// take the converted type (libraries_k8s138.go, built with -tags k8s138 by
// make plugin-next); this file and that one are all that differs.
type SchedulerSlices = []*resourceapi.ResourceSlice

// ForScheduler gives the slices to the allocator as its library version
// wants them.
func ForScheduler(_ testing.TB, slices []*resourceapi.ResourceSlice) SchedulerSlices {
	return slices
}

// PublisherValidatesNames: the 0.37 slice publisher (resourceslice) stores
// a pool whose attribute names carry the driver's own domain; the API
// server's validation is the only check.
const PublisherValidatesNames = false
