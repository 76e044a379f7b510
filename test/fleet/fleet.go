// Package fleet publishes the ResourceSlices of many simulated GPU nodes from
// one process, for the scale benchmark (issue 14): each node is a Node object
// that kwok keeps Ready and whose pods kwok runs, and its slices are exactly
// what dra-kubelet-plugin would publish there, built by the plugin's own
// inventory and slice code (inventory.Discover, inventory.Resources) over a mock
// NVML machine of the node, and published by the same resourceslice
// controller the plugin's kubeletplugin helper runs. Nothing is prepared:
// kwok's nodes have no kubelet.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
)

// KwokAnnotation marks the nodes kwok manages (its
// --manage-nodes-with-annotation-selector).
const KwokAnnotation = "kwok.x-k8s.io/node"

// FleetLabel names the fleet (its Prefix) on each of its Nodes.
const FleetLabel = "fleet.gpuaas.io/name"

// Options say what fleet to run.
type Options struct {
	Client kubernetes.Interface
	// Nodes is how many nodes; their names are Prefix-0 ... Prefix-(Nodes-1).
	Nodes  int
	Prefix string
	// Machine is the go-nvml mock machine of every node (nvmock.Machines);
	// "" is the 8 x H100 DGX.
	Machine string
	// Config is every node's NodeConfig (how its GPUs are offered); nil
	// offers every GPU whole.
	Config *configapi.NodeConfig
	// Driver is the DRA driver the nodes publish as; "" is ours.
	Driver string
	// Replay, when set, is what every node publishes instead of what
	// discovery on Machine finds: the slices one plugin published for one
	// node (another driver's too), their devices and counter sets as they
	// are, in the same slices. Config and Machine are then unused.
	Replay []resourceapi.ResourceSliceSpec
}

// Fleet is a running fleet of simulated nodes.
type Fleet struct {
	client  kubernetes.Interface
	stopped sync.Once
	driver  string
	prefix  string
	nodes   []*node
	slices  *sliceWatch
}

type node struct {
	name string
	uid  types.UID
	res  resourceslice.DriverResources
	lib  nvdev.Interface
	ctrl *resourceslice.Controller
	// inv is what discovery found (nil for a replayed node), for
	// SetFaults to taint.
	inv *inventory.Inventory
}

// Start creates the nodes (or adopts them when they exist) and starts
// publishing their slices. It does not wait for the slices to be stored;
// WaitPublished does. Stop ends it.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if opts.Machine == "" {
		opts.Machine = "dgxh100"
	}
	if opts.Driver == "" {
		opts.Driver = configapi.DriverName
	}
	f := &Fleet{client: opts.Client, driver: opts.Driver, prefix: opts.Prefix}
	var err error
	if f.slices, err = watchSlices(ctx, opts.Client, opts.Driver); err != nil {
		return nil, err
	}
	f.nodes = make([]*node, opts.Nodes)
	err = parallel(opts.Nodes, func(i int) error {
		var err error
		f.nodes[i], err = f.startNode(ctx, opts, fmt.Sprintf("%s-%d", opts.Prefix, i))
		return err
	})
	if err != nil {
		f.nodes = slices.DeleteFunc(f.nodes, func(n *node) bool { return n == nil })
		f.Stop()
		return nil, err
	}
	return f, nil
}

// parallel runs do(0..n-1), 32 at a time, and returns the first error.
// A slice controller waits for its informer to sync (polling each second)
// before it starts, so one node at a time took a second per node.
// (Not errgroup.WithContext: the publishers live on after it returns.)
func parallel(n int, do func(i int) error) error {
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error { return do(i) })
	}
	return g.Wait()
}

func (f *Fleet) startNode(ctx context.Context, opts Options, name string) (*node, error) {
	obj, err := f.ensureNode(ctx, name)
	if err != nil {
		return nil, err
	}
	if opts.Replay != nil {
		n := &node{name: name, uid: obj.UID, res: replayResources(name, opts.Replay)}
		return n, n.startPublisher(ctx, f.client, f.driver)
	}
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + opts.Machine, MockSeed: name})
	if err != nil {
		return nil, fmt.Errorf("opening the mock NVML of node %s: %w", name, err)
	}
	n := &node{name: name, uid: obj.UID, lib: lib}
	n.discover(ctx, opts.Config)
	if err := n.startPublisher(ctx, f.client, f.driver); err != nil {
		_ = lib.Shutdown()
		return nil, err
	}
	return n, nil
}

// pool is what the node publishes now.
func (n *node) pool() resourceslice.Pool { return n.res.Pools[n.name] }

// devices is how many devices the node publishes now.
func (n *node) devices() int {
	total := 0
	for _, s := range n.pool().Slices {
		total += len(s.Devices)
	}
	return total
}

// startPublisher starts the node's slice controller for driver, as the
// plugin's kubeletplugin helper does: the node owns its slices.
func (n *node) startPublisher(ctx context.Context, client kubernetes.Interface, driver string) error {
	res := n.res
	ctrl, err := resourceslice.StartController(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("node", n.name)), resourceslice.Options{
		DriverName: driver,
		KubeClient: client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: n.name, UID: n.uid},
		Resources:  &res,
	})
	if err != nil {
		return fmt.Errorf("starting the slice controller of node %s: %w", n.name, err)
	}
	n.ctrl = ctrl
	return nil
}

// discover sets what the plugin publishes for the node: discovery over its
// GPUs and configuration, cut into slices.
func (n *node) discover(ctx context.Context, cfg *configapi.NodeConfig) {
	if cfg == nil {
		cfg = &configapi.NodeConfig{}
	}
	inv := inventory.Discover(klog.FromContext(ctx), n.lib, cfg)
	n.inv = &inv
	n.res = inventory.Resources(n.name, inv)
}

// replayResources is a captured slice set as node name publishes it: the
// same devices and counter sets in as many slices; the publisher names the
// pool and the node after name.
func replayResources(name string, captured []resourceapi.ResourceSliceSpec) resourceslice.DriverResources {
	var pool resourceslice.Pool
	for _, s := range captured {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{name: pool}}
}

// ensureNode creates the Node kwok will keep Ready: 32 CPUs, 256 GiB and
// 110 pods allocatable, so only the GPUs limit where pods go.
func (f *Fleet) ensureNode(ctx context.Context, name string) (*corev1.Node, error) {
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{KwokAnnotation: "fake"},
			Labels:      map[string]string{"kubernetes.io/hostname": name, "type": "kwok", FleetLabel: f.prefix},
		},
		Status: corev1.NodeStatus{
			Allocatable: nodeResources(),
			Capacity:    nodeResources(),
		},
	}
	created, err := f.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err == nil {
		return created, nil
	}
	existing, getErr := f.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if getErr != nil {
		return nil, fmt.Errorf("creating node %s: %w", name, errors.Join(err, getErr))
	}
	return existing, nil
}

func nodeResources() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
}

// Reconfigure offers every node's GPUs as cfg says from now on, as a
// plugin restarted with a new --node-config would.
// A replayed fleet has nothing to discover again: it is left as it is.
func (f *Fleet) Reconfigure(ctx context.Context, cfg *configapi.NodeConfig) {
	for _, n := range f.nodes {
		if n.lib == nil {
			continue
		}
		n.discover(ctx, cfg)
		n.ctrl.Update(&n.res)
	}
}

// GPUs are the UUIDs of node i's GPUs (none on a replayed node).
func (f *Fleet) GPUs(i int) []string {
	n := f.nodes[i]
	if n.inv == nil {
		return nil
	}
	var out []string
	for _, d := range n.inv.Devices {
		if !slices.Contains(out, d.GPU.UUID) {
			out = append(out, d.GPU.UUID)
		}
	}
	return out
}

// SetFaults publishes node i's devices with faults as their taints from
// now on (none: healthy again), as the plugin does when its health
// monitor sees a fault or its end: the same slices, the devices of the
// faulty GPU tainted. Not safe to call with Reconfigure or for one node
// from two goroutines.
func (f *Fleet) SetFaults(i int, faults []health.Fault) {
	n := f.nodes[i]
	if n.inv == nil {
		return
	}
	n.res = inventory.Resources(n.name, n.inv.WithFaults(faults))
	n.ctrl.Update(&n.res)
}

// Restart stops every node's publisher and starts a new one with the same
// slices, as a rolling restart of the plugin DaemonSet does; the new
// controllers find their slices stored and should write nothing (Writes).
func (f *Fleet) Restart(ctx context.Context) error {
	f.stopPublishers()
	return parallel(len(f.nodes), func(i int) error { return f.nodes[i].startPublisher(ctx, f.client, f.driver) })
}

// Writes is how many slice creates, updates and deletes the nodes'
// current publishers made.
func (f *Fleet) Writes() int64 {
	var total int64
	for _, n := range f.nodes {
		s := n.ctrl.GetStats()
		total += s.NumCreates + s.NumUpdates + s.NumDeletes
	}
	return total
}

// Names are the nodes' names.
func (f *Fleet) Names() []string {
	out := make([]string, len(f.nodes))
	for i, n := range f.nodes {
		out[i] = n.name
	}
	return out
}

// Slices is how many slices the fleet publishes in all.
func (f *Fleet) Slices() int {
	total := 0
	for _, n := range f.nodes {
		total += len(n.pool().Slices)
	}
	return total
}

// Stop stops publishing; the slices stay until their Nodes are deleted
// (DeleteNodes), as when a plugin stops.
// Stopping again does nothing.
func (f *Fleet) Stop() {
	f.stopped.Do(func() {
		f.slices.stop()
		f.stopPublishers()
		for _, n := range f.nodes {
			if n.lib != nil {
				_ = n.lib.Shutdown()
			}
		}
	})
}

// Delete stops the fleet and deletes its Nodes, and with them (the
// garbage collector) their slices: also those of another fleet on the same
// nodes. It waits until no slice of the nodes is left.
func (f *Fleet) Delete(ctx context.Context) error {
	f.Stop()
	for _, n := range f.nodes {
		err := f.client.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting node %s: %w", n.name, err)
		}
	}
	names := sets.New(f.Names()...)
	var left int
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := f.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil // the API answers again in a moment
		}
		left = 0
		for _, s := range list.Items {
			if s.Spec.NodeName != nil && names.Has(*s.Spec.NodeName) {
				left++
			}
		}
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("the slices of %d deleted nodes (%d left): %w", len(names), left, err)
	}
	return nil
}

func (f *Fleet) stopPublishers() {
	var wg sync.WaitGroup
	for _, n := range f.nodes {
		wg.Go(n.ctrl.Stop)
	}
	wg.Wait()
}
