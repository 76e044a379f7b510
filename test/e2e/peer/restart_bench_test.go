package peer

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPeerRestart is the restart rows of BenchmarkPeer alone, for
// working on a plugin's start: both plugins on one simulated 8 x H100
// node, 100 admin-access claims prepared with each, then `restarts`
// SIGKILLs and starts each. About 3 minutes, where BenchmarkPeer takes
// half an hour:
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
	loadBefore := loadavg()
	t := &table{drivers: []*driver{gpuaas, nv}}
	for _, d := range t.drivers {
		held, err := createClaims(ctx, d, prefix(d, "restartbg"), node.Name, gpus, 100, true)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.prepareInBatches(ctx, held, 50); err != nil {
			b.Fatal(err)
		}
		if err := measureRestart(ctx, t, node, d, held[0]); err != nil {
			b.Fatalf("%v\n%s log %s:\n%s", err, d.label, d.proc.LogPath, d.proc.Tail(30))
		}
	}
	t.header = []string{
		fmt.Sprintf("gpuaas %s, NVIDIA %s, one node %q, %d restarts each, %d CPUs", gpuaas.version, nv.version, node.Name, restarts, numCPU()),
		fmt.Sprintf("%d claims of other nodes in the cluster", others),
		fmt.Sprintf("load before %s, after %s (/proc/loadavg)", loadBefore, loadavg()),
	}
	t.print(os.Stdout)
}

// clusterClaims is how many claims of other nodes BenchmarkPeerRestart
// makes: PEER_RESTART_CLUSTER_CLAIMS, or about what BenchmarkPeer's
// cluster holds by its restart rows.
func clusterClaims() (int, error) {
	v := os.Getenv("PEER_RESTART_CLUSTER_CLAIMS")
	if v == "" {
		return 2400, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("PEER_RESTART_CLUSTER_CLAIMS=%q: want a count of claims", v)
	}
	return n, nil
}
