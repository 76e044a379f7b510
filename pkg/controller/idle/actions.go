package idle

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// Event reasons, on the claim and each of its pods.
const (
	// ReasonIdleWarning: the claim is idle past its policy's duration; the
	// note says what happens when.
	ReasonIdleWarning = "IdleWarning"
	// ReasonIdleNotified: the policy's action is Notify (or a Deactivate
	// found no Workload): nothing is stopped.
	ReasonIdleNotified = "IdleNotified"
	// ReasonIdleEvicted: the claim's pod was evicted.
	ReasonIdleEvicted = "IdleEvicted"
	// ReasonIdleEvictionRefused: the Eviction API refused (a
	// PodDisruptionBudget); retried later, never forced.
	ReasonIdleEvictionRefused = "IdleEvictionRefused"
	// ReasonIdleDeactivated: the pod's Kueue Workload was deactivated
	// (spec.active=false).
	ReasonIdleDeactivated = "IdleDeactivated"
	// ReasonIdleActionFailed: the action failed; retried.
	ReasonIdleActionFailed = "IdleActionFailed"
)

// maxOwnerDepth bounds the walk from a pod up to the object Kueue made a
// Workload for (a JobSet's pod: Job, JobSet).
const maxOwnerDepth = 4

// errRefused is an eviction a PodDisruptionBudget refused.
var errRefused = errors.New("eviction refused")

// reservedPods are the pods the claim is reserved for that still exist with
// the UID the reservation names (a pod of the same name made since is
// another pod, not this claim's).
func (r *Reconciler) reservedPods(ctx context.Context, claim *resourceapi.ResourceClaim) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		var pod corev1.Pod
		if err := r.Live.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}, &pod); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading pod %s/%s of claim %s: %w", claim.Namespace, ref.Name, claim.Name, err)
		}
		if pod.UID != ref.UID || pod.DeletionTimestamp != nil {
			continue
		}
		out = append(out, &pod)
	}
	return out, nil
}

// evict evicts each pod through the Eviction API, which honours its
// PodDisruptionBudgets: a refusal (429) is errRefused, to be retried.
func (r *Reconciler) evict(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, why string) error {
	var refused []string
	for _, pod := range pods {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}}
		err := r.Client.SubResource("eviction").Create(ctx, pod, ev)
		switch {
		case apierrors.IsTooManyRequests(err):
			refused = append(refused, fmt.Sprintf("pod %s: %v", pod.Name, err))
			r.event(claim, pod, corev1.EventTypeWarning, ReasonIdleEvictionRefused, "Evict", why+"; eviction refused, retried later: "+err.Error())
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or another pod now
		case err != nil:
			return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		default:
			r.event(claim, pod, corev1.EventTypeWarning, ReasonIdleEvicted, "Evict", why+"; pod evicted")
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%w: %s", errRefused, strings.Join(refused, "; "))
	}
	return nil
}

// deactivate sets spec.active=false on the Kueue Workload of each pod; the
// pods without one are returned, to be notified instead.
func (r *Reconciler) deactivate(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, why string) ([]*corev1.Pod, error) {
	workloads, err := r.workloadsIn(ctx, claim.Namespace)
	if err != nil {
		return nil, err
	}
	var without []*corev1.Pod
	for _, pod := range pods {
		wl, err := r.workloadOf(ctx, pod, workloads)
		if err != nil {
			return nil, err
		}
		if wl == nil {
			without = append(without, pod)
			continue
		}
		if active, found, _ := unstructured.NestedBool(wl.Object, "spec", "active"); found && !active {
			continue // deactivated already (by us for another pod, or by a person)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"active":false}}`))
		if err := r.Client.Patch(ctx, wl, patch); err != nil {
			return nil, fmt.Errorf("deactivating Kueue Workload %s/%s: %w", wl.GetNamespace(), wl.GetName(), err)
		}
		_ = unstructured.SetNestedField(wl.Object, false, "spec", "active")
		r.event(claim, pod, corev1.EventTypeWarning, ReasonIdleDeactivated, "Deactivate",
			fmt.Sprintf("%s; Kueue Workload %s deactivated (spec.active=false): Kueue evicts it and admits it again once a person sets spec.active=true", why, wl.GetName()))
	}
	return without, nil
}

// workloadsIn lists the namespace's Kueue Workloads; none when Kueue is not
// installed.
func (r *Reconciler) workloadsIn(ctx context.Context, namespace string) ([]*unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueue.API.WithKind("WorkloadList"))
	if err := r.Live.List(ctx, list, client.InNamespace(namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing Kueue Workloads in %s: %w", namespace, err)
	}
	out := make([]*unstructured.Unstructured, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

// workloadOf finds the pod's Workload as Kueue makes it: owned by the pod
// itself (plain pods and pod groups), else controlled by the pod's
// controller (a Job) or one above it (a JobSet). Each owner above the pod is
// read back and must have the UID the reference names, so a pod's
// ownerReference alone never picks a Workload; a Workload is matched by
// the owner's UID, never its name.
func (r *Reconciler) workloadOf(ctx context.Context, pod *corev1.Pod, workloads []*unstructured.Unstructured) (*unstructured.Unstructured, error) {
	for _, wl := range workloads {
		for _, ref := range wl.GetOwnerReferences() {
			if ref.UID == pod.UID && ref.Kind == "Pod" {
				return wl, nil
			}
		}
	}
	var obj metav1.Object = pod
	for range maxOwnerDepth {
		ref := metav1.GetControllerOf(obj)
		if ref == nil {
			return nil, nil
		}
		owner, err := r.owner(ctx, pod.Namespace, ref)
		if err != nil || owner == nil {
			return nil, err
		}
		for _, wl := range workloads {
			if c := metav1.GetControllerOf(wl); c != nil && c.UID == owner.GetUID() {
				return wl, nil
			}
		}
		obj = owner
	}
	return nil, nil
}

// owner reads the object ref names (metadata only); nil when it is gone or
// is another object of the same name.
func (r *Reconciler) owner(ctx context.Context, namespace string, ref *metav1.OwnerReference) (metav1.Object, error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind))
	err := r.Live.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, obj)
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s/%s, a controller of a pod: %w", ref.Kind, namespace, ref.Name, err)
	case obj.UID != ref.UID:
		return nil, nil
	}
	return obj, nil
}

// notify records the note on the claim and each pod.
func (r *Reconciler) notify(claim *resourceapi.ResourceClaim, pods []*corev1.Pod, reason, note string) {
	r.event(claim, nil, corev1.EventTypeWarning, reason, "Notify", note)
	for _, pod := range pods {
		r.event(claim, pod, corev1.EventTypeWarning, reason, "Notify", note)
	}
}

// event records note on the pod (related: its claim), or on the claim
// when pod is nil.
func (r *Reconciler) event(claim *resourceapi.ResourceClaim, pod *corev1.Pod, eventType, reason, action, note string) {
	if r.Events == nil {
		return
	}
	if pod == nil {
		r.Events.Eventf(claim, nil, eventType, reason, action, "%s", note)
		return
	}
	r.Events.Eventf(pod, claim, eventType, reason, action, "%s", note)
}

// actionText is what the policy does, for the warning.
func actionText(a gpuaas.IdleAction) string {
	switch a {
	case gpuaas.IdleActionEvict:
		return "its pods are evicted"
	case gpuaas.IdleActionDeactivate:
		return "its Kueue Workload is deactivated"
	default:
		return "it is reported (Notify)"
	}
}
