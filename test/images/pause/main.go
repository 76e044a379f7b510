// Command pause is the pod sandbox ("infra") container of the node e2e tests.
//
// The CRI needs a sandbox image to hold each pod's namespaces. The e2e
// machine cannot pull registry.k8s.io/pause, so the tests build this static
// binary and wrap it in an image with test/e2e/framework/ociimage instead.
//
// It does nothing but wait for SIGTERM or SIGINT and exit 0. Because it is
// PID 1 of the pod's PID namespace when that is shared, orphaned processes
// are re-parented to it, so it also reaps zombie children on SIGCHLD.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child without blocking. Signals coalesce, so
// one SIGCHLD may stand for several children and the loop runs until none
// is left.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
