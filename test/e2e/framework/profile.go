package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
)

// SchedulerProfile takes a CPU profile of the kube-scheduler over d, from
// its /debug/pprof (on by default, behind its authorization: the admin
// token passes), in pprof's format.
func (cp *ControlPlane) SchedulerProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Host = cp.schedulerURL
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for the scheduler: %w", err)
	}
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", cp.schedulerURL, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("profiling the scheduler: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the scheduler's profile: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("profiling the scheduler: %s: %s", resp.Status, body)
	}
	return body, nil
}
