// Package hardwareprofiles publishes the catalog in the OpenShift AI / Open
// Data Hub dashboard as HardwareProfiles (infrastructure.opendatahub.io/v1),
// rendered by pkg/hardwareprofile:
//
//   - each GpuProfile, enabled or not, in one configured namespace
//     (--hardware-profile-namespace), scheduled as its settings say, and,
//     with --hardware-profiles-per-tenant, in every tenant's namespaces
//     (TenantQuota status.namespaces), scheduled as the tenant is: Queue
//     with a LocalQueue of the tenant's Kueue ClusterQueue where the tenant
//     is Kueue-managed (spec.kueue), Node otherwise;
//   - each GpuShape in each of its tenants' namespaces that holds its
//     ResourceClaimTemplate (the shape's status.namespaces), naming that
//     template in spec.dra.resourceClaimTemplateName, scheduled as the
//     tenant is.
//
// Every HardwareProfile is owned by its GpuProfile or GpuShape, so the
// garbage collector removes it with its owner; one in a namespace it is no
// longer meant for (a tenant gone, a LocalQueue gone) is deleted. A
// shape's is named hardwareprofile.ShapeName, apart from a profile's of
// the same name. Each carries its owner's UID (hardwareprofile.OwnerLabel),
// so a pass lists its owner's own, not every owner's in the cluster. Where it
// was published is written to the owner's status.hardwareProfileNamespaces
// and its HardwareProfilesPublished condition.
//
// The HardwareProfile CRD is the opendatahub-operator's and may be absent,
// or installed after the controller starts: the reconciler asks the REST
// mapper on every pass (each owner's resync) and writes nothing while the
// kind is not served, and it reads and writes HardwareProfiles (and reads
// Kueue's LocalQueues) through an uncached client, so no informer waits on
// a kind that may never come. Without an informer a hand edit, and a
// LocalQueue made or removed, are taken in on the owner's next resync (a
// namespace's LocalQueues, once listed, serve every owner's pass for
// queuesFresh).
package hardwareprofiles

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// Reconciler keeps the HardwareProfiles of GpuProfiles (Profiles) and
// GpuShapes (Shapes) in the namespaces they are meant for.
type Reconciler struct {
	// Client reads GpuProfiles, GpuShapes and TenantQuotas (the manager's
	// cache) and writes their status.
	Client client.Client
	// Direct reads and writes HardwareProfiles and reads LocalQueues,
	// uncached.
	Direct client.Client
	// Mapper tells whether the HardwareProfile and LocalQueue kinds are
	// served; it must ask discovery again on a miss (the manager's does),
	// so that a CRD installed later is found.
	Mapper meta.RESTMapper
	// Namespace, when set, holds every GpuProfile's HardwareProfile.
	Namespace string
	// PerTenant publishes every GpuProfile in each tenant's namespaces
	// too. GpuShapes are published in their tenants' namespaces either
	// way.
	PerTenant bool
	// Resync is how often an owner is looked at again without a change
	// of it: a later CRD install, hand edits and LocalQueues are caught
	// then.
	Resync time.Duration

	// queues: LocalQueues as listed lately, shared by every owner's pass.
	queues queueMemo
}

// takenError: a HardwareProfile of the name exists and is not the
// owner's: an admin's own, or another owner's whose name meets it (a
// GpuProfile named as a GpuShape's HardwareProfile is, or two profile
// names that Name makes one). holder names that owner, empty for an
// admin's own.
type takenError struct{ holder string }

func (e *takenError) Error() string { return "taken by " + cmp.Or(e.holder, "an object not ours") }

// target is a namespace an owner is meant to be published in, and how
// workloads are scheduled there.
type target struct {
	namespace string
	sched     hardwareprofile.Scheduling
	// global: the configured namespace, scheduled as the profile's own
	// settings say.
	global bool
}

// conflictRetry is how soon an owner whose status write conflicted is
// looked at again.
const conflictRetry = time.Second

// owner is a GpuProfile or GpuShape as publishing sees it.
type owner struct {
	kind, name string
	uid        types.UID
	// hpName is the name of its HardwareProfile in every namespace.
	hpName string
	// annotation names the owner on its HardwareProfiles (the profile's
	// or the shape's key), so one the owner reference was edited away
	// from is still known as ours.
	annotation string
	// render is the owner's HardwareProfile in a target.
	render func(target) (*unstructured.Unstructured, error)
}

// result is what publishing did: the namespaces it is published in, and
// where it is not, why.
type result struct {
	published []string
	problems  []string
	// notServed: the HardwareProfile kind is not served; nothing was
	// read or written.
	notServed bool
}

// publish writes o's HardwareProfile in each target and deletes o's in
// any other namespace. A target it cannot write (an admin's own object of
// the name) is a problem, not an error; so are the problems the targets
// came with.
func (r *Reconciler) publish(ctx context.Context, o owner, targets []target, problems []string) (result, error) {
	res := result{problems: problems}
	served, err := r.served()
	if err != nil || !served {
		res.notServed = !served
		return res, err
	}
	wanted := map[string]bool{}
	for _, t := range targets {
		// Wanted even where it does not render: what is published there
		// stays until the owner's settings hold again.
		wanted[t.namespace+"/"+o.hpName] = true
		want, err := o.render(t)
		if err != nil {
			res.problems = append(res.problems, fmt.Sprintf("%s: %v", t.namespace, err))
			continue
		}
		var taken *takenError
		err = r.apply(ctx, o, want)
		switch {
		case errors.As(err, &taken):
			res.problems = append(res.problems, takenProblem(t.namespace, want.GetName(), o, taken.holder))
			continue
		case err != nil:
			return res, err
		}
		res.published = append(res.published, t.namespace)
	}
	if err := r.prune(ctx, o, wanted); err != nil {
		return res, err
	}
	slices.Sort(res.published)
	res.published = slices.Compact(res.published)
	return res, nil
}

func (r *Reconciler) served() (bool, error) {
	gvk := hardwareprofile.GroupVersionKind
	return kinds.Served(r.Mapper, gvk.GroupKind(), gvk.Version)
}

// apply creates want, or puts what the renderer owns back into the
// HardwareProfile that exists: spec.identifiers, spec.scheduling and
// spec.dra, our labels and annotations and the owner reference. Other spec
// fields, labels and annotations (the dashboard's own) stay.
func (r *Reconciler) apply(ctx context.Context, o owner, want *unstructured.Unstructured) error {
	logger := klog.FromContext(ctx)
	key := client.ObjectKeyFromObject(want)
	have := &unstructured.Unstructured{}
	have.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	err := r.Direct.Get(ctx, key, have)
	if apierrors.IsNotFound(err) {
		if err := r.Direct.Create(ctx, want); err != nil {
			return fmt.Errorf("creating HardwareProfile %s for %s %s: %w", key, o.kind, o.name, err)
		}
		logger.Info("Published as a HardwareProfile", "owner", klog.KRef("", o.name), "kind", o.kind, "hardwareProfile", key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading HardwareProfile %s: %w", key, err)
	}
	if !ours(have, o) {
		return &takenError{holder: holderOf(have)}
	}
	updated := have.DeepCopy()
	spec := want.Object["spec"].(map[string]any)
	for _, field := range []string{"identifiers", "scheduling", "dra"} {
		v, set := spec[field]
		if !set {
			unstructured.RemoveNestedField(updated.Object, "spec", field)
			continue
		}
		if err := unstructured.SetNestedField(updated.Object, v, "spec", field); err != nil {
			return fmt.Errorf("HardwareProfile %s: %w", key, err)
		}
	}
	updated.SetLabels(merged(have.GetLabels(), want.GetLabels()))
	updated.SetAnnotations(merged(have.GetAnnotations(), want.GetAnnotations()))
	updated.SetOwnerReferences(want.GetOwnerReferences())
	if reflect.DeepEqual(have.Object, updated.Object) {
		return nil
	}
	if err := r.Direct.Update(ctx, updated); err != nil {
		return fmt.Errorf("updating HardwareProfile %s: %w", key, err)
	}
	logger.Info("Put HardwareProfile back in line with its owner", "owner", klog.KRef("", o.name), "kind", o.kind, "hardwareProfile", key)
	return nil
}

// prune deletes o's HardwareProfiles that are not wanted (by namespace and
// name): a tenant that no longer has the namespace, a shape's tenant
// removed, a Kueue-managed tenant's namespace whose LocalQueue is gone, a
// name o no longer publishes under (a shape's before ShapeName). Only
// objects owned by o (its UID) go, never an admin's own.
func (r *Reconciler) prune(ctx context.Context, o owner, wanted map[string]bool) error {
	candidates, err := r.candidates(ctx, o.uid)
	if err != nil {
		return err
	}
	for i := range candidates {
		hp := &candidates[i]
		if wanted[hp.GetNamespace()+"/"+hp.GetName()] || !ownedBy(hp, o.uid) {
			continue
		}
		uid := hp.GetUID()
		err := r.Direct.Delete(ctx, hp, client.Preconditions{UID: &uid})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting HardwareProfile %s/%s: %w", hp.GetNamespace(), hp.GetName(), err)
		}
		klog.FromContext(ctx).Info("Deleted HardwareProfile no longer meant for its namespace", "owner", klog.KRef("", o.name), "kind", o.kind, "hardwareProfile", klog.KObj(hp))
	}
	return nil
}

// candidates are the HardwareProfiles prune looks at: those labelled as
// uid's, and ours without the owner label, which only objects written
// before the label existed have (or one whose label was edited away). A
// pass so reads the owner's own, not every owner's in the cluster; after
// an upgrade each owner's first pass labels its wanted ones (apply) and
// deletes the rest, so the second list is soon empty.
func (r *Reconciler) candidates(ctx context.Context, uid types.UID) ([]unstructured.Unstructured, error) {
	unlabelled, err := labels.NewRequirement(hardwareprofile.OwnerLabel, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("selecting HardwareProfiles without %s: %w", hardwareprofile.OwnerLabel, err)
	}
	managed := labels.SelectorFromSet(labels.Set{deviceclass.ManagedByLabel: deviceclass.ManagedByValue})
	var out []unstructured.Unstructured
	for _, sel := range []labels.Selector{
		labels.SelectorFromSet(labels.Set{deviceclass.ManagedByLabel: deviceclass.ManagedByValue, hardwareprofile.OwnerLabel: string(uid)}),
		managed.Add(*unlabelled),
	} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(hardwareprofile.GroupVersionKind.GroupVersion().WithKind(hardwareprofile.GroupVersionKind.Kind + "List"))
		if err := r.Direct.List(ctx, list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil, fmt.Errorf("listing HardwareProfiles %s: %w", sel, err)
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

// tenantTargets are the namespaces of the tenants entitled (all where
// entitled is nil), each scheduled as its tenant is; a Kueue-managed
// tenant's namespace without a LocalQueue of its ClusterQueue is a problem
// instead: the dashboard would not offer a Queue profile there, and a Node
// one would run outside the queue.
func (r *Reconciler) tenantTargets(ctx context.Context, settings gpuaas.HardwareProfileSettings, entitled func(q *gpuaas.TenantQuota, namespace string) bool) ([]target, []string, error) {
	var quotas gpuaas.TenantQuotaList
	if err := r.Client.List(ctx, &quotas); err != nil {
		return nil, nil, fmt.Errorf("listing TenantQuotas: %w", err)
	}
	var targets []target
	var problems []string
	for i := range quotas.Items {
		q := &quotas.Items[i]
		for _, ns := range q.Status.Namespaces {
			if entitled != nil && !entitled(q, ns) {
				continue
			}
			if q.Spec.Kueue == nil {
				targets = append(targets, target{namespace: ns})
				continue
			}
			queue, problem, err := r.localQueue(ctx, ns, q.Spec.Kueue.ClusterQueue, settings.LocalQueueName)
			if err != nil {
				return nil, nil, err
			}
			if problem != "" {
				problems = append(problems, fmt.Sprintf("%s: tenant %s is Kueue-managed (ClusterQueue %s) and %s", ns, q.Name, q.Spec.Kueue.ClusterQueue, problem))
				continue
			}
			targets = append(targets, target{namespace: ns, sched: hardwareprofile.Scheduling{LocalQueue: queue, PriorityClass: settings.PriorityClass}})
		}
	}
	return targets, problems, nil
}

// localQueue is the LocalQueue of clusterQueue in namespace that workloads
// of a Kueue-managed tenant are queued through: preferred where several
// point at the ClusterQueue, else the first by name. A problem says why
// there is none.
func (r *Reconciler) localQueue(ctx context.Context, namespace, clusterQueue, preferred string) (string, string, error) {
	gvk := kueue.API.WithKind("LocalQueue")
	served, err := kinds.Served(r.Mapper, gvk.GroupKind(), gvk.Version)
	if err != nil {
		return "", "", err
	}
	if !served {
		return "", "Kueue's LocalQueue kind is not served", nil
	}
	queues, err := r.queuesIn(ctx, namespace)
	if err != nil {
		return "", "", err
	}
	var names []string
	for name, cq := range queues {
		if cq == clusterQueue {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", "the namespace has no LocalQueue of it", nil
	}
	if slices.Contains(names, preferred) {
		return preferred, "", nil
	}
	slices.Sort(names)
	return names[0], "", nil
}

// published is the owner's HardwareProfilesPublished condition for res.
func published(res result, generation int64) metav1.Condition {
	c := metav1.Condition{Type: gpuaas.ConditionHardwareProfilesPublished, ObservedGeneration: generation,
		Status: metav1.ConditionTrue, Reason: gpuaas.ReasonPublished}
	switch {
	case res.notServed:
		c.Status, c.Reason = metav1.ConditionFalse, gpuaas.ReasonNotPublished
		c.Message = "the HardwareProfile kind (" + hardwareprofile.GroupVersionKind.GroupVersion().String() + ") is not served: nothing is published"
	case len(res.problems) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, gpuaas.ReasonNotPublished
		c.Message = fmt.Sprintf("published in %d namespace(s); not in: %s", len(res.published), strings.Join(res.problems, "; "))
	default:
		c.Message = fmt.Sprintf("published in %d namespace(s)", len(res.published))
	}
	return c
}

// withGlobal puts the global namespace's target first unless a tenant's
// target has that namespace (a tenant's scheduling wins there).
func (r *Reconciler) withGlobal(targets []target, sched hardwareprofile.Scheduling) []target {
	if r.Namespace == "" || slices.ContainsFunc(targets, func(t target) bool { return t.namespace == r.Namespace }) {
		return targets
	}
	return append([]target{{namespace: r.Namespace, sched: sched, global: true}}, targets...)
}

func merged(have, want map[string]string) map[string]string {
	out := maps.Clone(have)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, want)
	return out
}

func ownedBy(obj *unstructured.Unstructured, uid types.UID) bool {
	return slices.ContainsFunc(obj.GetOwnerReferences(), func(ref metav1.OwnerReference) bool { return ref.UID == uid })
}

// ours tells whether a HardwareProfile is o's: owned by it, or (its owner
// reference edited away, or o deleted and made again before the garbage
// collector came by) labelled as ours and naming o; anything else is an
// admin's own (or the other kind's of the same name), never taken over.
func ours(obj *unstructured.Unstructured, o owner) bool {
	return ownedBy(obj, o.uid) ||
		obj.GetLabels()[deviceclass.ManagedByLabel] == deviceclass.ManagedByValue && obj.GetAnnotations()[o.annotation] == o.name
}

// holderOf names the owner of a HardwareProfile that is not ours to
// write: the GpuProfile or GpuShape its annotation names where it is one
// of the controller's, empty for an admin's own.
func holderOf(obj *unstructured.Unstructured) string {
	if obj.GetLabels()[deviceclass.ManagedByLabel] != deviceclass.ManagedByValue {
		return ""
	}
	if name := obj.GetAnnotations()[hardwareprofile.ShapeAnnotation]; name != "" {
		return gpuaas.GpuShapeKind + " " + name
	}
	if name := obj.GetAnnotations()[hardwareprofile.ProfileAnnotation]; name != "" {
		return gpuaas.GpuProfileKind + " " + name
	}
	return ""
}

// takenProblem says why o is not published in namespace: the
// HardwareProfile of its name there is holder's (rename one of the two),
// or an admin's own (holder empty: rename or delete it).
func takenProblem(namespace, name string, o owner, holder string) string {
	if holder == "" {
		return fmt.Sprintf("%s: HardwareProfile %s exists and is not %s %s's (rename or delete it)", namespace, name, o.kind, o.name)
	}
	return fmt.Sprintf("%s: HardwareProfile %s exists and is not %s %s's: it is %s's (rename one of them)", namespace, name, o.kind, o.name, holder)
}

func settingsOf(s *gpuaas.HardwareProfileSettings) gpuaas.HardwareProfileSettings {
	return ptr.Deref(s, gpuaas.HardwareProfileSettings{})
}
