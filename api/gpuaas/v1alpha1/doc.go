// Package v1alpha1 holds the cluster-scoped custom resources of the GPU
// service's control plane, group gpuaas.io: GpuProfile (one catalog entry,
// rendered by the dra-controller into one DeviceClass), TenantQuota (a
// tenant's namespaces and its limits in devices, GPU units and GPU memory)
// and GpuNode (status only: the posture of a node's GPUs, which the
// controller derives from ResourceSlices, claims and DeviceTaintRules).
//
// The CRD manifests under config/crd are generated from these types by
// controller-gen; the markers below and on the types are its input.
//
// +kubebuilder:object:generate=true
// +groupName=gpuaas.io
package v1alpha1
