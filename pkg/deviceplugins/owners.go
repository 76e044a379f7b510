package deviceplugins

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// GPU is a GPU of this node as device IDs may name it.
type GPU struct {
	Index int
	UUID  string
}

// Ownership says which of the node's GPUs device-plugin resources name.
type Ownership struct {
	// ByGPU maps the UUID of each GPU named to the "<resource>=<id>"
	// entries that name it, sorted.
	ByGPU map[string][]string
	// Unmatched are the "<resource>=<id>" entries that name no GPU of
	// this node (a GPU NVML cannot read, an ID scheme not known here).
	Unmatched []string
}

// Owners maps the device IDs of NVIDIA's device plugin to the GPUs they
// belong to. Its IDs are, by its deviceIDStrategy and sharing settings:
//   - the GPU's UUID ("GPU-...", the default);
//   - "<id>::<n>" for the n-th time-slicing or MPS replica of a device;
//   - a MIG device's UUID ("MIG-...") with its MIG strategies, which
//     migParents maps to its parent GPU's UUID (called at most once, and
//     only when a MIG UUID is seen);
//   - with deviceIDStrategy=index, the GPU's NVML index ("3"), or
//     "<gpu index>:<MIG index>" for a MIG device.
//
// A GPU is named if any of its IDs, replicas or MIG devices is.
func Owners(resources []Resource, gpus []GPU, migParents func() map[string]string) Ownership {
	byUUID, byIndex := map[string]bool{}, map[int]string{}
	for _, g := range gpus {
		byUUID[g.UUID] = true
		byIndex[g.Index] = g.UUID
	}
	var parents map[string]string
	parentOf := func(mig string) (string, bool) {
		if parents == nil && migParents != nil {
			parents = migParents()
		}
		p, ok := parents[mig]
		return p, ok
	}
	own := Ownership{ByGPU: map[string][]string{}}
	for _, r := range resources {
		for _, id := range r.IDs {
			entry := r.Name + "=" + id
			uuid, ok := gpuOf(id, byUUID, byIndex, parentOf)
			if !ok {
				own.Unmatched = append(own.Unmatched, entry)
				continue
			}
			own.ByGPU[uuid] = append(own.ByGPU[uuid], entry)
		}
	}
	for _, entries := range own.ByGPU {
		slices.Sort(entries)
	}
	slices.Sort(own.Unmatched)
	return own
}

func gpuOf(id string, byUUID map[string]bool, byIndex map[int]string, parentOf func(string) (string, bool)) (string, bool) {
	id, _, _ = strings.Cut(id, "::") // a replica: the device it replicates
	switch {
	case byUUID[id]:
		return id, true
	case strings.HasPrefix(id, "MIG-"):
		return parentOf(id)
	}
	// deviceIDStrategy=index: "<gpu>" or "<gpu>:<mig>".
	gpu, _, _ := strings.Cut(id, ":")
	if n, err := strconv.Atoi(gpu); err == nil {
		uuid, ok := byIndex[n]
		return uuid, ok
	}
	return "", false
}

// Summary is the resources in a few words for logs and events:
// "nvidia.com/gpu (2 device(s)), nvidia.com/mig-1g.10gb (7 device(s))".
func Summary(resources []Resource) string {
	parts := make([]string, 0, len(resources))
	for _, r := range resources {
		parts = append(parts, fmt.Sprintf("%s (%d device(s))", r.Name, len(r.IDs)))
	}
	return strings.Join(parts, ", ")
}
