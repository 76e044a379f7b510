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

// Instances is how many instances of the shape a claim holds: what a
// TenantQuota's cap on the shape counts. The claim is normalized first, so
// the same devices asked another way count the same: request names and
// order do not matter; a firstAvailable request is each of its
// alternatives in turn, and the claim counts its worst alternative's
// instances (as units charge the worst alternative); counts are summed per
// class and mode across requests (a pair is two count-1 requests as well as
// one count-2 one); the claim's constraints may be more than the shape's
// (written twice, or on other attributes). Requests a matchAttribute
// constraint on the shape's alignment attribute binds together are one
// aligned group, and a group holds as many instances as it has each part
// of the shape, so k disjoint copies in one claim are k instances. An
// aligned shape counts only requests such a constraint covers; without
// alignment the whole claim is one group. AdminAccess requests hold no
// devices. Selectors, tolerations and config a claim adds are not
// compared, as in SameClaim: such a claim asks for the shape's devices or
// fewer.
func Instances(s *gpuaas.GpuShape, spec *resourceapi.ResourceClaimSpec) int64 {
	need := shapeNeeds(s)
	if len(need) == 0 {
		return 0
	}
	attr, aligned := AlignmentAttribute(s.Spec.Alignment)
	var worst int64
	for _, reqs := range choices(spec.Devices.Requests) {
		var n int64
		for _, have := range groups(reqs, spec.Devices.Constraints, attr, aligned) {
			n += instancesIn(need, have)
		}
		worst = max(worst, n)
	}
	return worst
}

// maxChoices bounds how many combinations of firstAvailable alternatives
// Instances tries one by one (the API allows 8 alternatives in each of 32
// requests); past it, every alternative counts at once, which holds at
// least as many instances as any one combination.
const maxChoices = 256

// chosen is one request of a normalized claim: an exact request, or the
// alternative of a firstAvailable request tried.
type chosen struct {
	name, sub string // sub: the alternative's name, "" for an exact request
	key       string // class and mode
	count     int64  // devices with ExactCount; 1 with All (one request)
}

// appliesTo reports whether a constraint naming refs binds r: no refs is
// every request; "main" binds all of its alternatives, "main/sub" one.
func (r chosen) appliesTo(refs []string) bool {
	if len(refs) == 0 {
		return true
	}
	return slices.Contains(refs, r.name) || (r.sub != "" && slices.Contains(refs, r.name+"/"+r.sub))
}

func partKey(class string, mode resourceapi.DeviceAllocationMode) string {
	if mode == resourceapi.DeviceAllocationModeAll {
		return class + "/All"
	}
	return class + "/ExactCount"
}

func deviceCount(mode resourceapi.DeviceAllocationMode, count int64) int64 {
	if mode == resourceapi.DeviceAllocationModeAll {
		return 1
	}
	return max(count, 1) // the API's default: one device
}

// shapeNeeds is what one instance of the shape takes, per class and mode.
func shapeNeeds(s *gpuaas.GpuShape) map[string]int64 {
	need := map[string]int64{}
	for _, r := range ClaimSpec(s).Devices.Requests {
		need[partKey(r.Exactly.DeviceClassName, r.Exactly.AllocationMode)] += deviceCount(r.Exactly.AllocationMode, r.Exactly.Count)
	}
	return need
}

// choices are the claim's requests once per combination of firstAvailable
// alternatives, or, past maxChoices, once with every alternative at once.
func choices(rs []resourceapi.DeviceRequest) [][]chosen {
	combos := 1
	for _, r := range rs {
		if r.Exactly == nil && len(r.FirstAvailable) > 0 {
			combos *= len(r.FirstAvailable)
		}
		if combos > maxChoices {
			return [][]chosen{allAlternatives(rs)}
		}
	}
	out := [][]chosen{nil}
	for _, r := range rs {
		if e := r.Exactly; e != nil {
			if ptr.Deref(e.AdminAccess, false) {
				continue
			}
			c := chosen{name: r.Name, key: partKey(e.DeviceClassName, e.AllocationMode), count: deviceCount(e.AllocationMode, e.Count)}
			for i := range out {
				out[i] = append(out[i], c)
			}
			continue
		}
		if len(r.FirstAvailable) == 0 {
			continue
		}
		var next [][]chosen
		for _, prefix := range out {
			for _, sub := range r.FirstAvailable {
				c := chosen{name: r.Name, sub: sub.Name, key: partKey(sub.DeviceClassName, sub.AllocationMode), count: deviceCount(sub.AllocationMode, sub.Count)}
				next = append(next, append(slices.Clone(prefix), c))
			}
		}
		out = next
	}
	return out
}

// allAlternatives is the claim as if it got every alternative of each
// firstAvailable request.
func allAlternatives(rs []resourceapi.DeviceRequest) []chosen {
	var out []chosen
	for _, r := range rs {
		if e := r.Exactly; e != nil {
			if !ptr.Deref(e.AdminAccess, false) {
				out = append(out, chosen{name: r.Name, key: partKey(e.DeviceClassName, e.AllocationMode), count: deviceCount(e.AllocationMode, e.Count)})
			}
			continue
		}
		for _, sub := range r.FirstAvailable {
			out = append(out, chosen{name: r.Name, sub: sub.Name, key: partKey(sub.DeviceClassName, sub.AllocationMode), count: deviceCount(sub.AllocationMode, sub.Count)})
		}
	}
	return out
}

// groups sums the devices of the requests that are aligned together, per
// class and mode: every request, without alignment; else each set of
// requests that constraints on attr bind together (two constraints
// sharing a request bind both sets: all their devices share the value).
func groups(reqs []chosen, cs []resourceapi.DeviceConstraint, attr resourceapi.FullyQualifiedName, aligned bool) []map[string]int64 {
	if !aligned {
		have := map[string]int64{}
		for _, r := range reqs {
			have[r.key] += r.count
		}
		return []map[string]int64{have}
	}
	// Union-find over the requests' indices; -1: no constraint on attr
	// covers the request, so its devices are not aligned.
	parent := make([]int, len(reqs))
	for i := range parent {
		parent[i] = -1
	}
	find := func(i int) int {
		for parent[i] != i {
			i = parent[i]
		}
		return i
	}
	for _, c := range cs {
		if ptr.Deref(c.MatchAttribute, "") != attr {
			continue
		}
		root := -1
		for i, r := range reqs {
			if !r.appliesTo(c.Requests) {
				continue
			}
			if parent[i] == -1 {
				parent[i] = i
			}
			if root == -1 {
				root = find(i)
				continue
			}
			if ri := find(i); ri != root {
				parent[ri] = root
			}
		}
	}
	byRoot := map[int]map[string]int64{}
	for i, r := range reqs {
		if parent[i] == -1 {
			continue
		}
		root := find(i)
		if byRoot[root] == nil {
			byRoot[root] = map[string]int64{}
		}
		byRoot[root][r.key] += r.count
	}
	out := make([]map[string]int64, 0, len(byRoot))
	for _, have := range byRoot {
		out = append(out, have)
	}
	return out
}

// instancesIn is how many instances one aligned group holds: as many as it
// has of the part it has least of.
func instancesIn(need, have map[string]int64) int64 {
	n := int64(-1)
	for key, per := range need {
		k := have[key] / per
		if n == -1 || k < n {
			n = k
		}
	}
	return max(n, 0)
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
