package gpunode

import (
	"context"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
)

const (
	// probeNode is the node name of the controller's probe slices: dry-run
	// creates are never stored, and the chart's policy refuses any other.
	probeNode = "gpuaas-controller-probe"
	// probeEvery asks again even when the server's version stays: an admin
	// may turn a gate on or off with a restart of the same version.
	probeEvery = 10 * time.Minute
	// versionCheckEvery: a control-plane upgrade is seen within a minute.
	versionCheckEvery = time.Minute
)

// clusterFeatures finds out which DRA features the API server drops, with
// the same dry-run creates the plugin makes before it publishes
// (pkg/sliceprobe), so that each GpuNode's status names what the cluster
// lacks and the gate that brings it (issue 35). It asks at start, every
// probeEvery, and when the server's version changes, and queues every
// GpuNode when the answer changes. It runs on the leader only.
type clusterFeatures struct {
	prober sliceprobe.Prober
	reader client.Reader
	events chan event.GenericEvent

	mu      sync.RWMutex
	version string // "" until a probe answered
	missing []gpuaas.MissingFeature
}

func newClusterFeatures(cs kubernetes.Interface, reader client.Reader) *clusterFeatures {
	return &clusterFeatures{
		prober: sliceprobe.Prober{Client: cs, Node: probeNode, Driver: gpuapi.DriverName},
		reader: reader,
		events: make(chan event.GenericEvent, 64),
	}
}

// current is the last answer: the server version asked and what it lacks.
// Nil-safe: a reconciler without a prober reports nothing.
func (f *clusterFeatures) current() (string, []gpuaas.MissingFeature) {
	if f == nil {
		return "", nil
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.version, slices.Clone(f.missing)
}

// Start implements manager.Runnable.
func (f *clusterFeatures) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("cluster-features")
	ctx = klog.NewContext(ctx, logger)
	f.probe(ctx)
	lastProbe := time.Now()
	tick := time.NewTicker(versionCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		version, _ := f.current()
		if time.Since(lastProbe) < probeEvery && version != "" && f.serverVersion(ctx) == version {
			continue
		}
		f.probe(ctx)
		lastProbe = time.Now()
	}
}

// serverVersion is the API server's gitVersion, "" when it cannot be read.
func (f *clusterFeatures) serverVersion(ctx context.Context) string {
	v, err := f.prober.Client.Discovery().ServerVersion()
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Cannot read the API server's version; asking what it keeps again", "err", err)
		return ""
	}
	return v.GitVersion
}

// probe asks once and, when the answer changed, queues every GpuNode.
func (f *clusterFeatures) probe(ctx context.Context) {
	logger := klog.FromContext(ctx)
	support, err := f.prober.Probe(ctx)
	if err != nil {
		logger.Error(err, "Cannot ask the API server which DRA features it keeps; GpuNodes keep the last answer", "retryIn", versionCheckEvery)
		return
	}
	var missing []gpuaas.MissingFeature
	for _, g := range support.Gaps() {
		missing = append(missing, gpuaas.MissingFeature{Feature: g.Feature, Gate: g.Gate, Effect: g.Effect})
	}
	f.mu.Lock()
	changed := f.version != support.ServerVersion || !slices.Equal(f.missing, missing)
	f.version, f.missing = support.ServerVersion, missing
	f.mu.Unlock()
	if !changed {
		return
	}
	logger.Info("What the cluster keeps of ResourceSlices", "serverVersion", support.ServerVersion, "support", support.String())
	pools, err := publishingPools(ctx, f.reader)
	if err != nil {
		logger.Error(err, "Cannot list the nodes to update; their resync picks the answer up")
		return
	}
	for _, pool := range pools {
		node := &gpuaas.GpuNode{ObjectMeta: metav1.ObjectMeta{Name: pool}}
		select {
		case f.events <- event.GenericEvent{Object: node}:
		case <-ctx.Done():
			return
		}
	}
}
