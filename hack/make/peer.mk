# Side by side with NVIDIA's DRA driver (issue 37): its unmodified gpu-kubelet-plugin, built from a
# snapshot of kubernetes-sigs/dra-driver-nvidia-gpu kept outside this tree (the Go module proxy does
# not serve that module, so this is no part of CI), and ours on one simulated 8 x H100 node, measured
# by one Go benchmark (test/e2e/peer) in one run. See BENCHMARKS.md.

# NVIDIA_DRA_SRC: the snapshot's source tree (with its vendor/). NVIDIA_DRA_COMMIT names it in the
# table; a git checkout names itself, a `git archive` extract needs it given.
NVIDIA_DRA_SRC ?=
NVIDIA_DRA_COMMIT ?= $(shell git -C "$(NVIDIA_DRA_SRC)" rev-parse --short HEAD 2>/dev/null || echo "unknown commit")
PEER_OUT := $(OUTPUT)/peer
# PEER_BENCH: which of test/e2e/peer's benchmarks (PeerRestart: the restart rows alone, PEER_RESTART_ROUNDS runs of them, 3 by default, 4 minutes);
# the scheduler's half on kwok runs only with the whole table.
PEER_BENCH ?= Peer

.PHONY: bench-peer

## bench-peer: NVIDIA's DRA plugin and ours side by side on one simulated 8 x H100, one table
## (NVIDIA_DRA_SRC=<its source tree> is required; about 4 min to build theirs cold, then about 33 min,
## most of it NVIDIA's 1,000 background prepares on each of two nodes), then the scheduler on 100 kwok
## nodes that publish the slices both plugins published there (BenchmarkPeerShapes, about 6 min).
## PEER_SLICES_ONLY=1: the slices only, not the prepares
bench-peer: k8s-bins cdi-hook kwok
	@if [ -z "$(NVIDIA_DRA_SRC)" ] || [ ! -f "$(NVIDIA_DRA_SRC)/cmd/gpu-kubelet-plugin/main.go" ]; then \
		echo "bench-peer: NVIDIA_DRA_SRC='$(NVIDIA_DRA_SRC)' is not a source tree of kubernetes-sigs/dra-driver-nvidia-gpu" >&2; \
		echo "  (no cmd/gpu-kubelet-plugin/main.go there). Fetch a snapshot outside this tree, e.g." >&2; \
		echo "  git clone https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu /work/nvidia-dra-src," >&2; \
		echo "  and run: make bench-peer NVIDIA_DRA_SRC=/work/nvidia-dra-src" >&2; \
		exit 2; \
	fi
	mkdir -p $(PEER_OUT)
	cd "$(NVIDIA_DRA_SRC)" && GOWORK=off GOFLAGS=-mod=vendor $(GO) build -o $(PEER_OUT)/gpu-kubelet-plugin ./cmd/gpu-kubelet-plugin
	PEER_NVIDIA_PLUGIN=$(PEER_OUT)/gpu-kubelet-plugin \
	PEER_NVIDIA_VERSION="$$(cat "$(NVIDIA_DRA_SRC)/VERSION" 2>/dev/null) $(NVIDIA_DRA_COMMIT)" \
	PEER_SLICES_OUT=$(PEER_OUT)/slices \
	E2E_REQUIRED=1 $(GO) test -count=1 ./test/e2e/peer -run '^$$' -bench '^Benchmark$(PEER_BENCH)$$' -benchtime 1x -timeout 110m -v
	[ "$(PEER_BENCH)" != Peer ] || PEER_SLICES_DIR=$(PEER_OUT)/slices \
	E2E_REQUIRED=1 $(GO) test -count=1 ./test/e2e/scale -run '^$$' -bench PeerShapes -benchtime 1x -timeout 60m -v
