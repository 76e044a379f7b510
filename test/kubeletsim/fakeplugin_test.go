package kubeletsim

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fakePlugin is a DRA plugin as the kubelet sees it: a registration socket
// and a DRA socket. It records the calls it gets.
type fakePlugin struct {
	drapb.UnimplementedDRAPluginServer
	registerapi.UnimplementedRegistrationServer

	driver     string
	pluginType string
	endpoint   string
	servers    []*grpc.Server

	mu         sync.Mutex
	prepareErr string
	// requests names, per claim UID, the requests of the devices prepared
	// for the claim, one device each; default one device for "gpu".
	requests   map[string][]string
	prepared   [][]*drapb.Claim
	unprepared [][]*drapb.Claim
	statuses   []*registerapi.RegistrationStatus
	registered chan struct{} // one element per NotifyRegistrationStatus
}

// startFakePlugin serves the registration socket regSocket and the DRA
// socket in dataDir until the test ends.
func startFakePlugin(t *testing.T, driver, pluginType, regSocket, dataDir string) *fakePlugin {
	t.Helper()
	p := &fakePlugin{driver: driver, pluginType: pluginType,
		endpoint: filepath.Join(dataDir, "dra.sock"), registered: make(chan struct{}, 10)}
	p.serve(t, p.endpoint, func(s *grpc.Server) { drapb.RegisterDRAPluginServer(s, p) })
	p.serve(t, regSocket, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	t.Cleanup(p.stop)
	return p
}

func (p *fakePlugin) serve(t *testing.T, path string, register func(*grpc.Server)) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listening on %s: %v", path, err)
	}
	s := grpc.NewServer()
	register(s)
	p.servers = append(p.servers, s)
	go func() { _ = s.Serve(l) }()
}

// stop ends both servers; Serve removes the socket files.
func (p *fakePlugin) stop() {
	for _, s := range p.servers {
		s.Stop()
	}
}

func (p *fakePlugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &registerapi.PluginInfo{Type: p.pluginType, Name: p.driver, Endpoint: p.endpoint,
		SupportedVersions: []string{drapb.DRAPluginService}}, nil
}

func (p *fakePlugin) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p.mu.Lock()
	p.statuses = append(p.statuses, st)
	p.mu.Unlock()
	p.registered <- struct{}{}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (p *fakePlugin) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepared = append(p.prepared, req.Claims)
	resp := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		if p.prepareErr != "" {
			resp.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Error: p.prepareErr}
			continue
		}
		resp.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Devices: p.devices(c.Uid)}
	}
	return resp, nil
}

// devices returns device i, CDI ID k8s.<driver>/claim=<uid>-gpu-<i>, for
// the i-th request of the claim.
func (p *fakePlugin) devices(uid string) []*drapb.Device {
	requests, ok := p.requests[uid]
	if !ok {
		requests = []string{"gpu"}
	}
	var out []*drapb.Device
	for i, r := range requests {
		out = append(out, &drapb.Device{
			RequestNames: []string{r}, PoolName: "node-1", DeviceName: fmt.Sprintf("gpu-%d", i),
			CdiDeviceIds: []string{fmt.Sprintf("k8s.%s/claim=%s-gpu-%d", p.driver, uid, i)},
		})
	}
	return out
}

// setRequests makes the plugin prepare one device per request for the claim.
func (p *fakePlugin) setRequests(uid string, requests ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.requests == nil {
		p.requests = map[string][]string{}
	}
	p.requests[uid] = requests
}

func (p *fakePlugin) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unprepared = append(p.unprepared, req.Claims)
	resp := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		resp.Claims[c.Uid] = &drapb.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func (p *fakePlugin) setPrepareError(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepareErr = msg
}

// calls returns copies of the recorded prepare and unprepare batches.
func (p *fakePlugin) calls() (prepared, unprepared [][]*drapb.Claim) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]*drapb.Claim(nil), p.prepared...), append([][]*drapb.Claim(nil), p.unprepared...)
}
