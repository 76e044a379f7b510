package peer

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// BenchmarkPeerRestart is the restart rows of BenchmarkPeer alone, for
// working on a plugin's start: both plugins on one simulated 8 x H100
// node, 100 admin-access claims prepared with each, then `restarts`
// SIGKILLs and starts each, in PEER_RESTART_ROUNDS runs (3 by default),
// each run's table printed and then each row's ratios side by side. About
// 4 minutes, where BenchmarkPeer takes half an hour:
//
//	make bench-peer NVIDIA_DRA_SRC=... PEER_BENCH=PeerRestart
//
// The cluster also holds claims of other nodes, as many as the whole
// table leaves by its restart rows (PEER_RESTART_CLUSTER_CLAIMS, 2,400 by
// default): a start that reads every claim in the cluster pays for them
// here too, as it did there, where run alone it did not.
func BenchmarkPeerRestart(b *testing.B) {
	if cp == nil {
		b.Skipf("%s is not set: NVIDIA's plugin is not built (make bench-peer)", envPlugin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p := startBoth(ctx, b, "peer-restart")
	node, gpuaas, nv := p.node, p.gpuaas, p.nv
	others, err := clusterClaims()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := createClaims(ctx, gpuaas, "elsewhere", "peer-elsewhere", gpus, others, false); err != nil {
		b.Fatal(err)
	}
	rounds, err := restartRounds()
	if err != nil {
		b.Fatal(err)
	}
	drivers := []*driver{gpuaas, nv}
	held := map[*driver]*drapb.Claim{}
	for _, d := range drivers {
		claims, err := createClaims(ctx, d, prefix(d, "restartbg"), node.Name, gpus, 100, true)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.prepareInBatches(ctx, claims, 50); err != nil {
			b.Fatal(err)
		}
		held[d] = claims[0]
	}
	// Rounds alternate the plugins, so a moment of load falls on both.
	var runs []*table
	for round := range rounds {
		loadBefore := loadavg()
		t := &table{drivers: drivers}
		for _, d := range drivers {
			if err := measureRestart(ctx, t, node, d, held[d]); err != nil {
				b.Fatalf("%v\n%s log %s:\n%s", err, d.label, d.proc.LogPath, d.proc.Tail(30))
			}
		}
		t.header = []string{
			fmt.Sprintf("\nrun %d of %d: gpuaas %s, NVIDIA %s, one node %q, %d restarts each, %d CPUs", round+1, rounds, gpuaas.version, nv.version, node.Name, restarts, numCPU()),
			fmt.Sprintf("%d claims of other nodes in the cluster", others),
			fmt.Sprintf("load before %s, after %s (/proc/loadavg)", loadBefore, loadavg()),
		}
		t.print(os.Stdout)
		runs = append(runs, t)
	}
	printSpread(os.Stdout, runs)
}

// restartRounds is how many times BenchmarkPeerRestart runs its rows in
// one command: PEER_RESTART_ROUNDS, 3 by default. The rows moved between
// 0.43x and 1.79x from run to run; one run carries no claim.
func restartRounds() (int, error) { return envCount("PEER_RESTART_ROUNDS", 3, 1) }

// clusterClaims is how many claims of other nodes BenchmarkPeerRestart
// makes: PEER_RESTART_CLUSTER_CLAIMS, or about what BenchmarkPeer's
// cluster holds by its restart rows.
func clusterClaims() (int, error) { return envCount("PEER_RESTART_CLUSTER_CLAIMS", 2400, 0) }

// envCount reads a count from the environment: def when unset, an error
// naming the variable when it is not a number of at least least.
func envCount(name string, def, least int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		return 0, fmt.Errorf("%s=%q: want a count of at least %d", name, v, least)
	}
	return n, nil
}
