package quota

import (
	"context"
	"crypto/sha256"
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

// WithDryRun marks ctx as a dry run's: its shapes are priced and then
// forgotten, since a dry run stores nothing that would be priced again.
func WithDryRun(ctx context.Context) context.Context {
	return context.WithValue(ctx, dryRunKey{}, true)
}

func isDryRun(ctx context.Context) bool {
	v, _ := ctx.Value(dryRunKey{}).(bool)
	return v
}

// remember keeps pr for key, unless ctx is a dry run's; when the memo is
// full, an arbitrary shape makes room (map order): a forgotten shape is
// only priced again. The caller does not hold p.mu.
func (p *Pricer) remember(ctx context.Context, key shapeHash, pr *price) {
	if isDryRun(ctx) {
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
