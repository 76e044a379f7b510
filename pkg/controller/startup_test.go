package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// What the controller waits out at startup (an unreachable API server, or
// one still starting, which refuses and fails for a few seconds) and what
// it does not (errors that never reached the API server).
func TestAPIUnavailable(t *testing.T) {
	refused := refusedDial(t)
	crds := schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused, wrapped", fmt.Errorf("reading CRD x: %w", refused), true},
		{"service unavailable", apierrors.NewServiceUnavailable("etcd down"), true},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true},
		{"forbidden (RBAC not synced yet)", apierrors.NewForbidden(crds, "x", errors.New("RBAC")), true},
		{"a generic server response", fmt.Errorf("failed to get server groups: %w", apierrors.NewGenericServerResponse(403, "get", crds, "", "", 0, false)), true},
		{"not from the API server", errors.New("decoding embedded CRD x: bad yaml"), false},
	} {
		if got := apiUnavailable(c.err); got != c.want {
			t.Errorf("%s (%v): apiUnavailable = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A step that never reaches the API server ends with the context, naming
// what it waited for and the last error; one that fails before reaching it
// ends at once.
func TestUntilAPIAnswersEnds(t *testing.T) {
	refused := refusedDial(t)
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	err := untilAPIAnswers(ctx, "applying the gpuaas.io CRDs", func(context.Context) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return refused
	})
	if err == nil || !strings.Contains(err.Error(), "applying the gpuaas.io CRDs") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("after the context ended: %v, want the step and the last error named", err)
	}
	notAPI := errors.New("decoding embedded CRD x: bad yaml")
	calls = 0
	err = untilAPIAnswers(t.Context(), "applying the gpuaas.io CRDs", func(context.Context) error { calls++; return notAPI })
	if !errors.Is(err, notAPI) || calls != 1 {
		t.Fatalf("an error that never reached the API server: %v after %d calls, want it returned after one", err, calls)
	}
}

// refusedDial is the error of dialing a port nothing listens on.
func refusedDial(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	conn, err := net.Dial("tcp", addr)
	if err == nil {
		_ = conn.Close()
		t.Skip("something listens on the closed port again")
	}
	return err
}
