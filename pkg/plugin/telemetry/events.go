package telemetry

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

// Reasons of the Node events the plugin records: conditions an operator
// must act on, shown by `kubectl describe node` next to the kubelet's.
const (
	// ReasonDynamicMIGWithdrawn: the cluster drops the counters of
	// partitionable devices, so the node stopped offering dynamic MIG.
	ReasonDynamicMIGWithdrawn = "DynamicMIGWithdrawn"
	// ReasonUnownedMIGDevices: MIG devices that no claim owns occupy
	// placements, which the node does not offer until they are removed.
	ReasonUnownedMIGDevices = "UnownedMIGDevices"
	// ReasonClusterFeatureMissing: the API server drops or refuses a field
	// of the slices the plugin would publish, so it publishes less.
	ReasonClusterFeatureMissing = "ClusterFeatureMissing"
	// ReasonModeChangeDeferred: the node configuration changes the mode of
	// a GPU that claims hold; it keeps its mode until they are gone.
	ReasonModeChangeDeferred = "ModeChangeDeferred"
	// ReasonModeChangeApplied (Normal): such a GPU's last claim is gone,
	// and its configured mode applies.
	ReasonModeChangeApplied = "ModeChangeApplied"
)

// NodeEvents records warnings on the plugin's Node; a nil recorder records
// nothing (the reason is logged and counted in metrics either way).
type NodeEvents struct {
	recorder events.EventRecorder
	node     *v1.ObjectReference
}

// NewNodeEvents refers to the Node by name and, where it can be read, UID
// (kubectl describe node matches events by both).
func NewNodeEvents(ctx context.Context, recorder events.EventRecorder, client kubernetes.Interface, nodeName string) NodeEvents {
	ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName}
	if recorder == nil {
		return NodeEvents{}
	}
	if client != nil {
		node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Reading the node for its events; recording them by name only")
		} else {
			ref.UID = node.UID
		}
	}
	return NodeEvents{recorder: recorder, node: ref}
}

func (e NodeEvents) Warn(reason, action, note string, args ...any) {
	if e.recorder == nil {
		return
	}
	e.recorder.Eventf(e.node, nil, v1.EventTypeWarning, reason, action, note, args...)
}

// WarnOn records a warning on another object the node's plugin acts for (a
// claim), related to the Node.
func (e NodeEvents) WarnOn(regarding runtime.Object, reason, action, note string, args ...any) {
	if e.recorder == nil {
		return
	}
	e.recorder.Eventf(regarding, e.node, v1.EventTypeWarning, reason, action, note, args...)
}

// Normal records an informational event on the Node.
func (e NodeEvents) Normal(reason, action, note string, args ...any) {
	if e.recorder == nil {
		return
	}
	e.recorder.Eventf(e.node, nil, v1.EventTypeNormal, reason, action, note, args...)
}
