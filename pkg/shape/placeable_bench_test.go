package shape

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
)

// benchCluster is nodes nodes of 8 H100s, each on its own PCIe root (NUMA
// node 0 for GPUs 0-3, 1 for 4-7) with a NIC of another driver on the
// same root; every other node has GPUs 0-2 allocated.
func benchCluster(b *testing.B, nodes int) ([]*resourceapi.ResourceSlice, []*resourceapi.ResourceClaim) {
	b.Helper()
	var slices []*resourceapi.ResourceSlice
	var claims []*resourceapi.ResourceClaim
	for n := range nodes {
		name := fmt.Sprintf("node-%03d", n)
		var gpus, nics []resourceapi.Device
		for i := range 8 {
			root := fmt.Sprintf("pci0000:%02x", i*16)
			g := gpu(i, root, int64(i/4))
			g.Attributes["productName"] = resourceapi.DeviceAttribute{StringValue: ptrTo("NVIDIA H100 80GB HBM3")}
			g.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {}}
			gpus = append(gpus, g)
			nics = append(nics, nic(i, root))
		}
		slices = append(slices, slice(ourDriver, name, gpus...), slice(nicDriver, name, nics...))
		if n%2 == 0 {
			claims = append(claims, claimOn(ourDriver, name, "gpu-0", "gpu-1", "gpu-2"))
		}
	}
	return slices, claims
}

func ptrTo(s string) *string { return &s }

// h100Selectors are the CEL selectors of the class a GpuProfile "h100"
// (type gpu, its product name) renders to.
func h100Selectors(b *testing.B) []string {
	b.Helper()
	p := &gpuaas.GpuProfile{Spec: gpuaas.GpuProfileSpec{Selector: gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: "NVIDIA H100 80GB HBM3"}}}
	p.Name = "h100"
	dc, err := deviceclass.Build(p, nil)
	if err != nil {
		b.Fatal(err)
	}
	var out []string
	for _, s := range dc.Spec.Selectors {
		out = append(out, s.CEL.Expression)
	}
	return out
}

// BenchmarkPlaceable500Nodes: one count of a shape at 500 nodes of 8 x
// H100 (4,000 GPUs, 4,000 NICs, 250 claims), as the controller makes it
// on every (coalesced) change of slices or claims, cold and warm.
func BenchmarkPlaceable500Nodes(b *testing.B) {
	slices, claims := benchCluster(b, 500)
	gpuSel := h100Selectors(b)
	for _, tc := range []struct {
		name string
		q    Query
		want int
	}{
		{"slot-gpu-nic-pcieroot", Query{Align: pcieRoot, Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 1}, {Name: "nic", Selectors: nicSel, Count: 1}}}, 250*8 + 250*5},
		{"two-gpus-numa", Query{Align: numaNode, Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 2}}}, 250*4 + 250*(0+2)},
		{"whole-node", Query{Requests: []Request{{Name: "gpus", Selectors: gpuSel, All: true}}}, 250},
	} {
		// cold: every device's selectors evaluated (the controller's
		// first count, or every device's slice republished).
		b.Run(tc.name+"/cold", func(b *testing.B) {
			for b.Loop() {
				if got := Placeable(b.Context(), tc.q, slices, claims, nil); got.Placeable != tc.want {
					b.Fatalf("placeable %d, want %d", got.Placeable, tc.want)
				}
			}
		})
		// warm: the controller's Matcher has seen the slices (a claim
		// allocated or freed since the last count).
		b.Run(tc.name+"/warm", func(b *testing.B) {
			m := NewMatcher()
			m.Placeable(b.Context(), tc.q, slices, claims, nil)
			for b.Loop() {
				if got := m.Placeable(b.Context(), tc.q, slices, claims, nil); got.Placeable != tc.want {
					b.Fatalf("placeable %d, want %d", got.Placeable, tc.want)
				}
			}
		})
	}
}
