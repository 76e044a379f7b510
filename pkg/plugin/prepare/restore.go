package prepare

import (
	"context"
	"fmt"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"
)

// Restore rebuilds the state a previous run left on the node, in the
// order the plugin's start runs it (and the tests, so that they exercise
// that order): RestoreRecords; register, which makes the plugin reachable
// by the kubelet (its calls wait until the start is done); CheckClaims;
// and Withhold, which returns inv, the discovered inventory, less the
// placements of MIG devices that no claim owns. register may be nil (no
// kubelet).
func (s *State) Restore(ctx context.Context, client kubernetes.Interface, inv inventory.Inventory, register func(context.Context) error) (inventory.Inventory, error) {
	damaged, err := s.RestoreRecords(ctx)
	if err != nil {
		return inv, fmt.Errorf("restoring prepared claims: %w", err)
	}
	if register != nil {
		if err := register(ctx); err != nil {
			return inv, err
		}
	}
	s.CheckClaims(ctx, client, damaged)
	return s.Withhold(inv), nil
}

// RestoreRecords is what the restart rebuilds from the node alone, and
// returns the damaged records, for CheckClaims:
//   - records of interrupted prepares are undone;
//   - after a node reboot, what the records promise (MIG devices, sharing
//     settings, CDI specs) is made again, or the promise dropped;
//   - MPS daemons run and compute modes are set for the claims that hold
//     them, and daemons that no claim holds are stopped.
//
// During a rolling update the old instance keeps serving meanwhile, so what
// RestoreRecords reads and undoes it does under the lock of every GPU: a
// record the old instance is half-way through looks just like an
// interrupted one.
func (s *State) RestoreRecords(ctx context.Context) ([]checkpoint.Damaged, error) {
	logger := klog.FromContext(ctx)
	if s.bootIDErr != nil {
		logger.Error(s.bootIDErr, "Node reboots are not detected: what a reboot takes (MIG devices, sharing settings, CDI specs on a tmpfs) is not made again")
	}
	damaged, err := s.restoreRecords(ctx)
	if err != nil {
		return nil, err
	}
	s.metrics.AddDamaged(len(damaged))
	for _, d := range damaged {
		logger.Error(d.Err, "Checkpoint record damaged, rebuilding it from the API", "claimUID", d.UID)
	}
	return damaged, nil
}

// CheckClaims is what the restart needs the API for, after RestoreRecords;
// the plugin registers with the kubelet before it, and holds the kubelet's
// calls until it is done:
//   - claims deleted while the plugin was down are unprepared;
//   - damaged records are rebuilt from the claim in the API (prepare is a
//     function of the claim), or cleaned up if it is gone;
//   - CDI specs that no record explains are deleted;
//   - MIG devices that no record names are found, for Withhold.
//
// API errors never drop a record: a claim that cannot be checked is kept.
func (s *State) CheckClaims(ctx context.Context, client kubernetes.Interface, damaged []checkpoint.Damaged) {
	logger := klog.FromContext(ctx)
	var keepSpecs map[string]bool
	if claims, err := s.checkClaims(ctx, client, damaged); err != nil {
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
}

// restoreRecords loads the checkpoint and undoes interrupted prepares,
// holding every GPU.
func (s *State) restoreRecords(ctx context.Context) ([]checkpoint.Damaged, error) {
	held, err := s.lockAll(ctx, "the start's restore of prepared claims")
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
// those that records name (a GPU may have gone since). Only the start
// does, so it waits as the start does (StartLockWait).
func (s *State) lockAll(ctx context.Context, holder string) (*heldGPUs, error) {
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
	return s.locks.lockWithin(ctx, max(s.locks.wait, StartLockWait), holder, gpus)
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

func newAPIClaims() *apiClaims {
	return &apiClaims{uidByName: map[types.NamespacedName]types.UID{}, damaged: map[types.UID]*resourceapi.ResourceClaim{}}
}

// MaxClaimGets is the most prepared claims the start checks with a GET
// each; a node with more LISTs them instead. The plugin's API client adds
// it to its burst, so the check neither waits on the rate limiter nor
// leaves the first prepares after it waiting.
const MaxClaimGets = 100

// claimGetWorkers is how many of those GETs are in flight at once.
const claimGetWorkers = 16

// checkClaims reads what the restart needs of the API, asking nothing when
// nothing is prepared. A node with up to MaxClaimGets prepared claims and
// no damaged record GETs each of its claims, 16 at a time: that costs what
// the node holds. The LIST it used to make costs what the cluster holds
// (claims have no field selector for the node): 2,400 claims of other
// nodes made a restart with 100 claims 1.6x slower to register than
// NVIDIA's plugin, which checks nothing (issue 37), and every node of a
// DaemonSet rollout would LIST them all. A damaged record is known only by
// its claim's UID, which no GET can ask for, so it still takes the LIST.
func (s *State) checkClaims(ctx context.Context, client kubernetes.Interface, damaged []checkpoint.Damaged) (*apiClaims, error) {
	records := s.index.list()
	switch {
	case len(records) == 0 && len(damaged) == 0:
		return newAPIClaims(), nil
	case len(damaged) == 0 && len(records) <= s.claimGetLimit:
		return getClaims(ctx, client, records)
	default:
		return listClaims(ctx, client, damaged)
	}
}

// getClaims GETs the claim of each record; a claim not found is left out,
// as a LIST would leave it out. Any other error fails the whole check.
func getClaims(ctx context.Context, client kubernetes.Interface, records []*checkpoint.Claim) (*apiClaims, error) {
	uids := make([]types.UID, len(records))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(claimGetWorkers)
	for i, rec := range records {
		if rec.Name == "" {
			continue // nothing to ask for: absent, as from a LIST
		}
		g.Go(func() error {
			claim, err := client.ResourceV1().ResourceClaims(rec.Namespace).Get(gctx, rec.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return fmt.Errorf("getting claim %s/%s: %w", rec.Namespace, rec.Name, err)
			}
			uids[i] = claim.UID
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	claims := newAPIClaims()
	for i, rec := range records {
		if uids[i] != "" {
			claims.uidByName[types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}] = uids[i]
		}
	}
	return claims, nil
}

// listClaims reads every ResourceClaim with one paginated LIST (pages keep
// its memory bounded) and keeps only the UIDs and the damaged records'
// claims.
func listClaims(ctx context.Context, client kubernetes.Interface, damaged []checkpoint.Damaged) (*apiClaims, error) {
	claims := newAPIClaims()
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
	held, err := s.lockAll(ctx, "the start's cleanup of CDI specs")
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
