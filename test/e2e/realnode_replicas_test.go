package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// The chart runs two controller replicas behind the webhook Service. On
// this one-node cluster the chart's controller pod is on the host network,
// so a second pod would collide on its ports; the second replica is the
// same binary run by the test with the args and environment the chart
// renders for the Deployment (ports moved), under a token of the chart's
// ServiceAccount, and reached by the apiserver through an extra
// EndpointSlice of the chart's Service: the apiserver picks one of the two
// endpoints for every connection it opens, as it does for two pods.

const (
	replicaClaims = 50
	replicaLimit  = 10
	replicaRounds = 3
	// maxReplicaRounds bounds the extra rounds run while no round was
	// spread over both replicas.
	maxReplicaRounds = 8
	claimWebhook     = "/validate-resourceclaim"
)

// testTwoControllerReplicas: 50 claims created at once, spread by the
// apiserver over both replicas, against room for 10 GPU units, in several
// rounds: never more than 10 admitted, and both replicas decided some in
// the same round. The apiserver keeps a connection to one endpoint for as
// long as it stays open, so a round may go to one replica only (seen under
// load: [0 50]); rounds go on, up to maxReplicaRounds, until one was
// spread.
func testTwoControllerReplicas(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 8*time.Minute)
	first := chartControllerReplica(t, ctx)
	dep := renderedControllerDeployment(t, ctx, n)
	second := startSecondReplica(t, ctx, dep)
	addEndpoint(t, ctx, dep.Name+"-webhook", first.ip, second.webhookPort) // the chart's Service

	installCRDs(t)
	ns := cp.CreateNamespace(t, "replicas")
	class, tenant := uniqueName("replicas-h100"), uniqueName("replicas")
	createObject(t, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: "NVIDIA H100 80GB HBM3"}))
	waitForProfile(t, class, "matching the node's whole GPUs", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices > 0 })
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units(strconv.Itoa(replicaLimit))}))
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	spread := 0
	for round := 0; round < replicaRounds || (spread == 0 && round < maxReplicaRounds); round++ {
		before := [2]int{first.reviews(t, ctx), second.reviews(t, ctx)}
		admitted := createConcurrently(t, ctx, ns, class, round)
		after := [2]int{first.reviews(t, ctx), second.reviews(t, ctx)}
		served := [2]int{after[0] - before[0], after[1] - before[1]}
		t.Logf("round %d: %d of %d claims admitted against a limit of %d GPU units; reviews served: chart pod %d, second replica %d",
			round, admitted, replicaClaims, replicaLimit, served[0], served[1])
		if admitted > replicaLimit {
			t.Errorf("round %d: %d claims admitted against a limit of %d", round, admitted, replicaLimit)
		}
		if admitted == 0 {
			t.Errorf("round %d: no claim admitted with the quota free", round)
		}
		if served[0] > 0 && served[1] > 0 {
			spread++
		}
		deleteClaims(t, ctx, ns)
		waitForQuota(t, tenant, "empty again", func(q *gpuaas.TenantQuota) bool {
			return q.Status.ClaimsCounted == 0 && (q.Status.Reserved.GpuUnits == nil || q.Status.Reserved.GpuUnits.IsZero())
		})
	}
	if spread == 0 {
		t.Errorf("in no round of %d were the reviews spread over both replicas", maxReplicaRounds)
	}
	checkChartTrimsAlternatives(t, ctx, ns, class)
	first.alive(t, ctx)
	if exited, err := second.process.Exited(); exited {
		t.Errorf("the second replica exited: %v\n%s", err, second.process.Tail(30))
	}
}

// controllerReplica is one dra-controller of the release.
type controllerReplica struct {
	ip          string // where the apiserver reaches it (the node's address)
	webhookPort int
	metricsPort int
	process     *framework.Process // nil for the chart's pod
	pod         string
}

// chartControllerReplica is the controller pod the chart runs.
func chartControllerReplica(t *testing.T, ctx context.Context) *controllerReplica {
	t.Helper()
	pods, err := cp.ComponentPods(ctx, releaseNamespace, "controller")
	if err != nil || len(pods) != 1 || pods[0].Status.PodIP == "" {
		t.Fatalf("want the one running controller pod of the release: %d pods, %v", len(pods), err)
	}
	pod := pods[0]
	r := &controllerReplica{ip: pod.Status.PodIP, pod: pod.Name}
	for _, p := range pod.Spec.Containers[0].Ports {
		switch p.Name {
		case "webhook":
			r.webhookPort = int(p.ContainerPort)
		case "metrics":
			r.metricsPort = int(p.ContainerPort)
		}
	}
	return r
}

// alive fails the test if the chart's pod restarted meanwhile.
func (r *controllerReplica) alive(t *testing.T, ctx context.Context) {
	t.Helper()
	pod, err := cp.Client.CoreV1().Pods(releaseNamespace).Get(ctx, r.pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("controller pod %s restarted %d times", pod.Name, s.RestartCount)
		}
	}
}

// reviews is how many claim reviews the replica answered, from
// controller-runtime's webhook metric.
func (r *controllerReplica) reviews(t *testing.T, ctx context.Context) int {
	t.Helper()
	code, body, err := scrapeMetrics(ctx, r.metricsPort, serviceAccountToken(t, ctx, scraperAccount, metricsReaderRole))
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d", code)
	}
	if err != nil {
		t.Fatalf("metrics of the replica on port %d: %v", r.metricsPort, err)
	}
	// controller_runtime_webhook_requests_total of the claim webhook, over
	// its status codes.
	n, err := sumMetric(strings.NewReader(body), "controller_runtime_webhook_requests_total", `webhook="`+claimWebhook+`"`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sumMetric(r io.Reader, name, label string) (int, error) {
	total := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		total += int(v)
	}
	return total, sc.Err()
}

// startSecondReplica runs the controller binary as the chart's Deployment
// would run a second pod: its args and environment from `helm template`
// with the installed values, its ServiceAccount's token.
func startSecondReplica(t *testing.T, ctx context.Context, dep *appsv1.Deployment) *controllerReplica {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.ServiceAccountKubeconfig(ctx, releaseNamespace, dep.Spec.Template.Spec.ServiceAccountName, kubeconfig); err != nil {
		t.Fatal(err)
	}
	binary, err := framework.Build(ctx, dir, "cmd/dra-controller")
	if err != nil {
		t.Fatal(err)
	}
	ports, err := framework.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	r := &controllerReplica{webhookPort: ports[0], metricsPort: ports[1]}
	args := replicaArgs(dep.Spec.Template.Spec.Containers[0].Args, map[string]string{
		"--webhook-port":     strconv.Itoa(ports[0]),
		"--metrics-addr":     fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--health-addr":      fmt.Sprintf("127.0.0.1:%d", ports[2]),
		"--webhook-cert-dir": filepath.Join(dir, "certs"),
	})
	r.process = framework.NewProcess("dra-controller-2", binary, filepath.Join(cp.LogDir, "dra-controller-replica-2.log"),
		append(args, "--kubeconfig="+kubeconfig)...)
	r.process.Env = []string{"POD_NAMESPACE=" + releaseNamespace}
	if err := r.process.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.process.Stop(); err != nil {
			t.Logf("stopping the second replica: %v", err)
		}
	})
	waitForReadyz(t, ctx, r.process, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2]))
	return r
}

// renderedControllerDeployment is the controller Deployment of the chart
// with the installed release's values.
func renderedControllerDeployment(t *testing.T, ctx context.Context, n *realNode) *appsv1.Deployment {
	t.Helper()
	values, err := n.WriteValues("values-replica.yaml", n.values)
	if err != nil {
		t.Fatal(err)
	}
	out, err := framework.RunHelm(ctx, helmBin(t), "template", releaseName, framework.ChartPath,
		"--namespace", releaseNamespace, "-f", values, "--kube-version", serverVersion(t), "--show-only", "templates/controller.yaml")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, doc := range strings.Split(out, "\n---") {
		var dep appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &dep); err == nil && dep.Kind == "Deployment" {
			return &dep
		}
	}
	t.Fatalf("no Deployment in the chart's controller.yaml:\n%s", out)
	return nil
}

// replicaArgs are the chart's args with the flags in moved replaced.
func replicaArgs(chart []string, moved map[string]string) []string {
	args := make([]string, 0, len(chart))
	for _, a := range chart {
		flag, _, _ := strings.Cut(a, "=")
		if v, ok := moved[flag]; ok {
			a = flag + "=" + v
		}
		args = append(args, a)
	}
	return args
}

func waitForReadyz(t *testing.T, ctx context.Context, p *framework.Process, url string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("exited: %w", err)
		}
		return answersOK(ctx, url)
	})
	if err != nil {
		t.Fatalf("second replica not ready: %v\n%s", err, p.Tail(30))
	}
}

// addEndpoint gives the chart's webhook Service a second endpoint, in a
// slice of its own that the EndpointSlice controller leaves alone.
func addEndpoint(t *testing.T, ctx context.Context, service, ip string, port int) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-replica-2", Namespace: releaseNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   "e2e.gpuaas.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("webhook"), Port: ptr.To(int32(port)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	slices := cp.Client.DiscoveryV1().EndpointSlices(releaseNamespace)
	if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("adding the second replica to Service %s: %v", service, err)
	}
	t.Cleanup(func() {
		// The test's context may be done by now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := slices.Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("removing the second replica's endpoint: %v", err)
		}
	})
}

// createConcurrently creates replicaClaims claims of one GPU at once and
// returns how many were admitted; any answer but a quota denial fails.
func createConcurrently(t *testing.T, ctx context.Context, ns, class string, round int) int {
	t.Helper()
	var admitted atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range replicaClaims {
		wg.Go(func() {
			<-start
			err := createClaim(ctx, gpuClaim(ns, fmt.Sprintf("r%d-c%d", round, i), class, 1))
			switch {
			case err == nil:
				admitted.Add(1)
			case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded"): // denied by quota
			default:
				t.Errorf("claim %d: %v", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	return int(admitted.Load())
}

func deleteClaims(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	claims := cp.Client.ResourceV1().ResourceClaims(ns)
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := claims.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("claims of %s not gone: %v", ns, err)
	}
}

// checkChartTrimsAlternatives creates a claim asking for more GPUs than the
// tenant's limit, or else one: the chart's mutating webhook (its CA put in
// by the controller's rotator) drops the first alternative, and the claim
// is admitted for the second (issue 12 item 9).
func checkChartTrimsAlternatives(t *testing.T, ctx context.Context, ns, class string) {
	t.Helper()
	c := gpuClaim(ns, "too-many-or-one", "", 0)
	c.Spec.Devices.Requests[0].Exactly = nil
	sub := func(name string, count int64) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	}
	c.Spec.Devices.Requests[0].FirstAvailable = []resourceapi.DeviceSubRequest{sub("too-many", replicaLimit+1), sub("one", 1)}
	created, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a claim the tenant can have one GPU for: %v", err)
	}
	if alts := created.Spec.Devices.Requests[0].FirstAvailable; len(alts) != 1 || alts[0].Name != "one" {
		t.Errorf("stored alternatives %+v, want \"one\" alone", alts)
	}
	deleteClaims(t, ctx, ns)
}

// answersOK: a GET of url answers 200 OK; an error to connect is not yet,
// not a failure (the server is starting).
func answersOK(ctx context.Context, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, nil
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}
