package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the control-plane resources.
const GroupName = "gpuaas.io"

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Kinds served by this package.
const (
	GpuProfileKind  = "GpuProfile"
	TenantQuotaKind = "TenantQuota"
	GpuNodeKind     = "GpuNode"
	GpuShapeKind    = "GpuShape"
	TenantUsageKind = "TenantUsage"
)

var (
	// SchemeBuilder registers the types of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&GpuProfile{}, &GpuProfileList{},
		&TenantQuota{}, &TenantQuotaList{},
		&GpuNode{}, &GpuNodeList{},
		&GpuShape{}, &GpuShapeList{},
		&TenantUsage{}, &TenantUsageList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
