package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// dryRunPeerClaims is how many ordinary claims the peer of
// TestControllerDryRunAlternativesDoNotRefuseAnotherTenant
// creates, one every dryRunPeerPause past the last answer: the attack's
// dry runs take seconds each, and the peer asks all along.
const (
	dryRunPeerClaims = 20
	dryRunPeerPause  = 500 * time.Millisecond
)

// TestControllerDryRunAlternativesDoNotRefuseAnotherTenant (issue 55 route
// 4), against the real API server: a tenant's ServiceAccount sends
// server-side dry runs of claims of eight firstAvailable alternatives, each
// of eight distinct costly selectors, from two callers without pause,
// over 128 published GPUs; meanwhile another tenant, as its own
// ServiceAccount, creates ordinary claims, each of a new selector so that
// it needs a pricing slot. The alternatives webhook priced a dry run's
// alternatives on the unmarked context, each in a CEL budget of its own, so
// the dry runs held the claims' pricing slots and the peer's claim was
// refused at its deadline ("cannot charge the claim"). Every one of the
// peer's claims must be admitted; its latencies are logged, not asserted.
// Through the API server each caller gets about one dry run answered every
// 7 s, and the peer was not refused even before the fix (BENCHMARKS.md):
// the in-process BenchmarkPeerAdmissionUnderDryRunAlternatives and the
// alternatives webhook's unit tests reproduce the route; this is the same
// attack on the real path, as the tenants send it. The selectors are short
// but costly to evaluate: with selectors of 10 KiB the API server itself
// spends 20 s and more validating each dry run.
func TestControllerDryRunAlternativesDoNotRefuseAnotherTenant(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 5*time.Minute)
	w := newAttackWorld(t, "dryrun-attack", 8)
	name, attackerNS, peerNS, attacker, peer := w.class, w.attackerNS, w.peerNS, w.attacker, w.peer

	attack, stop := context.WithCancel(ctx)
	var answered atomic.Int64
	var firstAnswer atomic.Value
	var attackers sync.WaitGroup
	for a := range 2 {
		attackers.Go(func() {
			for i := 0; attack.Err() == nil; i++ {
				c := heavyAlternatives(attackerNS, fmt.Sprintf("dry-%d-%d", a, i), name, 1000000*(a+1)+i)
				// Refused or trimmed, it is the load that counts.
				_, err := attacker.Client.ResourceV1().ResourceClaims(attackerNS).Create(attack, c,
					metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if attack.Err() == nil {
					answered.Add(1)
					firstAnswer.CompareAndSwap(nil, fmt.Sprintf("%.300v", err))
				}
			}
		})
	}
	time.Sleep(time.Second) // the attack is under way
	lat, refused := peerCreates(ctx, peer.Client.ResourceV1().ResourceClaims(peerNS), peerNS, name)
	stop()
	attackers.Wait()
	t.Logf("the attacker's dry runs answered meanwhile: %d (the first: %v); the peer's latencies (sorted): %v",
		answered.Load(), firstAnswer.Load(), lat)
	if answered.Load() == 0 {
		t.Fatal("no dry run was answered while the peer created its claims: the test proves nothing")
	}
	for _, r := range refused {
		t.Errorf("the peer's claim was refused while another tenant dry-ran heavy alternatives: %s", r)
	}
	rc.alive(t)
}

// attackWorld is a red-team test's cluster: a profile (class) of 128
// published GPUs of one node (slice, the most one ResourceSlice holds),
// and two tenants, each with a namespace and its own ServiceAccount: the
// attacker, with attackerUnits GPU units, and a peer with room for
// dryRunPeerClaims claims.
type attackWorld struct {
	class, attackerNS, peerNS string
	slice                     *resourceapi.ResourceSlice
	attacker, peer            *framework.Tenant
}

func newAttackWorld(t *testing.T, prefix string, attackerUnits int) attackWorld {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	w := attackWorld{class: uniqueName(prefix)}
	product := "E2E Attack GPU " + w.class
	createObject(t, profile(w.class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: product}))
	waitForProfileReady(t, w.class)
	var gpus []resourceapi.Device
	for i := range 128 { // a ResourceSlice's most
		gpus = append(gpus, e2eShapeGPU(fmt.Sprintf("gpu-%d", i), product, fmt.Sprintf("pci0000:%02x", i/8)))
	}
	w.slice = e2eSlice(w.class+"-gpus", "gpu.gpuaas.io", w.class+"-node", gpus)
	createObject(t, w.slice)
	w.attackerNS, w.peerNS = cp.CreateNamespace(t, prefix+"-attacker"), cp.CreateNamespace(t, prefix+"-peer")
	createObject(t, quotaFor(w.class+"-a", []string{w.attackerNS}, gpuaas.QuotaLimits{GpuUnits: units(fmt.Sprint(attackerUnits))}))
	createObject(t, quotaFor(w.class+"-p", []string{w.peerNS}, gpuaas.QuotaLimits{GpuUnits: units(fmt.Sprint(dryRunPeerClaims))}))
	var err error
	if w.attacker, err = cp.NewTenant(ctx, w.attackerNS, "attacker"); err != nil {
		t.Fatal(err)
	}
	if w.peer, err = cp.NewTenant(ctx, w.peerNS, "team"); err != nil {
		t.Fatal(err)
	}
	return w
}

// peerCreates creates dryRunPeerClaims ordinary claims of one GPU of class,
// each of a selector of its own; it returns their latencies, sorted, and
// the refusals.
func peerCreates(ctx context.Context, claims resourceclient.ResourceClaimInterface, ns, class string) ([]time.Duration, []string) {
	var lat []time.Duration
	var refused []string
	for i := range dryRunPeerClaims {
		c := gpuClaim(ns, fmt.Sprintf("peer-%d", i), class, 1)
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == "gpu.gpuaas.io" && %q != ""`, c.Name)}}}
		start := time.Now()
		_, err := claims.Create(ctx, c, metav1.CreateOptions{})
		lat = append(lat, time.Since(start).Round(time.Millisecond))
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", c.Name, err))
		}
		time.Sleep(dryRunPeerPause)
	}
	slices.Sort(lat)
	return lat, refused
}

// heavyAlternatives is a claim of one request with eight firstAvailable
// alternatives of class, each of eight distinct costly selectors, distinct
// by salt so that no compiled selector or price is reused.
func heavyAlternatives(ns, name, class string, salt int) *resourceapi.ResourceClaim {
	c := gpuClaim(ns, name, class, 1)
	r := &c.Spec.Devices.Requests[0]
	r.Exactly = nil
	for a := range 8 {
		var sel []resourceapi.DeviceSelector
		for s := range 8 {
			sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: heavyDryRunSelector(salt*64 + a*8 + s)}})
		}
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: fmt.Sprintf("alt-%d", a),
			DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Selectors: sel})
	}
	return c
}

// heavyDryRunSelector is a nested comprehension that every device
// evaluates in full, 700 times 100 iterations (about half the API server's
// cost limit for one expression, so it is let through), distinct by salt.
// Short: the API server compiles it quickly, the pricing pays for it.
func heavyDryRunSelector(salt int) string {
	outer := make([]string, 700)
	for i := range outer {
		outer[i] = fmt.Sprint(i)
	}
	return fmt.Sprintf("[%s].all(x, [%s].all(y, x + y >= %d))", strings.Join(outer, ","), strings.Join(outer[:100], ","), -salt)
}
