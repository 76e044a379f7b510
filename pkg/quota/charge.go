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
// tenant holds. Devices counts devices per DeviceClass (= GpuProfile) name.
// Charges are values: methods return new ones.
type Charge struct {
	Units   Units
	Memory  int64 // bytes
	Devices map[string]int64
}

// Add returns c+d.
func (c Charge) Add(d Charge) Charge {
	out := Charge{Units: c.Units.Add(d.Units), Memory: c.Memory + d.Memory}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return a + b })
	return out
}

// Sub returns c-d (used to take a claim's own cost out of a total).
func (c Charge) Sub(d Charge) Charge {
	out := Charge{Units: c.Units.Sub(d.Units), Memory: c.Memory - d.Memory}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return a - b })
	return out
}

// Max returns the per-resource maximum of c and d: the worst case of two
// alternatives, each resource taken from whichever alternative needs more.
func (c Charge) Max(d Charge) Charge {
	out := Charge{Units: MaxUnits(c.Units, d.Units), Memory: max(c.Memory, d.Memory)}
	out.Devices = mergeDevices(c.Devices, d.Devices, func(a, b int64) int64 { return max(a, b) })
	return out
}

// Times returns c*n.
func (c Charge) Times(n int64) Charge {
	out := Charge{Units: c.Units.Mul(n), Memory: c.Memory * n}
	if len(c.Devices) > 0 {
		out.Devices = make(map[string]int64, len(c.Devices))
		for k, v := range c.Devices {
			out.Devices[k] = v * n
		}
	}
	return out
}

// IsZero reports whether the charge costs nothing.
func (c Charge) IsZero() bool {
	if !c.Units.IsZero() || c.Memory != 0 {
		return false
	}
	for _, v := range c.Devices {
		if v != 0 {
			return false
		}
	}
	return true
}

// String is a compact form for logs: "units=3/7 (~0.429) memory=30Gi devices=[mig-1g:3]".
func (c Charge) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "units=%s memory=%s", c.Units, FormatMemory(c.Memory))
	if len(c.Devices) > 0 {
		parts := make([]string, 0, len(c.Devices))
		for _, k := range slices.Sorted(maps.Keys(c.Devices)) {
			parts = append(parts, fmt.Sprintf("%s:%d", k, c.Devices[k]))
		}
		fmt.Fprintf(&b, " devices=[%s]", strings.Join(parts, " "))
	}
	return b.String()
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
}

func (p *tallyPart) add(c Charge) {
	if c.Units.r != nil {
		p.units.Add(&p.units, c.Units.r)
	}
	p.memory += c.Memory
	for k, v := range c.Devices {
		if p.devices == nil {
			p.devices = map[string]int64{}
		}
		p.devices[k] += v
	}
}

func (p *tallyPart) charge() Charge {
	return Charge{Units: Units{r: new(big.Rat).Set(&p.units)}, Memory: p.memory, Devices: maps.Clone(p.devices)}
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
