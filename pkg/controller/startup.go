package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// startupBackoff spaces the retries of a startup step while the API server
// cannot be reached: quick at first (a restarting API server is back in
// seconds), then every 10 s at most, so recovery is never later than that.
var startupBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 10 * time.Second}

// startupWaitLog is how often a controller waiting for the API server at
// startup says so, at most.
const startupWaitLog = 5 * time.Second

// untilAPIAnswers runs step (named by what, e.g. "applying the gpuaas.io
// CRDs") until it succeeds, retrying while the API server cannot be
// reached, and returns only when it succeeds, fails otherwise, or ctx
// ends. The controller exited on the first refused connection, and during
// an API server outage (a control-plane upgrade) the kubelet's
// CrashLoopBackOff then kept it down for minutes after the API server was
// back.
func untilAPIAnswers(ctx context.Context, what string, step func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	b := startupBackoff
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		err := step(ctx)
		if err == nil || !apiUnavailable(err) {
			return err
		}
		if time.Since(lastLog) >= startupWaitLog {
			logger.Info("Waiting for the API server", "for", what, "attempt", attempt, "err", err.Error())
			lastLog = time.Now()
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: stopped waiting for the API server: %w", what, errors.Join(context.Cause(ctx), err))
		case <-t.C:
		}
	}
}

// apiUnavailable tells whether err came from the API server, or from the
// way to it: the controller waits those out at startup. Unreachable is the
// outage itself; a kube-apiserver that has just started answers for a few
// seconds with errors of its own (Forbidden until its RBAC caches sync, and
// "unknown" for discovery) that a crash would turn into minutes of
// CrashLoopBackOff. A real refusal (RBAC the chart did not grant) is
// waited for too, saying so every few seconds, rather than crash-looping.
// Errors that never reached the API server (an embedded CRD that does not
// decode, a CA file that cannot be read) are returned.
func apiUnavailable(err error) bool {
	var netErr net.Error
	var status apierrors.APIStatus
	return errors.As(err, &netErr) || errors.As(err, &status) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}
