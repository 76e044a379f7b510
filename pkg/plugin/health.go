package plugin

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// Health answers the gRPC health protocol (what a Kubernetes grpc liveness
// probe calls) by checking the plugin the way the kubelet uses it: the
// kubelet has acknowledged our registration, and the DRA socket answers a
// NodePrepareResources call.
type Health struct {
	grpc_health_v1.UnimplementedHealthServer
	driver *Driver
	socket string
	server *grpc.Server
}

// NewHealth returns the health service of a started driver.
func NewHealth(driver *Driver) *Health {
	h := &Health{driver: driver, socket: driver.SocketPath(), server: grpc.NewServer()}
	grpc_health_v1.RegisterHealthServer(h.server, h)
	return h
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
func (h *Health) Check(ctx context.Context, _ *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	if err := h.check(ctx); err != nil {
		klog.FromContext(ctx).V(2).Info("Health check failed", "err", err)
		return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

func (h *Health) check(ctx context.Context) error {
	st := h.driver.Helper().RegistrationStatus()
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
