package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kueuePodSetLabel is set by Kueue on the pods of a workload when it admits
// the workload (the pod template's podset). A pod without it was not
// started by a Kueue admission.
const kueuePodSetLabel = "kueue.x-k8s.io/podset"

// kueueAPI is the Kueue API the controller reads and writes. Kueue is
// optional: its objects are handled as unstructured, and a cluster without
// its kinds is one where nothing is Kueue's.
var kueueAPI = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}

// kueueObject is an empty Kueue object (or list) of a kind.
func kueueObject(kind string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(kueueAPI.WithKind(kind))
	return obj
}

// kueueGate tells whether a claim belongs to a pod of a workload that Kueue
// has admitted. Kueue already decided that such a workload fits its
// ClusterQueue; denying one of its claims would strand an admitted gang
// (its other pods hold their GPUs while this one waits). The claim is
// still charged to its tenant, so that claims which bypass Kueue are
// judged against what Kueue's workloads hold.
//
// The gate reads the pod and the Workloads live, and only for a claim the
// quota would deny: the admission of every other claim costs nothing more.
type kueueGate struct {
	reader client.Reader
}

// admitted returns the admitted workload that owns the claim's pod, or "".
func (g *kueueGate) admitted(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	if g == nil || g.reader == nil {
		return "", nil
	}
	podRef := metav1.GetControllerOf(claim)
	if podRef == nil || podRef.Kind != "Pod" {
		return "", nil
	}
	var pod corev1.Pod
	if err := g.reader.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: podRef.Name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading pod %s of claim %s: %w", podRef.Name, claim.Name, err)
	}
	if pod.UID != podRef.UID || pod.Labels[kueuePodSetLabel] == "" {
		return "", nil
	}
	owner := metav1.GetControllerOf(&pod)
	if owner == nil {
		return "", nil
	}
	return g.admittedWorkloadOf(ctx, pod.Namespace, owner.UID)
}

// admittedWorkloadOf finds the admitted Workload that a job (by UID) owns.
func (g *kueueGate) admittedWorkloadOf(ctx context.Context, namespace string, job types.UID) (string, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueueAPI.WithKind("WorkloadList"))
	if err := g.reader.List(ctx, list, client.InNamespace(namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return "", nil // Kueue is not installed
		}
		return "", fmt.Errorf("listing Kueue workloads in %s: %w", namespace, err)
	}
	for i := range list.Items {
		wl := &list.Items[i]
		if ownedByUID(wl, job) && conditionTrue(wl, "Admitted") {
			return wl.GetName(), nil
		}
	}
	return "", nil
}

func ownedByUID(obj metav1.Object, uid types.UID) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == uid {
			return true
		}
	}
	return false
}

func conditionTrue(obj *unstructured.Unstructured, condType string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == condType && m["status"] == string(metav1.ConditionTrue) {
			return true
		}
	}
	return false
}
