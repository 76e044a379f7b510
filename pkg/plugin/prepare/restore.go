package prepare

import (
	"context"
	"fmt"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"
)

// Restore rebuilds the state a previous run left on the node, before the
// plugin serves the kubelet:
//   - records of interrupted prepares are undone;
//   - after a node reboot, what the records promise (MIG devices, sharing
//     settings, CDI specs) is made again, or the promise dropped;
//   - claims deleted while the plugin was down are unprepared;
//   - damaged records are reported and rebuilt from the claim in the API
//     (prepare is a function of the claim), or cleaned up if it is gone;
//   - MPS daemons run and compute modes are set for the claims that hold
//     them, and daemons that no claim holds are stopped;
//   - CDI specs that no record explains are deleted;
//   - MIG devices that no record names are found, for Withhold.
//
// During a rolling update the old instance keeps serving meanwhile, so what
// Restore reads and undoes it does under the lock of every GPU: a record
// the old instance is half-way through looks just like an interrupted one.
// API errors never drop a record: a claim that cannot be checked is kept.
func (s *State) Restore(ctx context.Context, client kubernetes.Interface) error {
	logger := klog.FromContext(ctx)
	if s.bootIDErr != nil {
		logger.Error(s.bootIDErr, "Node reboots are not detected: what a reboot takes (MIG devices, sharing settings, CDI specs on a tmpfs) is not made again")
	}
	damaged, err := s.restoreRecords(ctx)
	if err != nil {
		return err
	}
	s.metrics.AddDamaged(len(damaged))
	for _, d := range damaged {
		logger.Error(d.Err, "Checkpoint record damaged, rebuilding it from the API", "claimUID", d.UID)
	}
	var keepSpecs map[string]bool
	if claims, err := s.listClaims(ctx, client, damaged); err != nil {
		logger.Error(err, "Cannot check the prepared claims against the API: keeping every one, and the damaged records' CDI specs; their claims are checked at the next start")
		keepSpecs = damagedUIDs(damaged)
		for _, d := range damaged {
			if err := s.env.Store.Unchecked(d.UID); err != nil {
				logger.Error(err, "The damaged record's claim will not be checked at the next start", "claimUID", d.UID)
			}
		}
	} else {
		s.rebuildDamaged(ctx, claims, damaged)
		s.cleanStale(ctx, claims)
	}
	if err := s.deleteOrphanSpecs(ctx, keepSpecs); err != nil {
		logger.Error(err, "Deleting orphaned CDI specs")
	}
	s.metrics.SetPreparedClaims(s.index.list())
	claims, devices := s.index.counts()
	logger.Info("Restored prepared claims", "claims", claims, "devices", devices, "damaged", len(damaged))
	if err := s.findUnownedMIG(ctx); err != nil {
		logger.Error(err, "Looking for MIG devices that no claim owns")
	}
	return nil
}

// restoreRecords loads the checkpoint and undoes interrupted prepares,
// holding every GPU.
func (s *State) restoreRecords(ctx context.Context) ([]checkpoint.Damaged, error) {
	held, err := s.lockAll()
	if err != nil {
		return nil, err
	}
	defer held.unlock()
	// Nobody writes a record now: a temporary file is a dead write's.
	if err := s.env.Store.RemoveTemp(); err != nil {
		klog.FromContext(ctx).Error(err, "Removing temporary checkpoint files")
	}
	records, damaged, err := s.env.Store.LoadAll()
	if err != nil {
		return nil, fmt.Errorf("loading checkpoint: %w", err)
	}
	// Damaged records move aside and interrupted ones are undone: the old
	// instance must re-read.
	if err := held.stamp(); err != nil {
		return nil, err
	}
	s.adoptAll(ctx, records)
	rebooted := s.forgetReboot(ctx, records)
	// Not cut short by a shutdown: a half-undone claim is worse.
	ctx = context.WithoutCancel(ctx)
	s.undoInterrupted(ctx, records)
	s.reestablishAll(ctx, rebooted)
	if err := s.env.Sharing.Reconcile(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Restoring GPU sharing settings (MPS daemons, compute modes)")
	}
	return damaged, nil
}

// lockAll locks every GPU a claim may hold: those this node publishes and
// those that records name (a GPU may have gone since).
func (s *State) lockAll() (*heldGPUs, error) {
	records, _, err := s.env.Store.List()
	if err != nil {
		return nil, err
	}
	var gpus []string
	for _, d := range s.DeviceMap() {
		gpus = append(gpus, d.GPU.UUID)
	}
	for _, rec := range records {
		gpus = append(gpus, recordGPUs(rec)...)
	}
	return s.locks.lock(gpus)
}

// adoptAll counts every record's sharing holds, interrupted ones included,
// before anything is undone: undoing an interrupted prepare first would
// find it the GPU's only holder and reset the GPU under a running claim.
// Records of an earlier boot hold nothing: the reboot reset the GPUs.
func (s *State) adoptAll(ctx context.Context, records []*checkpoint.Claim) {
	for _, rec := range records {
		if s.fromOtherBoot(rec) {
			continue
		}
		if err := s.adoptRecord(rec, allGPUs); err != nil {
			klog.FromContext(ctx).Error(err, "Restoring sharing settings", "claimUID", rec.UID)
		}
		if indexed(rec) {
			s.index.add(rec)
		}
	}
}

func (s *State) undoInterrupted(ctx context.Context, records []*checkpoint.Claim) {
	for _, rec := range records {
		if rec.State != checkpoint.PrepareStarted {
			continue
		}
		klog.FromContext(ctx).Info("Undoing interrupted prepare", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", rec.UID)
		if err := s.undo(ctx, rec); err != nil {
			klog.FromContext(ctx).Error(err, "Undoing interrupted prepare", "claimUID", rec.UID)
		}
	}
}

// apiClaims is what the restart needs of the ResourceClaims in the API: the
// UID of each claim by namespace/name, and the whole claim for each damaged
// record (to rebuild it from).
type apiClaims struct {
	uidByName map[types.NamespacedName]types.UID
	damaged   map[types.UID]*resourceapi.ResourceClaim
}

// listClaims reads every ResourceClaim with one paginated LIST, not a GET per
// prepared claim: 100 sequential GETs made a restart with 100 claims 4x
// slower to register than NVIDIA's plugin (issue 37). Claims have no field
// selector for the node, so the LIST is of all of them; only the UIDs and
// the damaged records' claims are kept. Nothing is asked when nothing is
// prepared.
func (s *State) listClaims(ctx context.Context, client kubernetes.Interface, damaged []checkpoint.Damaged) (*apiClaims, error) {
	claims := &apiClaims{uidByName: map[types.NamespacedName]types.UID{}, damaged: map[types.UID]*resourceapi.ResourceClaim{}}
	if n, _ := s.index.counts(); n == 0 && len(damaged) == 0 {
		return claims, nil
	}
	wanted := damagedUIDs(damaged)
	list := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
		return client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, opts)
	}))
	err := list.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		claim, ok := obj.(*resourceapi.ResourceClaim)
		if !ok {
			return fmt.Errorf("listing claims: got a %T", obj)
		}
		claims.uidByName[types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}] = claim.UID
		if wanted[string(claim.UID)] {
			claims.damaged[claim.UID] = claim
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing claims: %w", err)
	}
	return claims, nil
}

func damagedUIDs(damaged []checkpoint.Damaged) map[string]bool {
	uids := make(map[string]bool, len(damaged))
	for _, d := range damaged {
		uids[d.UID] = true
	}
	return uids
}

// cleanStale unprepares claims that no longer exist (or were replaced by a
// claim of the same name).
func (s *State) cleanStale(ctx context.Context, claims *apiClaims) {
	logger := klog.FromContext(ctx)
	stale := 0
	for _, rec := range s.index.list() {
		uid, found := claims.uidByName[types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}]
		if found && string(uid) == rec.UID {
			continue
		}
		logger.Info("Cleaning up claim deleted while the plugin was down", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", rec.UID)
		if err := s.Unprepare(ctx, types.UID(rec.UID)); err != nil {
			logger.Error(err, "Cleaning up stale claim", "claimUID", rec.UID)
			continue
		}
		stale++
	}
	s.metrics.AddStale(stale)
}

// rebuildDamaged re-prepares claims whose record was damaged and which are
// still allocated here; the rest lose their CDI spec in deleteOrphanSpecs.
func (s *State) rebuildDamaged(ctx context.Context, claims *apiClaims, damaged []checkpoint.Damaged) {
	for _, d := range damaged {
		claim := claims.damaged[types.UID(d.UID)]
		if claim == nil || !s.allocatedHere(claim) {
			continue
		}
		if _, err := s.prepare(ctx, claim, true); err != nil {
			klog.FromContext(ctx).Error(err, "Rebuilding damaged claim record", "claimUID", d.UID)
		}
	}
}

func (s *State) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) == 0 {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == configapi.DriverName && r.Pool == s.nodeName {
			return true
		}
	}
	return false
}

// deleteOrphanSpecs deletes CDI specs of claims without a record, but for
// those in keep: damaged records whose claim could not be checked. It holds
// every GPU, so no prepare (of either plugin instance) is between writing a
// spec and writing its record.
func (s *State) deleteOrphanSpecs(ctx context.Context, keep map[string]bool) error {
	held, err := s.lockAll()
	if err != nil {
		return err
	}
	defer held.unlock()
	uids, err := s.cdi.ClaimSpecUIDs()
	if err != nil {
		return fmt.Errorf("listing CDI specs: %w", err)
	}
	for _, uid := range uids {
		// A damaged record keeps its spec: the claim may still run.
		if rec, err := s.env.Store.Load(uid); err != nil || rec != nil || keep[uid] {
			continue
		}
		klog.FromContext(ctx).Info("Deleting CDI spec of a claim that is not prepared", "claimUID", uid)
		if err := s.cdi.DeleteClaimSpec(uid); err != nil {
			klog.FromContext(ctx).Error(err, "Deleting orphaned CDI spec", "claimUID", uid)
		}
	}
	return nil
}
