package admission

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// Kueue's conventions (v0.19).
const (
	// kueuePodSetLabel is set by Kueue on the pods of a workload when it
	// admits the workload (the pod template's podset). A pod without it
	// was not started by a Kueue admission.
	kueuePodSetLabel = "kueue.x-k8s.io/podset"
	// kueuePrebuiltWorkload names, as a label or an annotation, which of
	// several Workloads of one owner a pod belongs to (a LeaderWorkerSet
	// has one per group).
	kueuePrebuiltWorkload = "kueue.x-k8s.io/prebuilt-workload-name"
)

// maxOwnerDepth bounds the walk from a pod to the object Kueue made its
// Workload for: a LeaderWorkerSet's worker is four controllers below it
// (worker StatefulSet, leader pod, leader StatefulSet, LeaderWorkerSet).
const maxOwnerDepth = 8

// KueueGate tells whether a claim the quota denied belongs to a pod of a
// workload that Kueue has admitted, and lets it through within what Kueue
// charged that workload. Kueue already decided that such a workload fits
// its ClusterQueue; denying one of its claims would strand an admitted gang
// (its other pods hold their GPUs while this one waits). The claim is still
// charged to its tenant, so that claims which bypass Kueue are judged
// against what Kueue's workloads hold.
//
// Nothing a tenant can write is taken on its word: its labels, its
// ownerReferences and its hand-made claims all say what the tenant wants.
// What counts is what the API server vouches for: the user who created the
// claim (the kube-controller-manager, making a pod's claim from its
// template), the objects that ownerReferences name (read back, UID and
// all), and the Workloads, which only Kueue writes. A tenant can still
// point a pod of its own at an admitted Job, so the overrule is capped at
// what Kueue charged the workload, counting every claim of a pod that
// leads to it (see kueuecap.go).
//
// The gate reads pods, owners and Workloads live, and only for a claim the
// quota would deny: the admission of every other claim costs nothing more.
type KueueGate struct {
	// live reads pods, their owners and Workloads from the API server.
	live client.Reader
	// creators are the users whose claims can be overruled
	// (Options.KueueClaimCreators).
	creators sets.Set[string]
	// acct prices claims in Kueue's terms and lists a namespace's claims.
	acct *Accountant
	// book keeps the claims overruled per workload, across replicas.
	book *overruleBook
}

// NewKueueGate is the gate for the claims the quota denies: live reads
// pods, their owners and Workloads from the API server, creators are the
// users whose claims it may overrule (Options.KueueClaimCreators), and the
// claims overruled per workload are kept in ConfigMaps of c in namespace.
func NewKueueGate(live client.Reader, c client.Client, namespace string, creators []string, acct *Accountant) *KueueGate {
	return &KueueGate{live: live, creators: sets.New(creators...), acct: acct,
		book: &overruleBook{client: c, namespace: namespace}}
}

// Overrule admits a claim the quota denied (adm) when the
// kube-controller-manager made it, as user, for a pod of a workload Kueue
// admitted, within what Kueue charged the workload; it is charged like any
// other. Refusals for the tenancy itself (no TenantQuota with
// DenyUnassigned, an invalid one) and of claims that cannot be priced yet
// are never overruled, and a nil gate (no Kueue integration) overrules
// nothing: adm is returned as it is.
func (g *KueueGate) Overrule(ctx context.Context, claim *resourceapi.ResourceClaim, adm Admission, user string, dryRun bool) (Admission, error) {
	if g == nil || adm.Allowed || !overrulable(adm.Resource) {
		return adm, nil
	}
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim))
	v, err := g.overrule(ctx, claim, user, dryRun)
	if err != nil {
		// Deny rather than fail: the claim is retried, and a workload
		// that is not Kueue's must not wait for Kueue's API.
		logger.Error(err, "Checking for a Kueue workload")
		return adm, nil
	}
	if v.overrule == nil {
		logger.V(4).Info("Not overruled for Kueue", "workload", v.workload, "why", v.why)
		if v.workload != "" { // a Kueue workload's pod: tell why it waits
			adm.Reason += "; not admitted for Kueue: " + v.why
		}
		return adm, nil
	}
	overruled, err := g.acct.admitOverruled(ctx, claim, dryRun, *v.overrule)
	if err != nil {
		return adm, err
	}
	if overruled.OverruledBy != "" { // else it fits now, and was simply admitted
		logger.V(2).Info("Claim over quota admitted for Kueue", "tenant", adm.Tenant, "workload", v.workload, "reason", overruled.Reason)
	}
	return overruled, nil
}

// kueueWorkload is what the gate needs of a Workload.
type kueueWorkload struct {
	name   string
	uid    types.UID
	owners sets.Set[types.UID]
	// active: admitted, neither finished nor evicted nor being deleted.
	active bool
	// charge is what Kueue charged it, per resource, all pod sets
	// together (status.admission.podSetAssignments[].resourceUsage).
	charge map[string]int64
}

// workloadsIn lists the namespace's Workloads; none when Kueue is not
// installed.
func (g *KueueGate) workloadsIn(ctx context.Context, namespace string) ([]kueueWorkload, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueue.API.WithKind("WorkloadList"))
	if err := g.live.List(ctx, list, client.InNamespace(namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing Kueue workloads in %s: %w", namespace, err)
	}
	out := make([]kueueWorkload, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, parseWorkload(&list.Items[i]))
	}
	return out, nil
}

func parseWorkload(wl *unstructured.Unstructured) kueueWorkload {
	w := kueueWorkload{name: wl.GetName(), uid: wl.GetUID(), owners: sets.New[types.UID](), charge: map[string]int64{}}
	for _, ref := range wl.GetOwnerReferences() {
		w.owners.Insert(ref.UID)
	}
	assignments, found, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	w.active = found && wl.GetDeletionTimestamp() == nil && conditionTrue(wl, "Admitted") &&
		!conditionTrue(wl, "Finished") && !conditionTrue(wl, "Evicted")
	for _, a := range assignments {
		m, _ := a.(map[string]any)
		usage, _, _ := unstructured.NestedMap(m, "resourceUsage")
		for name, v := range usage {
			s, _ := v.(string)
			if q, err := resource.ParseQuantity(s); err == nil {
				w.charge[name] += q.Value()
			}
		}
	}
	return w
}

// claimPod is the pod the kube-controller-manager made the claim for, or
// nil and why the claim is not one it made.
func (g *KueueGate) claimPod(ctx context.Context, claim *resourceapi.ResourceClaim, user string) (*corev1.Pod, string, error) {
	if !g.creators.Has(user) {
		return nil, fmt.Sprintf("it was created by %q, not by the kube-controller-manager from a pod's template", user), nil
	}
	podClaim := claim.Annotations[resourceapi.PodResourceClaimAnnotation]
	ref := metav1.GetControllerOf(claim)
	if podClaim == "" || ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" {
		return nil, "it was not made for a pod", nil
	}
	var pod corev1.Pod
	if err := g.live.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("its pod %s is gone", ref.Name), nil
		}
		return nil, "", fmt.Errorf("reading pod %s of claim %s: %w", ref.Name, claim.Name, err)
	}
	if pod.UID != ref.UID || !podNamesClaim(&pod, podClaim, claim.Name) {
		return nil, fmt.Sprintf("pod %s does not ask for it", pod.Name), nil
	}
	if pod.Labels[kueuePodSetLabel] == "" {
		return nil, fmt.Sprintf("pod %s was not started by a Kueue admission", pod.Name), nil
	}
	return &pod, "", nil
}

// podNamesClaim tells whether the pod asks for a claim from a template
// under podClaim, and has not been given another claim for it already.
func podNamesClaim(pod *corev1.Pod, podClaim, claimName string) bool {
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == podClaim && st.ResourceClaimName != nil && *st.ResourceClaimName != claimName {
			return false
		}
	}
	for _, c := range pod.Spec.ResourceClaims {
		if c.Name == podClaim {
			return c.ResourceClaimTemplateName != nil
		}
	}
	return false
}

// workloadOf finds the active Workload of the pod's nearest owner (the pod
// itself included: plain pods and pod groups) that a Workload names, walking
// controller ownerReferences upward. An owner that a Workload names is not
// read: Kueue vouches for it. Others are read back, so the walk only follows
// objects that exist with the UID named. Returns nil and why when none.
func (g *KueueGate) workloadOf(ctx context.Context, pod *corev1.Pod, workloads []kueueWorkload, w *ownerWalk) (*kueueWorkload, string, error) {
	if wl, why := activeOwnedBy(workloads, pod.UID, pod); wl != nil || why != "" {
		return wl, why, nil
	}
	var obj metav1.Object = pod
	for range maxOwnerDepth {
		ref := metav1.GetControllerOf(obj)
		if ref == nil {
			return nil, fmt.Sprintf("no Kueue workload owns pod %s or its controllers", pod.Name), nil
		}
		if wl, why := activeOwnedBy(workloads, ref.UID, pod); wl != nil || why != "" {
			return wl, why, nil
		}
		parent, err := w.owner(ctx, pod.Namespace, ref)
		if err != nil || parent == nil {
			return nil, fmt.Sprintf("%s %s, a controller of pod %s, is gone", ref.Kind, ref.Name, pod.Name), err
		}
		obj = parent
	}
	return nil, fmt.Sprintf("pod %s has more than %d controllers above it", pod.Name, maxOwnerDepth), nil
}

// activeOwnedBy is the active Workload among those owned by uid; when there are
// several (a LeaderWorkerSet's groups), the one the pod names. why says
// why none is, when some Workload names uid.
func activeOwnedBy(workloads []kueueWorkload, uid types.UID, pod *corev1.Pod) (*kueueWorkload, string) {
	var owned, active []*kueueWorkload
	for i := range workloads {
		if workloads[i].owners.Has(uid) {
			owned = append(owned, &workloads[i])
			if workloads[i].active {
				active = append(active, &workloads[i])
			}
		}
	}
	switch {
	case len(owned) == 0:
		return nil, ""
	case len(active) == 0:
		return nil, fmt.Sprintf("Kueue workload %s is not admitted, or finished, or evicted", owned[0].name)
	case len(active) == 1:
		return active[0], ""
	}
	named := pod.Labels[kueuePrebuiltWorkload]
	if named == "" {
		named = pod.Annotations[kueuePrebuiltWorkload]
	}
	for _, wl := range active {
		if wl.name == named {
			return wl, ""
		}
	}
	return nil, fmt.Sprintf("%d admitted Kueue workloads share an owner of pod %s, and it names none of them", len(active), pod.Name)
}

// ownerWalk reads pods and their owners for one decision, each once.
type ownerWalk struct {
	live    client.Reader
	pods    map[string]*corev1.Pod
	parents map[types.UID]metav1.Object
}

func newOwnerWalk(live client.Reader) *ownerWalk {
	return &ownerWalk{live: live, pods: map[string]*corev1.Pod{}, parents: map[types.UID]metav1.Object{}}
}

// pod reads a pod of the namespace; nil when it is gone.
func (w *ownerWalk) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if p, ok := w.pods[name]; ok {
		return p, nil
	}
	pod := &corev1.Pod{}
	if err := w.live.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
		}
		pod = nil
	}
	w.pods[name] = pod
	return pod, nil
}

// owner reads the object ref names (its metadata only); nil when it is gone
// or is another object of the same name.
func (w *ownerWalk) owner(ctx context.Context, namespace string, ref *metav1.OwnerReference) (metav1.Object, error) {
	if obj, ok := w.parents[ref.UID]; ok {
		return obj, nil
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind))
	var out metav1.Object = obj
	err := w.live.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, obj)
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		out = nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s/%s, a controller of a pod: %w", ref.Kind, namespace, ref.Name, err)
	case obj.UID != ref.UID:
		out = nil
	}
	w.parents[ref.UID] = out
	return out, nil
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
