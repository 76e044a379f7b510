package quota

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Pricer prices claims against one snapshot of the published devices and
// the DeviceClasses. Build a new one when either changes; a Pricer
// remembers what it worked out per request shape, so pricing the same
// template's claims again costs a map lookup. Safe for concurrent use.
type Pricer struct {
	inv      *Inventory
	classes  map[string]*resourceapi.DeviceClass
	profiles map[string]bool
	// shapesOf names the shapes a claim is an instance of (WithShapes).
	shapesOf ShapesOf
	// slots bound the new shapes evaluated at once (WithSlots).
	slots *PricingSlots

	mu         sync.Mutex
	memo       map[shapeHash]*price  // see remember
	profilesOf map[DeviceID][]string // see deviceProfiles
}

// price is what one request shape (class, selectors, capacity) costs.
type price struct {
	ours    bool   // the class is one of ours (or matches our devices)
	matches int    // devices it can get
	device  Charge // the most one allocated device can cost
	node    Charge // the most allocationMode All can cost: the largest node
	guessed bool   // no device matches: device is a guess, see fallback
	// memUnknown: guessed, and no memory to guess from (the request asks
	// for none and no device of ours is published), so device.Memory is 0.
	memUnknown bool
	// interrupted: the request's context ended before every device was
	// evaluated, so the walk proves nothing; never remembered.
	interrupted bool
}

// PricingSlots bound how many new request shapes are evaluated against
// the devices at once. A shape is priced by evaluating its CEL selectors
// against every published device, and anyone who may create claims (dry
// runs included) chooses the shapes: unbounded, a burst of new shapes took
// the CPU the fail-closed claim webhook needs. A caller waits for a slot
// only as long as its context lives. Dry runs have slots of their own: a
// dry run stores nothing, and two of them held both claims' slots while
// another tenant's new shape waited 4.8 of its 5 s (issue 36); dry runs
// queue behind each other, never ahead of a claim being created.
//
// The Accountant owns one set and hands it to every Pricer it builds, so
// the bound holds across catalog generations; a process-wide set shared
// every test's and replica's pricing by accident (issue 55).
type PricingSlots struct {
	claims, dryRuns chan struct{}
}

// NewPricingSlots are claims slots for claims being created and dryRuns
// for dry runs.
func NewPricingSlots(claims, dryRuns int) *PricingSlots {
	return &PricingSlots{claims: make(chan struct{}, claims), dryRuns: make(chan struct{}, dryRuns)}
}

// DefaultPricingSlots are the controller's: two for claims, one for dry
// runs.
func DefaultPricingSlots() *PricingSlots { return NewPricingSlots(2, 1) }

// slotsFor is the pool a pricing under ctx takes its slot from.
func (s *PricingSlots) slotsFor(ctx context.Context) chan struct{} {
	if dryRunOf(ctx) != nil {
		return s.dryRuns
	}
	return s.claims
}

// Unpriced is a request whose worst case what is published cannot bound:
// its class matches no published device, and the guess (see fallback)
// would undercharge. A guess of 0 or of the largest node seen so far is no
// bound: the claim waits and takes what the next node brings.
type Unpriced struct {
	Class string
	// All: allocationMode All, which takes every matching device of the
	// node it lands on; how many, and what they are, nothing tells yet.
	All bool
	// Memory: the memory of a device of the class; nothing published
	// says how much a device of ours holds.
	Memory bool
	// Interrupted: the request ended (its deadline, a cancelled dry run)
	// before its selectors were evaluated against every device.
	Interrupted bool
	// OverBudget: interrupted because the claim's selectors spent its CEL
	// budget (MaxCELCostPerClaim).
	OverBudget bool
}

// Reason says why, for a denial.
func (u Unpriced) Reason() string {
	if u.OverBudget {
		return fmt.Sprintf("the selectors of a request of class %q cost more to evaluate against the published devices than one claim may "+
			"(%d CEL cost units): make them simpler or fewer", u.Class, MaxCELCostPerClaim)
	}
	if u.Interrupted {
		return fmt.Sprintf("the selectors of a request of class %q could not be evaluated against the published devices before the request's deadline: retry", u.Class)
	}
	if u.All {
		return fmt.Sprintf("allocationMode All of class %q cannot be charged before devices of the class are published: it takes every matching device of the node it lands on, however many that node has", u.Class)
	}
	return fmt.Sprintf("the gpuMemory of a device of class %q cannot be charged before devices of ours are published: the claim asks for no memory capacity and no device shows how much one holds", u.Class)
}

// NewPricer prices against inv. classes are the DeviceClasses by name;
// profiles the names of GpuProfiles, whose classes are ours even before
// they exist or match a device.
func NewPricer(inv *Inventory, classes map[string]*resourceapi.DeviceClass, profiles map[string]bool) *Pricer {
	return &Pricer{inv: inv, classes: classes, profiles: profiles, slots: DefaultPricingSlots(),
		memo: map[shapeHash]*price{}, profilesOf: map[DeviceID][]string{}}
}

// WithSlots has the pricer take its slots for new shapes from s, shared
// with every pricer given s, instead of slots of its own; it returns p.
// Call it before the pricer is used.
func (p *Pricer) WithSlots(s *PricingSlots) *Pricer {
	p.slots = s
	return p
}

// ShapesOf counts the instances of each GpuShape a claim's spec holds,
// nil for none. pkg/shape knows what makes a claim a shape's
// and imports this package, so the pricer is handed the test.
type ShapesOf func(spec *resourceapi.ResourceClaimSpec) map[string]int64

// WithShapes has the pricer charge every claim the instances of each
// shape f counts (Charge.Shapes), allocated or not; it returns p. Call it before
// the pricer is used.
func (p *Pricer) WithShapes(f ShapesOf) *Pricer {
	p.shapesOf = f
	return p
}

// shapes is what spec counts in instances of shapes.
func (p *Pricer) shapes(spec *resourceapi.ResourceClaimSpec) map[string]int64 {
	if p.shapesOf == nil {
		return nil
	}
	return p.shapesOf(spec)
}

// Inventory is the device snapshot the pricer uses.
func (p *Pricer) Inventory() *Inventory { return p.inv }

// ClaimCost is the worst case a claim may be charged once allocated: for
// each request, count times the most expensive device its class and
// selectors can match; for firstAvailable the most expensive alternative,
// per resource; for allocationMode All what it can match on the largest
// node; nothing for adminAccess requests.
func (p *Pricer) ClaimCost(ctx context.Context, spec *resourceapi.ResourceClaimSpec) Charge {
	var total Charge
	for i := range spec.Devices.Requests {
		total = total.Add(p.RequestCost(ctx, &spec.Devices.Requests[i]))
	}
	total.Shapes = p.shapes(spec)
	return total
}

// Unpriced lists the requests of a claim (firstAvailable alternatives
// included: the worst one is charged) whose worst case cannot be bounded
// from what is published; ClaimCost prices them by a guess.
func (p *Pricer) Unpriced(ctx context.Context, spec *resourceapi.ResourceClaimSpec) []Unpriced {
	var out []Unpriced
	check := func(class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements,
		mode resourceapi.DeviceAllocationMode, admin *bool) {
		if ptr.Deref(admin, false) {
			return
		}
		pr := p.priceOf(ctx, class, sel, capReq)
		switch {
		case pr.interrupted:
			out = append(out, Unpriced{Class: class, Interrupted: true, OverBudget: overBudget(ctx)})
		case !pr.ours || !pr.guessed:
		case mode == resourceapi.DeviceAllocationModeAll:
			out = append(out, Unpriced{Class: class, All: true})
		case pr.memUnknown:
			out = append(out, Unpriced{Class: class, Memory: true})
		}
	}
	for _, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			check(e.DeviceClassName, e.Selectors, e.Capacity, e.AllocationMode, e.AdminAccess)
		}
		for _, sub := range r.FirstAvailable {
			check(sub.DeviceClassName, sub.Selectors, sub.Capacity, sub.AllocationMode, nil)
		}
	}
	return out
}

// Guessed lists, sorted and once each, the classes of a claim's requests
// (firstAvailable alternatives included) that no published device matches,
// so that ClaimCost priced each of their devices as a whole GPU (fallback):
// a refusal must say its price is a guess, or a tenant asking for a 1/7
// slice reads "requested 1" and nothing else.
func (p *Pricer) Guessed(ctx context.Context, spec *resourceapi.ResourceClaimSpec) []string {
	var out []string
	check := func(class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements, admin *bool) {
		if ptr.Deref(admin, false) {
			return
		}
		if pr := p.priceOf(ctx, class, sel, capReq); pr.ours && pr.guessed && !pr.interrupted {
			out = append(out, class)
		}
	}
	for _, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			check(e.DeviceClassName, e.Selectors, e.Capacity, e.AdminAccess)
		}
		for _, sub := range r.FirstAvailable {
			check(sub.DeviceClassName, sub.Selectors, sub.Capacity, nil)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// RequestCost prices one request of a claim (see ClaimCost).
func (p *Pricer) RequestCost(ctx context.Context, r *resourceapi.DeviceRequest) Charge {
	if r.Exactly != nil {
		return p.exactCost(ctx, r.Exactly.DeviceClassName, r.Exactly.Selectors, r.Exactly.Capacity,
			r.Exactly.AllocationMode, r.Exactly.Count, r.Exactly.AdminAccess)
	}
	var worst Charge
	for _, sub := range r.FirstAvailable {
		c := p.exactCost(ctx, sub.DeviceClassName, sub.Selectors, sub.Capacity, sub.AllocationMode, sub.Count, nil)
		worst = worst.Max(c)
	}
	return worst
}

func (p *Pricer) exactCost(ctx context.Context, class string, sel []resourceapi.DeviceSelector,
	capReq *resourceapi.CapacityRequirements, mode resourceapi.DeviceAllocationMode, count int64, admin *bool) Charge {
	if ptr.Deref(admin, false) {
		return Charge{} // admin access watches devices, it does not hold them
	}
	pr := p.priceOf(ctx, class, sel, capReq)
	if !pr.ours {
		return Charge{}
	}
	if mode == resourceapi.DeviceAllocationModeAll {
		return pr.node
	}
	return pr.device.Times(max(count, 1))
}

func (p *Pricer) priceOf(ctx context.Context, class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) *price {
	key := shapeHash(sha256.Sum256([]byte(shapeKey(class, sel, capReq))))
	if pr, ok := p.recall(ctx, key); ok {
		return pr
	}
	slots := p.slots.slotsFor(ctx)
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return p.interrupted(class, capReq)
	}
	pr := p.compute(ctx, class, sel, capReq)
	<-slots
	if pr.interrupted {
		// A walk cut short matched fewer devices than there are: kept,
		// it would price every later claim of the shape too cheap.
		return pr
	}
	p.remember(ctx, key, pr)
	return pr
}

// interrupted is the price of a shape that could not be worked out: the
// most a device of ours can cost, so ClaimCost never undercharges, and
// marked so that Unpriced refuses it.
func (p *Pricer) interrupted(class string, capReq *resourceapi.CapacityRequirements) *price {
	device := p.fallback(class, capReq)
	return &price{ours: true, interrupted: true, guessed: true, device: device,
		node: device.Times(max(p.inv.MaxGPUsPerNode(), 1))}
}

// shapeKey is the memo key of a request shape. Every field is written with
// its length, so no field can spell the boundary of the next: selector
// expressions are the claim author's text, and a CEL comment may hold any
// byte. (With plain separators, one selector whose comment held a separator
// keyed the same as two selectors, and a dry run of a cheap claim priced a
// dear one.) Capacity names are sorted: the same shape keys the same.
func shapeKey(class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) string {
	var b strings.Builder
	field := func(tag byte, s string) {
		b.WriteByte(tag)
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	field('c', class)
	for _, s := range sel {
		if s.CEL != nil {
			field('s', s.CEL.Expression)
		}
	}
	if capReq != nil {
		for _, name := range slices.Sorted(maps.Keys(capReq.Requests)) {
			q := capReq.Requests[name]
			field('n', string(name))
			field('q', q.String())
		}
	}
	return b.String()
}

// compute walks the inventory once for a request shape.
func (p *Pricer) compute(ctx context.Context, class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) *price {
	exprs := p.selectors(class, sel)
	pr := &price{}
	var nodeTotal Charge
	for _, pool := range p.inv.Pools() {
		var onNode Charge
		for _, d := range p.inv.Pool(pool) {
			if ctx.Err() != nil {
				return p.interrupted(class, capReq)
			}
			c, ok := p.deviceCharge(ctx, d, class, exprs, capReq)
			if !ok {
				continue
			}
			pr.matches++
			pr.device = pr.device.Max(c)
			onNode = onNode.Add(c)
		}
		nodeTotal = nodeTotal.Max(onNode)
	}
	pr.node = nodeTotal
	pr.ours = pr.matches > 0 || p.isOurs(class) || p.classes[class] == nil
	if pr.matches == 0 && pr.ours {
		// Nothing to price against. Free would let the claim through now
		// and onto a device once one (or the class) appears, past quota.
		pr.device, pr.guessed = p.fallback(class, capReq), true
		pr.memUnknown = pr.device.Memory == 0
		// Only a guess for a tenant with no limit it could exceed:
		// Unpriced tells the others' admission to refuse it.
		pr.node = pr.device.Times(max(p.inv.MaxGPUsPerNode(), 1))
	}
	return pr
}

// fallback prices a device of ours when none is published that matches
// (no node yet, MIG not configured yet): a whole GPU, the most any device is
// worth, and the memory asked for or else the largest device's memory.
// The true-up after allocation corrects it.
func (p *Pricer) fallback(class string, capReq *resourceapi.CapacityRequirements) Charge {
	mem := p.inv.MaxMemory()
	if capReq != nil {
		if q, ok := quantityIn(capReq.Requests, p.inv.Driver(), CapacityMemory); ok {
			mem = q.Value()
		}
	}
	return Charge{Units: WholeUnits(1), Memory: mem, Devices: map[string]int64{class: 1}}
}

// isOurs tells a class of this driver that matches nothing right now from
// someone else's class (a NIC, say), which costs nothing here. A class that
// does not exist yet is priced as ours by compute: whoever creates it
// decides what it selects, and the claim waits for it.
func (p *Pricer) isOurs(class string) bool {
	if p.profiles[class] {
		return true
	}
	dc := p.classes[class]
	return dc != nil && p.ClassIsOurs(dc)
}

// ClassIsOurs tells, without looking at any device, a class of this
// driver: a GpuProfile's (by its name, or the label of the classes
// profiles render), or one with a selector naming our driver. It is the
// one such rule: pricing (isOurs, then compute, which also takes a class
// that selects a published device of ours or does not exist yet) and the
// webhook's matchCondition of foreign classes both use it.
func (p *Pricer) ClassIsOurs(dc *resourceapi.DeviceClass) bool {
	return p.profiles[dc.Name] || ClassNamesDriver(dc, p.inv.Driver())
}

// ClassNamesDriver is ClassIsOurs without the catalog: the class carries
// the label of the classes profiles render, or a selector names driver.
// The Kueue mappings use it to charge a class of ours that a shape names
// in GPU units.
func ClassNamesDriver(dc *resourceapi.DeviceClass, driver string) bool {
	if _, ok := dc.Labels[gpuaas.ProfileLabel]; ok {
		return true
	}
	for _, s := range dc.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, `"`+driver+`"`) {
			return true
		}
	}
	return false
}

// selectors are the class's expressions followed by the request's. An
// unknown class selects nothing: the scheduler cannot allocate it either.
func (p *Pricer) selectors(class string, sel []resourceapi.DeviceSelector) []string {
	dc := p.classes[class]
	if dc == nil {
		return nil
	}
	var exprs []string
	for _, s := range append(append([]resourceapi.DeviceSelector(nil), dc.Spec.Selectors...), sel...) {
		if s.CEL != nil {
			exprs = append(exprs, s.CEL.Expression)
		}
	}
	return exprs
}

// deviceCharge is what one allocation of d for the request costs, and
// whether d is a candidate at all.
func (p *Pricer) deviceCharge(ctx context.Context, d *Device, class string, exprs []string, capReq *resourceapi.CapacityRequirements) (Charge, bool) {
	if p.classes[class] == nil || !Matches(ctx, d, exprs) {
		return Charge{}, false
	}
	mem, ok := consumedMemory(d, p.inv.Driver(), capReq)
	if !ok {
		return Charge{}, false
	}
	devices := p.devicesOf(ctx, d, class)
	if ptr.Deref(d.Basic.AllowMultipleAllocations, false) {
		return Charge{Units: shareUnits(mem, d.Memory), Memory: mem, Devices: devices}, true
	}
	return Charge{Units: d.Units, Memory: d.Memory, Devices: devices}, true
}

// devicesOf is the device count one allocation of d charges: one of the
// class requested and one of every GpuProfile d belongs to. Device limits
// are per profile, so they hold whatever class the device came through: a
// tenant with h100: 0 got an H100 through a generic class when only the
// class requested was counted.
func (p *Pricer) devicesOf(ctx context.Context, d *Device, class string) map[string]int64 {
	devices := map[string]int64{class: 1}
	for _, profile := range p.deviceProfiles(ctx, d) {
		devices[profile] = 1
	}
	return devices
}

// deviceProfiles are the GpuProfiles whose class selects d, worked out
// once per device and pricer. They are evaluated whatever is left of ctx's
// deadline or CEL budget: the selectors are the profiles' (the platform's),
// the answer is kept for every later claim, and one worked out under a
// pricing cut short matched no profile, so every later claim given d was
// charged none of its profiles' device limits (issue 55).
func (p *Pricer) deviceProfiles(ctx context.Context, d *Device) []string {
	p.mu.Lock()
	known, ok := p.profilesOf[d.ID]
	p.mu.Unlock()
	if ok {
		return known
	}
	ctx = context.WithoutCancel(ctx)
	var out []string
	for _, name := range slices.Sorted(maps.Keys(p.profiles)) {
		if p.classes[name] != nil && Matches(ctx, d, p.selectors(name, nil)) {
			out = append(out, name)
		}
	}
	p.mu.Lock()
	p.profilesOf[d.ID] = out
	p.mu.Unlock()
	return out
}

// Matches evaluates DRA CEL selector expressions against a device with the
// same compiler the scheduler uses. An expression that fails to compile or
// to evaluate does not match, as the scheduler would not allocate the
// device either.
func Matches(ctx context.Context, d *Device, exprs []string) bool {
	for _, expr := range exprs {
		if ctx.Err() != nil { // a deadline or the CEL budget: the walk is cut short
			return false
		}
		res := celPrograms.get(ctx, expr)
		if res.Error != nil {
			return false
		}
		ok, details, err := res.DeviceMatches(ctx, cel.Device{
			Driver:                   d.ID.Driver,
			AllowMultipleAllocations: d.Basic.AllowMultipleAllocations,
			Attributes:               d.Basic.Attributes,
			Capacity:                 d.Basic.Capacity,
		})
		spendCEL(ctx, details)
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// memoryOf reads a consumed-capacity entry of an allocation result.
func memoryOf(m map[resourceapi.QualifiedName]resource.Quantity, driver string) (int64, bool) {
	q, ok := quantityIn(m, driver, CapacityMemory)
	return q.Value(), ok
}
