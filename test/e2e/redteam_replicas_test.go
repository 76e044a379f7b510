package e2e

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// Issue 26 item 4, as the tenant runs it against two controller replicas.
// Replica A is the red team's controller; replica B is a second one in
// this process, run with A's options as a second pod of the chart runs
// with the first's args: a follower of A's leader-election lease, serving
// the webhook with A's certificate. The API server calls the webhook at
// one address, a switch in front of the replicas (the chart's Service),
// which the test points at one replica at a time; and B reaches the API
// server through a proxy that can hold back its ResourceClaim watch.
//
// Both replicas run in the test process rather than beside the chart's
// pod (TestRealNode/TwoControllerReplicas): the route needs the red
// team's tenant, peer and Kueue Job, and steering each admission to one
// replica, which a switch does at once while a Service's endpoints change
// only for connections the API server has yet to open.

// redTeamSettleWait is past the controller's settleDelay (3 s, pkg/controller/admission/reservation.go):
// after it, a replica whose cache shows a claim drops the claim's
// reservation at its next write of the book.
const redTeamSettleWait = 4 * time.Second

// redTeamWebhookSwitch is the webhook's address for the red team's
// replicas, closed when the test ends (after the controllers).
func redTeamWebhookSwitch(t *testing.T) *framework.TCPSwitch {
	t.Helper()
	sw, err := framework.NewTCPSwitch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sw.Close(); err != nil {
			t.Errorf("closing the webhook switch: %v", err)
		}
	})
	return sw
}

// asReplicaBehind makes o a replica whose webhook the API server reaches
// through sw, electing a leader as the chart's replicas do.
func asReplicaBehind(o *controller.Options, sw *framework.TCPSwitch) {
	sw.SwitchTo(webhookAddr(*o))
	o.Webhook.URL = "https://" + sw.Addr()
	o.LeaderElection, o.LeaderElectionNamespace = true, "default"
	o.LeaderElectionID = uniqueName("redteam-controller")
}

// attackLaggingReplica: with the Job holding one of its two units, the
// tenant takes the second through A. Past A's settle delay the cohort
// goes on (its peer's claim, through A), and A's write of the cohort's
// book drops the tenant's reservation: A's cache shows the claim. B's
// claim watch has been held back since before that claim, so B sees
// neither the claim nor its reservation; the tenant asks B for a third
// unit. B must refuse it, or fail closed, not admit it; and once its
// watch is released it refuses by quota, and admits the peer within its
// limit (the containment check, which runs through B).
func attackLaggingReplica(t *testing.T, ctx context.Context, env *redTeamEnv) {
	b := startLaggingReplica(t, ctx, env)
	b.watch.Hold()
	second, err := env.claims().Create(ctx, gpuClaim(env.ns, "second", "gpu.gpuaas.io", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the tenant's second unit, through replica A: %v", err)
	}
	time.Sleep(redTeamSettleWait)
	peerClaim := gpuClaim(env.peerNS, uniqueName("busy-peer"), "gpu.gpuaas.io", 1)
	peer, err := cp.Client.ResourceV1().ResourceClaims(env.peerNS).Create(ctx, peerClaim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the peer's unit, through replica A: %v", err)
	}
	expectSettledBy(t, ctx, peer.UID, second.UID)

	switchWebhook(t, ctx, env.webhook, b.webhook)
	_, err = env.claims().Create(ctx, gpuClaim(env.ns, "third", "gpu.gpuaas.io", 1), metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Error("replica B, whose claim watch lags, admitted a third unit against a limit of 2")
	case strings.Contains(err.Error(), "behind the quota ledger"):
		t.Logf("failed closed as expected: %v", err)
	default:
		refused(t, err, `TenantQuota "`+env.tenant+`" exceeded`)
	}
	b.watch.Release()
	_, err = env.claims().Create(ctx, gpuClaim(env.ns, "fourth", "gpu.gpuaas.io", 1), metav1.CreateOptions{})
	refused(t, err, `TenantQuota "`+env.tenant+`" exceeded`)
	// The peer's unit back, for the containment check's peer claim.
	if err := cp.Client.ResourceV1().ResourceClaims(env.peerNS).Delete(ctx, peer.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// laggingReplica is replica B.
type laggingReplica struct {
	watch   *framework.HoldingProxy // between B and the API server
	webhook string                  // where B serves the webhook
}

// startLaggingReplica runs replica B until the test ends, and switches
// the webhook back to A then.
func startLaggingReplica(t *testing.T, ctx context.Context, env *redTeamEnv) *laggingReplica {
	t.Helper()
	proxy, err := framework.NewHoldingProxy(cp.Config, "resourceclaims")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := proxy.Close(); err != nil {
			t.Errorf("closing replica B's proxy: %v", err)
		}
	})
	ports, err := framework.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	o := env.replicaA
	o.Webhook.Port, o.HealthAddr = ports[0], net.JoinHostPort(o.Webhook.Host, strconv.Itoa(ports[1]))
	o.Webhook.URL = "https://" + webhookAddr(o)
	// A's certificate, which the webhook configuration A wrote trusts;
	// B neither writes it nor the configuration, nor removes them.
	o.Webhook.ExternalCerts, o.Webhook.ConfigOwnedByChart, o.Webhook.RemoveOnExit = true, true, false

	// B runs until the test's clean-up, not the route's deadline.
	rctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.Background().WithName("dra-controller-b")))
	rc := &runningController{cancel: cancel, done: make(chan error, 1)}
	go func() { rc.done <- controller.Run(rctx, proxy.Config(cp.Config), o) }()
	t.Cleanup(func() { rc.stop(t) })
	waitForReplicaReady(t, ctx, rc, "http://"+o.HealthAddr+"/readyz")
	t.Cleanup(func() {
		// The route's context may be done by now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		switchWebhook(t, ctx, env.webhook, webhookAddr(env.replicaA))
	})
	return &laggingReplica{watch: proxy, webhook: webhookAddr(o)}
}

// webhookAddr is where a replica serves its webhook.
func webhookAddr(o controller.Options) string {
	return net.JoinHostPort(o.Webhook.Host, strconv.Itoa(o.Webhook.Port))
}

// switchWebhook points the webhook's address at the replica serving on
// addr, and returns once the API server's calls reach it: one sent on a
// kept-alive connection the switch has just closed fails ("failed calling
// webhook"), so a dry run of a claim no quota covers is repeated until a
// webhook answers it.
func switchWebhook(t *testing.T, ctx context.Context, sw *framework.TCPSwitch, addr string) {
	t.Helper()
	sw.SwitchTo(addr)
	probe := gpuClaim(metav1.NamespaceDefault, "webhook-probe", "gpu.gpuaas.io", 1)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = cp.Client.ResourceV1().ResourceClaims(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil || !strings.Contains(last.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatalf("the API server's webhook calls did not reach %s: %v (last: %v)", addr, err, last)
	}
}

// waitForReplicaReady polls the replica's readiness: its webhook serves
// and its caches have synced.
func waitForReplicaReady(t *testing.T, ctx context.Context, rc *runningController, url string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		rc.alive(t)
		return answersOK(ctx, url)
	})
	if err != nil {
		t.Fatalf("replica B not ready: %v", err)
	}
}

// expectSettledBy checks the route's premise in the quota ledger: the
// book that reserved the claim just admitted no longer reserves the
// settled one, and records how far a replica's cache must have got. Were
// it still reserved, a lagging replica would count it and the route would
// prove nothing.
func expectSettledBy(t *testing.T, ctx context.Context, admitted, settled types.UID) {
	t.Helper()
	// The red team's controller keeps its books in the default namespace.
	books, err := cp.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "gpuaas.io/quota-ledger=true"})
	if err != nil {
		t.Fatal(err)
	}
	var book *corev1.ConfigMap
	for i := range books.Items {
		if strings.Contains(books.Items[i].Data["reservations"], string(admitted)) {
			book = &books.Items[i]
		}
	}
	switch {
	case book == nil:
		t.Fatalf("no quota book reserves claim %s", admitted)
	case strings.Contains(book.Data["reservations"], string(settled)) || book.Data["settledResourceVersion"] == "":
		t.Fatalf("book %s still reserves claim %s %v after replica A's cache showed it (settled resourceVersion %q): "+
			"the route needs it dropped", book.Name, settled, redTeamSettleWait, book.Data["settledResourceVersion"])
	}
	t.Logf("book %s: the tenant's claim settled, settledResourceVersion %s", book.Name, book.Data["settledResourceVersion"])
}
