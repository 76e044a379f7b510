package kubeletsim

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// A pod can ask for a device through an extended resource
// (resources.limits: {nvidia.com/gpu: 1}) that a DeviceClass maps with
// spec.extendedResourceName (KEP-5004). The scheduler then allocates a
// ResourceClaim it creates for the pod, owned by the pod and not listed in
// pod.spec.resourceClaims, and records it, with which container gets which
// request, in pod.status.extendedResourceClaimStatus before it binds the pod.

// extendedClaimRef returns the pod's extended-resource claim, if the
// scheduler made one. The scheduler always makes it owned by the pod, so the
// simulator checks the owner as for a claim made from a template.
func extendedClaimRef(pod *v1.Pod) (claimRef, bool) {
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		return claimRef{}, false
	}
	return claimRef{name: st.ResourceClaimName, checkOwner: true, extended: true}, true
}

// extendedDevicesOf returns the CDI device IDs of the extended-resource
// claim's requests that the scheduler mapped to the container.
func extendedDevicesOf(pod *v1.Pod, container string, extended *claimInfo) []string {
	if extended == nil {
		return nil
	}
	var ids []string
	for _, m := range pod.Status.ExtendedResourceClaimStatus.RequestMappings {
		if m.ContainerName == container {
			ids = append(ids, extended.cdiDeviceIDsFor(m.RequestName)...)
		}
	}
	return ids
}

// awaitedExtendedResources returns, sorted, the extended resources the pod's
// containers have a non-zero limit on that the node does not offer, while
// the pod has no extended-resource claim yet: such a pod cannot start
// before the scheduler allocates one. A resource no DeviceClass maps (a
// device plugin's) never gets a claim; the pod then waits for ever, where
// the kubelet would reject it for lack of capacity: not ours to model.
func awaitedExtendedResources(pod *v1.Pod, capacity v1.ResourceList) []string {
	if pod.Status.ExtendedResourceClaimStatus != nil {
		return nil
	}
	var names []string
	for _, c := range allContainers(pod) {
		for name, q := range c.Resources.Limits {
			_, offered := capacity[name]
			if strings.Contains(string(name), "/") && !offered && !q.IsZero() && !slices.Contains(names, string(name)) {
				names = append(names, string(name))
			}
		}
	}
	slices.Sort(names)
	return names
}
