package packing

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
)

// Mix is how often each profile of a shape is asked for (weights by
// profile index of the Shape).
type Mix struct {
	Name    string
	Weights []float64
}

// Mixes are the three: small profiles mostly, large ones mostly,
// and all alike. Weights are for the shapes the benchmark builds, whose
// profiles are 1g, 2g, 3g, 4g and 7g in that order.
var Mixes = []Mix{
	{"small-heavy", []float64{50, 25, 15, 7, 3}},
	{"large-heavy", []float64{10, 10, 25, 25, 30}},
	{"uniform", []float64{20, 20, 20, 20, 20}},
}

// Event is one arrival or departure of a claim.
type Event struct {
	Arrive  bool
	Claim   int
	Profile int
}

// Stream is a seeded stream of arrivals of claims and of their
// departures. One claim arrives per step and holds its device for an
// exponentially distributed number of steps whose mean makes the offered
// load (compute slices asked for, by Little's law) load times what gpus
// GPUs of the shape have, so the node runs full and refusals happen. A
// claim that is refused departs anyway at its time: its departure is then
// nothing. Every packer sees the same events.
func Stream(s *Shape, m Mix, gpus, arrivals int, load float64, seed uint64) []Event {
	rng := rand.New(rand.NewPCG(seed, 0x29))
	var total, mean float64
	for _, w := range m.Weights {
		total += w
	}
	for i, w := range m.Weights {
		mean += w / total * float64(s.Profiles[i].ComputeSlices)
	}
	life := load * float64(gpus*s.Totals.ComputeSlices) / mean
	var out []Event
	due := &departures{}
	for i := range arrivals {
		for due.Len() > 0 && (*due)[0].at <= float64(i) {
			d := heap.Pop(due).(departure)
			out = append(out, Event{Claim: d.claim, Profile: d.profile})
		}
		prof := pick(rng, m.Weights, total)
		out = append(out, Event{Arrive: true, Claim: i, Profile: prof})
		heap.Push(due, departure{at: float64(i) + math.Max(rng.ExpFloat64()*life, 0.5), claim: i, profile: prof})
	}
	return out
}

func pick(rng *rand.Rand, weights []float64, total float64) int {
	x := rng.Float64() * total
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(weights) - 1
}

type departure struct {
	at             float64
	claim, profile int
}

type departures []departure

func (d departures) Len() int           { return len(d) }
func (d departures) Less(i, j int) bool { return d[i].at < d[j].at }
func (d departures) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)        { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// Result is what a packer did with a stream.
type Result struct {
	Arrivals int
	// Refused are the claims no device was found for.
	Refused int
	// RefusedWithRoom are the refused claims for which some GPU had the
	// compute slices and the number of memory slices free (Node.HasRoom).
	RefusedWithRoom int
	// LargestMean is the mean, after every event, of the compute slices of
	// the largest profile the node could still take (Node.Largest).
	LargestMean float64
}

// Add sums o into r: counts add up, LargestMean becomes the mean over
// the streams (each weighed by its arrivals).
func (r *Result) Add(o Result) {
	if total := r.Arrivals + o.Arrivals; total > 0 {
		r.LargestMean = (r.LargestMean*float64(r.Arrivals) + o.LargestMean*float64(o.Arrivals)) / float64(total)
	}
	r.Arrivals += o.Arrivals
	r.Refused += o.Refused
	r.RefusedWithRoom += o.RefusedWithRoom
}

// Allocate places or refuses one claim of profile prof; it is the packer
// under test (a model packer, or the upstream allocator).
type Allocate func(n *Node, claim, prof int) (Place, bool)

// Release is told of a departing claim that held p.
type Release func(claim int, p Place)

// Run plays a stream on a node of gpus GPUs: alloc decides each arrival,
// which the node then records (so the model sees what the allocator did),
// and each departure frees what its claim held. A place that the model
// says does not fit is an error: the model and the packer disagree on
// NVIDIA's rules, and no figure would mean anything.
func Run(s *Shape, gpus int, events []Event, alloc Allocate, release Release) (Result, error) {
	n := NewNode(s, gpus)
	held := map[int]Place{}
	var r Result
	largest := 0
	for _, e := range events {
		if e.Arrive {
			r.Arrivals++
			p, ok := alloc(n, e.Claim, e.Profile)
			if ok && !n.Fits(p) {
				return r, fmt.Errorf("claim %d: %s at %+v on GPU %d does not fit there", e.Claim, s.Profiles[p.Profile].Name, p.Placement, p.GPU)
			}
			if ok {
				n.Add(p)
				held[e.Claim] = p
			} else {
				r.Refused++
				if n.HasRoom(e.Profile) {
					r.RefusedWithRoom++
				}
			}
		} else if p, ok := held[e.Claim]; ok {
			n.Remove(p)
			delete(held, e.Claim)
			if release != nil {
				release(e.Claim, p)
			}
		}
		largest += n.Largest()
	}
	if len(events) > 0 {
		r.LargestMean = float64(largest) / float64(len(events))
	}
	return r, nil
}

// RunPacker is Run with a model packer.
func RunPacker(s *Shape, gpus int, events []Event, p Packer) (Result, error) {
	return Run(s, gpus, events, func(n *Node, _, prof int) (Place, bool) { return p.Choose(n, prof) }, nil)
}
