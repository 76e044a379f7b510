package admission

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// nudgeDelay gathers the claim deletions of one burst into one nudge.
const nudgeDelay = 500 * time.Millisecond

// Nudger remembers pods whose template claims the webhook denied and, when
// quota may have freed up (a claim deleted or deallocated, a quota
// changed), touches an annotation on them. The kube-controller-manager
// retries a failed claim creation with exponential back-off of up to about
// 16 minutes, but it retries at once when the pod changes: so the waiting
// pod gets its claim as soon as there is room. A pod denied again is simply
// remembered again. Every replica nudges the pods its own webhook denied.
type Nudger struct {
	client  client.Client
	enabled bool

	mu           sync.Mutex
	waiting      map[types.NamespacedName]bool
	perNamespace map[string]int // of waiting
	kick         chan struct{}
}

func NewNudger(c client.Client, enabled bool) *Nudger {
	return &Nudger{client: c, enabled: enabled, waiting: map[types.NamespacedName]bool{}, perNamespace: map[string]int{}, kick: make(chan struct{}, 1)}
}

// PodOf is the pod a claim was generated for (by the resourceclaim
// controller from a template, or by the scheduler for extended
// resources), if any.
func PodOf(claim *resourceapi.ResourceClaim) (types.NamespacedName, bool) {
	for _, ref := range claim.OwnerReferences {
		if ref.Kind == "Pod" && ref.APIVersion == "v1" {
			return types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}, true
		}
	}
	return types.NamespacedName{}, false
}

// Bounds on the pods remembered between nudges. The pod a denied claim
// names is whatever its ownerReference says, which the claim's creator
// writes: a tenant creating claims that name made-up pods grew the map
// without bound until the next kick. Past a bound a pod is not remembered,
// and only waits for the kube-controller-manager's own back-off; one
// namespace cannot take the others' room.
const (
	maxWaitingPerNamespace = 512
	maxWaiting             = 16384
)

// Wait remembers a pod whose claim was denied.
func (n *Nudger) Wait(pod types.NamespacedName) {
	if !n.enabled {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waiting[pod] {
		return
	}
	if len(n.waiting) >= maxWaiting || n.perNamespace[pod.Namespace] >= maxWaitingPerNamespace {
		return
	}
	n.waiting[pod] = true
	n.perNamespace[pod.Namespace]++
}

// Waits tells whether a pod is remembered, to be nudged at the next kick.
func (n *Nudger) Waits(pod types.NamespacedName) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.waiting[pod]
}

// Kick says quota may have freed up.
func (n *Nudger) Kick() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Nudger) NeedLeaderElection() bool { return false }

func (n *Nudger) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("nudger")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.kick:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(nudgeDelay):
		}
		n.nudgeAll(klog.NewContext(ctx, logger))
	}
}

func (n *Nudger) nudgeAll(ctx context.Context) {
	n.mu.Lock()
	pods := n.waiting
	n.waiting, n.perNamespace = map[types.NamespacedName]bool{}, map[string]int{}
	n.mu.Unlock()
	for pod := range pods {
		if err := n.nudge(ctx, pod); err != nil {
			klog.FromContext(ctx).Error(err, "Nudging pod failed", "pod", pod)
		}
	}
}

func (n *Nudger) nudge(ctx context.Context, pod types.NamespacedName) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, gpuaas.QuotaRetryAnnotation, time.Now().UTC().Format(time.RFC3339Nano))
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	err := n.client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patching pod %s: %w", pod, err)
	}
	klog.FromContext(ctx).V(2).Info("Nudged pod waiting for quota", "pod", pod)
	return nil
}
