package webhook

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// rejectedCountersFixedIn is the first Kubernetes minor whose scheduler
// gives back the counters of a device that a claim's constraint rejected.
// Before it (k8s.io/dynamic-resource-allocation v0.34 and v0.35,
// allocator_experimental.go), the allocator reserves a device's counters,
// then checks the constraints, and keeps the counters when a constraint
// rejects the device. A claim for several MIG devices of one GPU
// (matchAttribute parentUUID) then finds the next GPU used up whenever the
// first GPU it tried could not hold them all, and waits although a GPU has
// room (issue 35, docs/install.md). Nothing in the pool is wrong, so the
// plugin cannot fix it; the webhook tells the user at creation.
const rejectedCountersFixedIn = 36

// serverMinorCheckEvery: a control-plane upgrade changes the warning within
// a minute.
const serverMinorCheckEvery = time.Minute

// serverMinor keeps the API server's minor version for the webhooks of
// every replica (not only the leader's), read from discovery off the
// admission path.
type serverMinor struct {
	discovery discovery.ServerVersionInterface
	minor     atomic.Int32 // 0 while unknown
}

// Start implements manager.Runnable.
func (s *serverMinor) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("server-version")
	tick := time.NewTicker(serverMinorCheckEvery)
	defer tick.Stop()
	for {
		s.refresh(logger)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves webhooks.
func (s *serverMinor) NeedLeaderElection() bool { return false }

func (s *serverMinor) refresh(logger klog.Logger) {
	v, err := s.discovery.ServerVersion()
	if err != nil {
		logger.V(2).Info("Cannot read the API server's version; keeping the last one", "err", err)
		return
	}
	// "35", or "35+" from some distributions.
	minor, err := strconv.Atoi(strings.TrimRight(v.Minor, "+"))
	if err != nil {
		logger.V(2).Info("API server reports a minor version that is not a number", "minor", v.Minor)
		return
	}
	if old := s.minor.Swap(int32(minor)); old != int32(minor) {
		logger.V(2).Info("API server version", "gitVersion", v.GitVersion)
	}
}

// get is the minor version, 0 while unknown; nil-safe for tests.
func (s *serverMinor) get() int {
	if s == nil {
		return 0
	}
	return int(s.minor.Load())
}

// rejectedCountersWarning warns about a claim the scheduler of minor may
// keep pending: one whose matchAttribute constraint spans several devices.
// Empty when the version is fixed or unknown, or no constraint is at risk.
func rejectedCountersWarning(minor int, devices resourceapi.DeviceClaim) string {
	if minor == 0 || minor >= rejectedCountersFixedIn {
		return ""
	}
	for i, c := range devices.Constraints {
		if c.MatchAttribute == nil || devicesUnder(devices.Requests, c.Requests) < 2 {
			continue
		}
		return fmt.Sprintf("constraints[%d]: with DRAPartitionableDevices on, the scheduler of Kubernetes 1.%d may leave this claim "+
			"pending although a GPU has room: it keeps the counters of a device that matchAttribute %s rejected (fixed in 1.%d). "+
			"Pin the GPU with a selector (its index or uuid) or upgrade; see docs/install.md",
			i, minor, *c.MatchAttribute, rejectedCountersFixedIn)
	}
	return ""
}

// devicesUnder counts the devices of the requests a constraint names (all
// of them when it names none); a request of every matching device, or of
// one of several alternatives, counts as what it may take at most.
func devicesUnder(requests []resourceapi.DeviceRequest, names []string) int {
	n := 0
	for _, r := range requests {
		if len(names) > 0 && !slices.ContainsFunc(names, func(name string) bool {
			return name == r.Name || strings.HasPrefix(name, r.Name+"/")
		}) {
			continue
		}
		switch {
		case r.Exactly != nil:
			n += exactDevices(*r.Exactly)
		default:
			most := 0
			for _, sub := range r.FirstAvailable {
				most = max(most, exactDevices(resourceapi.ExactDeviceRequest{AllocationMode: sub.AllocationMode, Count: sub.Count}))
			}
			n += most
		}
	}
	return n
}

func exactDevices(r resourceapi.ExactDeviceRequest) int {
	if r.AllocationMode == resourceapi.DeviceAllocationModeAll {
		return 2 // every matching device: several, as far as the risk goes
	}
	return max(int(r.Count), 1)
}
