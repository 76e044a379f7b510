# gpuaas-dra: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
# go-nvml's cgo header marks some calls deprecated; the warnings are noise.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# One compile of each package for go vet, the tests' binaries and the
# images: the images (and the release) must build with -trimpath, so
# everything else does too. Without it a cold `make test` compiled the whole
# dependency graph once more, for go vet and the e2e test binary
# (docs/development.md, "On a cold machine"). Paths in test output are then
# module paths (github.com/gpuaas/gpu-dra-driver/...), not the checkout's.
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)

OUTPUT      := $(CURDIR)/_output
BIN         := $(OUTPUT)/bin
TOOLS       := $(OUTPUT)/tools
KUBE_BIN_DIR ?= $(BIN)
export KUBE_BIN_DIR

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)

.PHONY: all build test unit lint validate-next plugin-next k8s-next-check test-next e2e e2e-recovery e2e-repeat soak test-versions k8s-versions demo bench bench-scale bench-controller-fleet k8s-bins node-bins generate generate-docs helm kueue kwok prometheus image image-base cdi-hook driver-userspace fmt vet clean

IMAGE   ?= ghcr.io/gpuaas/gpu-dra-driver
# One version from git (hack/version.sh): binaries, image tag, chart. Read
# once per make run (:=), so a commit made while a long target runs cannot
# give its later recipes (a test's RELEASE_VERSION) another version than the
# release built at its start.
ifndef VERSION
VERSION := $(shell hack/version.sh)
endif

CONTROLLER_GEN_VERSION := v0.23.0

all: build

# Each area's own targets (release, simulated NVML library, ...): hack/make/*.mk
include $(wildcard hack/make/*.mk)

## build: the two binaries into _output/bin
build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/ ./cmd/...

## test: everything CI runs: lint, unit tests with -race, 1.38's validation of what we write, e2e on a real control plane
test: lint unit validate-next e2e

## unit: unit tests (race detector on); the e2e package is excluded here
# -timeout: go test's default of 10 minutes a package is too short on a cold
# machine (load 6-16 here).
# hack/image/release's TestBuildReleaseImage builds both cgo binaries with the
# release's flags (a go build of its own, compiled packages shared with go vet's
# through -trimpath) and gzips and hashes them into layers, all on one goroutine:
# nothing for the race detector to find, and under it that took 4.5x as long
# (143 s against 31 s warm, 469 s in a cold run). It runs once, without -race.
unit: helm prometheus
	$(GO) test -race -count=1 -timeout 30m -skip '^TestBuildReleaseImage$$' $$($(GO) list ./... | grep -v /test/e2e)
	$(GO) test -count=1 -timeout 30m -run '^TestBuildReleaseImage$$' ./hack/image/release

## lint: gofmt, and golangci-lint (pinned), whose govet runs every analyzer of `go vet`
# No separate `go vet ./...`: golangci-lint v2.15's govet runs the analyzers cmd/vet of Go 1.26 runs
# (its defaultAnalyzers list them), on tests too, and a second vet only analysed every dependency
# again for its facts (minutes on a cold cache, docs/development.md).
lint: $(GOLANGCI_LINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLS)/golangci-lint $@

## k8s-bins: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kubelet (cached)
k8s-bins:
	hack/build-k8s-bins.sh

## validate-next: every object the project writes (the plugin's slices for every node configuration, healthy
## and tainted; the catalog's classes; the shapes' templates: hack/writtenobjects) checked by Kubernetes 1.38's
## own validation (hack/validate-next, a module of its own on the 1.38 modules and Go 1.27, which the go command
## fetches from the module proxy through GOTOOLCHAIN)
VALIDATE_NEXT_TOOLCHAIN ?= go1.27.4
validate-next:
	rm -rf $(OUTPUT)/written-objects
	$(GO) run ./hack/writtenobjects -out $(OUTPUT)/written-objects
	cd hack/validate-next && GOTOOLCHAIN=$(VALIDATE_NEXT_TOOLCHAIN) WRITTEN_OBJECTS=$(OUTPUT)/written-objects $(GO) test -count=1 -v ./...

## plugin-next: the kubelet plugin built and its packages' unit tests run on the next minor's (1.38) libraries
## (hack/plugin-next.sh: a copy of go.mod in _output/plugin-next with the k8s.io modules at v0.38.0-beta.0,
## read through -modfile, on Go 1.27 and -tags k8s138; the project's go.mod is not touched; not in `make test`)
plugin-next:
	hack/plugin-next.sh $(PLUGIN_NEXT_VERSION)

# the versions nextVersionCases (test/e2e/versions_test.go) names
K8S_NEXT_CASES ?= v1.38.0-beta.0
## k8s-next-check: whether the module proxy serves what the next minor's (1.38) control plane and kubelet need,
## each module it refuses named; when nothing is refused, those four built with the Go toolchain their go.mod
## asks for into _output/k8s/<version> (exit 3 while something is refused; not in `make test`)
k8s-next-check:
	hack/k8s-next-check.sh $(K8S_NEXT_VERSION)

## test-next: the next minor's cases of the version tests (nextVersionCases: what its API server keeps of our
## slices, what a user asks under its scheduler and controller-manager) on the control plane k8s-next-check
## builds; its exit 4 (the kubelet alone not built) is no failure, as these tests run no kubelet; then TestRealNode
## (the chart on a real node) on that control plane with the suite's own kubelet (not in `make test`)
test-next: k8s-bins node-bins helm driver-userspace image-base cdi-hook
	hack/k8s-next-check.sh $(K8S_NEXT_VERSION) || [ $$? = 4 ]
	E2E_REQUIRED=1 E2E_K8S_VERSIONS="$(K8S_NEXT_CASES)" $(GO) test -count=1 -timeout 20m ./test/e2e \
		-run 'TestSlicesOnEachAPIServer/1.38|TestUserCasesOnEachControlPlane/1.38' -v
	@echo "== TestRealNode on the $(K8S_NEXT_CASES) control plane, the suite's own kubelet (a skew, as an upgrade runs it)"
	E2E_REQUIRED=1 E2E_SUITE_K8S=$(K8S_NEXT_CASES) E2E_SUITE_GATES=defaults E2E_SUITE_KUBELET_K8S=own \
		$(GO) test -count=1 -timeout 30m ./test/e2e -run 'TestRealNode$$' -v

## node-bins: containerd, its runc shim, ctr and runc for the real node, plus the CNI plugins (cached)
node-bins:
	hack/build-node-bins.sh

## helm: Helm v3.22.0 from the Go module proxy into _output/bin (cached)
helm:
	hack/build-helm.sh

## kueue: the Kueue manager (pinned v0.19.2) from the Go module proxy into _output/bin, its CRDs into _output/kueue (cached)
kueue:
	hack/build-kueue.sh

## kwok: kwok (pinned v0.8.0) from the Go module proxy into _output/bin, its stages into _output/kwok (cached)
kwok:
	hack/build-kwok.sh

## prometheus: Prometheus and promtool from Debian bookworm's prometheus package (pinned 2.42.0+ds-5+deb12u1)
## into _output/bin, and the Prometheus Operator's CRDs (v0.81.0) into _output/prometheus-operator, for the
## monitoring mixin's tests (cached)
prometheus:
	hack/build-prometheus.sh

## driver-userspace: NVIDIA's driver userspace (535.261.03, Debian non-free) unpacked, never installed, as a
## host install's driver root into _output/driver-userspace/host: the real node's driver root (cached)
driver-userspace:
	hack/build-driver-userspace.sh

## image-base: the images' runtime base (glibc for the cgo binaries) from Debian packages (cached)
image-base:
	hack/build-image-base.sh

## cdi-hook: NVIDIA's nvidia-cdi-hook at the nvidia-container-toolkit version go.mod pins (cached), static into
## _output/bin, and dynamically linked into _output/bin/nvml-hook (the one that loads NVML, for memory limits)
cdi-hook:
	hack/build-cdi-hook.sh
	CDI_HOOK_LINK=dynamic KUBE_BIN_DIR=$(BIN)/nvml-hook hack/build-cdi-hook.sh

## image: the release image (both binaries, nvidia-cdi-hook, glibc) as an OCI archive, without Docker or a
## registry: $(IMAGE_TAR). Push: skopeo copy oci-archive:$(IMAGE_TAR) docker://$(IMAGE):$(VERSION)
IMAGE_TAR ?= $(OUTPUT)/images/gpu-dra-driver-$(VERSION).oci.tar
image: image-base cdi-hook
	$(GO) run ./hack/image --version $(VERSION) --repository $(IMAGE) \
		--base-rootfs $(OUTPUT)/image-base/rootfs --cdi-hook $(BIN)/nvidia-cdi-hook \
		--nvml-hook $(BIN)/nvml-hook/nvidia-cdi-hook --out $(IMAGE_TAR)

## k8s-versions: the control plane (kube-apiserver, kube-scheduler, kube-controller-manager) of each older
## Kubernetes minor the version tests run (cached); K8S_VERSIONS picks them (make e2e: the oldest supported, v1.34)
K8S_VERSIONS ?= v1.34 v1.35 v1.36
K8S_VERSION_COMPONENTS ?= kube-apiserver kube-scheduler kube-controller-manager
k8s-versions:
	for v in $(K8S_VERSIONS); do hack/build-k8s-version.sh $$v $(K8S_VERSION_COMPONENTS) || exit 1; done

## e2e: tests against a real control plane, a real node (kubelet, containerd, runc) running
## the Helm chart, and simulated nodes, plus a small run of the scale benchmark; never skipped
## here. One package at a time (-p 1): each runs its own control plane on this 2-core machine.
e2e: k8s-bins node-bins helm kueue kwok prometheus driver-userspace image-base cdi-hook
	$(MAKE) k8s-versions K8S_VERSIONS=v1.34
	E2E_REQUIRED=1 E2E_K8S_VERSIONS=v1.34.4 $(GO) test -p 1 -count=1 -timeout 45m ./test/e2e/... \
		-skip '$(E2E_RECOVERY_TESTS)' -v

# The real-node tests of what survives a crash that make e2e leaves to make e2e-recovery (time budget)
E2E_RECOVERY_TESTS = ^(TestRealNodeNodeEvents|TestRealNodeBilling)$$

## e2e-recovery: what survives a crash, on real nodes of their own (not in `make test`, which they would take
## past its 40-minute budget; about 7 minutes): the node's events (kubelet, containerd and API server restarts,
## a full records disk, a reboot) and the billing records across two leader kills and an API server outage
e2e-recovery: k8s-bins node-bins helm driver-userspace image-base cdi-hook
	E2E_REQUIRED=1 $(GO) test -count=1 -timeout 30m ./test/e2e -run '$(E2E_RECOVERY_TESTS)' -v

## test-versions: the version matrix (1.34, 1.35, 1.36 with default and documented gates, and the suite's
## own): what each API server keeps of the plugin's slices, and what a user asks (whole, replica, share,
## dynamic MIG, firstAvailable, pods queued through a plugin restart) under that version's scheduler and
## controller-manager: docs/install.md's table, and docs/reference/version-matrix.md (written when all pass)
## Then TestRealNode (the chart on a real node: that version's kubelet, containerd, runc) per version
## (REAL_NODE_VERSIONS) and gate setting (REAL_NODE_GATES: documented, defaults), the whole suite's control plane of that version
REAL_NODE_VERSIONS ?= v1.34.4 v1.35.4 v1.36.3
# docs: the gates docs/install.md names for the version; defaults: none set
REAL_NODE_GATES ?= docs defaults
test-versions: k8s-bins node-bins helm driver-userspace image-base cdi-hook
	$(MAKE) k8s-versions K8S_VERSION_COMPONENTS="kube-apiserver kube-scheduler kube-controller-manager kubelet"
	E2E_REQUIRED=1 E2E_K8S_VERSIONS="v1.34.4 v1.35.4 v1.36.3" E2E_MATRIX_OUT=$(CURDIR)/docs/reference/version-matrix.md \
		$(GO) test -count=1 -timeout 40m ./test/e2e -run 'TestSlicesOnEachAPIServer|TestUserCasesOnEachControlPlane' -v
	for v in $(REAL_NODE_VERSIONS); do for g in $(REAL_NODE_GATES); do \
		echo "== TestRealNode on $$v, gates: $$g"; \
		E2E_REQUIRED=1 E2E_SUITE_K8S=$$v E2E_SUITE_GATES=$$g $(GO) test -count=1 -timeout 30m ./test/e2e \
			-run 'TestRealNode$$' -v || exit 1; \
	done; done

## e2e-repeat: the e2e suite RUNS times (default 5), then each test's pass rate (hack/flakereport); LOAD=N
## busy loops beside it, RUN=regexp and COUNT=n to repeat a few tests. Streams in _output/e2e-repeat/
e2e-repeat: k8s-bins node-bins helm kueue kwok prometheus driver-userspace image-base cdi-hook
	hack/e2e-repeat.sh

## soak: TestRealNodeSoak, SOAK_DURATION (default 30m) of churn on the real node (pods of every kind, XIDs, a lost
## GPU, a plugin restart, a controller leader change), sampled every minute; the report goes to SOAK_REPORT
SOAK_DURATION ?= 30m
SOAK_REPORT ?= $(OUTPUT)/soak-report.md
soak: k8s-bins node-bins helm kueue driver-userspace image-base cdi-hook
	E2E_REQUIRED=1 SOAK_DURATION=$(SOAK_DURATION) SOAK_REPORT=$(SOAK_REPORT) $(GO) test -count=1 -timeout 3h ./test/e2e \
		-run 'TestRealNodeSoak$$' -v

## demo: a real control plane, a simulated 8 x H100 node, the demo specs
demo: k8s-bins node-bins helm kueue prometheus driver-userspace image-base cdi-hook
	$(GO) run ./hack/demo $(DEMO_FLAGS)

## bench: the Go benchmarks reported in BENCHMARKS.md
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./pkg/...

## bench-scale: the real scheduler on 100 and 500 kwok nodes of 8 x H100 (our plugin's slices), every
## device mode; prints the tables of BENCHMARKS.md "Scale". SCALE_NODES=100 for one size (~45 min for both)
bench-scale: k8s-bins kwok
	E2E_REQUIRED=1 $(GO) test ./test/e2e/scale -run '^$$' -bench Scale -benchtime 1x -timeout 3h -v

## bench-controller-fleet: the dra-controller binary (the chart's flags, one replica) on 1,000 and 5,000 kwok
## nodes of ours plus 5,000 slices of another driver while slices churn: dry-run admission p50/p99 through the
## API server, RSS and heap (BENCHMARKS.md, issue 52). FLEET_NODES=1000 for one size; FLEET_BASELINE=<ref> adds
## the controller of that commit, same run
bench-controller-fleet: k8s-bins kwok
	E2E_REQUIRED=1 $(GO) test ./test/e2e/scale -run '^$$' -bench ControllerWhileSlicesChurn -benchtime 1x -timeout 3h -v

## generate: deepcopy, CRD manifests (config/crd), the chart's catalog schema from api/gpuaas, and the generated docs
generate:
	$(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION) \
		object paths=./api/gpuaas/... crd paths=./api/gpuaas/... output:crd:artifacts:config=config/crd
	cp config/crd/*.yaml deployments/helm/gpuaas-dra/crds/
	$(GO) run ./hack/chartschema
	$(MAKE) generate-docs

## generate-docs: the chart's README (values reference), docs/reference/crds.md and docs/reference/flags.md (hack/docgen)
generate-docs:
	$(GO) run ./hack/docgen

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(OUTPUT)
