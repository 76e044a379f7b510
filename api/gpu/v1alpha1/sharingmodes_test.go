package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// A shared GPU's largest share must be one the request policy can give.
func TestSharedMemoryMax(t *testing.T) {
	for maxShare, want := range map[string]string{
		"16Gi":   "",
		"512Mi":  "shared.memory.max: 512Mi must be at least default 1Gi",
		"1536Mi": "min 1Gi plus a multiple of step 1Gi",
	} {
		m := SharedMode{Memory: SharedMemoryPolicy{Max: ptr.To(resource.MustParse(maxShare))}}
		err := m.validate()
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("max %s: err = %v, want %q", maxShare, err, want)
		}
		if cp := (GpuMode{Shared: &m}).deepCopy(); cp.Shared.Memory.Max == m.Memory.Max {
			t.Errorf("max %s: the copy shares the quantity", maxShare)
		}
	}
}
