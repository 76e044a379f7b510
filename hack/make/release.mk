# Release targets (issue 40): a versioned, multi-architecture release into
# _output/release, pushed to an OCI registry and installed from it.
# See docs/install.md (installing from a registry) and CHANGELOG.md.

.PHONY: version release release-bases release-cdi-hooks release-tools release-cross release-reproducible \
	release-push registry e2e-release release-qemu release-previous e2e-upgrade

RELEASE_DIR    := $(OUTPUT)/release
RELEASE_ARCHES ?= amd64 arm64
# The commit's time dates every file of the release (reproducible builds); given to hack/release
# only, not exported to every recipe.
SOURCE_DATE_EPOCH ?= $(shell hack/version.sh --date)
GIT_COMMIT ?= $(shell hack/version.sh --commit)
# What `make build` stamps into both binaries (--version).
VERSION_LDFLAGS = -X github.com/gpuaas/gpu-dra-driver/pkg/version.version=$(VERSION) \
	-X github.com/gpuaas/gpu-dra-driver/pkg/version.commit=$(GIT_COMMIT)

## version: the version hack/version.sh derives from git (binaries, image tag, chart)
version:
	@echo $(VERSION)

## release-cross: Debian's aarch64 cross gcc (cgo) and qemu-user-static, installed if missing
release-cross:
	hack/build-cross.sh

## release-tools: distribution's registry and crane from the Go module proxy into _output/bin (cached)
release-tools:
	hack/build-registry.sh

## release-bases: the image base of each release architecture from Debian packages into
## _output/release/image-base-<arch> (cached)
release-bases: release-cross
	for a in $(RELEASE_ARCHES); do \
		DEBS_CACHE=$(RELEASE_DIR)/debs IMAGE_BASE_ARCH=$$a IMAGE_BASE_OUT=$(RELEASE_DIR)/image-base-$$a \
			hack/build-image-base.sh || exit 1; done

## release-cdi-hooks: nvidia-cdi-hook for each release architecture into _output/release/cdi-hook-<arch>, static, and
## dynamically linked into its nvml-hook/ (cached)
release-cdi-hooks: release-cross
	for a in $(RELEASE_ARCHES); do \
		CDI_HOOK_ARCH=$$a KUBE_BIN_DIR=$(RELEASE_DIR)/cdi-hook-$$a hack/build-cdi-hook.sh && \
		CDI_HOOK_ARCH=$$a CDI_HOOK_LINK=dynamic KUBE_BIN_DIR=$(RELEASE_DIR)/cdi-hook-$$a/nvml-hook hack/build-cdi-hook.sh || exit 1; done

RELEASE_PLATFORMS = $(foreach a,$(RELEASE_ARCHES),--platform $(a)=$(RELEASE_DIR)/image-base-$(a)/rootfs,$(RELEASE_DIR)/cdi-hook-$(a)/nvidia-cdi-hook,$(RELEASE_DIR)/cdi-hook-$(a)/nvml-hook/nvidia-cdi-hook)
RELEASE_FLAGS = --version $(VERSION) --revision $(GIT_COMMIT) --source-date-epoch $(SOURCE_DATE_EPOCH) \
	--repository $(IMAGE) --helm $(BIN)/helm $(RELEASE_PLATFORMS)

## release: the release into _output/release: the image for linux/amd64 and linux/arm64 as one image
## index (OCI layout image/ and its .oci.tar), the chart (.tgz, version and appVersion = VERSION), a
## CycloneDX SBOM and SHA256SUMS; prints the listing (also in release.txt)
release: helm release-bases release-cdi-hooks
	$(GO) run ./hack/release $(RELEASE_FLAGS) --out $(RELEASE_DIR) | tee $(RELEASE_DIR)/release.txt

## release-reproducible: builds the release a second time, from a copy of the commit (git archive HEAD,
## so edits made meanwhile cannot leak in) with an empty Go build cache, into _output/release/rebuild,
## and fails unless every digest and checksum is the same (run it on a clean work tree)
release-reproducible: release
	rm -rf $(RELEASE_DIR)/rebuild
	src=$$(mktemp -d) && cache=$$(mktemp -d) && trap 'rm -rf "$$src" "$$cache"' EXIT && \
		git archive HEAD | tar -x -C "$$src" && cd "$$src" && \
		GOCACHE=$$cache $(GO) run ./hack/release $(RELEASE_FLAGS) --out $(RELEASE_DIR)/rebuild | tee $(RELEASE_DIR)/rebuild.txt
	hack/release-compare.sh $(RELEASE_DIR)/release.txt $(RELEASE_DIR)/rebuild.txt

## registry: distribution's registry on REGISTRY (default 127.0.0.1:5000), storage in
## _output/release/registry, in the foreground (Ctrl-C stops it)
REGISTRY ?= 127.0.0.1:5000
registry: release-tools
	hack/run-registry.sh $(REGISTRY) $(RELEASE_DIR)/registry

## release-push: pushes the built release to REGISTRY: the image index to
## REGISTRY/gpuaas/gpu-dra-driver:VERSION (crane), the chart to oci://REGISTRY/gpuaas/charts (crane push of its OCI layout)
release-push: release-tools helm
	hack/release-push.sh $(REGISTRY) $(RELEASE_DIR) $(VERSION)

## e2e-release: the real node installs the release from a local registry (TestInstallFromRegistry):
## containerd pulls the image index, helm installs oci://127.0.0.1:PORT/gpuaas/charts/gpuaas-dra
e2e-release: k8s-bins node-bins helm driver-userspace image-base release-tools release
	E2E_REQUIRED=1 RELEASE_DIR=$(RELEASE_DIR) RELEASE_VERSION=$(VERSION) $(GO) test -count=1 -timeout 20m \
		./test/e2e -run 'TestInstallFromRegistry$$' -v

## release-qemu: the release's arm64 binaries under qemu-user (no binfmt): --version, --help, and the
## kubelet plugin on a mock machine publishing to a real API server (TestArm64PluginUnderQemu)
release-qemu: k8s-bins release
	E2E_REQUIRED=1 RELEASE_DIR=$(RELEASE_DIR) $(GO) test -count=1 -timeout 15m \
		./test/e2e -run 'TestArm64PluginUnderQemu$$' -v

## release-previous: the previous release (hack/release/previous: a commit and its version), its
## amd64 image index and chart built from git archive of that commit into
## _output/release-previous/<commit> (cached: the commit fixes its sources)
PREVIOUS_COMMIT  = $(shell sed -n 's/^commit=//p' hack/release/previous)
PREVIOUS_VERSION = $(shell sed -n 's/^version=//p' hack/release/previous)
PREVIOUS_DIR     = $(OUTPUT)/release-previous/$(PREVIOUS_COMMIT)
release-previous: helm release-bases release-cdi-hooks
	IMAGE=$(IMAGE) hack/release-previous.sh $(PREVIOUS_DIR)

## e2e-upgrade: TestUpgradeFromPreviousRelease: the real node installs the previous release from a
## local registry, runs pods of every kind, helm upgrade to this release, helm rollback, nothing leaked
e2e-upgrade: k8s-bins node-bins helm driver-userspace image-base release-tools release release-previous
	E2E_REQUIRED=1 RELEASE_DIR=$(RELEASE_DIR) RELEASE_VERSION=$(VERSION) \
		PREVIOUS_RELEASE_DIR=$(PREVIOUS_DIR) PREVIOUS_RELEASE_VERSION=$(PREVIOUS_VERSION) \
		$(GO) test -count=1 -timeout 40m ./test/e2e -run 'TestUpgradeFromPreviousRelease$$' -v
