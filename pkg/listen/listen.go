// Package listen opens the plugin's TCP endpoints (metrics, liveness) in a
// way that survives a rolling update on the host network: the new plugin
// pod starts next to the old one (maxSurge) and finds the ports taken until
// the old pod is gone. Exiting then would crash-loop the new pod and stall
// the update; waiting for the port does not.
package listen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// retryInterval is how often a taken port is tried again.
const retryInterval = time.Second

// WhenFree listens on addr and calls serve with the listener. While another
// process holds the address, it retries in the background until ctx ends;
// any other error is returned at once.
func WhenFree(ctx context.Context, what, addr string, serve func(net.Listener)) error {
	lis, err := net.Listen("tcp", addr)
	if err == nil {
		serve(lis)
		return nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listening for %s on %s: %w", what, addr, err)
	}
	logger := klog.FromContext(ctx)
	logger.Info("Address in use (another plugin pod on the host network?), waiting for it", "endpoint", what, "address", addr)
	go func() {
		ticker := time.NewTicker(retryInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			lis, err := net.Listen("tcp", addr)
			if err == nil {
				logger.Info("Address free, serving", "endpoint", what, "address", addr)
				serve(lis)
				return
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				logger.Error(err, "Listening failed, giving up", "endpoint", what, "address", addr)
				return
			}
		}
	}()
	return nil
}
