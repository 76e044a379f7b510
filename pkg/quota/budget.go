package quota

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/google/cel-go/cel"
	resourceapi "k8s.io/api/resource/v1"
)

// MaxCELCostPerClaim bounds the CEL evaluation that pricing one claim may
// spend, in CEL's cost units, over all its selectors and every published
// device: five times what the API server lets one selector expression cost
// on one device (about 1.3 s of one core of the 2-core machine the tests
// run on). A claim's author chooses its selectors; unbounded, one
// claim of 32 selectors near the API server's limit took 30 s of the
// webhook's CPU and held its cohort's admissions past the webhook timeout
// (issue 36). A claim past the budget is refused as unpriced. Ordinary
// selectors cost a few units per device, so a cluster of 100,000 devices
// prices a claim of several selectors within it; a shape once priced is
// remembered and costs nothing more.
const MaxCELCostPerClaim = 5 * resourceapi.CELSelectorExpressionMaxCost

// ErrCELBudgetSpent is the cause of a pricing cut short by its CEL budget.
var ErrCELBudgetSpent = errors.New("the claim's selectors cost more CEL evaluation than one claim may")

type celBudgetKey struct{}

// celBudget is what is left of one claim's CEL budget; spending the last
// of it cancels the pricing's context, which cuts the walk short like a
// deadline does.
type celBudget struct {
	left   atomic.Int64
	cancel context.CancelCauseFunc
	// outer is the budget ctx had already, which every evaluation spends
	// from too (the alternatives webhook prices each alternative as a
	// claim, all under the one claim's budget).
	outer *celBudget
}

// WithCELBudget is ctx for pricing one claim within cost units of CEL
// evaluation; call stop when the pricing is done. Within a budget ctx has
// already, both are spent: the inner one cannot grant more than is left of
// the outer one.
func WithCELBudget(ctx context.Context, cost int64) (_ context.Context, stop func()) {
	outer, _ := ctx.Value(celBudgetKey{}).(*celBudget)
	ctx, cancel := context.WithCancelCause(ctx)
	b := &celBudget{cancel: cancel, outer: outer}
	b.left.Store(cost)
	return context.WithValue(ctx, celBudgetKey{}, b), func() { cancel(context.Canceled) }
}

// spendCEL charges one evaluation's cost to ctx's budget, if it has one.
func spendCEL(ctx context.Context, details *cel.EvalDetails) {
	if details != nil && details.ActualCost() != nil {
		spendCost(ctx, *details.ActualCost())
	}
}

// spendCost charges cost units to ctx's budget and those it is within,
// if it has one. Spending an outer budget's last cancels its context, and
// so every context within it, with the same cause.
func spendCost(ctx context.Context, cost uint64) {
	b, _ := ctx.Value(celBudgetKey{}).(*celBudget)
	for ; b != nil; b = b.outer {
		if b.left.Add(-int64(min(cost, uint64(MaxCELCostPerClaim)))) <= 0 {
			b.cancel(ErrCELBudgetSpent)
		}
	}
}

// overBudget tells whether ctx ended because its CEL budget was spent.
func overBudget(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrCELBudgetSpent) }
