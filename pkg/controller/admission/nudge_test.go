package admission

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// Issue 26 item 8: every denied claim's pod was remembered, and the pod is
// whatever the claim's ownerReference names, so a tenant's claims naming
// made-up pods grew the map without bound. It is bounded per namespace and
// in all, and a flooding namespace leaves the others their room.
func TestNudgerRemembersBoundedPods(t *testing.T) {
	n := NewNudger(nil, true)
	for i := range 3 * maxWaitingPerNamespace {
		n.Wait(types.NamespacedName{Namespace: "attacker", Name: fmt.Sprintf("forged-%d", i)})
	}
	n.Wait(types.NamespacedName{Namespace: "peer", Name: "train-0"})
	if got := len(n.waiting); got != maxWaitingPerNamespace+1 {
		t.Errorf("%d pods remembered, want the attacker's %d and the peer's one", got, maxWaitingPerNamespace)
	}
	if !n.waiting[types.NamespacedName{Namespace: "peer", Name: "train-0"}] {
		t.Error("the peer's pod was not remembered")
	}
	for ns := 0; len(n.waiting) < maxWaiting+10; ns++ {
		before := len(n.waiting)
		for i := range maxWaitingPerNamespace {
			n.Wait(types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", ns), Name: fmt.Sprintf("p-%d", i)})
		}
		if len(n.waiting) == before {
			break
		}
	}
	if got := len(n.waiting); got > maxWaiting {
		t.Errorf("%d pods remembered, over the bound %d", got, maxWaiting)
	}
}
