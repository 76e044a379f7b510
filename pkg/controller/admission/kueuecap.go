package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The cap of the Kueue overrule. Kueue charged an admitted workload an
// amount of each of its resources (GPU milli-units, for our classes); the
// claims of the pods that lead to the workload may hold that much past
// their tenant's quota, and no more. A tenant's pod that names an admitted
// Job as its controller is one of those pods: it takes from the Job's
// charge, and the Job's own pods then wait for quota, but the tenant gets
// no more than Kueue gave it.
//
// What the workload's pods hold is counted twice over, so that a tenant
// who edits its pods' or claims' ownerReferences afterwards cannot make
// room: live, the claims in the namespace whose pods lead to the workload
// now; and from the overrule book, every claim overruled for the workload
// that still exists, as the controller recorded it at admission.

// kueueClaimCharge is what a claim costs in Kueue's terms.
type kueueClaimCharge struct {
	// milli is per Kueue resource: for each device, the gpu-milliunits
	// counter it publishes (its GPU units in thousandths, rounded down),
	// as Kueue charges it.
	milli map[string]int64
	// classes are the classes of ours the claim asks for.
	classes sets.Set[string]
	// uncharged tells why Kueue charges some request of the claim nothing
	// (a firstAvailable request, a class it does not map); "" if none.
	uncharged string
}

// kueueCharge prices a claim's requests as Kueue's deviceClassMappings
// charge them: count times the counter of the dearest device the request
// can get.
func (a *Accountant) kueueCharge(ctx context.Context, spec *resourceapi.ResourceClaimSpec) (kueueClaimCharge, error) {
	cat, _, err := a.snapshots(ctx)
	if err != nil {
		return kueueClaimCharge{}, err
	}
	out := kueueClaimCharge{milli: map[string]int64{}, classes: sets.New[string]()}
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			e := r.Exactly
			if ptr.Deref(e.AdminAccess, false) {
				continue // holds nothing
			}
			why := out.add(ctx, cat, e.DeviceClassName, e.Selectors, e.Capacity, e.AllocationMode, e.Count)
			out.uncharged = cmp.Or(out.uncharged, why)
			continue
		}
		// Kueue does not read firstAvailable requests: what they hold is
		// counted (the dearest alternative), but Kueue charged none of it.
		worst := kueueClaimCharge{milli: map[string]int64{}, classes: out.classes}
		for _, sub := range r.FirstAvailable {
			alt := kueueClaimCharge{milli: map[string]int64{}, classes: out.classes}
			alt.add(ctx, cat, sub.DeviceClassName, sub.Selectors, sub.Capacity, sub.AllocationMode, sub.Count)
			for res, m := range alt.milli {
				worst.milli[res] = max(worst.milli[res], m)
			}
		}
		for res, m := range worst.milli {
			out.milli[res] += m
		}
		if len(worst.milli) > 0 {
			out.uncharged = cmp.Or(out.uncharged, fmt.Sprintf("Kueue does not charge request %s (firstAvailable)", r.Name))
		}
	}
	return out, nil
}

// add adds one request's charge; it returns why Kueue charges it nothing,
// if it does not.
func (c *kueueClaimCharge) add(ctx context.Context, cat *priceList, class string, sel []resourceapi.DeviceSelector,
	capReq *resourceapi.CapacityRequirements, mode resourceapi.DeviceAllocationMode, count int64) string {
	one := cat.pricer.RequestCost(ctx, &resourceapi.DeviceRequest{Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, Selectors: sel, Capacity: capReq,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}})
	if one.IsZero() {
		return "" // not ours
	}
	c.classes.Insert(class)
	res, charged := kueueResourceOf(cat, class)
	switch {
	case !charged:
		return fmt.Sprintf("Kueue does not charge class %s", class)
	case mode == resourceapi.DeviceAllocationModeAll:
		all := cat.pricer.RequestCost(ctx, &resourceapi.DeviceRequest{Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class, Selectors: sel, Capacity: capReq, AllocationMode: mode,
		}})
		c.milli[res] += all.Units.FloorMilli()
		return fmt.Sprintf("Kueue does not charge class %s with allocationMode All", class)
	}
	c.milli[res] += max(count, 1) * one.Units.FloorMilli()
	return ""
}

// kueueResourceOf is the Kueue resource a class is charged as: its
// profile's, or the default for a class of ours that no profile renders
// (the admin maps it in Kueue's configuration by hand). false when the
// controller renders no mapping for it.
func kueueResourceOf(cat *priceList, class string) (string, bool) {
	if p := cat.profiles[class]; p != nil {
		return kueue.ChargedAs(p)
	}
	return kueue.DefaultResource, true
}

// kueueVerdict is the gate's answer for a claim the quota denied.
type kueueVerdict struct {
	// overrule admits the claim; nil when Kueue does not.
	overrule *overruling
	// workload is the admitted workload of the claim's pod, if any.
	workload string
	// why the claim is not overruled.
	why string
}

// overrule decides whether Kueue overrules the quota for a claim that user
// is creating: the kube-controller-manager must have made it for a pod that
// leads to an active Workload, and it must fit, with every other claim of
// that workload's pods, in what Kueue charged the workload. Unless dryRun,
// the claim is recorded against the workload before it is admitted.
func (g *KueueGate) overrule(ctx context.Context, claim *resourceapi.ResourceClaim, user string, dryRun bool) (kueueVerdict, error) {
	if g == nil {
		return kueueVerdict{why: "the controller does not integrate with Kueue"}, nil
	}
	walk := newOwnerWalk(g.live)
	wl, workloads, why, err := g.workloadFor(ctx, claim, user, walk)
	if wl == nil {
		return kueueVerdict{why: why}, err
	}
	v := kueueVerdict{workload: claim.Namespace + "/" + wl.name}
	charge, err := g.acct.kueueCharge(ctx, &claim.Spec)
	if err != nil {
		return v, err
	}
	if charge.uncharged != "" {
		v.why = charge.uncharged
		return v, nil
	}
	var claims resourceapi.ResourceClaimList
	if err := g.acct.reader.List(ctx, &claims, client.InNamespace(claim.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return v, fmt.Errorf("listing the ResourceClaims of %s: %w", claim.Namespace, err)
	}
	live, err := g.heldLive(ctx, claim, wl, workloads, claims.Items, walk)
	if err != nil {
		return v, err
	}
	spend := overruleRecord{UID: claim.UID, Name: claim.Name, Workload: wl.uid, Milli: charge.milli}
	// workloadFor found wl only through the pod claimPod verified: the
	// claim's controller in the kube-controller-manager's own create.
	if ref := metav1.GetControllerOf(claim); ref != nil {
		spend.Pod, spend.PodName = ref.UID, ref.Name
	}
	if v.why, err = g.spend(ctx, claim.Namespace, wl, spend, live, claims.Items, dryRun); v.why != "" || err != nil {
		return v, err
	}
	charged, capped, err := g.tenantCharge(ctx, claim.Namespace, workloads)
	if err != nil {
		return v, err
	}
	v.overrule = &overruling{by: "Kueue admitted workload " + v.workload, classes: charge.classes, charged: charged, capped: capped}
	return v, nil
}

// tenantCharge is what Kueue charged the active workloads of every
// namespace of the claim's tenant, in GPU units, and the units that charge
// caps, with room for Kueue's rounding (kueueRounding); nil when the
// namespace has no valid tenant. inNamespace are the Workloads of the
// claim's namespace, read already.
func (g *KueueGate) tenantCharge(ctx context.Context, namespace string, inNamespace []kueueWorkload) (charged, capped *quota.Units, _ error) {
	cat, ten, err := g.acct.snapshots(ctx)
	if err != nil {
		return nil, nil, err
	}
	owner, err := g.acct.ownerLocked(ctx, ten, namespace)
	if err != nil || owner == "" || ten.invalid[owner] != "" {
		return nil, nil, err
	}
	ours := sets.New(kueue.DefaultResource)
	for class := range cat.profiles {
		if res, ok := kueueResourceOf(cat, class); ok {
			ours.Insert(res)
		}
	}
	var milli int64
	for _, ns := range ten.assign.Namespaces[owner] {
		workloads := inNamespace
		if ns != namespace {
			if workloads, err = g.workloadsIn(ctx, ns); err != nil {
				return nil, nil, err
			}
		}
		for _, wl := range workloads {
			for res, m := range wl.charge {
				if wl.active && ours.Has(res) {
					milli += m
				}
			}
		}
	}
	return ptr.To(quota.NewUnits(milli, 1000)), ptr.To(kueueRounding(cat.pricer.Inventory(), milli)), nil
}

// kueueRounding converts what Kueue charged, in milli-units, into GPU units
// that the devices it was charged for fit in. Kueue charges each device
// its units in thousandths rounded down (a 1g MIG device, 1/7, is 142), so
// the devices hold a little more than Kueue's sum, less than a thousandth
// more each. A device of units d is charged more than 1000d - 1, so with
// the smallest device published costing u, the devices a charge of m
// thousandths covers hold at most m/1000 times 1000u/(1000u - 1) units:
// 0.7% more than Kueue's sum when u is 1/7.
func kueueRounding(inv *quota.Inventory, milli int64) quota.Units {
	charged := quota.NewUnits(milli, 1000)
	var smallest quota.Units
	for _, d := range inv.Devices() {
		if d.Units.Sign() > 0 && (smallest.IsZero() || d.Units.Cmp(smallest) < 0) {
			smallest = d.Units
		}
	}
	perMilli := smallest.Mul(1000) // the smallest device, in thousandths
	if perMilli.Cmp(quota.NewUnits(1, 1)) <= 0 {
		return charged // no device Kueue could charge a thousandth for: nothing to round
	}
	return charged.Scaled(perMilli, perMilli.Sub(quota.NewUnits(1, 1)))
}

// spend records the claim's charge against the workload in the overrule
// book (unless dryRun), if it fits in what Kueue charged the workload with
// what its claims hold; else it says why not. The book is written with the
// version read, so replicas deciding at once on claims of one workload
// decide one after the other.
func (g *KueueGate) spend(ctx context.Context, namespace string, wl *kueueWorkload, rec overruleRecord,
	live map[types.UID]map[string]int64, claims []resourceapi.ResourceClaim, dryRun bool) (string, error) {
	for attempt := 1; ; attempt++ {
		cm, records, err := g.book.load(ctx, namespace)
		if err != nil {
			return "", err
		}
		if why := overCharge(wl, rec.Milli, heldBy(live, records, wl.uid)); why != "" || dryRun {
			return why, nil
		}
		rec.At = g.acct.now()
		err = g.book.write(ctx, namespace, cm, append(pruneRecords(records, claims, rec.At), rec))
		if err == nil || !conflicted(err) || attempt == ledgerAttempts {
			return "", err
		}
		klog.FromContext(ctx).V(4).Info("Kueue overrule book changed by another replica, deciding again", "namespace", namespace)
	}
}

// workloadFor is the active Workload of the pod the kube-controller-manager
// made the claim for, with the namespace's Workloads; nil and why when
// there is none.
func (g *KueueGate) workloadFor(ctx context.Context, claim *resourceapi.ResourceClaim, user string, walk *ownerWalk) (*kueueWorkload, []kueueWorkload, string, error) {
	pod, why, err := g.claimPod(ctx, claim, user)
	if pod == nil {
		return nil, nil, why, err
	}
	walk.pods[pod.Name] = pod
	workloads, err := g.workloadsIn(ctx, claim.Namespace)
	if err != nil {
		return nil, nil, "", err
	}
	wl, why, err := g.workloadOf(ctx, pod, workloads, walk)
	return wl, workloads, why, err
}

// heldLive is what the namespace's other claims hold, by claim, whose pods
// lead to the workload now. Any claim of such a pod counts, made by hand
// or not: counting more only makes the cap stricter.
func (g *KueueGate) heldLive(ctx context.Context, claim *resourceapi.ResourceClaim, wl *kueueWorkload,
	workloads []kueueWorkload, claims []resourceapi.ResourceClaim, walk *ownerWalk) (map[types.UID]map[string]int64, error) {
	out := map[types.UID]map[string]int64{}
	for i := range claims {
		c := &claims[i]
		ref := metav1.GetControllerOf(c)
		if c.UID == claim.UID || ref == nil || ref.Kind != "Pod" {
			continue
		}
		pod, err := walk.pod(ctx, c.Namespace, ref.Name)
		if err != nil {
			return nil, err
		}
		if pod == nil || pod.UID != ref.UID {
			continue
		}
		owner, _, err := g.workloadOf(ctx, pod, workloads, walk)
		if err != nil {
			return nil, err
		}
		if owner == nil || owner.uid != wl.uid {
			continue
		}
		charge, err := g.acct.kueueCharge(ctx, &c.Spec)
		if err != nil {
			return nil, err
		}
		out[c.UID] = charge.milli
	}
	return out, nil
}

// heldBy sums, per resource, what the workload's claims hold: live, and
// as recorded when they were overruled (each claim once).
func heldBy(live map[types.UID]map[string]int64, records []overruleRecord, workload types.UID) map[string]int64 {
	held := map[string]int64{}
	counted := sets.New[types.UID]()
	for _, r := range records {
		if r.Workload != workload || counted.Has(r.UID) {
			continue
		}
		counted.Insert(r.UID)
		for res, m := range r.Milli {
			held[res] += m
		}
	}
	for uid, milli := range live {
		if counted.Has(uid) {
			continue
		}
		for res, m := range milli {
			held[res] += m
		}
	}
	return held
}

// overCharge tells why the claim does not fit in what Kueue charged the
// workload; "" when it does.
func overCharge(wl *kueueWorkload, want, held map[string]int64) string {
	var over []string
	for _, res := range slices.Sorted(maps.Keys(want)) {
		if held[res]+want[res] > wl.charge[res] {
			over = append(over, fmt.Sprintf("%s: Kueue charged %d, its pods' claims hold %d, this claim needs %d",
				res, wl.charge[res], held[res], want[res]))
		}
	}
	if len(over) == 0 {
		return ""
	}
	return "over what Kueue charged workload " + wl.name + " (" + strings.Join(over, "; ") + ")"
}

// overruleBook keeps, per namespace, the claims admitted past their quota
// for a Kueue workload, in a ConfigMap of the controller's namespace that no
// tenant can write. Every replica reads it live and writes it with the
// version it read, so two replicas cannot both spend the same charge.
type overruleBook struct {
	client    client.Client // uncached
	namespace string
}

// overruleRecord is one overruled claim.
type overruleRecord struct {
	UID      types.UID `json:"uid"`
	Name     string    `json:"name"`
	Workload types.UID `json:"workload"`
	// Pod and PodName are the pod the gate verified the claim was made for
	// (the kube-controller-manager's create, the pod's spec and status):
	// the sweep keeps the claim past its workload only while that pod
	// runs. The claim's ownerReferences, later, are the tenant's to edit.
	Pod     types.UID        `json:"pod,omitempty"`
	PodName string           `json:"podName,omitempty"`
	Milli   map[string]int64 `json:"milli"`
	At      time.Time        `json:"at"`
}

const (
	// managedByLabel marks every book the controller keeps (quota books
	// and overrule books) as its own.
	managedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "gpuaas-dra-controller"

	overruleBookPrefix = "gpuaas-kueue-overrules-"
	overruleBookKey    = "overrules"
)

// load reads a namespace's records and their ConfigMap (nil: none yet).
// A damaged book is started afresh, as the quota ledger is: the live count
// of the workloads' claims still holds, and the controller alone writes it.
func (b *overruleBook) load(ctx context.Context, namespace string) (*corev1.ConfigMap, []overruleRecord, error) {
	cm := &corev1.ConfigMap{}
	err := b.client.Get(ctx, types.NamespacedName{Namespace: b.namespace, Name: overruleBookPrefix + namespace}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading the Kueue overrule book of %s: %w", namespace, err)
	}
	return cm, overruleRecords(ctx, cm), nil
}

// overruleRecords are the records a book's ConfigMap holds; none when it
// is damaged.
func overruleRecords(ctx context.Context, cm *corev1.ConfigMap) []overruleRecord {
	var records []overruleRecord
	if raw := cm.Data[overruleBookKey]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &records); err != nil {
			klog.FromContext(ctx).Error(err, "Kueue overrule book unreadable, starting it afresh", "configMap", klog.KObj(cm))
			return nil
		}
	}
	return records
}

// write stores records, with the version of cm (nil: create) as
// precondition.
func (b *overruleBook) write(ctx context.Context, namespace string, cm *corev1.ConfigMap, records []overruleRecord) error {
	raw, err := json.Marshal(records)
	if err != nil {
		return fmt.Errorf("encoding the Kueue overrule book of %s: %w", namespace, err)
	}
	if cm == nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: b.namespace, Name: overruleBookPrefix + namespace,
			Labels:      map[string]string{managedByLabel: managedBy},
			Annotations: map[string]string{"gpuaas.io/kueue-overrules-of": namespace},
		}}
		cm.Data = map[string]string{overruleBookKey: string(raw)}
		err = b.client.Create(ctx, cm)
	} else {
		cm = cm.DeepCopy()
		cm.Data = map[string]string{overruleBookKey: string(raw)}
		err = b.client.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("writing the Kueue overrule book of %s: %w", namespace, err)
	}
	return nil
}

// pruneRecords drops the records of claims that are gone: not in the
// namespace's claims, and older than a claim takes to reach the cache.
func pruneRecords(records []overruleRecord, claims []resourceapi.ResourceClaim, now time.Time) []overruleRecord {
	exists := sets.New[types.UID]()
	for i := range claims {
		exists.Insert(claims[i].UID)
	}
	return slices.DeleteFunc(records, func(r overruleRecord) bool {
		return !exists.Has(r.UID) && now.Sub(r.At) >= reservationGrace
	})
}
