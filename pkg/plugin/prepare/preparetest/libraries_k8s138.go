//go:build k8s138

package preparetest

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	draapi "k8s.io/dynamic-resource-allocation/api"
)

// SchedulerSlices are ResourceSlices as the 0.38 allocator takes them: the
// scheduler's slice tracker converts the API's slices once (interned
// names) and hands the allocator the converted ones (issue 57; make
// plugin-next builds this file, libraries.go is the 0.37 one).
type SchedulerSlices = []*draapi.ResourceSlice

// ForScheduler converts the slices as the scheduler's tracker does.
func ForScheduler(tb testing.TB, slices []*resourceapi.ResourceSlice) SchedulerSlices {
	tb.Helper()
	out := make(SchedulerSlices, len(slices))
	for i, s := range slices {
		out[i] = new(draapi.ResourceSlice)
		if err := draapi.Convert_v1_ResourceSlice_To_api_ResourceSlice(s, out[i], nil); err != nil {
			tb.Fatalf("converting ResourceSlice %s for the allocator: %v", s.Name, err)
		}
	}
	return out
}

// PublisherValidatesNames: the 0.38 slice publisher validates names by
// default (resourceslice.Options.ValidateQualifiedNames) and refuses,
// without retrying, a pool whose attribute or capacity names carry the
// driver's own domain.
const PublisherValidatesNames = true
