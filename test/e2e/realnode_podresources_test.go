package e2e

// The kubelet's PodResources API on the real node: what dcgm-exporter
// (KUBERNETES_ENABLE_DRA) reads to attribute GPU metrics to pods and
// claims. For each device kind we offer, a running pod's entry must name
// its claim and, for each allocated device, our driver, the node's pool,
// the device and the CDI device the plugin prepared for it.

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// podResourcesKinds are the device kinds of demo/node-config.yaml, each
// selected by a claim's CEL selector: whole GPUs 0-3, a dynamic MIG slice
// (GPUs 6-7, created at prepare), a time-slice replica (GPU 4) and a
// memory share of the MPS-shared GPU 5 (a multi-allocatable device: its
// allocation carries a share ID).
var podResourcesKinds = []struct{ kind, cel string }{
	{"whole-gpu", `device.attributes["gpu.gpuaas.io"].type == "gpu" && device.attributes["gpu.gpuaas.io"].index < 4`},
	{"mig-1g", `device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`},
	{"timeslice", `device.attributes["gpu.gpuaas.io"].type == "timeslice"`},
	{"memory-share-mps", `device.attributes["gpu.gpuaas.io"].type == "shared"`},
}

// TestRealNodePodResources runs one pod per device kind on the real node
// and checks the kubelet's PodResources List and Get report each pod's
// claim with our driver, pool, device names and CDI device IDs.
func TestRealNodePodResources(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	ctx := framework.Context(t, 10*time.Minute)
	h := newHealthRun(t, n)
	for _, k := range podResourcesKinds {
		h.pod(t, ctx, k.kind, k.cel)
	}
	for _, k := range podResourcesKinds {
		runningPod(t, ctx, h.ns, k.kind)
	}

	// The socket the kubelet serves under its root dir, which a
	// dcgm-exporter pod mounts (hostPath <kubeletDir>/pod-resources).
	socket := filepath.Join(n.KubeletDir, "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("PodResources List on %s: %v", socket, err)
	}
	for _, k := range podResourcesKinds {
		claim, err := cp.Client.ResourceV1().ResourceClaims(h.ns).Get(ctx, k.kind, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var listed *podresourcesv1.PodResources
		for _, p := range list.GetPodResources() {
			if p.GetNamespace() == h.ns && p.GetName() == k.kind {
				listed = p
			}
		}
		if listed == nil {
			t.Errorf("%s: PodResources List has no pod %s/%s", k.kind, h.ns, k.kind)
			continue
		}
		checkPodResources(t, n, "List", k.kind, listed, claim)
		got, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: k.kind, PodNamespace: h.ns})
		if err != nil {
			t.Errorf("%s: PodResources Get: %v", k.kind, err)
			continue
		}
		checkPodResources(t, n, "Get", k.kind, got.GetPodResources(), claim)
		out, _ := json.MarshalIndent(got.GetPodResources(), "", "  ")
		t.Logf("%s: PodResources Get %s/%s:\n%s", k.kind, h.ns, k.kind, out)
	}
}

// claimDevice is one device of a claim as PodResources reports it.
type claimDevice struct {
	driver, pool, device, shareID string
	cdi                           []string
}

// checkPodResources checks that a pod's PodResources (from List or Get)
// report the claim on its container with every allocated device: driver,
// pool, device, share ID, and the CDI device of our spec for that device.
func checkPodResources(t *testing.T, n *realNode, api, kind string, pr *podresourcesv1.PodResources, claim *resourceapi.ResourceClaim) {
	t.Helper()
	if claim.Status.Allocation == nil {
		t.Fatalf("%s: claim %s not allocated", kind, claim.Name)
	}
	var want []claimDevice
	kindOfSpec := cdiSpecKind(t, n, claim)
	for _, r := range claim.Status.Allocation.Devices.Results {
		d := claimDevice{driver: r.Driver, pool: r.Pool, device: r.Device,
			cdi: []string{kindOfSpec + "=" + string(claim.UID) + "-" + r.Device}}
		if r.ShareID != nil {
			d.shareID = string(*r.ShareID)
		}
		want = append(want, d)
	}
	var got []claimDevice
	for _, c := range pr.GetContainers() {
		if c.GetName() != "ctr" {
			continue
		}
		for _, dr := range c.GetDynamicResources() {
			if dr.GetClaimName() != claim.Name || dr.GetClaimNamespace() != claim.Namespace {
				continue
			}
			for _, r := range dr.GetClaimResources() {
				d := claimDevice{driver: r.GetDriverName(), pool: r.GetPoolName(), device: r.GetDeviceName(), shareID: r.GetShareId()}
				for _, c := range r.GetCdiDevices() {
					d.cdi = append(d.cdi, c.GetName())
				}
				got = append(got, d)
			}
		}
	}
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		same = got[i].driver == want[i].driver && got[i].pool == want[i].pool && got[i].device == want[i].device &&
			got[i].shareID == want[i].shareID && slices.Equal(got[i].cdi, want[i].cdi)
	}
	if !same {
		t.Errorf("%s: PodResources %s of pod %s reports claim %s as %+v, want %+v", kind, api, pr.GetName(), claim.Name, got, want)
		return
	}
	for _, d := range got {
		if d.driver != framework.DriverName || d.pool != n.Name {
			t.Errorf("%s: PodResources %s: device %s of driver %s pool %s, want %s and %s", kind, api, d.device, d.driver, d.pool, framework.DriverName, n.Name)
		}
	}
}

// cdiSpecKind is the CDI kind of the spec the plugin wrote for a claim
// (vendor/class, the part of a CDI device ID before "=").
func cdiSpecKind(t *testing.T, n *realNode, claim *resourceapi.ResourceClaim) string {
	t.Helper()
	var spec struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal([]byte(readFile(t, n.CDISpecPath(claim.UID))), &spec); err != nil || spec.Kind == "" {
		t.Fatalf("CDI spec of claim %s: kind %q, %v", claim.Name, spec.Kind, err)
	}
	return spec.Kind
}
