// Package kubeletsim simulates the kubelet of one node, for tests and the
// demo: it registers and heartbeats the Node, discovers DRA plugins through
// the plugin registration directory, and for the pods bound to the node
// calls NodePrepareResources / NodeUnprepareResources over the plugins' gRPC
// API the way the kubelet does. No container runs: a pod whose claims are
// prepared is reported Running, and a pod being deleted is removed once its
// claims are unprepared.
package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// DefaultRegistryDir is where the kubelet looks for plugin registration
// sockets.
const DefaultRegistryDir = "/var/lib/kubelet/plugins_registry"

// CDIDevicesAnnotation is set on a pod before it is reported Running: a JSON
// object mapping each of the pod's ResourceClaim names (its extended-resource
// claim included) to the CDI device IDs the drivers returned for it.
const CDIDevicesAnnotation = "kubeletsim.gpuaas.io/cdi-devices"

// CDIContainerDevicesAnnotation is set with CDIDevicesAnnotation: a JSON
// object mapping each container that gets devices to their CDI device IDs,
// what a container runtime would inject. As in the kubelet, a container
// gets those of the claims (or claim requests) it names in resources.claims
// and those of the extended-resource claim's requests that
// status.extendedResourceClaimStatus maps to it.
const CDIContainerDevicesAnnotation = "kubeletsim.gpuaas.io/container-cdi-devices"

// Config describes the simulated node.
type Config struct {
	Client   kubernetes.Interface
	NodeName string
	// RegistryDir is watched for plugin registration sockets.
	// Default: DefaultRegistryDir.
	RegistryDir string
	// Labels are added to the Node (kubernetes.io/hostname is always set).
	Labels map[string]string
	// Capacity of the Node; default 64 CPUs, 512Gi memory, 110 pods.
	Capacity v1.ResourceList
	// HeartbeatInterval of Lease and Ready condition; default 10 s.
	HeartbeatInterval time.Duration
	// Workers processing pods concurrently; default 2.
	Workers int
	// RetryBase and RetryMax bound the per-pod retry backoff after a
	// failed prepare or unprepare; default 200 ms and 10 s.
	RetryBase, RetryMax time.Duration
}

// Simulator is the simulated kubelet of one node.
type Simulator struct {
	cfg        Config
	plugins    *registry
	claims     *claimCache
	queue      workqueue.TypedRateLimitingInterface[string]
	podLister  corelisters.PodLister
	recorder   record.EventRecorder
	readySince metav1.Time
	nodeUID    types.UID

	mu      sync.Mutex
	pods    map[string]types.UID // namespace/name -> UID of the pod we track
	started map[types.UID]bool   // pods reported Running
	synced  chan struct{}        // closed once the node exists and pods are listed
}

// New checks the configuration and fills in defaults; Run starts the work.
func New(cfg Config) (*Simulator, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, errors.New("kubeletsim: Client and NodeName are required")
	}
	setDefaults(&cfg)
	return &Simulator{
		cfg:     cfg,
		plugins: newRegistry(cfg.RegistryDir),
		claims:  newClaimCache(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubeletsim-" + cfg.NodeName}),
		pods:    map[string]types.UID{},
		started: map[types.UID]bool{},
		synced:  make(chan struct{}),
	}, nil
}

func setDefaults(cfg *Config) {
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = DefaultRegistryDir
	}
	if cfg.Capacity == nil {
		cfg.Capacity = defaultCapacity()
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 200 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 10 * time.Second
	}
}

// Run registers the node and simulates its kubelet until ctx ends. It
// returns an error only when it cannot start. Call it once per Simulator.
func (s *Simulator) Run(ctx context.Context) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", s.cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if err := s.registerNode(ctx); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.cfg.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	s.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: s.cfg.NodeName})

	// Cancel before waiting, so an early error return also ends the
	// goroutines started so far.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { s.heartbeat(ctx) })
	wg.Go(func() {
		if err := s.plugins.run(ctx); err != nil {
			logger.Error(err, "Plugin watcher stopped")
		}
	})
	if err := s.watchPods(ctx); err != nil {
		return err
	}
	close(s.synced)
	defer s.queue.ShutDown()
	for range s.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, s.work, time.Second) })
	}
	<-ctx.Done()
	return nil
}

// watchPods starts an informer on the pods bound to this node and waits for
// its first list.
func (s *Simulator) watchPods(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + s.cfg.NodeName
		}))
	informer := factory.Core().V1().Pods()
	_, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.enqueue,
		UpdateFunc: func(_, obj any) { s.enqueue(obj) },
		DeleteFunc: s.enqueue,
	})
	if err != nil {
		return fmt.Errorf("adding pod event handler: %w", err)
	}
	s.podLister = informer.Lister()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return errors.New("pod informer did not sync")
	}
	return nil
}

func (s *Simulator) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		s.queue.Add(key)
	}
}

func (s *Simulator) work(ctx context.Context) {
	for s.processNext(ctx) {
	}
}

func (s *Simulator) processNext(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", key)
	if err := s.syncPod(klog.NewContext(ctx, logger), key); err != nil {
		logger.Error(err, "Syncing pod failed, will retry")
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

// Synced is closed once the node is registered and the pods bound to it are
// listed.
func (s *Simulator) Synced() <-chan struct{} { return s.synced }

// FailedRegistrations returns the error of every registration handshake
// that failed so far (GetInfo refused or timed out, the endpoint not
// reachable, ...), each of which the kubelet retries only after a backoff
// (500 ms, then the next pass of its one-second reconcile loop).
func (s *Simulator) FailedRegistrations() []error {
	return s.plugins.failedRegistrations()
}

// PluginRegisteredSince returns when the newest registration of a DRA
// driver's plugin happened, and false while none is registered. A test that
// restarts a plugin waits for a time after the restart.
func (s *Simulator) PluginRegisteredSince(driver string) (time.Time, bool) {
	return s.plugins.registeredSince(driver)
}
