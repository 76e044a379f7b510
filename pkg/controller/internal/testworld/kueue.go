package testworld

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// Kueue fixtures: an admitted Job "trainer-job" in namespace a, its pod and
// its Workload, and the claims the kube-controller-manager makes for pods.

// The users claims are created as: the kube-controller-manager's
// resource-claim controller, and a tenant's own ServiceAccount.
const (
	KCMUser    = "system:serviceaccount:kube-system:resource-claim-controller"
	TenantUser = "system:serviceaccount:a:attacker"
)

// ControllerRef is a controller ownerReference.
func ControllerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}
}

// JobRef names the admitted Job "trainer-job" (uid job-uid).
func JobRef() metav1.OwnerReference {
	return ControllerRef("batch/v1", "Job", "trainer-job", "job-uid")
}

// GPUPod is a pod of namespace a asking for claim "gpu" from a template,
// controlled by owner (if any); Kueue's podset label marks the pods a
// Kueue admission started.
func GPUPod(name string, uid types.UID, owner *metav1.OwnerReference, podset bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, UID: uid, Labels: map[string]string{}},
		Spec:       corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}},
	}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	if podset {
		p.Labels["kueue.x-k8s.io/podset"] = "main" // Kueue's, set when it admits the pod's workload
	}
	return p
}

// KueuePod is the pod "trainer" (uid pod-uid) of the Job.
func KueuePod(podset bool) *corev1.Pod {
	return GPUPod("trainer", "pod-uid", ptr.To(JobRef()), podset)
}

// KueueWorkload is a Workload of namespace a owned by owners, charged
// milli GPU milli-units, with the conditions named true (Admitted, ...).
func KueueWorkload(name string, owners []types.UID, milli int64, conditions ...string) *unstructured.Unstructured {
	conds := []any{}
	for _, c := range conditions {
		conds = append(conds, map[string]any{"type": c, "status": "True"})
	}
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"namespace": "a", "name": name, "uid": "wl-" + name},
		"status":   map[string]any{"conditions": conds},
	}}
	if milli > 0 {
		wl.Object["status"].(map[string]any)["admission"] = map[string]any{
			"clusterQueue": "team-a",
			"podSetAssignments": []any{map[string]any{
				"name": "main", "flavors": map[string]any{kueue.DefaultResource: kueue.Flavor},
				"resourceUsage": map[string]any{kueue.DefaultResource: strconv.FormatInt(milli, 10)},
			}},
		}
	}
	refs := make([]metav1.OwnerReference, 0, len(owners))
	for _, uid := range owners {
		refs = append(refs, metav1.OwnerReference{APIVersion: "v1", Kind: "Owner", Name: string(uid), UID: uid})
	}
	wl.SetOwnerReferences(refs)
	return wl
}

// Workload is the admitted Workload of the Job, charged one GPU.
func Workload() *unstructured.Unstructured {
	return KueueWorkload("job-trainer-job", []types.UID{"job-uid"}, 1000, "Admitted")
}

// KCMClaim is the claim the kube-controller-manager makes from the pod's
// template claim "gpu".
func KCMClaim(pod *corev1.Pod, name, class string, count int64) *resourceapi.ResourceClaim {
	c := Claim("a", name, class, count)
	c.OwnerReferences = []metav1.OwnerReference{ControllerRef("v1", "Pod", pod.Name, pod.UID)}
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	return c
}
