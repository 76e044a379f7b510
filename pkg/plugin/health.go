package plugin

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// Services of the health endpoint, as a grpc probe's `service` names them.
// A start can take minutes (after a reboot every MIG device of every
// prepared claim is made again, MPS daemons started) or wait indefinitely
// for the NVIDIA driver (the GPU Operator's driver container), so each
// probe asks its own question, and the endpoint answers from the first
// moment of the process:
//   - HealthServiceLiveness (or ""): is this process doing its job? While
//     it starts, yes, unless a start step has run past StartTimeout (a
//     hang); once started, the kubelet check below.
//   - HealthServiceStartup: has the start finished, or is the process in a
//     wait that is not a failure (the driver root)? The chart's
//     startupProbe, sized for the slowest restore, asks this: a start that
//     is slow is not killed, and a waiting one does not crash-loop.
//   - HealthServiceReadiness: registered with the kubelet and serving DRA
//     calls. A rolling update's surge pod becomes ready only then, before
//     the old pod is deleted. Not while the GPUs are released for
//     maintenance (maintenance.go), which liveness does not mind.
const (
	HealthServiceLiveness  = "liveness"
	HealthServiceStartup   = "startup"
	HealthServiceReadiness = "readiness"
)

// DefaultStartTimeout bounds a start step (NVML, discovery, restore,
// registration) before liveness calls it hung. Waiting for the driver
// root is not bounded: it is the driver's to end.
const DefaultStartTimeout = 10 * time.Minute

// Health answers the gRPC health protocol (what a Kubernetes grpc probe
// calls). Once the plugin runs it checks it the way the kubelet uses it:
// the kubelet has acknowledged our registration, and the DRA socket
// answers a NodePrepareResources call. Before that it says how far the
// start is.
type Health struct {
	grpc_health_v1.UnimplementedHealthServer
	server *grpc.Server
	// StartTimeout: see DefaultStartTimeout; zero is the default.
	startTimeout time.Duration
	now          func() time.Time

	mu sync.Mutex
	// driver and socket are set once started.
	driver *Driver
	socket string
	// step is what the start is doing, since when; waiting marks a step
	// that is a state to wait out, not progress to time.
	step      string
	stepSince time.Time
	waiting   bool
}

// NewHealth returns the health service of a starting plugin; Started
// hands it the running driver.
func NewHealth(startTimeout time.Duration) *Health {
	if startTimeout <= 0 {
		startTimeout = DefaultStartTimeout
	}
	h := &Health{server: grpc.NewServer(), startTimeout: startTimeout, now: time.Now,
		step: "starting", stepSince: time.Now()}
	grpc_health_v1.RegisterHealthServer(h.server, h)
	return h
}

// Step records what the start does now (for the probes' answers and the
// log); it restarts the hang timer.
func (h *Health) Step(ctx context.Context, step string) { h.setStep(ctx, step, false) }

// Wait records a wait for something outside the plugin: not ready, but
// alive however long it takes.
func (h *Health) Wait(ctx context.Context, what string) { h.setStep(ctx, what, true) }

func (h *Health) setStep(ctx context.Context, step string, waiting bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.step != step || h.waiting != waiting {
		klog.FromContext(ctx).V(1).Info("Start step", "step", step, "waiting", waiting)
	}
	h.step, h.stepSince, h.waiting = step, h.now(), waiting
}

// Started hands the running driver to the health service: from now on
// every service checks it.
func (h *Health) Started(driver *Driver) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.driver, h.socket = driver, driver.SocketPath()
}

// Serve answers health checks on lis until Stop.
func (h *Health) Serve(ctx context.Context, lis net.Listener) {
	klog.FromContext(ctx).Info("Serving gRPC health checks", "address", lis.Addr().String())
	go func() {
		if err := h.server.Serve(lis); err != nil {
			klog.FromContext(ctx).Error(err, "Health server stopped")
		}
	}()
}

// Stop stops the health server.
func (h *Health) Stop() { h.server.Stop() }

// Check implements grpc_health_v1.HealthServer.
func (h *Health) Check(ctx context.Context, req *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	service := req.GetService()
	switch service {
	case "", HealthServiceLiveness, HealthServiceStartup, HealthServiceReadiness:
	default:
		return nil, status.Errorf(codes.NotFound, "unknown service %q: want %q, %q or %q", service,
			HealthServiceLiveness, HealthServiceStartup, HealthServiceReadiness)
	}
	if err := h.answer(ctx, service); err != nil {
		klog.FromContext(ctx).V(2).Info("Health check failed", "service", service, "err", err)
		return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

// answer is nil when service is serving, else why not.
func (h *Health) answer(ctx context.Context, service string) error {
	h.mu.Lock()
	driver := h.driver
	step, since, waiting := h.step, h.stepSince, h.waiting
	h.mu.Unlock()
	if driver != nil {
		// Released for maintenance: alive (a restart would take the
		// GPUs back from the reset or upgrade), but not ready.
		if err := driver.NotReady(); err != nil && service == HealthServiceReadiness {
			return err
		}
		return h.check(ctx)
	}
	switch service {
	case HealthServiceReadiness:
		return fmt.Errorf("not ready: %s", step)
	case HealthServiceStartup:
		if waiting {
			return nil
		}
		return fmt.Errorf("starting: %s", step)
	}
	if took := h.now().Sub(since); !waiting && took > h.startTimeout {
		return fmt.Errorf("start step %q has taken %s, more than %s: hung", step, took.Round(time.Second), h.startTimeout)
	}
	return nil
}

func (h *Health) check(ctx context.Context) error {
	h.mu.Lock()
	driver := h.driver
	h.mu.Unlock()
	st := driver.Helper().RegistrationStatus()
	if st == nil || !st.PluginRegistered {
		return fmt.Errorf("not registered with the kubelet (yet)")
	}
	conn, err := grpc.NewClient("unix://"+h.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", h.socket, err)
	}
	defer func() { _ = conn.Close() }()
	_, err = drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{})
	if err != nil {
		return fmt.Errorf("calling NodePrepareResources: %w", err)
	}
	return nil
}

// Watch is not supported: probes use Check.
func (h *Health) Watch(*grpc_health_v1.HealthCheckRequest, grpc_health_v1.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "use Check")
}
