package quota

import (
	"context"
	"sync"

	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/lru"
)

// Compiled selector expressions, shared by every Pricer: classes and
// claims repeat the same few expressions. The cache is bounded by the
// length of the expressions it holds, not only their number: anyone who
// may create claims writes them, a compiled expression takes about 25
// bytes of heap per byte of its text, and 300 distinct selectors of 10 KiB
// (the API's limit) grew the heap by 75 MiB under the former cache of 1000
// entries (issue 36), where the chart gives the controller 256 Mi.
const (
	maxPrograms       = 1000
	maxProgramsLength = 1 << 20 // bytes of expression text: about 25 MiB of heap
	// compileCostPerByte is what compiling an expression the cache does
	// not hold charges to the claim's CEL budget (MaxCELCostPerClaim), per
	// byte of its text: compiling is not metered in CEL's cost units, and
	// a 10 KiB selector took about as long to compile as 700,000 units of
	// evaluation. A claim can so make the controller compile about 75 KiB
	// of new selector text, not the 10 MiB its 32 requests of 32 selectors
	// of 10 KiB could hold.
	compileCostPerByte = 64
)

var (
	celCompiler = cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})
	celPrograms = newProgramCache(maxPrograms, maxProgramsLength)
)

// programCache is a least-recently-used cache of compiled expressions,
// bounded in entries and in the length of their text.
type programCache struct {
	mu       sync.Mutex
	lru      *lru.Cache
	length   int
	maxBytes int
}

func newProgramCache(entries, maxBytes int) *programCache {
	c := &programCache{maxBytes: maxBytes}
	c.lru = lru.NewWithEvictionFunc(entries, func(key lru.Key, _ any) { c.length -= len(key.(string)) })
	return c
}

// get is expr compiled: from the cache, or compiled now and charged to
// ctx's CEL budget. An expression that fails to compile is not kept.
func (c *programCache) get(ctx context.Context, expr string) cel.CompilationResult {
	c.mu.Lock()
	v, ok := c.lru.Get(expr)
	c.mu.Unlock()
	if ok {
		return v.(cel.CompilationResult)
	}
	spendCost(ctx, uint64(len(expr))*compileCostPerByte)
	res := celCompiler.CompileCELExpression(expr, cel.Options{DisableCostEstimation: true})
	if res.Error != nil || len(expr) > c.maxBytes {
		return res
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.lru.Get(expr); !ok {
		c.length += len(expr)
		c.lru.Add(expr, res)
	}
	for c.length > c.maxBytes {
		c.lru.RemoveOldest()
	}
	return res
}

// size is how many expressions are held, and the length of their text.
func (c *programCache) size() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.length
}
