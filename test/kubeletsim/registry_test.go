package kubeletsim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const testDriver = "gpu.gpuaas.io"

// startRegistry runs a registry on a fresh directory until the test ends.
func startRegistry(t *testing.T) (*registry, context.Context) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := newRegistry(filepath.Join(t.TempDir(), "registry"))
	done := make(chan error)
	go func() { done <- r.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry.run: %v", err)
		}
	})
	// The directory exists once run started watching it.
	waitFor(t, ctx, "registry dir", func() bool { return dirExists(r.dir) })
	return r, ctx
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func awaitNotification(t *testing.T, p *fakePlugin) *registerapi.RegistrationStatus {
	t.Helper()
	select {
	case <-p.registered:
	case <-time.After(10 * time.Second):
		t.Fatal("plugin never got NotifyRegistrationStatus")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statuses[len(p.statuses)-1]
}

func TestRegistryRegistersAndForgetsPlugin(t *testing.T) {
	r, ctx := startRegistry(t)
	p := startFakePlugin(t, testDriver, registerapi.DRAPlugin, filepath.Join(r.dir, testDriver+"-reg.sock"), t.TempDir())

	if st := awaitNotification(t, p); !st.PluginRegistered {
		t.Fatalf("registration status = %+v, want registered", st)
	}
	// The registry records the plugin right after the notification returns.
	waitFor(t, ctx, "registration", func() bool { _, err := r.get(testDriver); return err == nil })
	got, err := r.get(testDriver)
	if err != nil {
		t.Fatal(err)
	}
	if got.endpoint != p.endpoint {
		t.Errorf("endpoint = %s, want %s", got.endpoint, p.endpoint)
	}

	p.stop() // removes the socket, as a plugin that shuts down does
	waitFor(t, ctx, "deregistration", func() bool { _, err := r.get(testDriver); return err != nil })
	if _, err := r.get(testDriver); err == nil || err.Error() != "DRA driver gpu.gpuaas.io is not registered" {
		t.Errorf("get after removal: %v, want the kubelet's not-registered error", err)
	}
}

func TestRegistryReRegistersRestartedPlugin(t *testing.T) {
	r, ctx := startRegistry(t)
	regSocket := filepath.Join(r.dir, testDriver+"-reg.sock")
	dataDir := t.TempDir()
	first := startFakePlugin(t, testDriver, registerapi.DRAPlugin, regSocket, dataDir)
	awaitNotification(t, first)
	var since time.Time
	waitFor(t, ctx, "registration", func() bool { var ok bool; since, ok = r.registeredSince(testDriver); return ok })

	first.stop()
	second := startFakePlugin(t, testDriver, registerapi.DRAPlugin, regSocket, dataDir)
	if st := awaitNotification(t, second); !st.PluginRegistered {
		t.Fatalf("registration status = %+v, want registered", st)
	}
	waitFor(t, ctx, "new registration", func() bool {
		now, ok := r.registeredSince(testDriver)
		return ok && now.After(since)
	})
}

func TestRegistryRejectsOtherPluginTypes(t *testing.T) {
	r, _ := startRegistry(t)
	p := startFakePlugin(t, "csi.example.com", registerapi.CSIPlugin, filepath.Join(r.dir, "csi-reg.sock"), t.TempDir())
	st := awaitNotification(t, p)
	if st.PluginRegistered || st.Error == "" {
		t.Fatalf("registration status = %+v, want a rejection with an error", st)
	}
	if _, err := r.get("csi.example.com"); err == nil {
		t.Error("a CSI plugin was registered as a DRA driver")
	}
}

func TestRegistryIgnoresHiddenSockets(t *testing.T) {
	r, _ := startRegistry(t)
	p := startFakePlugin(t, testDriver, registerapi.DRAPlugin, filepath.Join(r.dir, ".hidden-reg.sock"), t.TempDir())
	select {
	case <-p.registered:
		t.Fatal("a socket whose name starts with '.' was registered")
	case <-time.After(2 * reconcilePeriod):
	}
}

func TestRegistryFindsSocketsInSubdirectories(t *testing.T) {
	r, _ := startRegistry(t)
	sub := filepath.Join(r.dir, "sub")
	if err := mkdir(sub); err != nil {
		t.Fatal(err)
	}
	p := startFakePlugin(t, testDriver, registerapi.DRAPlugin, filepath.Join(sub, "reg.sock"), t.TempDir())
	if st := awaitNotification(t, p); !st.PluginRegistered {
		t.Fatalf("registration status = %+v, want registered", st)
	}
}

func dirExists(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}

func mkdir(path string) error { return os.Mkdir(path, 0o750) }
