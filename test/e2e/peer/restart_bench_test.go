package peer

import (
	"context"
	"fmt"
	"os"
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
func BenchmarkPeerRestart(b *testing.B) {
	if cp == nil {
		b.Skipf("%s is not set: NVIDIA's plugin is not built (make bench-peer)", envPlugin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p := startBoth(ctx, b, "peer-restart")
	node, gpuaas, nv := p.node, p.gpuaas, p.nv
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
		fmt.Sprintf("load before %s, after %s (/proc/loadavg)", loadBefore, loadavg()),
	}
	t.print(os.Stdout)
}
