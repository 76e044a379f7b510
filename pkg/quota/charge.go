package quota

import (
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Charge is an amount of the quota's resources: what a claim costs or what a
// tenant holds. Devices counts devices per DeviceClass (= GpuProfile) name;
// Shapes counts instances per GpuShape name (a claim of a shape is one).
// Charges are values: methods return new ones.
type Charge struct {
	Units   Units
	Memory  int64 // bytes
	Devices map[string]int64
	Shapes  map[string]int64
}

// Add returns c+d.
func (c Charge) Add(d Charge) Charge {
	out := Charge{Units: c.Units.Add(d.Units), Memory: c.Memory + d.Memory}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return a + b })
	out.Shapes = mergeDevices(c.Shapes, d.Shapes, func(a, b int64) int64 { return a + b })
	return out
}

// Sub returns c-d (used to take a claim's own cost out of a total).
func (c Charge) Sub(d Charge) Charge {
	out := Charge{Units: c.Units.Sub(d.Units), Memory: c.Memory - d.Memory}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return a - b })
	out.Shapes = mergeDevices(c.Shapes, d.Shapes, func(a, b int64) int64 { return a - b })
	return out
}

// Max returns the per-resource maximum of c and d: the worst case of two
// alternatives, each resource taken from whichever alternative needs more.
func (c Charge) Max(d Charge) Charge {
	out := Charge{Units: MaxUnits(c.Units, d.Units), Memory: max(c.Memory, d.Memory)}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return max(a, b) })
	out.Shapes = mergeDevices(c.Shapes, d.Shapes, func(a, b int64) int64 { return max(a, b) })
	return out
}

// Times returns c*n.
func (c Charge) Times(n int64) Charge {
	out := Charge{Units: c.Units.Mul(n), Memory: c.Memory * n}
	out.Devices = timesCounts(c.Devices, n)
	out.Shapes = timesCounts(c.Shapes, n)
	return out
}

func timesCounts(m map[string]int64, n int64) map[string]int64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v * n
	}
	return out
}

// IsZero reports whether the charge costs nothing.
func (c Charge) IsZero() bool {
	if !c.Units.IsZero() || c.Memory != 0 {
		return false
	}
	for _, m := range []map[string]int64{c.Devices, c.Shapes} {
		for _, v := range m {
			if v != 0 {
				return false
			}
		}
	}
	return true
}

// String is a compact form for logs: "units=3/7 (~0.429) memory=30Gi devices=[mig-1g:3] shapes=[slot:1]".
func (c Charge) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "units=%s memory=%s", c.Units, FormatMemory(c.Memory))
	writeCounts(&b, "devices", c.Devices)
	writeCounts(&b, "shapes", c.Shapes)
	return b.String()
}

func writeCounts(b *strings.Builder, name string, m map[string]int64) {
	if len(m) == 0 {
		return
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	fmt.Fprintf(b, " %s=[%s]", name, strings.Join(parts, " "))
}

func mergeDevices(a, b map[string]int64, op func(x, y int64) int64) map[string]int64 {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	out := make(map[string]int64, len(a)+len(b))
	for k, v := range a {
		out[k] = op(v, b[k])
	}
	for k, v := range b {
		if _, done := out[k]; !done {
			out[k] = op(0, v)
		}
	}
	return out
}

// FormatMemory writes bytes the way kubectl does: "80Gi", "10737418240".
func FormatMemory(bytes int64) string {
	return resource.NewQuantity(bytes, resource.BinarySI).String()
}

// Usage is what a tenant holds: Used by allocated claims (trued up from
// their allocation), Reserved by admitted claims not allocated yet (their
// worst case).
type Usage struct {
	Used, Reserved Charge
	Claims         int
}

// Total is Used+Reserved: what admission compares with the limits.
func (u Usage) Total() Charge { return u.Used.Add(u.Reserved) }

// AddClaim counts one claim's charge.
func (u Usage) AddClaim(c Charge, allocated bool) Usage {
	if allocated {
		u.Used = u.Used.Add(c)
	} else {
		u.Reserved = u.Reserved.Add(c)
	}
	u.Claims++
	return u
}

// Tally adds up many charges without allocating per charge: summing a
// tenant's claims on every admission must stay cheap. The zero value is
// ready to use; a Tally must not be copied after use.
type Tally struct {
	used, reserved tallyPart
	claims         int
}

type tallyPart struct {
	units   big.Rat
	memory  int64
	devices map[string]int64
	shapes  map[string]int64
}

func (p *tallyPart) add(c Charge) {
	if c.Units.r != nil {
		p.units.Add(&p.units, c.Units.r)
	}
	p.memory += c.Memory
	p.devices = addCounts(p.devices, c.Devices)
	p.shapes = addCounts(p.shapes, c.Shapes)
}

// addCounts adds m to sum, made when first needed.
func addCounts(sum, m map[string]int64) map[string]int64 {
	for k, v := range m {
		if sum == nil {
			sum = map[string]int64{}
		}
		sum[k] += v
	}
	return sum
}

func (p *tallyPart) charge() Charge {
	return Charge{Units: Units{r: new(big.Rat).Set(&p.units)}, Memory: p.memory,
		Devices: maps.Clone(p.devices), Shapes: maps.Clone(p.shapes)}
}

// Add counts one claim's charge.
func (t *Tally) Add(c Charge, allocated bool) {
	if allocated {
		t.used.add(c)
	} else {
		t.reserved.add(c)
	}
	t.claims++
}

// AddUsage counts a usage summed elsewhere.
func (t *Tally) AddUsage(u Usage) {
	t.used.add(u.Used)
	t.reserved.add(u.Reserved)
	t.claims += u.Claims
}

// Usage is the sum so far.
func (t *Tally) Usage() Usage {
	return Usage{Used: t.used.charge(), Reserved: t.reserved.charge(), Claims: t.claims}
}
