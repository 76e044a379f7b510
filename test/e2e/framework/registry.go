package framework

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Registry is distribution's OCI registry (make release-tools builds it into
// the bin dir) serving plain HTTP on 127.0.0.1, its storage in a directory
// of the test: where the release tests push a release and install it from,
// as a user installs from ghcr.io.
type Registry struct {
	// Addr is "127.0.0.1:<port>", the host part of its references.
	Addr    string
	Process *Process
}

// registryConfig is the registry's configuration: filesystem storage, one
// plain-HTTP listener, no authentication.
const registryConfig = `version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %q
http:
  addr: %q
`

// StartRegistry starts a registry with its storage under dir and its log in
// the control plane's log directory, and waits until it answers /v2/. The
// caller stops it (Process.Stop).
func (cp *ControlPlane) StartRegistry(ctx context.Context, dir string) (*Registry, error) {
	bin := filepath.Join(cp.BinDir, "registry")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("registry: %w (make release-tools builds it)", err)
	}
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, filepath.Join(dir, "storage"), addr), 0o644); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	r := &Registry{Addr: addr, Process: NewProcess("registry", bin, filepath.Join(cp.LogDir, "registry.log"), "serve", cfg)}
	// No OpenTelemetry collector here: without this the registry tries
	// to export traces to localhost:4318 and logs each failure.
	r.Process.Env = []string{"OTEL_TRACES_EXPORTER=none"}
	if err := r.Process.Start(); err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 2 * time.Second}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := r.Process.Exited(); exited {
			return false, fmt.Errorf("registry exited (%w):\n%s", err, r.Process.Tail(20))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v2/", nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		_ = r.Process.Stop()
		return nil, fmt.Errorf("registry on %s: %w", addr, err)
	}
	cp.logf("registry on http://%s (storage %s)", addr, dir)
	return r, nil
}
