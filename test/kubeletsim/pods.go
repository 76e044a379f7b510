package kubeletsim

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// ReasonFailedPrepare is the reason of the Warning event a failed prepare
// leaves on the pod, the same as the kubelet's.
const ReasonFailedPrepare = "FailedPrepareDynamicResources"

// syncPod brings one pod (by namespace/name) to where the kubelet would:
// started with its claims prepared, or unprepared and removed when it is
// being deleted, or unprepared when it is terminal or gone.
func (s *Simulator) syncPod(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return fmt.Errorf("bad pod key %q: %w", key, err)
	}
	pod, err := s.podLister.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return s.forget(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("getting pod from cache: %w", err)
	}
	if err := s.forgetReplaced(ctx, key, pod.UID); err != nil {
		return err
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return s.finishDeletion(ctx, pod)
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return s.unprepare(ctx, pod.UID)
	case s.isStarted(pod.UID):
		return nil
	default:
		return s.startPod(ctx, pod)
	}
}

// startPod prepares the pod's claims, records the CDI devices on the pod and
// reports it Running. A failed prepare leaves a Warning event, as the
// kubelet does on every failed sync, and is retried with backoff.
func (s *Simulator) startPod(ctx context.Context, pod *v1.Pod) error {
	logger := klog.FromContext(ctx)
	if waiting := awaitedExtendedResources(pod, s.cfg.Capacity); len(waiting) > 0 {
		// No retry needed: the scheduler sets the claim in the pod status,
		// and that update syncs the pod again.
		logger.V(2).Info("Pod waits for its extended-resource claim", "resources", waiting)
		return nil
	}
	s.track(pod)
	cdi, err := s.prepare(ctx, pod)
	if err != nil {
		s.recorder.Eventf(pod, v1.EventTypeWarning, ReasonFailedPrepare, "Failed to prepare dynamic resources: %v", err)
		return err
	}
	if len(cdi.claims) > 0 {
		logger.Info("Prepared resource claims", "cdiDevices", cdi.claims, "containerCDIDevices", cdi.containers)
		if pod, err = s.annotateCDI(ctx, pod, cdi); err != nil {
			return err
		}
	}
	pod = pod.DeepCopy()
	pod.Status = runningStatus(pod, metav1.Now())
	if _, err := s.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting pod running: %w", err)
	}
	s.mu.Lock()
	s.started[pod.UID] = true
	s.mu.Unlock()
	logger.V(2).Info("Pod running")
	return nil
}

// annotateCDI stores the CDI device IDs per claim name and per container on
// the pod.
func (s *Simulator) annotateCDI(ctx context.Context, pod *v1.Pod, cdi podCDI) (*v1.Pod, error) {
	byClaim, err := json.Marshal(cdi.claims)
	if err != nil {
		return nil, fmt.Errorf("encoding CDI devices per claim: %w", err)
	}
	byContainer, err := json.Marshal(cdi.containers)
	if err != nil {
		return nil, fmt.Errorf("encoding CDI devices per container: %w", err)
	}
	annotations := map[string]string{CDIDevicesAnnotation: string(byClaim), CDIContainerDevicesAnnotation: string(byContainer)}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return nil, fmt.Errorf("encoding annotation patch: %w", err)
	}
	updated, err := s.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("annotating pod with CDI devices: %w", err)
	}
	return updated, nil
}

// finishDeletion unprepares the pod's claims, then removes the pod with
// grace period 0: the kubelet's last step of a graceful delete.
func (s *Simulator) finishDeletion(ctx context.Context, pod *v1.Pod) error {
	if err := s.unprepare(ctx, pod.UID); err != nil {
		return err
	}
	err := s.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To(int64(0)),
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing deleted pod: %w", err)
	}
	s.untrack(cache.MetaObjectToName(pod).String(), pod.UID)
	klog.FromContext(ctx).V(2).Info("Pod deleted")
	return nil
}

// forget unprepares what the pod that had this key used, once it is gone
// from the API (force-deleted, or removed by finishDeletion).
func (s *Simulator) forget(ctx context.Context, key string) error {
	s.mu.Lock()
	uid, ok := s.pods[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := s.unprepare(ctx, uid); err != nil {
		return err
	}
	s.untrack(key, uid)
	return nil
}

// forgetReplaced handles a pod deleted and re-created under the same name
// between two syncs: the old one's claims are unprepared first.
func (s *Simulator) forgetReplaced(ctx context.Context, key string, uid types.UID) error {
	s.mu.Lock()
	old, ok := s.pods[key]
	s.mu.Unlock()
	if !ok || old == uid {
		return nil
	}
	if err := s.unprepare(ctx, old); err != nil {
		return err
	}
	s.untrack(key, old)
	return nil
}

func (s *Simulator) track(pod *v1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[cache.MetaObjectToName(pod).String()] = pod.UID
}

func (s *Simulator) untrack(key string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pods[key] == uid {
		delete(s.pods, key)
	}
	delete(s.started, uid)
}

func (s *Simulator) isStarted(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started[uid]
}
