// Package posture tells, per node and per GPU, what an operator asks of
// the fleet: is this GPU free, partly or fully taken, held whole, being
// drained, blocked on a failed cleanup or unhealthy, and why. It reads only
// API objects (the driver's ResourceSlices, allocated ResourceClaims and
// DeviceTaintRules), so it is a pure function the controller calls and
// tests drive without a cluster.
//
// The GPU postures, first that holds wins (reasons as produced for a DGX
// H100, from the tests):
//
//	Unhealthy           a device of the GPU carries a plugin fault taint
//	                    (gpu.gpuaas.io/<kind>, not cleanup-blocked or
//	                    unmonitored) whose effect is not None:
//	                    "gpu.gpuaas.io/xid=79:NoSchedule on all 29 devices"
//	CleanupBlocked      a device carries gpu.gpuaas.io/cleanup-blocked:
//	                    "gpu.gpuaas.io/cleanup-blocked=mig-destroy:NoSchedule on gpu-0-mig-3g40gb-4 (1 of 29 devices)"
//	Draining            a DeviceTaintRule, or a taint the plugin did not set,
//	                    with effect NoSchedule or NoExecute covers a device:
//	                    "DeviceTaintRule maint (example.com/maintenance=kernel:NoExecute) on all 4 devices"
//	AllocatedWhole      the whole-GPU device (type gpu) is allocated:
//	                    "whole GPU gpu-3 allocated to team-a/train"
//	FullyAllocated      something is allocated and no further device can be:
//	                    every replica or static MIG device ("4 of 4 replicas
//	                    allocated"); for dynamic MIG, no unallocated
//	                    partition fits in the counters the allocated ones
//	                    leave (memory slices, compute slices, GPU memory,
//	                    engines: "1g.10gb@6, 2g.20gb@4, 3g.40gb@0 allocated:
//	                    1 of 8 memory slices free, but no partition fits in
//	                    them");
//	                    for a shared GPU, the memory left is below the
//	                    smallest share ("2 shares allocated: 0 of 80Gi
//	                    memory free, less than the smallest share")
//	PartiallyAllocated  something is allocated and more can be:
//	                    "3 of 4 replicas allocated",
//	                    "2g.20gb@4, 3g.40gb@0 allocated: 2 of 8 memory slices free"
//	Available           nothing is allocated: "whole GPU free", "4 replicas
//	                    free", "nothing allocated: 8 of 8 memory slices free"
//
// Out-of-service reasons add "; N devices still allocated" when work may
// still run there. A MIG partition is named profile@first memory slice.
// "Covers a device" is any device of the GPU, not all: a fault on one MIG
// partition, or an admin's rule naming only the whole-GPU device, is worth
// the operator's attention, and the reason says how many devices it covers.
// Allocations with adminAccess are not counted: they share a device with
// its real user. Taints and rules with effect None are informational: they
// never change the posture, and a plugin's informational taint (such as
// gpu.gpuaas.io/unmonitored) is added to the reason.
//
// A node's posture is its GPUs' when they all share one; otherwise the first
// of Unhealthy, CleanupBlocked and Draining that a GPU has when no GPU takes
// work, FullyAllocated when every GPU is full or out of service, Degraded
// when some GPU is out of service, PartiallyAllocated when something is
// allocated, Available otherwise; Empty when the node publishes no GPU.
// ExclusivelyAllocated overrides the in-service postures when every GPU is
// in service, full, and held by one claim alone through a request with
// allocationMode All (a whole-node lease, such as a GpuShape's): "8 GPUs
// leased to team-a/lease (allocationMode All); 8 GPUs: 8 AllocatedWhole".
package posture

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// GPU is one GPU's posture.
type GPU struct {
	// Index is the NVML index its devices carry (-1 when they carry none).
	Index       int
	UUID        string
	ProductName string
	Mode        gpuaas.GpuMode
	Posture     gpuaas.Posture
	Reason      string
	// Devices are the names of its published devices, in slice order.
	Devices []string
	// Allocated are the names of its allocated devices, sorted.
	Allocated []string
	// Claims are the claims (namespace/name) holding them, sorted.
	Claims []string
	// MemoryLimit is whether the driver enforces its replicas' or
	// shares' memory; "" for whole and MIG GPUs.
	MemoryLimit gpuaas.MemoryLimit
}

// NodePosture is a node's posture and its GPUs'.
type NodePosture struct {
	Node    string
	Posture gpuaas.Posture
	Reason  string
	// GPUs are sorted by index.
	GPUs []GPU
	// Counts are how many GPUs have each posture.
	Counts map[gpuaas.Posture]int
}

// Compute works out the posture of node's GPUs from the driver's slices
// (of any node: only the node's pool is read), the claims (only results
// on the node's pool count) and the cluster's DeviceTaintRules.
func Compute(node string, slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim, rules []resourceapi.DeviceTaintRule) NodePosture {
	p := readPool(node, slices)
	p.addAllocations(claims)
	out := NodePosture{Node: node, Counts: map[gpuaas.Posture]int{}}
	for _, g := range p.gpus {
		gp := g.posture(p, rules)
		out.GPUs = append(out.GPUs, gp)
		out.Counts[gp.Posture]++
	}
	out.Posture, out.Reason = nodePosture(out.GPUs, out.Counts)
	if lease, ok := exclusiveLease(out.GPUs, p.leases); ok {
		out.Posture = gpuaas.PostureExclusivelyAllocated
		out.Reason = fmt.Sprintf("%s leased to %s (allocationMode All); %s", plural(len(out.GPUs), "GPU"), lease, out.Reason)
	}
	return out
}

// exclusiveLease reports the claim that holds the node exclusively: every
// GPU is in service, has no room left and is held by that one claim alone,
// through a request with allocationMode All (a whole-node lease). A node
// fully taken by several claims, or by one claim counting its devices, is
// FullyAllocated or AllocatedWhole instead: the operator reads the
// difference between a tenant renting the node and a node that filled up.
func exclusiveLease(gpus []GPU, leases map[string]bool) (string, bool) {
	if len(gpus) == 0 {
		return "", false
	}
	lease := ""
	for _, g := range gpus {
		if open(g.Posture) || outOfService(g.Posture) || len(g.Claims) != 1 || !leases[g.Claims[0]] {
			return "", false
		}
		if lease != "" && g.Claims[0] != lease {
			return "", false
		}
		lease = g.Claims[0]
	}
	return lease, true
}

// posture decides one GPU's posture: taints first, in priority order, then
// what is allocated.
func (g *gpu) posture(p *pool, rules []resourceapi.DeviceTaintRule) GPU {
	out := GPU{
		Index: g.index, UUID: g.uuid, ProductName: g.product, Mode: g.mode(),
		Devices: g.deviceNames(), Allocated: g.allocatedNames(), Claims: g.claims(), MemoryLimit: g.memoryLimit,
	}
	t := g.taints(p.name, rules)
	switch {
	case !t.unhealthy.empty():
		out.Posture, out.Reason = gpuaas.PostureUnhealthy, t.unhealthy.describe(len(g.devices))
	case !t.cleanupBlocked.empty():
		out.Posture, out.Reason = gpuaas.PostureCleanupBlocked, t.cleanupBlocked.describe(len(g.devices))
	case !t.draining.empty():
		out.Posture, out.Reason = gpuaas.PostureDraining, t.draining.describe(len(g.devices))
	default:
		out.Posture, out.Reason = g.allocationPosture(p.counterSets, out.Mode)
	}
	if outOfService(out.Posture) && len(out.Allocated) > 0 {
		// Work may still run there: the operator must know before a reset.
		out.Reason += fmt.Sprintf("; %s still allocated", plural(len(out.Allocated), "device"))
	}
	if !t.informational.empty() {
		out.Reason += "; informational: " + t.informational.describe(len(g.devices))
	}
	return out
}

// outOfService postures keep new work off the GPU.
func outOfService(p gpuaas.Posture) bool {
	return p == gpuaas.PostureUnhealthy || p == gpuaas.PostureCleanupBlocked || p == gpuaas.PostureDraining
}

// open postures still take new work.
func open(p gpuaas.Posture) bool {
	return p == gpuaas.PosturePartiallyAllocated || p == gpuaas.PostureAvailable
}

// maxNodeDetails bounds how many GPUs out of service the node's reason
// spells out.
const maxNodeDetails = 3

// nodePosture sums the GPUs up (see the package comment for the rules).
func nodePosture(gpus []GPU, counts map[gpuaas.Posture]int) (gpuaas.Posture, string) {
	if len(gpus) == 0 {
		return gpuaas.PostureEmpty, "the driver publishes no GPU on this node"
	}
	reason := countsReason(len(gpus), counts)
	var details []string
	for _, g := range gpus {
		if outOfService(g.Posture) {
			details = append(details, fmt.Sprintf("GPU %d %s: %s", g.Index, g.Posture, g.Reason))
		}
	}
	if len(details) > maxNodeDetails {
		details = append(details[:maxNodeDetails], fmt.Sprintf("and %d more", len(details)-maxNodeDetails))
	}
	if len(details) > 0 {
		reason += "; " + strings.Join(details, "; ")
	}
	return nodeSummary(len(gpus), counts), reason
}

func nodeSummary(n int, counts map[gpuaas.Posture]int) gpuaas.Posture {
	var openN, outN, allocatedN int
	for p, c := range counts {
		if c == n {
			return p
		}
		switch {
		case open(p):
			openN += c
		case outOfService(p):
			outN += c
		}
		if p != gpuaas.PostureAvailable && !outOfService(p) {
			allocatedN += c
		}
	}
	switch {
	case openN == 0 && outN == n:
		for _, p := range []gpuaas.Posture{gpuaas.PostureUnhealthy, gpuaas.PostureCleanupBlocked, gpuaas.PostureDraining} {
			if counts[p] > 0 {
				return p
			}
		}
	case openN == 0:
		return gpuaas.PostureFullyAllocated
	case outN > 0:
		return gpuaas.PostureDegraded
	case allocatedN > 0:
		return gpuaas.PosturePartiallyAllocated
	}
	return gpuaas.PostureAvailable
}

// countsReason is e.g. "8 GPUs: 5 Available, 2 PartiallyAllocated, 1 Unhealthy":
// the postures from free to faulty, the order an operator scans.
func countsReason(n int, counts map[gpuaas.Posture]int) string {
	var parts []string
	for _, p := range slices.Backward(gpuaas.GpuPostures) {
		if c := counts[p]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, p))
		}
	}
	return plural(n, "GPU") + ": " + strings.Join(parts, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
