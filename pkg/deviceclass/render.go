package deviceclass

import (
	"encoding/json"
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// DriverName is the DRA driver every rendered class selects.
const DriverName = "gpu.gpuaas.io"

// Labels and annotations of rendered classes.
const (
	ManagedByLabel        = "app.kubernetes.io/managed-by"
	ManagedByValue        = "gpuaas-dra-controller"
	DisplayNameAnnotation = "gpuaas.io/display-name"
	DescriptionAnnotation = "gpuaas.io/description"
)

// Build validates a profile and renders its DeviceClass: same name, a CEL
// selector per set selector field (all must match), the opaque config, the
// extended resource name, and the profile as controlling owner so the class
// goes when the profile does. publishedMig are MIG profile names nodes
// publish, accepted beside the built-in list.
func Build(p *gpuaas.GpuProfile, publishedMig map[string]bool) (*resourceapi.DeviceClass, error) {
	if errs := Validate(p, publishedMig); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	dc := &resourceapi.DeviceClass{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            p.Name,
			Labels:          map[string]string{ManagedByLabel: ManagedByValue, gpuaas.ProfileLabel: p.Name},
			Annotations:     annotations(p),
			OwnerReferences: []metav1.OwnerReference{OwnerReference(p)},
		},
	}
	for _, expr := range Selectors(&p.Spec.Selector) {
		dc.Spec.Selectors = append(dc.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
	if cfg := p.Spec.Config; cfg != nil && len(cfg.Raw) > 0 {
		dc.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: compact(cfg.Raw)}},
		}}}
	}
	if name := ptr.Deref(p.Spec.ExtendedResourceName, ""); name != "" {
		dc.Spec.ExtendedResourceName = &name
	}
	return dc, nil
}

// OwnerReference makes the profile the controller of its class.
func OwnerReference(p *gpuaas.GpuProfile) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: gpuaas.GroupVersion.String(), Kind: gpuaas.GpuProfileKind,
		Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}
}

func annotations(p *gpuaas.GpuProfile) map[string]string {
	a := map[string]string{}
	if p.Spec.DisplayName != "" {
		a[DisplayNameAnnotation] = p.Spec.DisplayName
	}
	if p.Spec.Description != "" {
		a[DescriptionAnnotation] = p.Spec.Description
	}
	if len(a) == 0 {
		return nil
	}
	return a
}

// compact re-encodes JSON without insignificant space, so the rendered
// class compares equal to what the apiserver stores.
func compact(raw []byte) []byte {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// Selectors are the CEL expressions of a profile selector. Each attribute
// test first checks the attribute exists: a runtime error ("no such key")
// in a class selector would fail the allocation of every claim of the class
// instead of skipping the one device.
func Selectors(s *gpuaas.ProfileSelector) []string {
	exprs := []string{fmt.Sprintf("device.driver == %s", strconv.Quote(DriverName))}
	typ := s.Type
	if s.MigProfile != "" && typ == "" {
		typ = gpuaas.DeviceTypeMIG
	}
	if typ != "" {
		exprs = append(exprs, attrEquals("type", string(typ)))
	}
	if s.ProductName != "" {
		exprs = append(exprs, attrEquals("productName", s.ProductName))
	}
	if s.Architecture != "" {
		exprs = append(exprs, attrEquals("architecture", s.Architecture))
	}
	if s.MigProfile != "" {
		exprs = append(exprs, attrEquals("profile", s.MigProfile))
	}
	if s.MinMemory != nil {
		exprs = append(exprs, fmt.Sprintf(`"memory" in %s && %s.memory.compareTo(quantity(%s)) >= 0`,
			domainMap("capacity"), domainMap("capacity"), strconv.Quote(s.MinMemory.String())))
	}
	if s.CEL != "" {
		exprs = append(exprs, s.CEL)
	}
	return exprs
}

func domainMap(field string) string {
	return fmt.Sprintf("device.%s[%s]", field, strconv.Quote(DriverName))
}

func attrEquals(name, value string) string {
	m := domainMap("attributes")
	return fmt.Sprintf("%s in %s && %s.%s == %s", strconv.Quote(name), m, m, name, strconv.Quote(value))
}
