// Package podresourcestest serves the kubelet's PodResources API (the
// generated v1 server of k8s.io/kubelet) on a Unix socket, answering what
// a test sets, so that tests talk to the API over gRPC as the plugin does
// to the kubelet.
package podresourcestest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Server is a PodResources server whose answers a test sets.
type Server struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	// Socket is where it serves.
	Socket string

	mu          sync.Mutex
	allocatable []*podresourcesv1.ContainerDevices
	pods        []*podresourcesv1.PodResources
	failing     error
}

// Start serves on a socket in a new temporary directory (short, so the
// path stays within a Unix socket's 108 bytes) until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "podres-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &Server{Socket: filepath.Join(dir, "kubelet.sock")}
	lis, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return s
}

// Devices is a ContainerDevices entry: a resource and some of its IDs.
func Devices(resource string, ids ...string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

// SetAllocatable sets what GetAllocatableResources answers: the devices
// device plugins advertise healthy.
func (s *Server) SetAllocatable(devices ...*podresourcesv1.ContainerDevices) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allocatable = devices
}

// SetPodDevices sets what List answers: one running pod whose container
// holds devices (none: no pod).
func (s *Server) SetPodDevices(devices ...*podresourcesv1.ContainerDevices) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = nil
	if len(devices) > 0 {
		s.pods = []*podresourcesv1.PodResources{{Name: "dp-pod", Namespace: "default",
			Containers: []*podresourcesv1.ContainerResources{{Name: "ctr", Devices: devices}}}}
	}
}

// Fail makes every call fail with err's message (Unavailable); nil heals.
func (s *Server) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = err
}

func (s *Server) err() error {
	if s.failing != nil {
		return status.Error(codes.Unavailable, s.failing.Error())
	}
	return nil
}

// GetAllocatableResources implements podresourcesv1.PodResourcesListerServer.
func (s *Server) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.err(); err != nil {
		return nil, err
	}
	return &podresourcesv1.AllocatableResourcesResponse{Devices: s.allocatable, CpuIds: []int64{0, 1}}, nil
}

// List implements podresourcesv1.PodResourcesListerServer.
func (s *Server) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.err(); err != nil {
		return nil, err
	}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: s.pods}, nil
}
