package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Event reason on a pod whose claim was denied: the kube-controller-manager
// only logs the failed creation, so this is how `kubectl describe pod`
// shows why the pod waits.
const reasonQuotaExceeded = "QuotaExceeded"

// Event reason on a pod whose claim was refused because its shape has
// nothing placeable (whenUnavailable: Refuse).
const reasonShapeUnavailable = "ShapeUnavailable"

// ShapeGate refuses a new claim of a GpuShape with whenUnavailable: Refuse
// while none of it can be placed (shapes.Refuser); it returns the reason,
// or "".
type ShapeGate interface {
	Refuse(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error)
}

// claimWebhook charges ResourceClaims against quotas and validates their
// opaque configuration.
type claimWebhook struct {
	exempt   sets.Set[string] // namespaces whose claims skip quota, exactly
	acct     *quotaadmission.Accountant
	decoder  admission.Decoder
	recorder events.EventRecorder
	nudger   *quotaadmission.Nudger
	// kueue admits claims of Kueue-admitted workloads over quota; nil
	// when the controller does not integrate with Kueue.
	kueue *quotaadmission.KueueGate
	// shapes refuses claims of shapes with nothing placeable; nil when
	// the GpuShape CRD is not installed.
	shapes ShapeGate
	// server is the API server's version, for warnings about its
	// scheduler; nil: no such warnings.
	server *serverMinor
	// classes reads the DeviceClasses whose configs cap the MPS limits a
	// claim's config may ask; nil: no such check.
	classes client.Reader
	// shares lists the devices a request can get, whose shares of their
	// GPUs cap the MPS limits; nil: no such check.
	shares Candidates
}

func (h *claimWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	var claim resourceapi.ResourceClaim
	if err := h.decoder.Decode(req, &claim); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding ResourceClaim: %w", err))
	}
	// With generateName the request carries no name, but the object does:
	// the apiserver names it before validating admission.
	claim.Namespace = req.Namespace
	if claim.Name == "" {
		claim.Name = req.Name
	}
	if errs := validateOpaque(field.NewPath("spec", "devices", "config"), claim.Spec.Devices.Config); len(errs) > 0 {
		return invalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaim"}, claim.Name, errs)
	}
	errs, err := withinCaps(ctx, h.classes, h.shares, field.NewPath("spec", "devices", "config"), claim.Spec.Devices)
	if err != nil {
		admissionErrors.Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("checking the claim's config against its classes' and devices' caps, retry: %w", err))
	}
	if len(errs) > 0 {
		return invalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaim"}, claim.Name, errs)
	}
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	resp := h.admit(ctx, req, &claim)
	if warning := rejectedCountersWarning(h.server.get(), claim.Spec.Devices); resp.Allowed && warning != "" {
		resp = resp.WithWarnings(warning)
	}
	return resp
}

// admit decides a new claim: quota (or its exemption), shapes, Kueue.
func (h *claimWebhook) admit(ctx context.Context, req admission.Request, claim *resourceapi.ResourceClaim) admission.Response {
	if h.exempt.Has(claim.Namespace) {
		return admission.Allowed("")
	}
	dryRun := ptr.Deref(req.DryRun, false)
	if dryRun {
		// Priced in the dry runs' slots, not remembered (issue 36), from
		// the first check on.
		ctx = quota.WithDryRun(ctx)
	}
	// Before quota: a refused claim reserves nothing.
	if resp, refused := h.refuseUnavailable(ctx, claim, dryRun); refused {
		return resp
	}
	adm, err := h.acct.Admit(ctx, claim, dryRun)
	if err != nil {
		// Fail closed, like the webhook's failurePolicy: no quota check,
		// no claim. The creator (or the kube-controller-manager) retries.
		klog.FromContext(ctx).Error(err, "Quota check failed", "claim", klog.KObj(claim))
		admissionErrors.Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("quota check failed, retry: %w", err))
	}
	if !adm.Allowed {
		adm, err = h.kueue.Overrule(ctx, claim, adm, req.UserInfo.Username, dryRun)
		if err != nil {
			admissionErrors.Inc()
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("quota check failed, retry: %w", err))
		}
	}
	if !dryRun {
		recordAdmission(adm.Tenant, adm)
	}
	if adm.OverruledBy != "" {
		return admission.Allowed("").WithWarnings(fmt.Sprintf("over TenantQuota %q (%s); admitted because %s", adm.Tenant, adm.Reason, adm.OverruledBy))
	}
	if !adm.Allowed {
		h.denied(ctx, claim, adm, dryRun)
		return admission.Denied(adm.Reason)
	}
	klog.FromContext(ctx).V(4).Info("Claim admitted", "claim", klog.KObj(claim), "tenant", adm.Tenant, "cost", adm.Cost.String())
	resp := admission.Allowed("")
	if adm.Borrows {
		resp = resp.WithWarnings(fmt.Sprintf("TenantQuota %q is over its own limits; this claim borrows idle quota of cohort %q", adm.Tenant, adm.Cohort))
	}
	return resp
}

// refuseUnavailable refuses a claim of a shape with whenUnavailable: Refuse
// and nothing placeable, and tells its pod why. An error fails closed, as
// the quota check does.
func (h *claimWebhook) refuseUnavailable(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool) (admission.Response, bool) {
	if h.shapes == nil {
		return admission.Response{}, false
	}
	reason, err := h.shapes.Refuse(ctx, claim)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Shape check failed", "claim", klog.KObj(claim))
		admissionErrors.Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("shape check failed, retry: %w", err)), true
	}
	if reason == "" {
		return admission.Response{}, false
	}
	klog.FromContext(ctx).V(2).Info("Claim refused", "claim", klog.KObj(claim), "reason", reason)
	if pod, ok := quotaadmission.PodOf(claim); ok && !dryRun && h.recorder != nil {
		ref := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
		h.recorder.Eventf(ref, nil, corev1.EventTypeWarning, reasonShapeUnavailable, "CreateResourceClaim",
			"ResourceClaim for the pod is refused: %s", reason)
	}
	return admission.Denied(reason), true
}

// denied tells the pod that waits for the claim why, and remembers it so it
// is retried once quota frees up.
func (h *claimWebhook) denied(ctx context.Context, claim *resourceapi.ResourceClaim, adm quotaadmission.Admission, dryRun bool) {
	klog.FromContext(ctx).V(2).Info("Claim denied", "claim", klog.KObj(claim), "tenant", adm.Tenant, "reason", adm.Reason)
	pod, ok := quotaadmission.PodOf(claim)
	if !ok || dryRun {
		return
	}
	h.nudger.Wait(pod)
	if h.recorder != nil {
		ref := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
		for _, o := range claim.OwnerReferences {
			if o.Kind == "Pod" {
				ref.UID = o.UID
			}
		}
		h.recorder.Eventf(ref, nil, corev1.EventTypeWarning, reasonQuotaExceeded, "CreateResourceClaim",
			"ResourceClaim for the pod is waiting for quota: %s", adm.Reason)
	}
}

// templateWebhook validates the opaque configuration of
// ResourceClaimTemplates: their claims are made later by the
// kube-controller-manager, where nobody would see the error (or a
// warning: the user sees the template's).
type templateWebhook struct {
	decoder admission.Decoder
	server  *serverMinor // nil: no warnings about the scheduler
	// classes reads the DeviceClasses whose configs cap the MPS limits a
	// template's claim config may ask; nil: no such check.
	classes client.Reader
	// shares: as the claim webhook's.
	shares Candidates
}

func (h *templateWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	var tmpl resourceapi.ResourceClaimTemplate
	if err := h.decoder.Decode(req, &tmpl); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding ResourceClaimTemplate: %w", err))
	}
	gk := schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaimTemplate"}
	path := field.NewPath("spec", "spec", "devices", "config")
	if errs := validateOpaque(path, tmpl.Spec.Spec.Devices.Config); len(errs) > 0 {
		return invalid(gk, req.Name, errs)
	}
	// The caps its claims would be refused for, found before any is made.
	errs, err := withinCaps(ctx, h.classes, h.shares, path, tmpl.Spec.Spec.Devices)
	if err != nil {
		admissionErrors.Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("checking the template's config against its classes' and devices' caps, retry: %w", err))
	}
	if len(errs) > 0 {
		return invalid(gk, req.Name, errs)
	}
	if warning := rejectedCountersWarning(h.server.get(), tmpl.Spec.Spec.Devices); warning != "" {
		return admission.Allowed("").WithWarnings(warning)
	}
	return admission.Allowed("")
}

// profileWebhook refuses a GpuProfile whose selector, config or extended
// resource name is invalid: the error shows at `kubectl apply`.
type profileWebhook struct {
	acct    *quotaadmission.Accountant
	decoder admission.Decoder
}

func (h *profileWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	var p gpuaas.GpuProfile
	if err := h.decoder.Decode(req, &p); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding GpuProfile: %w", err))
	}
	if req.Operation == admissionv1.Update {
		// Only the spec is validated: an invalid profile stored while no
		// webhook ran must still take the controller's finalizer and
		// labels, or it could never be drained.
		var old gpuaas.GpuProfile
		if err := h.decoder.DecodeRaw(req.OldObject, &old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old GpuProfile: %w", err))
		}
		if equality.Semantic.DeepEqual(old.Spec, p.Spec) {
			return admission.Allowed("")
		}
	}
	migs, err := h.acct.PublishedMigProfiles(ctx)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if errs := deviceclass.Validate(&p, migs); len(errs) > 0 {
		return invalid(gpuaas.GroupVersion.WithKind(gpuaas.GpuProfileKind).GroupKind(), req.Name, errs)
	}
	return admission.Allowed("")
}

// quotaWebhook refuses a TenantQuota the controller could not enforce and
// warns when its namespaces are already another quota's.
type quotaWebhook struct {
	acct    *quotaadmission.Accountant
	decoder admission.Decoder
}

func (h *quotaWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	var q gpuaas.TenantQuota
	if err := h.decoder.Decode(req, &q); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding TenantQuota: %w", err))
	}
	if errs := q.Validate(); len(errs) > 0 {
		return invalid(gpuaas.GroupVersion.WithKind(gpuaas.TenantQuotaKind).GroupKind(), req.Name, errs)
	}
	held, err := h.acct.HeldByOthers(ctx, req.Name, q.Spec.Namespaces)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.Allowed("")
	if len(held) > 0 {
		resp = resp.WithWarnings(append(held, "the older quota keeps those namespaces; see status condition NamespaceConflict")...)
	}
	return resp
}

// invalid answers 422 with field errors, as the apiserver's own
// validation would.
func invalid(gk schema.GroupKind, name string, errs field.ErrorList) admission.Response {
	status := apierrors.NewInvalid(gk, name, errs).ErrStatus
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}
