package prepare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// gpuLocks hands out one lock per GPU that excludes both the other
// goroutines of this process and the other plugin instance of a rolling
// update, which shares the checkpoint: an in-process mutex first (cheap
// waiting inside one plugin), then flock(2) on a file per GPU. Claims on
// different GPUs are still prepared in parallel.
//
// Each lock file also carries a stamp that a holder rewrites before it
// changes a claim on the GPU. While the stamp is the one this process last
// saw, no other process changed the GPU's claims since, and the process's
// cached view of them (claim index, sharing holders) is current without
// re-reading the checkpoint; prepare stays independent of how many claims
// are prepared.
//
// Waiting is bounded: by the caller's context and by wait, so that a holder
// that never lets go (an NVML call on a GPU that fell off the bus, a
// blocked MPS control command, a wedged old pod) fails the calls behind it
// with who holds the GPU since when, instead of keeping them past the
// kubelet's deadline.
type gpuLocks struct {
	dir string
	// nonce tells this process's stamps from any other's.
	nonce string
	seq   atomic.Uint64
	// wait bounds how long a lock is waited for (DefaultLockWait).
	wait time.Duration
	// label names a GPU in errors (its index); nil: its UUID.
	label func(uuid string) string
	mu    sync.Mutex
	gpus  map[string]*gpuLock
}

// gpuLock is one GPU's lock. Its fields are guarded by holding sem.
type gpuLock struct {
	// sem is the in-process mutex: a channel, so a wait can end.
	sem  chan struct{}
	file *os.File // opened on first use and kept open
	// seen is the stamp this process last read or wrote; unseen until then,
	// so a process looks at the checkpoint once before trusting its view.
	seen string
	// holder and since say who holds the lock in this process, for the
	// errors of those that wait (so guarded by whoMu, not sem).
	whoMu  sync.Mutex
	holder string
	since  time.Time
}

const (
	unseen    = "unseen"
	stampSize = 33 // 16 hex digits of nonce, '-', 16 of sequence
	// holderSize is the room after the stamp where the holder writes who
	// it is, for the other process's errors.
	holderSize = 160
)

// DefaultLockWait bounds the wait for a GPU's lock, as NVIDIA's device
// plugin bounds its own: well within the kubelet's deadline for a call.
const DefaultLockWait = 10 * time.Second

// StartLockWait bounds the start's wait for every GPU's lock: the other
// instance of a rolling update may be changing a GPU's MIG mode, which
// alone may retry for 10 s (mig.DefaultInUseRetry), and a start that gives
// up restarts the pod.
const StartLockWait = time.Minute

func newGPULocks(dir string) *gpuLocks {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return &gpuLocks{dir: dir, nonce: hex.EncodeToString(b[:]), wait: DefaultLockWait, gpus: map[string]*gpuLock{}}
}

// errGPUBusy is what a lock wait that reached its bound returns, wrapped
// with the GPU and its holder.
var errGPUBusy = errors.New("busy")

func (l *gpuLocks) get(uuid string) *gpuLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.gpus[uuid]
	if !ok {
		g = &gpuLock{sem: make(chan struct{}, 1), seen: unseen}
		l.gpus[uuid] = g
	}
	return g
}

// heldGPUs are locked GPUs with the stamps found on them.
type heldGPUs struct {
	l      *gpuLocks
	uuids  []string
	locks  []*gpuLock
	stamps []string
}

// lock takes the locks of all given GPUs in a fixed (sorted) order, which
// rules out deadlock between claims spanning several GPUs, in this process
// and across processes alike. holder says who takes them ("claim <uid>"),
// for the errors of those that wait. Waiting ends with ctx or after the
// bound, with an error that names the GPU and who holds it since when.
func (l *gpuLocks) lock(ctx context.Context, holder string, uuids []string) (*heldGPUs, error) {
	return l.lockWithin(ctx, l.wait, holder, uuids)
}

// lockWithin is lock with the bound wait.
func (l *gpuLocks) lockWithin(ctx context.Context, wait time.Duration, holder string, uuids []string) (*heldGPUs, error) {
	keys := slices.Clone(uuids)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	h := &heldGPUs{l: l}
	for _, k := range keys {
		g := l.get(k)
		stamp, err := g.lock(ctx, l.dir, k, holder)
		if err != nil {
			h.unlock()
			if errors.Is(err, errGPUBusy) {
				return nil, fmt.Errorf("GPU %s %w (waited up to %s)", l.name(k), err, wait)
			}
			return nil, fmt.Errorf("locking GPU %s: %w", l.name(k), err)
		}
		h.uuids, h.locks, h.stamps = append(h.uuids, k), append(h.locks, g), append(h.stamps, stamp)
	}
	return h, nil
}

func (l *gpuLocks) name(uuid string) string {
	if l.label == nil {
		return uuid
	}
	return l.label(uuid)
}

// lock locks one GPU for holder and returns the stamp on it.
func (g *gpuLock) lock(ctx context.Context, dir, uuid, holder string) (string, error) {
	select {
	case g.sem <- struct{}{}:
	case <-ctx.Done():
		who, since := g.who()
		return "", g.busy(ctx, who, since)
	}
	if err := g.flock(ctx, dir, uuid); err != nil {
		<-g.sem
		return "", err
	}
	since := g.setWho(holder)
	buf := make([]byte, stampSize)
	n, err := g.file.ReadAt(buf, 0)
	if err != nil && n != stampSize && n != 0 {
		g.unlock()
		return "", fmt.Errorf("reading lock stamp: %w", err)
	}
	// Who holds it, for the other process's errors; a failed write costs
	// only that.
	_, _ = g.file.WriteAt(holderRecord(holder, since), stampSize)
	return string(buf[:n]), nil
}

// setWho records holder as the lock's, from now, and returns now.
func (g *gpuLock) setWho(holder string) time.Time {
	g.whoMu.Lock()
	defer g.whoMu.Unlock()
	g.holder, g.since = holder, time.Now()
	return g.since
}

// who is the lock's holder in this process and since when.
func (g *gpuLock) who() (string, time.Time) {
	g.whoMu.Lock()
	defer g.whoMu.Unlock()
	return g.holder, g.since
}

// busy is the error of a wait for a lock that holder took at since; a
// context that ended before the bound is the caller's, and says so.
func (g *gpuLock) busy(ctx context.Context, holder string, since time.Time) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("waiting for the lock: %w", ctx.Err())
	}
	if holder == "" {
		holder = "an unknown holder"
	}
	return fmt.Errorf("%w: held by %s since %s", errGPUBusy, holder, since.UTC().Format(time.RFC3339))
}

// holderRecord is who holds a lock since when, padded to holderSize.
func holderRecord(holder string, since time.Time) []byte {
	rec := []byte(fmt.Sprintf("%s\t%s", since.UTC().Format(time.RFC3339), holder))
	if len(rec) > holderSize {
		rec = rec[:holderSize]
	}
	return append(rec, make([]byte, holderSize-len(rec))...)
}

// otherHolder reads who holds the lock file in another process.
func (g *gpuLock) otherHolder() (string, time.Time) {
	buf := make([]byte, holderSize)
	n, _ := g.file.ReadAt(buf, stampSize)
	when, who, ok := strings.Cut(strings.TrimRight(string(buf[:n]), "\x00"), "\t")
	since, err := time.Parse(time.RFC3339, when)
	if !ok || err != nil {
		return "", time.Time{}
	}
	return who + " (the other plugin instance)", since
}

// A lock held by the other process is tried again after 1 ms, then ever
// less often up to maxFlockPoll: flock(2) itself cannot wait with a
// deadline, and the other process holds a GPU only while it prepares.
const maxFlockPoll = 20 * time.Millisecond

func (g *gpuLock) flock(ctx context.Context, dir, uuid string) error {
	if g.file == nil {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(dir, uuid+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		g.file = f
	}
	poll := time.Millisecond
	for {
		err := syscall.Flock(int(g.file.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return err
		}
		select {
		case <-ctx.Done():
			who, since := g.otherHolder()
			return g.busy(ctx, who, since)
		case <-time.After(poll):
		}
		poll = min(2*poll, maxFlockPoll)
	}
}

func (g *gpuLock) unlock() {
	// Closing the file would drop the lock too; unlocking keeps it open.
	_ = syscall.Flock(int(g.file.Fd()), syscall.LOCK_UN)
	g.setWho("")
	<-g.sem
}

// unlock releases the GPUs in reverse order.
func (h *heldGPUs) unlock() {
	for i := len(h.locks) - 1; i >= 0; i-- {
		h.locks[i].unlock()
	}
}

// stale returns the GPUs whose claims another process may have changed
// since this one last looked.
func (h *heldGPUs) stale() []string {
	var out []string
	for i, g := range h.locks {
		if g.seen != h.stamps[i] {
			out = append(out, h.uuids[i])
		}
	}
	return out
}

// markSeen records that this process's view of the held GPUs is current.
func (h *heldGPUs) markSeen() {
	for i, g := range h.locks {
		g.seen = h.stamps[i]
	}
}

// stamp must run before the holder changes a claim on the held GPUs: the
// other process then knows to re-read them. It is not synced to disk: the
// other process reads it from the page cache, and after a reboot every
// process starts by reading the whole checkpoint anyway.
func (h *heldGPUs) stamp() error {
	for i, g := range h.locks {
		s := fmt.Sprintf("%s-%016x", h.l.nonce, h.l.seq.Add(1))
		if _, err := g.file.WriteAt([]byte(s), 0); err != nil {
			return fmt.Errorf("stamping lock of GPU %s: %w", h.uuids[i], err)
		}
		g.seen, h.stamps[i] = s, s
	}
	return nil
}

// RecordsUnderLocks lists the checkpoint's records holding the locks of
// the given GPUs (those the node has) and of every GPU a record names, as
// a State does: the start pins GPU modes from them (device.PinModes), and
// the other plugin instance of a rolling update may be half-way through a
// prepare. It waits as a State's lock does.
func RecordsUnderLocks(ctx context.Context, lockDir string, gpus []string, store *checkpoint.Store) ([]*checkpoint.Claim, error) {
	// The records name the GPUs to lock; read again once they are held.
	records, _, err := store.List()
	if err != nil {
		return nil, fmt.Errorf("loading checkpoint: %w", err)
	}
	all := slices.Clone(gpus)
	for _, rec := range records {
		all = append(all, recordGPUs(rec)...)
	}
	locks := newGPULocks(lockDir)
	held, err := locks.lockWithin(ctx, StartLockWait, "the start's reading of prepared claims", all)
	if err != nil {
		return nil, err
	}
	defer locks.close(held)
	records, _, err = store.List()
	if err != nil {
		return nil, fmt.Errorf("loading checkpoint: %w", err)
	}
	return records, nil
}

// close unlocks held and closes the lock files of locks, which is used no
// more.
func (l *gpuLocks) close(held *heldGPUs) {
	held.unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, g := range l.gpus {
		if g.file != nil {
			_ = g.file.Close()
		}
	}
}

// planGPUs are the GPUs of a plan's devices (repeated per device).
func planGPUs(plan []device.Planned) []string {
	out := make([]string, 0, len(plan))
	for _, p := range plan {
		out = append(out, p.Device.GPU.UUID)
	}
	return out
}

// sortedGPUs is the order in which gpuLocks holds GPUs.
func sortedGPUs(uuids []string) []string {
	out := slices.Clone(uuids)
	slices.Sort(out)
	return slices.Compact(out)
}

// lockFresh locks the GPUs and brings this process's view of them up to
// date with the checkpoint, should the other plugin instance of a rolling
// update have changed their claims since this one last looked.
func (s *State) lockFresh(ctx context.Context, holder string, gpus []string) (*heldGPUs, error) {
	held, err := s.locks.lock(ctx, holder, gpus)
	if err != nil {
		return nil, err
	}
	if err := s.refresh(ctx, held); err != nil {
		held.unlock()
		return nil, err
	}
	return held, nil
}

// refresh re-reads the claims of the held GPUs that another process
// changed. It reads the whole checkpoint, which only happens while two
// plugin instances take turns on a GPU; otherwise the cache is current.
func (s *State) refresh(ctx context.Context, held *heldGPUs) error {
	stale := held.stale()
	if len(stale) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	records, damaged, err := s.env.Store.List()
	if err != nil {
		return fmt.Errorf("re-reading the checkpoint: %w", err)
	}
	for _, d := range damaged {
		logger.Error(d.Err, "Checkpoint record damaged; it is rebuilt at the next start", "claimUID", d.UID)
	}
	logger.V(4).Info("Re-reading claims another plugin instance changed", "gpus", stale, "records", len(records))
	s.index.reload(stale, records)
	on := toSet(stale)
	for _, gpu := range stale {
		s.env.Sharing.Forget(gpu)
	}
	for _, rec := range records {
		if err := s.adoptRecord(rec, func(gpu string) bool { return on[gpu] }); err != nil {
			logger.Error(err, "Re-reading sharing settings", "claimUID", rec.UID)
		}
	}
	held.markSeen()
	s.metrics.SetPreparedClaims(s.index.list())
	return nil
}

// inflight tracks the claims this process is preparing, so that an
// unprepare arriving meanwhile, before any record exists, knows which GPU
// locks to wait for.
type inflight struct {
	mu     sync.Mutex
	claims map[types.UID]*inflightClaim
}

type inflightClaim struct {
	gpus []string
	n    int // concurrent prepares of the claim
}

func newInflight() *inflight { return &inflight{claims: map[types.UID]*inflightClaim{}} }

// add marks a claim as being prepared on gpus until done is called.
func (f *inflight) add(uid types.UID, gpus []string) (done func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.claims[uid]
	if c == nil {
		c = &inflightClaim{gpus: gpus}
		f.claims[uid] = c
	}
	c.n++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if c.n--; c.n == 0 {
			delete(f.claims, uid)
		}
	}
}

// gpus returns the GPUs of a claim being prepared, nil for none.
func (f *inflight) gpus(uid types.UID) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.claims[uid]; c != nil {
		return c.gpus
	}
	return nil
}
