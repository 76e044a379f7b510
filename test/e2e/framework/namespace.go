package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cleanupTimeout bounds how long a test's cleanup waits for its pods.
const cleanupTimeout = time.Minute

// Context returns a context for one test step that ends after timeout or
// with the test.
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// CreateNamespace creates a namespace with a generated name, waits until
// pods can be created in it, and deletes it when the test ends (see
// DeleteNamespace).
func (cp *ControlPlane) CreateNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx := Context(t, time.Minute)
	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	cp.DeleteNamespaceAtCleanup(t, ns.Name)
	if err := WaitForServiceAccount(ctx, cp.Client, ns.Name); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// DeleteNamespaceAtCleanup deletes a namespace when the test ends.
func (cp *ControlPlane) DeleteNamespaceAtCleanup(t testing.TB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := cp.DeleteNamespace(ctx, name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// DeleteNamespace deletes the pods of a namespace gracefully, waits until
// they are gone (the node simulator unprepares their claims and finishes
// the deletion), then deletes the namespace without waiting for it.
// Deleting pods first matters: the namespace controller waits out the pods'
// whole termination grace period (30 s by default) before it looks again.
func (cp *ControlPlane) DeleteNamespace(ctx context.Context, name string) error {
	pods := cp.Client.CoreV1().Pods(name)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("deleting pods of namespace %s: %w", name, err)
	}
	if err := cp.WaitForNoPods(ctx, name); err != nil {
		return err
	}
	err := cp.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	return nil
}
