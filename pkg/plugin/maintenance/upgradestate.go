package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// The GPU Operator's upgrade controller walks a node through the states it
// writes in the node's label nvidia.com/gpu-driver-upgrade-state. At
// pod-restart-required it has emptied the node of GPU workloads and
// deletes the driver pod; the next driver pod unloads the kernel module
// before it loads the new one, and the plugin's NVML session (and health
// event set) would make that unload fail and the upgrade stall. So while
// the label says pod-restart-required the plugin releases the GPUs as
// --release-gpus does, and once the label moves on (validation-required
// and after, upgrade-failed, or removed) it reacquires them, waiting for
// the driver as at start; a new driver version takes a new process, as
// the driver watch does. GPUs an operator released by hand stay released
// until the operator's --reacquire-gpus.

// UpgradeStateLabel is the GPU Operator's driver-upgrade state of a node.
const UpgradeStateLabel = "nvidia.com/gpu-driver-upgrade-state"

// UpgradeStateDriverRestart is the state in which the driver pod is
// restarted and its kernel module unloaded.
const UpgradeStateDriverRestart = "pod-restart-required"

// WatchUpgradeState watches the node's upgrade-state label and returns a
// reader of its current value ("" when the label is absent or the node
// not yet seen). The watch selects the one node by name and stops with
// ctx.
func WatchUpgradeState(ctx context.Context, client kubernetes.Interface, nodeName string) func() string {
	var state atomic.Value
	state.Store("")
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	record := func(obj any) {
		if node, ok := obj.(*v1.Node); ok {
			state.Store(node.Labels[UpgradeStateLabel])
		}
	}
	_, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: func(any) { state.Store("") },
	})
	if err != nil {
		// Only a stopped informer refuses a handler; this one is new.
		klog.FromContext(ctx).Error(err, "Watching the node's driver-upgrade state")
	}
	factory.Start(ctx.Done())
	return func() string { return state.Load().(string) }
}

// followUpgradeState releases the GPUs while the node's upgrade state is
// pod-restart-required and reacquires those it released once the state
// moved on. It reports whether the GPUs are held released for the upgrade,
// in which case the driver watch must not take them back.
func (m *Maintenance) followUpgradeState(ctx context.Context) bool {
	if m.opts.UpgradeState == nil {
		return false
	}
	state := m.opts.UpgradeState()
	m.mu.Lock()
	released, forUpgrade := m.released, m.forUpgrade
	m.mu.Unlock()
	logger := klog.FromContext(ctx)
	switch {
	case state == UpgradeStateDriverRestart && !released:
		if err := m.Release(ctx, fmt.Sprintf("the GPU Operator restarts the driver (%s=%s)", UpgradeStateLabel, state)); err != nil {
			logger.Error(err, "Releasing the GPUs for the GPU Operator's driver upgrade")
			return false
		}
		m.mu.Lock()
		m.forUpgrade = true
		m.mu.Unlock()
		m.writeStatus(ctx, m.stateName(), "", nil)
		return true
	case state == UpgradeStateDriverRestart:
		return forUpgrade
	case released && forUpgrade:
		why := fmt.Sprintf("the GPU Operator's driver upgrade moved on (%s=%q)", UpgradeStateLabel, state)
		err := m.Reacquire(ctx, why, m.waitingForDriver(ctx))
		if errors.Is(err, nvdev.ErrNewProcessNeeded) && m.opts.Restart != nil {
			m.writeStatus(ctx, StateRestarting, "", nil)
			return true
		}
		if err != nil {
			logger.Error(err, "Reacquiring the GPUs after the GPU Operator's driver upgrade; trying again")
		}
		m.writeStatus(ctx, m.stateName(), "", nil)
		return err != nil
	}
	return false
}
