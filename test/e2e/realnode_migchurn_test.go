package e2e

// Dynamic MIG after churn on the real node (issue 29 item 4): pods of small
// MIG profiles come and go on the demo's dynamic MIG GPUs (6 and 7), and
// afterwards a GPU whose pods are gone takes the largest profile again, and
// the GPU instances in the mock machine are exactly the MIG devices the API
// has allocated: none stranded by an unprepare, none missing.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	// migChurnClass selects any MIG device of ours; each template narrows
	// it to one profile.
	migChurnClass = "migchurn-mig.gpuaas.io"
	// migChurnSeed fixes the churn: profiles, batch sizes and which pods go.
	migChurnSeed = 29
	// migChurnRounds of create-then-delete; 2-4 pods are created a round.
	migChurnRounds = 14
	// migLargest is the largest profile of the mock H100 (go-nvml's
	// dgxh100 with a real H100's placements: 7 compute and 8 memory
	// slices).
	migLargest = "7g.80gb"
)

// migChurnMix is the seeded mix: profile and weight.
var migChurnMix = []struct {
	profile string
	weight  int
}{{"1g.10gb", 50}, {"2g.20gb", 30}, {"3g.40gb", 20}}

// TestRealNodeMIGChurn churns dynamic MIG pods on the real node, then
// checks that a GPU whose pods are gone takes 7g.80gb, that both GPUs take
// one each once every pod is gone, and, after every round, that the mock
// machine's GPU instances are exactly the allocated MIG devices.
func TestRealNodeMIGChurn(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	ctx := framework.Context(t, 20*time.Minute)
	c := newMIGChurn(t, n)

	rng := rand.New(rand.NewPCG(migChurnSeed, migChurnSeed))
	var live []string
	var created, refused, refusedWithRoom, placedOnRetry, maxLive int
	for round := range migChurnRounds {
		var batch []string
		for range 2 + rng.IntN(3) {
			name := fmt.Sprintf("churn-%d", created)
			created++
			c.pod(t, ctx, name, pickProfile(rng))
			batch = append(batch, name)
		}
		for _, name := range batch {
			if c.waitRunningOrRefused(t, ctx, name) {
				live = append(live, name)
				continue
			}
			state := c.allocated(t, ctx)
			if !c.roomFor(state, c.profileOf[name]) {
				refused++
				t.Logf("round %d: %s (%s) refused, no GPU has the slices and memory; allocated: %s", round, name, c.profileOf[name], state)
				c.deletePods(t, ctx, name)
				continue
			}
			// Refused while a GPU had the compute and memory slices: ask
			// again with a new pod, so that a scheduler that had not yet
			// seen the last round's claims go is told apart from a
			// placement that does not exist.
			c.deletePods(t, ctx, name)
			again := name + "-again"
			c.pod(t, ctx, again, c.profileOf[name])
			if c.waitRunningOrRefused(t, ctx, again) {
				placedOnRetry++
				live = append(live, again)
				t.Logf("round %d: %s (%s) refused with the slices and memory free (%q), placed when asked again as %s; allocated: %s",
					round, name, c.profileOf[name], c.refusal, again, c.allocated(t, ctx))
				continue
			}
			refused++
			refusedWithRoom++
			t.Logf("round %d: %s (%s) refused twice while a GPU had the slices and memory free (%q); allocated: %s", round, name, c.profileOf[name], c.refusal, state)
			c.deletePods(t, ctx, again)
		}
		maxLive = max(maxLive, len(live))
		c.checkMockMatches(t, ctx, fmt.Sprintf("round %d, %d pods running", round, len(live)))
		// Delete down to 2-5 running pods (at least one each round).
		keep := max(0, min(len(live)-1, 2+rng.IntN(4)))
		rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		c.deletePods(t, ctx, live[keep:]...)
		live = live[:keep]
	}
	state := c.allocated(t, ctx)
	c.checkMockMatches(t, ctx, "after the churn")
	t.Logf("churn (seed %d): %d pods created, %d refused (%d of them twice while a GPU had the slices and memory free), %d placed when asked again, at most %d running; left running: %s",
		migChurnSeed, created, refused, refusedWithRoom, placedOnRetry, maxLive, state)

	// Free the GPU with the fewer compute slices in use; the other keeps
	// its pods. The freed GPU must take the largest profile.
	gpus := c.migGPUs()
	free, busy := gpus[0], gpus[1]
	if state.usedCompute(free) > state.usedCompute(busy) {
		free, busy = busy, free
	}
	var onFree []string
	for _, name := range live {
		if state.gpuOfPod[name] == free {
			onFree = append(onFree, name)
		}
	}
	c.deletePods(t, ctx, onFree...)
	live = slices.DeleteFunc(live, func(name string) bool { return slices.Contains(onFree, name) })
	c.pod(t, ctx, "largest", migLargest)
	if !c.waitRunningOrRefused(t, ctx, "largest") {
		t.Fatalf("%s refused on GPU %d, whose %d pods are gone; allocated: %s", migLargest, free, len(onFree), c.allocated(t, ctx))
	}
	after := c.allocated(t, ctx)
	if got := after.gpuOfPod["largest"]; got != free {
		t.Errorf("%s landed on GPU %d, want the freed GPU %d", migLargest, got, free)
	}
	c.checkMockMatches(t, ctx, fmt.Sprintf("%s on GPU %d beside %d pods on GPU %d", migLargest, free, len(live), busy))
	t.Logf("GPU %d freed (%d pods deleted): %s placed there while GPU %d keeps %d pods: %s", free, len(onFree), migLargest, busy, len(live), after)

	// Every pod gone: both GPUs whole again, one largest profile each.
	c.deletePods(t, ctx, append(live, "largest")...)
	c.checkMockMatches(t, ctx, "every pod gone")
	for _, name := range []string{"largest-a", "largest-b"} {
		c.pod(t, ctx, name, migLargest)
	}
	for _, name := range []string{"largest-a", "largest-b"} {
		if !c.waitRunningOrRefused(t, ctx, name) {
			t.Fatalf("%s refused with no other pod on the node; allocated: %s", name, c.allocated(t, ctx))
		}
	}
	final := c.allocated(t, ctx)
	c.checkMockMatches(t, ctx, "two "+migLargest)
	t.Logf("every churn pod gone: two %s placed: %s", migLargest, final)
	c.deletePods(t, ctx, "largest-a", "largest-b")
	if gis := c.mockInstances(t); len(gis) != 0 {
		t.Errorf("GPU instances left in the mock machine after every pod is gone: %v", gis)
	}
}

func pickProfile(rng *rand.Rand) string {
	total := 0
	for _, m := range migChurnMix {
		total += m.weight
	}
	r := rng.IntN(total)
	for _, m := range migChurnMix {
		if r < m.weight {
			return m.profile
		}
		r -= m.weight
	}
	return migChurnMix[0].profile
}

// migChurn is the churn's fixtures: its namespace, the published MIG
// devices and the mock machine's state directory.
type migChurn struct {
	ns       string
	stateDir string
	// devices are the node's published MIG devices by name.
	devices map[string]churnDevice
	// profileOf is each pod's profile.
	profileOf map[string]string
	// refusal is the scheduler's message of the last refused pod.
	refusal string
}

// churnDevice is what a published MIG device says of itself.
type churnDevice struct {
	gpu                  int
	parentUUID           string
	profile              string
	start, memorySlices  int
	computeSlices, total int
	memory               int64 // bytes
}

func newMIGChurn(t *testing.T, n *realNode) *migChurn {
	t.Helper()
	ctx := framework.Context(t, 2*time.Minute)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: migChurnClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == "mig"`, framework.DriverName, framework.DriverName)}}}},
	}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceClasses().Delete(context.Background(), migChurnClass, metav1.DeleteOptions{})
	})
	c := &migChurn{ns: cp.CreateNamespace(t, "real-migchurn"), devices: map[string]churnDevice{}, profileOf: map[string]string{},
		stateDir: filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mock-nvml")}
	published, err := n.WaitForDevices(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range published {
		if stringAttr(d, "type") != "mig" {
			continue
		}
		var md churnDevice
		var ok [4]bool
		md.parentUUID = stringAttr(d, "parentUUID")
		md.profile = stringAttr(d, "profile")
		var v int64
		v, ok[0] = intAttr(d, "index")
		md.gpu = int(v)
		v, ok[1] = intAttr(d, "memorySlices")
		md.memorySlices = int(v)
		v, ok[2] = intAttr(d, "computeSlices")
		md.computeSlices = int(v)
		v, ok[3] = intAttr(d, "totalComputeSlices")
		md.total = int(v)
		// The name ends in the placement's first memory slice (mig.DeviceName).
		start, err := strconv.Atoi(d.Name[strings.LastIndexByte(d.Name, '-')+1:])
		if err != nil || md.parentUUID == "" || md.profile == "" || slices.Contains(ok[:], false) {
			t.Fatalf("MIG device %s lacks what this test reads (index, parentUUID, profile, memorySlices, computeSlices, totalComputeSlices, placement in the name): %+v", d.Name, d.Attributes)
		}
		md.start = start
		if m, ok := d.Capacity["memory"]; ok {
			md.memory = m.Value.Value()
		}
		c.devices[d.Name] = md
	}
	if got := c.migGPUs(); len(got) != 2 {
		t.Fatalf("dynamic MIG on GPUs %v, want two (demo/node-config.yaml: 6 and 7)", got)
	}
	for _, p := range append([]string{migLargest}, "1g.10gb", "2g.20gb", "3g.40gb") {
		tmpl := &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: templateOf(p), Namespace: c.ns},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: migChurnClass,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
						Expression: fmt.Sprintf(`device.attributes[%q].profile == %q`, framework.DriverName, p)}}}}}},
			}}},
		}
		if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(c.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func templateOf(profile string) string {
	return "mig-" + strings.NewReplacer(".", "-", "+", "-").Replace(profile)
}

// migGPUs are the indexes of the GPUs that publish MIG devices, in order.
func (c *migChurn) migGPUs() []int {
	var out []int
	for _, d := range c.devices {
		if !slices.Contains(out, d.gpu) {
			out = append(out, d.gpu)
		}
	}
	slices.Sort(out)
	return out
}

// pod creates a workload pod whose claim, from a template, is one MIG
// device of the profile.
func (c *migChurn) pod(t *testing.T, ctx context.Context, name, profile string) {
	t.Helper()
	pod := workloadPod(c.ns, name)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "mig", ResourceClaimTemplateName: ptr.To(templateOf(profile))}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "mig"}}
	if _, err := cp.Client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.profileOf[name] = profile
}

// waitRunningOrRefused waits until the pod runs (true) or the scheduler
// refuses it (false). No pod is being deleted meanwhile, so a refusal
// stands: the test waits for each deletion to finish.
func (c *migChurn) waitRunningOrRefused(t *testing.T, ctx context.Context, name string) bool {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	pod, err := cp.WaitForPod(wctx, c.ns, name, "running or unschedulable", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning || podUnschedulable(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == v1.PodRunning {
		return true
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == v1.PodScheduled {
			c.refusal = cond.Message
		}
	}
	// The refusal stands: see that it stays so.
	time.Sleep(2 * time.Second)
	pod, err = cp.Client.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != "" {
		if _, err := cp.WaitForPodRunning(wctx, c.ns, name); err != nil {
			t.Fatal(err)
		}
		return true
	}
	return false
}

// podUnschedulable: the scheduler refused the pod for its devices. Before
// the kube-controller-manager made the pod's claim from its template, or
// before the scheduler's informer saw it, the scheduler says Unschedulable
// too: that is a wait, which a loaded machine makes last longer than the two
// seconds once given to it, not a refusal.
func podUnschedulable(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
			return !slices.ContainsFunc(claimNotMadeYet, func(s string) bool { return strings.Contains(cond.Message, s) })
		}
	}
	return false
}

// claimNotMadeYet are the scheduler's words for a pod whose claim does not
// exist yet: resourceclaim.ErrClaimNotFound (1.37), the older plugin's
// message, and the claim lister's not-found.
var claimNotMadeYet = []string{"ResourceClaim not created yet", "waiting for dynamic resource controller", "not found"}

// deletePods deletes pods and waits until they and their claims are gone:
// the claims unprepared (the MIG devices destroyed) and deallocated.
func (c *migChurn) deletePods(t *testing.T, ctx context.Context, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := cp.Client.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims, err := cp.Client.ResourceV1().ResourceClaims(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if slices.Contains(names, p.Name) {
				return false, nil
			}
		}
		return len(claims.Items) == len(pods.Items), nil
	})
	if err != nil {
		t.Fatalf("pods %v and their claims not gone: %v", names, err)
	}
}

// churnAllocation is what the API has allocated of the node's MIG GPUs.
type churnAllocation struct {
	// devices are the allocated MIG devices by name.
	devices map[string]churnDevice
	// gpuOfPod is the GPU of each pod's device.
	gpuOfPod map[string]int
	// gpus is every dynamic MIG GPU with its totals.
	gpus map[int]churnGPU
}

// churnGPU is a dynamic MIG GPU's totals: compute slices, memory slices
// (the largest placement's end) and memory (its largest MIG device's: the
// full profile's, 80 GiB on the mock H100, twice 3g.40gb's).
type churnGPU struct {
	compute, memorySlices int
	memory                int64
}

// allocated reads the claims of the namespace: every allocated device
// must be one of the published MIG devices.
func (c *migChurn) allocated(t *testing.T, ctx context.Context) churnAllocation {
	t.Helper()
	a := churnAllocation{devices: map[string]churnDevice{}, gpuOfPod: map[string]int{}, gpus: map[int]churnGPU{}}
	for _, d := range c.devices {
		g := a.gpus[d.gpu]
		a.gpus[d.gpu] = churnGPU{compute: d.total, memorySlices: max(g.memorySlices, d.start+d.memorySlices), memory: max(g.memory, d.memory)}
	}
	claims, err := cp.Client.ResourceV1().ResourceClaims(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, claim := range claims.Items {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			d, ok := c.devices[r.Device]
			if r.Driver != framework.DriverName || r.Pool != realNodeName || !ok {
				t.Fatalf("claim %s got %s/%s/%s, not one of the node's MIG devices", claim.Name, r.Driver, r.Pool, r.Device)
			}
			if _, twice := a.devices[r.Device]; twice {
				t.Fatalf("device %s allocated to two claims", r.Device)
			}
			a.devices[r.Device] = d
			for _, ref := range claim.Status.ReservedFor {
				a.gpuOfPod[ref.Name] = d.gpu
			}
		}
	}
	return a
}

func (a churnAllocation) usedCompute(gpu int) int {
	used := 0
	for _, d := range a.devices {
		if d.gpu == gpu {
			used += d.computeSlices
		}
	}
	return used
}

// roomFor tells whether some GPU had the compute slices, as many free
// memory slices and the memory the profile needs, wherever they sit (the
// "room" of BENCHMARKS.md's packing figures): a refusal with room is one
// for where the instances sit, not for lack of capacity.
func (c *migChurn) roomFor(a churnAllocation, profile string) bool {
	var need churnDevice
	for _, d := range c.devices {
		if d.profile == profile {
			need = d
		}
	}
	for gpu, total := range a.gpus {
		var usedSlices int
		var usedMemory int64
		for _, d := range a.devices {
			if d.gpu == gpu {
				usedSlices += d.memorySlices
				usedMemory += d.memory
			}
		}
		if total.compute-a.usedCompute(gpu) >= need.computeSlices && total.memorySlices-usedSlices >= need.memorySlices &&
			total.memory-usedMemory >= need.memory {
			return true
		}
	}
	return false
}

func (a churnAllocation) String() string {
	var parts []string
	for _, gpu := range slices.Sorted(func(yield func(int) bool) {
		for g := range a.gpus {
			if !yield(g) {
				return
			}
		}
	}) {
		var names []string
		for name, d := range a.devices {
			if d.gpu == gpu {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("GPU %d (%d/%d compute slices) %v", gpu, a.usedCompute(gpu), a.gpus[gpu].compute, names))
	}
	return strings.Join(parts, "; ")
}

// churnGI is one GPU instance of the mock machine: its GPU's UUID and its
// placement, with its compute instances.
type churnGI struct {
	uuid        string
	start, size int
	cis         int
}

func (g churnGI) String() string {
	return fmt.Sprintf("%s@%d+%d(%d CIs)", g.uuid, g.start, g.size, g.cis)
}

// mockInstances reads the GPU instances of the plugin's mock machine from
// its state file (pkg/nvdev/nvmock/mockstate.go), as a GPU keeps them.
func (c *migChurn) mockInstances(t *testing.T) []churnGI {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.stateDir, "mock-*.json"))
	if err != nil || len(files) != 1 {
		t.Fatalf("want one mock machine state file in %s, found %v (%v)", c.stateDir, files, err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var state struct {
		GPUs []struct {
			UUID string `json:"uuid"`
			GIs  []struct {
				Start uint32            `json:"start"`
				Size  uint32            `json:"size"`
				CIs   []json.RawMessage `json:"computeInstances"`
			} `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &state); err != nil {
		t.Fatalf("mock machine state %s: %v", files[0], err)
	}
	var out []churnGI
	for _, g := range state.GPUs {
		for _, gi := range g.GIs {
			out = append(out, churnGI{uuid: g.UUID, start: int(gi.Start), size: int(gi.Size), cis: len(gi.CIs)})
		}
	}
	slices.SortFunc(out, func(a, b churnGI) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// checkMockMatches waits (the kubelet unprepares a claim as its pod
// terminates, and the state file follows each change) until the mock
// machine's GPU instances are exactly the allocated MIG devices, each
// with one compute instance, and fails if they never are.
func (c *migChurn) checkMockMatches(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	var got, want []churnGI
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		want = nil
		for _, d := range c.allocated(t, ctx).devices {
			want = append(want, churnGI{uuid: d.parentUUID, start: d.start, size: d.memorySlices, cis: 1})
		}
		slices.SortFunc(want, func(a, b churnGI) int { return strings.Compare(a.String(), b.String()) })
		got = c.mockInstances(t)
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("%s: the mock machine's GPU instances %v are not the allocated MIG devices %v", when, got, want)
	}
	t.Logf("%s: %d GPU instances in the mock machine = the %d allocated MIG devices (agreed after %v)", when, len(got), len(want), time.Since(start).Round(time.Millisecond))
}
