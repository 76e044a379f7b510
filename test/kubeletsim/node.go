package kubeletsim

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// leaseDuration is what the kubelet puts in its node Lease.
const leaseDuration = 40 * time.Second

// defaultCapacity is roomy enough that CPU, memory and pod count never keep a
// test pod off the node: only DRA devices decide.
func defaultCapacity() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("512Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
}

// nodeObject is the Node as the simulator registers it. It is created with
// Ready=True: the node-lifecycle controller then removes the not-ready taint
// that admission puts on every new Node.
func (s *Simulator) nodeObject(now metav1.Time) *v1.Node {
	labels := map[string]string{v1.LabelHostname: s.cfg.NodeName, v1.LabelOSStable: "linux"}
	for k, v := range s.cfg.Labels {
		labels[k] = v
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName, Labels: labels},
		Status: v1.NodeStatus{
			Capacity:    s.cfg.Capacity,
			Allocatable: s.cfg.Capacity,
			Conditions:  []v1.NodeCondition{s.readyCondition(now)},
			Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: v1.NodeHostName, Address: s.cfg.NodeName},
			},
			NodeInfo: v1.NodeSystemInfo{KubeletVersion: "v1.37.2-sim", OperatingSystem: "linux", Architecture: "amd64"},
		},
	}
}

func (s *Simulator) readyCondition(now metav1.Time) v1.NodeCondition {
	return v1.NodeCondition{
		Type:               v1.NodeReady,
		Status:             v1.ConditionTrue,
		Reason:             "KubeletReady",
		Message:            "kubelet simulator is posting ready status",
		LastHeartbeatTime:  now,
		LastTransitionTime: s.readySince,
	}
}

// registerNode creates the Node, or takes over an existing one (a restarted
// simulator) by updating its labels and status.
func (s *Simulator) registerNode(ctx context.Context) error {
	now := metav1.Now()
	s.readySince = now
	want := s.nodeObject(now)
	nodes := s.cfg.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		s.nodeUID = created.UID
		klog.FromContext(ctx).Info("Registered node", "node", s.cfg.NodeName)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating node %s: %w", s.cfg.NodeName, err)
	}
	node, err := nodes.Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting node %s: %w", s.cfg.NodeName, err)
	}
	for k, v := range want.Labels {
		metav1.SetMetaDataLabel(&node.ObjectMeta, k, v)
	}
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating node %s: %w", s.cfg.NodeName, err)
	}
	node.Status = want.Status
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating status of node %s: %w", s.cfg.NodeName, err)
	}
	s.nodeUID = node.UID
	klog.FromContext(ctx).Info("Took over existing node", "node", s.cfg.NodeName)
	return nil
}

// heartbeat renews the node Lease and the Ready condition every interval,
// as the kubelet does; without them the node-lifecycle controller marks the
// node Unknown and taints it unreachable after about 50 s.
func (s *Simulator) heartbeat(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(s.cfg.HeartbeatInterval)
	defer ticker.Stop()
	for {
		if err := s.renewLease(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Renewing node lease")
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if err := s.postReady(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Posting node status")
		}
	}
}

func (s *Simulator) renewLease(ctx context.Context) error {
	leases := s.cfg.Client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, s.newLease(now), metav1.CreateOptions{})
		return wrap(err, "creating node lease")
	}
	if err != nil {
		return fmt.Errorf("getting node lease: %w", err)
	}
	lease.Spec.RenewTime = &now
	lease.Spec.HolderIdentity = ptr.To(s.cfg.NodeName)
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return wrap(err, "updating node lease")
}

// newLease is owned by the Node, so deleting the Node removes it.
func (s *Simulator) newLease(now metav1.MicroTime) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.cfg.NodeName,
			Namespace: v1.NamespaceNodeLease,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: s.cfg.NodeName, UID: s.nodeUID,
			}},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(s.cfg.NodeName),
			LeaseDurationSeconds: ptr.To(int32(leaseDuration.Seconds())),
			RenewTime:            &now,
		},
	}
}

// postReady refreshes the Ready condition with a strategic merge patch
// (conditions merge by type), leaving the rest of the status alone.
func (s *Simulator) postReady(ctx context.Context) error {
	patch, err := json.Marshal(map[string]any{
		"status": map[string]any{"conditions": []v1.NodeCondition{s.readyCondition(metav1.Now())}},
	})
	if err != nil {
		return fmt.Errorf("encoding node status patch: %w", err)
	}
	_, err = s.cfg.Client.CoreV1().Nodes().Patch(ctx, s.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return wrap(err, "patching node status")
}

func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
