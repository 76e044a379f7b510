package framework

import (
	"fmt"
	"path/filepath"
)

// The command lines below are the ones measured in
// shared/notes/real-control-plane.md, with ports and paths made unique so
// several control planes (a test run and a demo) can share a machine.

func (cp *ControlPlane) etcd(clientPort, peerPort int) component {
	client := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	return component{
		name: "etcd",
		args: []string{
			"--name", "e2e",
			"--data-dir", filepath.Join(cp.Dir, "etcd"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "e2e=" + peer,
			// Throw-away data: durability buys nothing and costs seconds.
			"--unsafe-no-fsync",
			"--log-level", "warn",
		},
		healthURL: client + "/health",
	}
}

func (cp *ControlPlane) apiserver(port, etcdPort int, saKey, saPub, tokens string) component {
	const issuer = "https://kubernetes.default.svc"
	return component{
		name: "kube-apiserver",
		args: []string{
			"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
			"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--secure-port", fmt.Sprint(port),
			"--cert-dir", filepath.Join(cp.Dir, "apiserver"),
			// With a loopback advertise address the endpoint reconciler
			// only logs errors; nothing here needs the kubernetes Service.
			"--endpoint-reconciler-type", "none",
			"--service-account-issuer", issuer,
			"--service-account-key-file", saPub,
			"--service-account-signing-key-file", saKey,
			"--api-audiences", issuer,
			"--token-auth-file", tokens,
			// Real authorization, so RBAC rules of the chart can be tested.
			"--authorization-mode", "Node,RBAC",
			// As on real clusters: the kubelet plugin's DaemonSet is privileged.
			"--allow-privileged=true",
			// Webhooks and aggregated APIs are called at their endpoints, not
			// their ClusterIP: nothing routes ClusterIPs here (no kube-proxy),
			// and the real node's controller serves on the host network.
			"--enable-aggregator-routing=true",
			"--service-cluster-ip-range", "10.96.0.0/16",
			"--v", "1",
		},
		healthURL: fmt.Sprintf("https://127.0.0.1:%d/readyz", port),
	}
}

func (cp *ControlPlane) scheduler(port, verbosity, qps int) component {
	c := component{
		name: "kube-scheduler",
		args: []string{
			"--kubeconfig", cp.Kubeconfig,
			"--authentication-kubeconfig", cp.Kubeconfig,
			"--authorization-kubeconfig", cp.Kubeconfig,
			"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
			"--cert-dir", filepath.Join(cp.Dir, "kube-scheduler"),
			"--leader-elect=false",
			"--v", fmt.Sprint(verbosity),
		},
		healthURL: fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
	}
	if qps > 0 {
		c.args = append(c.args, fmt.Sprintf("--kube-api-qps=%d", qps), fmt.Sprintf("--kube-api-burst=%d", 2*qps))
	}
	return c
}

func (cp *ControlPlane) controllerManager(port, verbosity, qps int, saKey string) component {
	if qps == 0 {
		// The default 20 QPS would make claim creation from templates,
		// not scheduling, the limit of the throughput benchmark.
		qps = 200
	}
	return component{
		name: "kube-controller-manager",
		args: []string{
			"--kubeconfig", cp.Kubeconfig,
			"--authentication-kubeconfig", cp.Kubeconfig,
			"--authorization-kubeconfig", cp.Kubeconfig,
			"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
			"--cert-dir", filepath.Join(cp.Dir, "kube-controller-manager"),
			"--leader-elect=false",
			// All default controllers: resourceclaim (claims from templates,
			// reservedFor cleanup), serviceaccount, namespace, garbage
			// collector, node-lifecycle (hence the node heartbeats).
			"--controllers", "*",
			"--service-account-private-key-file", saKey,
			"--root-ca-file", filepath.Join(cp.Dir, "apiserver", "apiserver.crt"),
			// Each controller under its own ServiceAccount, as in a real
			// cluster: claims from templates are created by
			// system:serviceaccount:kube-system:resource-claim-controller,
			// the identity the quota webhook trusts for Kueue overrules.
			"--use-service-account-credentials=true",
			fmt.Sprintf("--kube-api-qps=%d", qps), fmt.Sprintf("--kube-api-burst=%d", 2*qps),
			"--v", fmt.Sprint(verbosity),
		},
		healthURL: fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
	}
}
