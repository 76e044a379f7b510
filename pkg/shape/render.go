// Package shape is pure functions over a GpuShape: the ResourceClaimTemplate
// it renders to, which of its parts are missing, and how many more
// instances of it the cluster could place now (Placeable). It imports no
// client code, so it is unit-tested without a cluster, as pkg/deviceclass.
package shape

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// AlignmentAttribute is the standard attribute the shape's matchAttribute
// constraint names; false for AlignNone. The kubelet plugin publishes
// both on every device of a GPU that has them (pkg/plugin/device), and
// other drivers' NICs publish the same standard names.
func AlignmentAttribute(a gpuaas.ShapeAlignment) (resourceapi.FullyQualifiedName, bool) {
	switch a {
	case gpuaas.AlignPCIeRoot:
		return resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot), true
	case gpuaas.AlignNUMANode:
		return resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributeNUMANode), true
	}
	return "", false
}

// ClaimSpec is the claim one instance of the shape is: one request per
// part, and the alignment as a matchAttribute constraint over all of them.
func ClaimSpec(s *gpuaas.GpuShape) resourceapi.ResourceClaimSpec {
	var spec resourceapi.ResourceClaimSpec
	for i := range s.Spec.Requests {
		r := &s.Spec.Requests[i]
		exact := &resourceapi.ExactDeviceRequest{DeviceClassName: r.ClassName()}
		if r.IsAll() {
			exact.AllocationMode = resourceapi.DeviceAllocationModeAll
		} else {
			exact.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			exact.Count = r.DeviceCount()
		}
		spec.Devices.Requests = append(spec.Devices.Requests, resourceapi.DeviceRequest{Name: r.Name, Exactly: exact})
	}
	if attr, ok := AlignmentAttribute(s.Spec.Alignment); ok {
		// No requests listed: the constraint covers every request.
		spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(attr)}}
	}
	return spec
}

// Template is the shape's ResourceClaimTemplate in namespace: named after
// the shape, labeled with ShapeLabel, controlled by the shape (a
// cluster-scoped owner, so the garbage collector removes it with the
// shape).
func Template(s *gpuaas.GpuShape, namespace string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.Name,
			Namespace: namespace,
			Labels:    map[string]string{gpuaas.ShapeLabel: s.Name},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         gpuaas.GroupVersion.String(),
				Kind:               gpuaas.GpuShapeKind,
				Name:               s.Name,
				UID:                s.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: ClaimSpec(s)},
	}
}

// Parts is what a shape's requests name, as the cluster has them.
type Parts struct {
	// Profiles by name.
	Profiles map[string]*gpuaas.GpuProfile
	// Classes by name.
	Classes map[string]*resourceapi.DeviceClass
}

// Missing names the parts of s the cluster lacks, one phrase each, in the
// order of its requests: a GpuProfile absent or disabled, or whose
// DeviceClass is not rendered yet; a DeviceClass that does not exist.
func Missing(s *gpuaas.GpuShape, parts Parts) []string {
	var out []string
	for i := range s.Spec.Requests {
		r := &s.Spec.Requests[i]
		if r.Profile != "" {
			p := parts.Profiles[r.Profile]
			switch {
			case p == nil:
				out = append(out, fmt.Sprintf("request %s: GpuProfile %q does not exist", r.Name, r.Profile))
			case !p.IsEnabled():
				out = append(out, fmt.Sprintf("request %s: GpuProfile %q is disabled", r.Name, r.Profile))
			case parts.Classes[r.Profile] == nil:
				out = append(out, fmt.Sprintf("request %s: GpuProfile %q has no DeviceClass yet", r.Name, r.Profile))
			}
			continue
		}
		if parts.Classes[r.DeviceClassName] == nil {
			out = append(out, fmt.Sprintf("request %s: DeviceClass %q does not exist", r.Name, r.DeviceClassName))
		}
	}
	return out
}

// Describe is how messages name one instance of the shape: its requests'
// names, upper-cased and joined with "+" ("GPU+NIC", "2xGPU", "GPU (all of
// the node)"),
// and where its alignment puts them.
func Describe(s *gpuaas.GpuShape) string {
	var parts []string
	for i := range s.Spec.Requests {
		r := &s.Spec.Requests[i]
		name := strings.ToUpper(r.Name)
		switch {
		case r.IsAll():
			name += " (all of the node)"
		case r.DeviceCount() > 1:
			name = fmt.Sprintf("%dx%s", r.DeviceCount(), name)
		}
		parts = append(parts, name)
	}
	out := strings.Join(parts, "+")
	switch s.Spec.Alignment {
	case gpuaas.AlignPCIeRoot:
		out += " on one PCIe root"
	case gpuaas.AlignNUMANode:
		out += " on one NUMA node"
	}
	return out
}

// InstanceOf reports whether a claim asks for what the shape sells: the
// same requests (class, mode and count) and the same alignment, whatever
// the requests are named and in whatever order. A TenantQuota's cap on a
// shape's instances counts these: with SameClaim, a tenant who renamed or
// reordered the template's requests got the same devices uncounted.
// Selectors, tolerations and config a claim adds are not compared, as in
// SameClaim: such a claim asks for the shape's devices or fewer.
func InstanceOf(s *gpuaas.GpuShape, spec *resourceapi.ResourceClaimSpec) bool {
	want := ClaimSpec(s)
	return sameKeys(requestKeys(want.Devices.Requests), requestKeys(spec.Devices.Requests)) &&
		sameKeys(constraintKeys(want.Devices.Constraints), constraintKeys(spec.Devices.Constraints))
}

// requestKeys describe each request by what it asks for, not its name;
// a request of alternatives (firstAvailable) is never the shape's.
func requestKeys(rs []resourceapi.DeviceRequest) []string {
	keys := make([]string, 0, len(rs))
	for _, r := range rs {
		if r.Exactly == nil || len(r.FirstAvailable) > 0 {
			keys = append(keys, "alternatives")
			continue
		}
		// The API's defaults: ExactCount, one device.
		mode, count := resourceapi.DeviceAllocationModeExactCount, max(r.Exactly.Count, 1)
		if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll {
			mode, count = resourceapi.DeviceAllocationModeAll, 0
		}
		keys = append(keys, fmt.Sprintf("%s/%s/%d", r.Exactly.DeviceClassName, mode, count))
	}
	return keys
}

func constraintKeys(cs []resourceapi.DeviceConstraint) []string {
	keys := make([]string, 0, len(cs))
	for _, c := range cs {
		keys = append(keys, string(ptr.Deref(c.MatchAttribute, "")))
	}
	return keys
}

// sameKeys compares two lists as multisets.
func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// SameClaim reports whether a claim's spec is the shape's rendered spec:
// how the claim webhook tells a claim of the shape (its labels are the
// tenant's to write and prove nothing). Requests compare in order, by
// name, class, mode and count; constraints by attribute. Selectors,
// tolerations and config a claim adds are not compared: such a claim asks
// for the shape's devices or fewer, and Refuse is a promise to fail fast,
// not a fence (a claim that dodges it waits as with Queue; quota charges
// it the same).
func SameClaim(s *gpuaas.GpuShape, spec *resourceapi.ResourceClaimSpec) bool {
	want := ClaimSpec(s)
	if len(want.Devices.Requests) != len(spec.Devices.Requests) ||
		len(want.Devices.Constraints) != len(spec.Devices.Constraints) {
		return false
	}
	for i, w := range want.Devices.Requests {
		h := spec.Devices.Requests[i]
		if h.Name != w.Name || h.Exactly == nil || len(h.FirstAvailable) > 0 ||
			h.Exactly.DeviceClassName != w.Exactly.DeviceClassName ||
			h.Exactly.AllocationMode != w.Exactly.AllocationMode ||
			(w.Exactly.AllocationMode == resourceapi.DeviceAllocationModeExactCount && h.Exactly.Count != w.Exactly.Count) {
			return false
		}
	}
	for i, w := range want.Devices.Constraints {
		h := spec.Devices.Constraints[i]
		if ptr.Deref(h.MatchAttribute, "") != ptr.Deref(w.MatchAttribute, "") {
			return false
		}
	}
	return true
}
