package kubeletsim

import (
	"reflect"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// preparedInfo is a claim whose driver answered one device per request
// name list, with CDI ID "<claim>-<i>" for device i.
func preparedInfo(name string, requests ...[]string) *claimInfo {
	info := &claimInfo{Name: name, Devices: map[string][]*drapb.Device{}}
	for i, r := range requests {
		info.Devices[testDriver] = append(info.Devices[testDriver], &drapb.Device{
			RequestNames: r, CdiDeviceIds: []string{name + "-" + strconv.Itoa(i)},
		})
	}
	return info
}

func TestContainerCDI(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "shared"}}}}},
		Containers: []v1.Container{
			{Name: "one-request", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "shared", Request: "a"}}}},
			{Name: "extended"},
			{Name: "nothing"},
		},
	}}
	pod.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "ext",
		RequestMappings: []v1.ContainerExtendedResourceRequest{
			{ContainerName: "extended", ResourceName: "nvidia.com/gpu", RequestName: "container-1-request-0"},
		},
	}
	refs := []claimRef{{podClaim: "shared", name: "shared-claim"}, {name: "ext", extended: true}}
	infos := []*claimInfo{
		preparedInfo("shared-claim", []string{"a"}, []string{"b"}, nil), // a device without request names serves all
		preparedInfo("ext", []string{"container-0-request-0"}, []string{"container-1-request-0"}),
	}
	want := map[string][]string{
		"init":        {"shared-claim-0", "shared-claim-1", "shared-claim-2"},
		"one-request": {"shared-claim-0", "shared-claim-2"},
		"extended":    {"ext-1"},
	}
	if got := containerCDI(pod, refs, infos); !reflect.DeepEqual(got, want) {
		t.Errorf("containerCDI() = %v, want %v", got, want)
	}
}

func TestAwaitedExtendedResources(t *testing.T) {
	limits := func(l v1.ResourceList) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: l}}}}}
	}
	one := resource.MustParse("1")
	capacity := v1.ResourceList{v1.ResourceCPU: one, "example.com/plugin-dev": one}
	tests := []struct {
		name string
		pod  *v1.Pod
		want []string
	}{
		{"no limits", limits(nil), nil},
		{"native resources only", limits(v1.ResourceList{v1.ResourceCPU: one, v1.ResourceMemory: one}), nil},
		{"extended resource missing from the node", limits(v1.ResourceList{gpuResource: one, v1.ResourceCPU: one}), []string{"nvidia.com/gpu"}},
		{"extended resource the node offers", limits(v1.ResourceList{"example.com/plugin-dev": one}), nil},
		{"zero limit", limits(v1.ResourceList{gpuResource: resource.MustParse("0")}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := awaitedExtendedResources(tt.pod, capacity); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("awaitedExtendedResources() = %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("status set", func(t *testing.T) {
		pod := limits(v1.ResourceList{gpuResource: one})
		pod.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{ResourceClaimName: "c"}
		if got := awaitedExtendedResources(pod, capacity); got != nil {
			t.Errorf("awaitedExtendedResources() = %v, want none once the claim is known", got)
		}
	})
}
