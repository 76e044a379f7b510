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
	"sync"
	"sync/atomic"
	"syscall"

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
type gpuLocks struct {
	dir string
	// nonce tells this process's stamps from any other's.
	nonce string
	seq   atomic.Uint64
	mu    sync.Mutex
	gpus  map[string]*gpuLock
}

// gpuLock is one GPU's lock. Its fields are guarded by mu.
type gpuLock struct {
	mu   sync.Mutex
	file *os.File // opened on first use and kept open
	// seen is the stamp this process last read or wrote; unseen until then,
	// so a process looks at the checkpoint once before trusting its view.
	seen string
}

const (
	unseen    = "unseen"
	stampSize = 33 // 16 hex digits of nonce, '-', 16 of sequence
)

func newGPULocks(dir string) *gpuLocks {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return &gpuLocks{dir: dir, nonce: hex.EncodeToString(b[:]), gpus: map[string]*gpuLock{}}
}

func (l *gpuLocks) get(uuid string) *gpuLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.gpus[uuid]
	if !ok {
		g = &gpuLock{seen: unseen}
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
// and across processes alike.
func (l *gpuLocks) lock(uuids []string) (*heldGPUs, error) {
	keys := slices.Clone(uuids)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	h := &heldGPUs{l: l}
	for _, k := range keys {
		g := l.get(k)
		stamp, err := g.lock(l.dir, k)
		if err != nil {
			h.unlock()
			return nil, fmt.Errorf("locking GPU %s: %w", k, err)
		}
		h.uuids, h.locks, h.stamps = append(h.uuids, k), append(h.locks, g), append(h.stamps, stamp)
	}
	return h, nil
}

// lock locks one GPU and returns the stamp on it.
func (g *gpuLock) lock(dir, uuid string) (string, error) {
	g.mu.Lock()
	if err := g.flock(dir, uuid); err != nil {
		g.mu.Unlock()
		return "", err
	}
	buf := make([]byte, stampSize)
	n, err := g.file.ReadAt(buf, 0)
	if err != nil && n != stampSize && n != 0 {
		g.unlock()
		return "", fmt.Errorf("reading lock stamp: %w", err)
	}
	return string(buf[:n]), nil
}

func (g *gpuLock) flock(dir, uuid string) error {
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
	for {
		err := syscall.Flock(int(g.file.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func (g *gpuLock) unlock() {
	// Closing the file would drop the lock too; unlocking keeps it open.
	_ = syscall.Flock(int(g.file.Fd()), syscall.LOCK_UN)
	g.mu.Unlock()
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
func (s *State) lockFresh(ctx context.Context, gpus []string) (*heldGPUs, error) {
	held, err := s.locks.lock(gpus)
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
