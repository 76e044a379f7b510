package packing_test

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig/packing"
)

// BenchmarkMIGPackingOrders compares device orders the plugin could
// publish, by the model's first fit over each (which the allocator matches
// claim for claim: TestAllocatorAgreesWithModel), on more and longer
// streams than BenchmarkMIGPacking can afford with the allocator in the
// loop: "published" is what the plugin publishes; "gpumajor" the order
// before issue 29 (each GPU's devices together, highest placement first);
// "ascending" the same with lowest placements first; "defer-2g3g" and
// "defer-1g2g3g" also list the 2g (and 1g) placements that overlap the 4g
// placement after every GPU's others, as "published" does for the lower
// 3g; "cutfirst" takes a device of a GPU already cut before the published
// order's first, as a claim's firstAvailable could ask if devices said
// whether their GPU is cut; "bestfit" and "repack" are the bounds of BenchmarkMIGPacking.
// Metrics as in BenchmarkMIGPacking, summed over the streams.
//
//	go test -run '^$' -bench MIGPackingOrders -benchtime 1x ./pkg/mig/packing/
func BenchmarkMIGPackingOrders(b *testing.B) {
	const seeds, arrivals = 20, 1500
	for _, machine := range []string{"dgxh100", "dgxa100"} {
		node := publish(b, machine)
		orders := []struct {
			name  string
			order packing.FirstFit
		}{
			{"published", node.order},
			{"gpumajor", gpuMajorOrder(node)},
			{"ascending", ascendingOrder(node)},
			{"defer-2g3g", deferOrder(node, 1, 2)},
			{"defer-1g2g3g", deferOrder(node, 0, 1, 2)},
		}
		// cutFirst is what a claim could ask with firstAvailable: a device
		// of a GPU that is cut already, else any, each in the published
		// order. The devices would need an attribute saying so, kept
		// current by the plugin (not published today).
		cutFirst := func(n *packing.Node, prof int) (packing.Place, bool) {
			for _, p := range node.order {
				if p.Profile == prof && n.Cut(p.GPU) && n.Fits(p) {
					return p, true
				}
			}
			return node.order.Choose(n, prof)
		}
		for mi, mix := range packing.Mixes {
			b.Run(machine+"/"+mix.Name, func(b *testing.B) {
				results := make([]packing.Result, len(orders))
				var bestFit, repack, cut packing.Result
				for b.Loop() {
					clear(results)
					bestFit, repack, cut = packing.Result{}, packing.Result{}, packing.Result{}
					for seed := range uint64(seeds) {
						events := packing.Stream(&node.shape, mix, node.gpus, arrivals, benchLoad, 1000+100*uint64(mi)+seed)
						for i, o := range orders {
							results[i].Add(run(b, node, events, o.order))
						}
						bestFit.Add(run(b, node, events, packing.BestFit{}))
						cut.Add(run(b, node, events, packerFunc(cutFirst)))
						repack.Add(packing.RunRepack(&node.shape, node.gpus, events))
					}
				}
				for i, o := range orders {
					report(b, o.name+"-", results[i], true)
				}
				report(b, "cutfirst-", cut, true)
				report(b, "bestfit-", bestFit, true)
				report(b, "repack-", repack, false)
			})
		}
	}
}

func ascendingOrder(n *publishedNode) packing.FirstFit {
	var o packing.FirstFit
	for g := range n.gpus {
		for prof, p := range n.shape.Profiles {
			for _, pl := range p.Placements {
				o = append(o, packing.Place{GPU: g, Profile: prof, Placement: pl})
			}
		}
	}
	return o
}

// deferOrder is the GPU-major order with the placements of the given
// profiles that overlap the largest profile below the whole GPU (4g, the
// shape's fourth) moved after every GPU's other devices.
func deferOrder(n *publishedNode, profiles ...int) packing.FirstFit {
	var first, later packing.FirstFit
	four := n.shape.Profiles[3].Placements
	for _, p := range gpuMajorOrder(n) {
		if slices.Contains(profiles, p.Profile) && slices.ContainsFunc(four, p.Placement.Overlaps) {
			later = append(later, p)
		} else {
			first = append(first, p)
		}
	}
	return append(first, later...)
}

type packerFunc func(n *packing.Node, prof int) (packing.Place, bool)

func (f packerFunc) Choose(n *packing.Node, prof int) (packing.Place, bool) { return f(n, prof) }
