// Package hardwareprofile renders a GpuProfile or a GpuShape into the
// OpenShift AI / Open Data Hub HardwareProfile
// (infrastructure.opendatahub.io/v1, namespaced) the dashboard offers it
// as. Pure functions over the API types,
// no client code: pkg/controller/hardwareprofiles writes what they render.
//
// The object is unstructured: the opendatahub-operator's Go types are not a
// dependency of this project, and the controller writes HardwareProfiles
// only where their CRD is served.
package hardwareprofile

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
)

// GroupVersionKind of the HardwareProfile API the dashboard reads (the
// older dashboard.opendatahub.io/v1alpha1 kind is refused on create).
var GroupVersionKind = schema.GroupVersionKind{Group: "infrastructure.opendatahub.io", Version: "v1", Kind: "HardwareProfile"}

// Annotations the dashboard reads a HardwareProfile's name, description
// and state from, and the one that names the GpuProfile it was rendered
// from.
const (
	DisplayNameAnnotation = "opendatahub.io/display-name"
	DescriptionAnnotation = "opendatahub.io/description"
	DisabledAnnotation    = "opendatahub.io/disabled"
	ProfileAnnotation     = gpuaas.ProfileLabel
)

// OwnerLabel on a HardwareProfile is its owner's UID (a GpuProfile's or a
// GpuShape's): what the controller lists its own by, so that a pass reads
// none of the other owners' (hundreds of tenants' namespaces, many
// profiles each).
const OwnerLabel = "gpuaas.io/owner-uid"

// Identifier resource types of the HardwareProfile API.
const (
	ResourceTypeCPU         = "CPU"
	ResourceTypeMemory      = "Memory"
	ResourceTypeAccelerator = "Accelerator"
)

// Scheduling types of the HardwareProfile API.
const (
	SchedulingQueue = "Queue"
	SchedulingNode  = "Node"
)

// Defaults of the CPU and memory identifiers where the GpuProfile's
// spec.hardwareProfile leaves them unset (api/gpuaas/v1alpha1, documented
// on HardwareProfileSettings): a notebook's worth, which the admin narrows
// or widens per profile.
var (
	DefaultCPU    = Range{Min: resource.MustParse("1"), Default: resource.MustParse("2"), Max: resource.MustParse("8")}
	DefaultMemory = Range{Min: resource.MustParse("2Gi"), Default: resource.MustParse("8Gi"), Max: resource.MustParse("64Gi")}
)

// DefaultMaxDevices is the Accelerator identifier's maxCount unless the
// profile sets spec.hardwareProfile.maxDevices.
const DefaultMaxDevices = 1

// Range is an identifier's least, default and most amount, all set.
type Range struct {
	Min, Default, Max resource.Quantity
}

// Scheduling is how workloads started with a HardwareProfile are
// scheduled: through a Kueue LocalQueue (type Queue) where LocalQueue is
// set, else by the scheduler alone (type Node).
type Scheduling struct {
	LocalQueue    string
	PriorityClass string
}

// SchedulingOf is the scheduling a profile's own settings say: what it is
// published with in the global namespace.
func SchedulingOf(s gpuaas.HardwareProfileSettings) Scheduling {
	return Scheduling{LocalQueue: s.LocalQueueName, PriorityClass: s.PriorityClass}
}

// Render is the HardwareProfile for profile p in namespace, owned by p (so
// it goes with it), scheduled as its settings say. A disabled or deleted
// profile renders too, marked disabled: the dashboard stops offering it
// while workloads that name it keep their reference. It fails where the
// admin's ranges do not hold (min <= default <= max).
func Render(p *gpuaas.GpuProfile, namespace string) (*unstructured.Unstructured, error) {
	settings := ptr.Deref(p.Spec.HardwareProfile, gpuaas.HardwareProfileSettings{})
	if settings.PriorityClass != "" && settings.LocalQueueName == "" {
		return nil, fmt.Errorf("GpuProfile %s: spec.hardwareProfile.priorityClass needs localQueueName (Kueue's priority applies to queued workloads only)", p.Name)
	}
	return RenderIn(p, namespace, SchedulingOf(settings))
}

// RenderIn is Render with the scheduling given: a tenant's namespace is
// scheduled as the tenant is (its LocalQueue where Kueue manages it).
func RenderIn(p *gpuaas.GpuProfile, namespace string, sched Scheduling) (*unstructured.Unstructured, error) {
	settings := ptr.Deref(p.Spec.HardwareProfile, gpuaas.HardwareProfileSettings{})
	identifiers, err := baseIdentifiers(settings)
	if err != nil {
		return nil, fmt.Errorf("GpuProfile %s: %w", p.Name, err)
	}
	if ern := p.Spec.ExtendedResourceName; ern != nil && *ern != "" {
		maxDevices := int64(DefaultMaxDevices)
		if settings.MaxDevices != nil {
			maxDevices = int64(*settings.MaxDevices)
		}
		identifiers = append(identifiers, map[string]any{
			"displayName": acceleratorName(p), "identifier": *ern, "resourceType": ResourceTypeAccelerator,
			"minCount": int64(1), "defaultCount": int64(1), "maxCount": maxDevices,
		})
	}
	hp := object(namespace, Name(p.Name), Annotations(p), deviceclass.OwnerReference(p))
	hp.Object["spec"] = map[string]any{"identifiers": identifiers, "scheduling": sched.render()}
	return hp, nil
}

// RenderShape is the HardwareProfile for shape s in namespace, one of its
// tenants' namespaces holding its ResourceClaimTemplate, which
// spec.dra.resourceClaimTemplateName names (the template has the shape's
// name: pkg/shape.Template). Owned by s, so it goes with it. No
// Accelerator identifier: the devices come from the template's claim.
func RenderShape(s *gpuaas.GpuShape, namespace string, sched Scheduling) (*unstructured.Unstructured, error) {
	settings := ptr.Deref(s.Spec.HardwareProfile, gpuaas.HardwareProfileSettings{})
	identifiers, err := baseIdentifiers(settings)
	if err != nil {
		return nil, fmt.Errorf("GpuShape %s: %w", s.Name, err)
	}
	hp := object(namespace, ShapeName(s.Name), ShapeAnnotations(s), metav1.OwnerReference{
		APIVersion: gpuaas.GroupVersion.String(), Kind: gpuaas.GpuShapeKind, Name: s.Name, UID: s.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
	})
	hp.Object["spec"] = map[string]any{
		"identifiers": identifiers,
		"scheduling":  sched.render(),
		"dra":         map[string]any{"resourceClaimTemplateName": s.Name},
	}
	return hp, nil
}

// ShapeAnnotation names the GpuShape a HardwareProfile was rendered from.
const ShapeAnnotation = gpuaas.ShapeLabel

// ShapeAnnotations are the dashboard's name, description and state of s's
// HardwareProfiles (a shape being deleted is disabled), and the shape.
func ShapeAnnotations(s *gpuaas.GpuShape) map[string]string {
	settings := ptr.Deref(s.Spec.HardwareProfile, gpuaas.HardwareProfileSettings{})
	return map[string]string{
		DisplayNameAnnotation: cmp.Or(settings.DisplayName, s.Spec.DisplayName, s.Name),
		DescriptionAnnotation: cmp.Or(settings.Description, s.Spec.Description),
		DisabledAnnotation:    fmt.Sprint(!s.DeletionTimestamp.IsZero()),
		ShapeAnnotation:       s.Name,
	}
}

func object(namespace, name string, annotations map[string]string, owner metav1.OwnerReference) *unstructured.Unstructured {
	hp := &unstructured.Unstructured{}
	hp.SetGroupVersionKind(GroupVersionKind)
	hp.SetNamespace(namespace)
	hp.SetName(name)
	hp.SetLabels(map[string]string{deviceclass.ManagedByLabel: deviceclass.ManagedByValue, OwnerLabel: string(owner.UID)})
	hp.SetAnnotations(annotations)
	hp.SetOwnerReferences([]metav1.OwnerReference{owner})
	return hp
}

// baseIdentifiers are the CPU and memory identifiers every published
// HardwareProfile has (the dashboard hides one without both).
func baseIdentifiers(settings gpuaas.HardwareProfileSettings) ([]any, error) {
	cpu, err := rangeOf(settings.CPU, DefaultCPU)
	if err != nil {
		return nil, fmt.Errorf("spec.hardwareProfile.cpu: %w", err)
	}
	memory, err := rangeOf(settings.Memory, DefaultMemory)
	if err != nil {
		return nil, fmt.Errorf("spec.hardwareProfile.memory: %w", err)
	}
	return []any{
		identifier("CPU", "cpu", ResourceTypeCPU, cpu),
		identifier("Memory", "memory", ResourceTypeMemory, memory),
	}, nil
}

// Annotations are the dashboard's name, description and state of p's
// HardwareProfile, and the GpuProfile it comes from. Every key is always
// written ("false" for an enabled profile), so that a hand edit of any is
// put back.
func Annotations(p *gpuaas.GpuProfile) map[string]string {
	settings := ptr.Deref(p.Spec.HardwareProfile, gpuaas.HardwareProfileSettings{})
	disabled := !p.IsEnabled() || !p.DeletionTimestamp.IsZero()
	return map[string]string{
		DisplayNameAnnotation: cmp.Or(settings.DisplayName, p.Spec.DisplayName, p.Name),
		DescriptionAnnotation: cmp.Or(settings.Description, p.Spec.Description),
		DisabledAnnotation:    fmt.Sprint(disabled),
		ProfileAnnotation:     p.Name,
	}
}

// notLabelChars are what a DNS-1123 label may not hold.
var notLabelChars = regexp.MustCompile(`[^a-z0-9-]+`)

// Name is the HardwareProfile's name for profile name: the same name where
// it is a DNS-1123 label (most are; it is what tools and the dashboard's
// URLs take), else a label made of it with a hash of the whole name, so
// "mig-1g.10gb" and "mig-1g-10gb" never meet.
func Name(profile string) string {
	if len(validation.IsDNS1123Label(profile)) == 0 {
		return profile
	}
	sum := sha256.Sum256([]byte(profile))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	base := notLabelChars.ReplaceAllString(strings.ToLower(profile), "-")
	base = base[:min(len(base), validation.DNS1123LabelMaxLength-len(suffix))]
	return strings.Trim(base, "-") + suffix
}

// ShapePrefix begins the name of every GpuShape's HardwareProfile.
const ShapePrefix = "shape-"

// ShapeName is the HardwareProfile's name for shape name: Name of it with
// ShapePrefix, so that a GpuShape and a GpuProfile of one name, both
// published in a tenant's namespace, do not meet there. Only a profile
// named with the prefix itself still meets the shape's; the controller
// then publishes the one that is there first and says so on the other.
func ShapeName(shape string) string {
	return Name(ShapePrefix + shape)
}

func (s Scheduling) render() map[string]any {
	if s.LocalQueue == "" {
		return map[string]any{"type": SchedulingNode}
	}
	kueue := map[string]any{"localQueueName": s.LocalQueue}
	if s.PriorityClass != "" {
		kueue["priorityClass"] = s.PriorityClass
	}
	return map[string]any{"type": SchedulingQueue, "kueue": kueue}
}

func identifier(displayName, id, resourceType string, r Range) map[string]any {
	return map[string]any{
		"displayName": displayName, "identifier": id, "resourceType": resourceType,
		"minCount": count(r.Min), "defaultCount": count(r.Default), "maxCount": count(r.Max),
	}
}

// count is a quantity as the API's int-or-string counts take it: an
// integer where it is a whole number without a suffix (cpu: 2), else its
// canonical string (cpu: 500m, memory: 8Gi).
func count(q resource.Quantity) any {
	s := q.String()
	if v, ok := q.AsInt64(); ok && s == fmt.Sprint(v) {
		return v
	}
	return s
}

// rangeOf is set with def's values where set leaves them out; min <=
// default <= max must hold.
func rangeOf(set *gpuaas.ResourceRange, def Range) (Range, error) {
	r := def
	if set != nil {
		r.Min = valueOr(set.Min, def.Min)
		r.Default = valueOr(set.Default, def.Default)
		r.Max = valueOr(set.Max, def.Max)
	}
	if r.Min.Sign() <= 0 {
		return Range{}, fmt.Errorf("min %s must be more than zero", r.Min.String())
	}
	if r.Min.Cmp(r.Default) > 0 || r.Default.Cmp(r.Max) > 0 {
		return Range{}, fmt.Errorf("min %s <= default %s <= max %s does not hold (unset fields are %s, %s, %s)",
			r.Min.String(), r.Default.String(), r.Max.String(), def.Min.String(), def.Default.String(), def.Max.String())
	}
	return r, nil
}

func acceleratorName(p *gpuaas.GpuProfile) string {
	return cmp.Or(p.Spec.DisplayName, p.Name)
}

func valueOr(q *resource.Quantity, def resource.Quantity) resource.Quantity {
	if q == nil {
		return def
	}
	return *q
}
