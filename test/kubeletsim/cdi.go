package kubeletsim

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// podCDI is what the simulator records on a started pod: the CDI device IDs
// per ResourceClaim name (CDIDevicesAnnotation) and per container
// (CDIContainerDevicesAnnotation).
type podCDI struct {
	claims     map[string][]string
	containers map[string][]string
}

// claimCDI maps each claim with devices to their CDI device IDs. Callers
// hold the claim cache lock.
func claimCDI(infos []*claimInfo) map[string][]string {
	out := map[string][]string{}
	for _, info := range infos {
		if ids := info.CDIDeviceIDs(); len(ids) > 0 {
			out[info.Name] = ids
		}
	}
	return out
}

// containerCDI mirrors the kubelet's GetResources, which decides what CDI
// devices each container gets: those of the claims it names in
// resources.claims (of the named request only, when there is one), and
// those of the extended-resource claim's requests mapped to it. refs and
// infos are parallel, as prepare builds them. Callers hold the claim cache
// lock.
func containerCDI(pod *v1.Pod, refs []claimRef, infos []*claimInfo) map[string][]string {
	byPodClaim := map[string]*claimInfo{}
	var extended *claimInfo
	for i, ref := range refs {
		if ref.extended {
			extended = infos[i]
		} else {
			byPodClaim[ref.podClaim] = infos[i]
		}
	}
	out := map[string][]string{}
	for _, c := range allContainers(pod) {
		ids := sets.New(claimDevicesOf(c, byPodClaim)...)
		ids.Insert(extendedDevicesOf(pod, c.Name, extended)...)
		if ids.Len() > 0 {
			out[c.Name] = sets.List(ids)
		}
	}
	return out
}

// claimDevicesOf returns the CDI device IDs of the claims c names in
// resources.claims.
func claimDevicesOf(c *v1.Container, byPodClaim map[string]*claimInfo) []string {
	var ids []string
	for _, rc := range c.Resources.Claims {
		if info := byPodClaim[rc.Name]; info != nil {
			ids = append(ids, info.cdiDeviceIDsFor(rc.Request)...)
		}
	}
	return ids
}

// allContainers returns the init containers, then the others: both kinds
// can use claims and extended resources.
func allContainers(pod *v1.Pod) []*v1.Container {
	out := make([]*v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}
