// Package kinds tells whether the API server serves a kind: the
// controller's planes each turn off what the cluster does not serve (a CRD
// not installed yet, a resource.k8s.io kind of a newer release) rather
// than start a watch that never syncs.
package kinds

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Served tells whether the API serves a kind at a version. The manager's
// REST mapper asks discovery again on a miss, so a CRD established after
// the first look is found on the next.
func Served(m meta.RESTMapper, gk schema.GroupKind, version string) (bool, error) {
	_, err := m.RESTMapping(gk, version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	}
	return false, fmt.Errorf("looking up %s: %w", gk, err)
}

// ServedWithin is Served, asked every second for up to timeout: a CRD that
// ApplyCRDs created a moment ago may not be served yet. Only an error
// other than running out of time is returned.
func ServedWithin(ctx context.Context, m meta.RESTMapper, gk schema.GroupKind, version string, timeout time.Duration) (bool, error) {
	var served bool
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(context.Context) (bool, error) {
		var err error
		served, err = Served(m, gk, version)
		return served, err
	})
	if err != nil && !wait.Interrupted(err) {
		return false, err
	}
	return served, nil
}
