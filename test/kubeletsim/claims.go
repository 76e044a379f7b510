package kubeletsim

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// claimInfo is what the simulator remembers of one ResourceClaim it
// prepared (or is about to prepare), like the kubelet's claim info cache:
// which drivers must be called, which pods on this node use the claim, and
// what the drivers answered.
type claimInfo struct {
	UID       types.UID
	Name      string
	Namespace string
	// Drivers maps each driver with devices in the allocation to the node
	// operations it skips (KEP-5304 skipNodeOperations).
	Drivers map[string][]resourceapi.SkipNodeOperation
	PodUIDs sets.Set[types.UID]
	// Devices holds each driver's answer to NodePrepareResources.
	Devices     map[string][]*drapb.Device
	Prepared    bool
	Unpreparing bool
}

// newClaimInfo derives the drivers to call from an allocated claim.
func newClaimInfo(claim *resourceapi.ResourceClaim) (*claimInfo, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	return &claimInfo{
		UID:       claim.UID,
		Name:      claim.Name,
		Namespace: claim.Namespace,
		Drivers:   driverSkips(claim.Status.Allocation.Devices.Results),
		PodUIDs:   sets.New[types.UID](),
		Devices:   map[string][]*drapb.Device{},
	}, nil
}

// driverSkips groups allocation results by driver. A driver skips an
// operation for the claim only when every one of its allocated devices skips
// it (directly or through "*"): one device that needs a prepare means the
// driver gets called.
func driverSkips(results []resourceapi.DeviceRequestAllocationResult) map[string][]resourceapi.SkipNodeOperation {
	total := map[string]int{}
	counts := map[string]map[resourceapi.SkipNodeOperation]int{}
	for _, r := range results {
		total[r.Driver]++
		if counts[r.Driver] == nil {
			counts[r.Driver] = map[resourceapi.SkipNodeOperation]int{}
		}
		for _, op := range expandSkips(r.SkipNodeOperations) {
			counts[r.Driver][op]++
		}
	}
	out := make(map[string][]resourceapi.SkipNodeOperation, len(total))
	for driver, n := range total {
		var skipped []resourceapi.SkipNodeOperation
		for op, c := range counts[driver] {
			if c == n {
				skipped = append(skipped, op)
			}
		}
		slices.Sort(skipped)
		out[driver] = skipped
	}
	return out
}

// knownOperations are the node operations the simulator performs; unknown
// values in skipNodeOperations are ignored, as the API asks of kubelets.
var knownOperations = []resourceapi.SkipNodeOperation{
	resourceapi.SkipNodeOperationNodePrepareResources,
	resourceapi.SkipNodeOperationNodeUnprepareResources,
}

func expandSkips(ops []resourceapi.SkipNodeOperation) []resourceapi.SkipNodeOperation {
	if slices.Contains(ops, resourceapi.SkipNodeOperationAll) {
		return knownOperations
	}
	var out []resourceapi.SkipNodeOperation
	for _, op := range ops {
		if slices.Contains(knownOperations, op) && !slices.Contains(out, op) {
			out = append(out, op)
		}
	}
	return out
}

// driversFor returns, sorted, the drivers that must be called for op.
func (c *claimInfo) driversFor(op resourceapi.SkipNodeOperation) []string {
	var drivers []string
	for driver, skipped := range c.Drivers {
		if !slices.Contains(skipped, op) {
			drivers = append(drivers, driver)
		}
	}
	sort.Strings(drivers)
	return drivers
}

// request is the claim as NodePrepareResources and NodeUnprepareResources
// take it: namespace, UID and name, nothing else.
func (c *claimInfo) request() *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Uid: string(c.UID), Name: c.Name}
}

// CDIDeviceIDs returns the CDI device IDs all drivers returned, sorted and
// without duplicates.
func (c *claimInfo) CDIDeviceIDs() []string { return c.cdiDeviceIDsFor("") }

// cdiDeviceIDsFor is CDIDeviceIDs for the devices of one request ("" for
// all). It filters as the kubelet does, on the request names the driver
// returned (not on the allocation), so a driver that reports them wrong
// shows here too; a device reported without any serves every request.
func (c *claimInfo) cdiDeviceIDsFor(request string) []string {
	ids := sets.New[string]()
	for _, devices := range c.Devices {
		for _, d := range devices {
			if request == "" || len(d.RequestNames) == 0 || slices.Contains(d.RequestNames, request) {
				ids.Insert(d.CdiDeviceIds...)
			}
		}
	}
	return sets.List(ids)
}

// groupByDriver batches claims per driver for one operation, the way the
// kubelet makes one gRPC call per driver with all of a pod's claims.
func groupByDriver(claims []*claimInfo, op resourceapi.SkipNodeOperation) map[string][]*drapb.Claim {
	batches := map[string][]*drapb.Claim{}
	for _, c := range claims {
		for _, driver := range c.driversFor(op) {
			batches[driver] = append(batches[driver], c.request())
		}
	}
	return batches
}

// claimCache holds claimInfos by namespace/name, as the kubelet's cache
// does, so a second pod sharing a claim finds it prepared.
type claimCache struct {
	mu     sync.Mutex
	claims map[string]*claimInfo
}

func newClaimCache() *claimCache {
	return &claimCache{claims: map[string]*claimInfo{}}
}

func cacheKey(namespace, name string) string { return namespace + "/" + name }

// attach records that pod uses the claim and returns the cached entry,
// creating it from fresh when missing. It refuses a claim whose name now
// belongs to a different object, or one being unprepared.
func (c *claimCache) attach(fresh *claimInfo, pod types.UID) (*claimInfo, error) {
	key := cacheKey(fresh.Namespace, fresh.Name)
	info, ok := c.claims[key]
	switch {
	case !ok:
		info = fresh
		c.claims[key] = info
	case info.UID != fresh.UID:
		return nil, fmt.Errorf("old ResourceClaim with same name %s and different UID %s still exists", fresh.Name, info.UID)
	case info.Unpreparing:
		return nil, fmt.Errorf("ResourceClaim %s is being unprepared", fresh.Name)
	}
	info.PodUIDs.Insert(pod)
	return info, nil
}

// forPod returns the claims pod uses, sorted by key for stable batches.
func (c *claimCache) forPod(pod types.UID) []*claimInfo {
	var out []*claimInfo
	for _, info := range c.claims {
		if info.PodUIDs.Has(pod) {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return cacheKey(out[i].Namespace, out[i].Name) < cacheKey(out[j].Namespace, out[j].Name)
	})
	return out
}

// detach drops pod from its claims and returns the claims that no other pod
// uses any more, marked Unpreparing: those, and only those, get
// NodeUnprepareResources.
func (c *claimCache) detach(pod types.UID) []*claimInfo {
	var last []*claimInfo
	for _, info := range c.forPod(pod) {
		if info.PodUIDs.Len() > 1 {
			info.PodUIDs.Delete(pod)
			continue
		}
		info.Unpreparing = true
		last = append(last, info)
	}
	return last
}

// remove forgets claims after a successful unprepare.
func (c *claimCache) remove(claims []*claimInfo) {
	for _, info := range claims {
		delete(c.claims, cacheKey(info.Namespace, info.Name))
	}
}
