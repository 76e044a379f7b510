package admission

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// leaderSweep runs a sweep at once and then every period, on the leader
// only: the book sweeper and the sweep of claims overruled for ended
// workloads. A failed sweep is logged and tried again next period.
type leaderSweep struct {
	name    string // the logger's name
	failure string // the log message of a failed sweep
	period  time.Duration
	sweep   func(context.Context) error
}

var _ manager.LeaderElectionRunnable = &leaderSweep{}

func (s *leaderSweep) NeedLeaderElection() bool { return true }

func (s *leaderSweep) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName(s.name)
	ctx = klog.NewContext(ctx, logger)
	t := time.NewTicker(s.period)
	defer t.Stop()
	for {
		if err := s.sweep(ctx); err != nil {
			logger.Error(err, s.failure)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
