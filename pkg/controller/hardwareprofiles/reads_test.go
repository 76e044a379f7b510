package hardwareprofiles

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// TestAPassReadsOnlyItsOwnHardwareProfiles: with many profiles published
// in many tenants' namespaces, one profile's pass lists its own
// HardwareProfiles only (by hardwareprofile.OwnerLabel), not every one in
// the cluster, and it still prunes its own.
func TestAPassReadsOnlyItsOwnHardwareProfiles(t *testing.T) {
	const profiles, tenants = 10, 8
	var objs []client.Object
	for i := range profiles {
		p := sharedProfile()
		p.Name, p.UID = fmt.Sprintf("profile-%d", i), types.UID(fmt.Sprintf("uid-profile-%d", i))
		objs = append(objs, p)
	}
	for i := range tenants {
		objs = append(objs, tenant(fmt.Sprintf("team-%d", i), "", fmt.Sprintf("team-%d", i)))
	}
	w := newWorld(t, objs...)
	w.r.PerTenant = true
	w.install()
	for i := range profiles {
		w.reconcile(t, fmt.Sprintf("profile-%d", i))
	}

	// Its own: the global namespace's and each tenant's.
	const own = 1 + tenants
	w.listed = 0
	w.reconcile(t, "profile-0")
	t.Logf("one profile's pass listed %d of the %d HardwareProfiles published", w.listed, profiles*own)
	if w.listed > own {
		t.Errorf("one profile's pass listed %d HardwareProfiles, want at most its own %d (%d are published in all)", w.listed, own, profiles*own)
	}

	q := &gpuaas.TenantQuota{}
	if err := w.client.Get(t.Context(), client.ObjectKey{Name: "team-3"}, q); err != nil {
		t.Fatal(err)
	}
	if err := w.client.Delete(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	w.listed = 0
	w.reconcile(t, "profile-0")
	if w.listed > own {
		t.Errorf("pruning: listed %d HardwareProfiles, want at most its own %d", w.listed, own)
	}
	w.absent(t, "team-3", "profile-0", "the tenant is gone")
	w.hardwareProfileIn(t, "team-3", "profile-1")
}

// TestLocalQueuesAreListedOncePerNamespaceForEveryOwner: every profile's
// pass over Kueue-managed tenants reads the LocalQueues of each tenant
// namespace; within queuesFresh one list of each serves every profile
// and shape, and after it the next pass lists again.
func TestLocalQueuesAreListedOncePerNamespaceForEveryOwner(t *testing.T) {
	const profiles, tenants = 10, 8
	var objs []client.Object
	for i := range profiles {
		p := sharedProfile()
		p.Name, p.UID = fmt.Sprintf("profile-%d", i), types.UID(fmt.Sprintf("uid-profile-%d", i))
		objs = append(objs, p)
	}
	for i := range tenants {
		objs = append(objs, tenant(fmt.Sprintf("team-%d", i), "cq", fmt.Sprintf("team-%d", i)))
	}
	w := newWorld(t, objs...)
	w.r.PerTenant = true
	w.install()
	w.withKueue(t)
	for i := range tenants {
		if err := w.client.Create(t.Context(), localQueue(fmt.Sprintf("team-%d", i), "gpus", "cq")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range profiles {
		w.reconcile(t, fmt.Sprintf("profile-%d", i))
	}
	t.Logf("%d profiles over %d Kueue-managed namespaces: %d LocalQueue lists", profiles, tenants, w.queueLists)
	if w.queueLists != tenants {
		t.Errorf("%d LocalQueue lists for %d profiles' passes, want one per namespace (%d)", w.queueLists, profiles, tenants)
	}
	if got := scheduling(t, w.hardwareProfileIn(t, "team-5", "profile-9")); got["type"] != "Queue" {
		t.Errorf("scheduling %v, want Queue through the tenant's LocalQueue", got)
	}

	w.now = w.now.Add(queuesFresh)
	w.reconcile(t, "profile-0")
	if w.queueLists != 2*tenants {
		t.Errorf("after queuesFresh: %d LocalQueue lists in all, want each namespace listed again (%d)", w.queueLists, 2*tenants)
	}
}
