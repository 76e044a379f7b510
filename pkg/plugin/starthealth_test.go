package plugin

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func checkService(t *testing.T, h *Health, service string) string {
	t.Helper()
	resp, err := h.Check(context.Background(), &grpc_health_v1.HealthCheckRequest{Service: service})
	if err != nil {
		return status.Code(err).String()
	}
	return resp.GetStatus().String()
}

// Issue 25 items 3 and 5: before the plugin is started the health service
// answers each probe its own question. A start under way is alive but not
// started (the startupProbe's budget runs) nor ready; a wait for the driver
// is alive and no failed start (no crash loop), not ready; a start step
// that runs past the start timeout is hung, and liveness says so.
func TestHealthWhileStarting(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	want := func(step string, liveness, startup, readiness string) {
		t.Helper()
		for service, w := range map[string]string{"": liveness, HealthServiceLiveness: liveness,
			HealthServiceStartup: startup, HealthServiceReadiness: readiness} {
			if got := checkService(t, h, service); got != w {
				t.Errorf("%s: service %q answers %s, want %s", step, service, got, w)
			}
		}
	}
	h.Step(ctx, "restoring 56 prepared claims")
	want("restoring", "SERVING", "NOT_SERVING", "NOT_SERVING")
	now = now.Add(59 * time.Second)
	want("a step of 59 s", "SERVING", "NOT_SERVING", "NOT_SERVING")
	h.Step(ctx, "re-establishing prepared claim 2 of 56 after a reboot")
	now = now.Add(59 * time.Second)
	want("the next step of 59 s", "SERVING", "NOT_SERVING", "NOT_SERVING")
	now = now.Add(2 * time.Second)
	want("a step of 61 s", "NOT_SERVING", "NOT_SERVING", "NOT_SERVING")

	h.Wait(ctx, "waiting for the NVIDIA driver under driver root /run/nvidia/driver")
	now = now.Add(time.Hour)
	want("waiting an hour for the driver", "SERVING", "SERVING", "NOT_SERVING")

	if got := checkService(t, h, "gpu"); got != codes.NotFound.String() {
		t.Errorf("unknown service: %s, want NotFound", got)
	}
}
