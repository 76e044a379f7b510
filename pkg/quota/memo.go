package quota

import (
	"context"
	"crypto/sha256"
	"sync"
)

// MaxRememberedShapes bounds the request shapes a Pricer remembers. Anyone
// who may create claims chooses the shapes; unbounded, 300 dry runs of
// 290 kB selectors grew the controller's heap by 130 MiB (issue 36).
// Templates repeat a few shapes, so a real catalog stays far below it.
const MaxRememberedShapes = 4096

// shapeHash is what the memo keys by: a hash of shapeKey, so a remembered
// shape costs 32 bytes of key however long its selectors.
type shapeHash [sha256.Size]byte

type dryRunKey struct{}

// dryRunMemo is one dry run's own memo: a claim is priced several times in
// one admission (its cost, what cannot be priced, again with a Kueue
// overrule's limits), and each would otherwise evaluate its selectors anew.
// It goes with the request.
type dryRunMemo struct {
	mu     sync.Mutex
	prices map[dryRunShape]*price
}

type dryRunShape struct {
	pricer *Pricer
	key    shapeHash
}

// WithDryRun marks ctx as a dry run's: its shapes are priced and then
// forgotten, since a dry run stores nothing that would be priced again.
func WithDryRun(ctx context.Context) context.Context {
	return context.WithValue(ctx, dryRunKey{}, &dryRunMemo{prices: map[dryRunShape]*price{}})
}

func dryRunOf(ctx context.Context) *dryRunMemo {
	m, _ := ctx.Value(dryRunKey{}).(*dryRunMemo)
	return m
}

// recall is what p, or this dry run, worked out for key already.
func (p *Pricer) recall(ctx context.Context, key shapeHash) (*price, bool) {
	p.mu.Lock()
	pr, ok := p.memo[key]
	p.mu.Unlock()
	if dry := dryRunOf(ctx); !ok && dry != nil {
		dry.mu.Lock()
		pr, ok = dry.prices[dryRunShape{p, key}]
		dry.mu.Unlock()
	}
	return pr, ok
}

// remember keeps pr for key: a dry run's in its own memo only; otherwise
// in p's, where, when it is full, an arbitrary shape makes room (map
// order): a forgotten shape is only priced again. The caller does not hold
// p.mu.
func (p *Pricer) remember(ctx context.Context, key shapeHash, pr *price) {
	if dry := dryRunOf(ctx); dry != nil {
		dry.mu.Lock()
		dry.prices[dryRunShape{p, key}] = pr
		dry.mu.Unlock()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.memo {
		if len(p.memo) < MaxRememberedShapes {
			break
		}
		delete(p.memo, k)
	}
	p.memo[key] = pr
}

// memoSize is how many shapes are remembered, and the bytes of their keys.
func (p *Pricer) memoSize() (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.memo), len(p.memo) * sha256.Size
}
