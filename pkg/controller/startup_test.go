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

// What the controller waits out at startup (an unreachable or unready API
// server) and what it does not (a refusal, which waiting does not fix).
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
		{"forbidden", apierrors.NewForbidden(crds, "x", errors.New("RBAC")), false},
		{"not found", apierrors.NewNotFound(crds, "x"), false},
		{"other", errors.New("decoding embedded CRD x: bad yaml"), false},
	} {
		if got := apiUnavailable(c.err); got != c.want {
			t.Errorf("%s (%v): apiUnavailable = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A step that never reaches the API server ends with the context, naming
// what it waited for and the last error; one refused otherwise ends at
// once.
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
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "x", errors.New("RBAC"))
	calls = 0
	err = untilAPIAnswers(t.Context(), "the webhook certificate", func(context.Context) error { calls++; return forbidden })
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("a refusal: %v after %d calls, want it returned after one", err, calls)
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
