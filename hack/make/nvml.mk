# The simulated NVML library (issue 37): hack/nvmlshim built with -buildmode=c-shared as a
# libnvidia-ml.so.1 that answers NVML's C API from our simulated machines (pkg/nvdev/nvmock).
# See docs/simulated-nvml.md.

NVML_OUT := $(OUTPUT)/nvml
NVML_LIB := $(NVML_OUT)/libnvidia-ml.so.1

.PHONY: nvml-lib nvml-test nvml-stubs

## nvml-lib: the simulated NVML library as _output/nvml/libnvidia-ml.so.1 (about 4 min cold on 2 busy cores,
## 30 s warm), and nvmlprobe (reads a driver root as --nvml real does) beside it
nvml-lib:
	$(GO) build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libnvidia-ml.so.1 -o $(NVML_LIB) ./hack/nvmlshim
	rm -f $(NVML_OUT)/libnvidia-ml.so.h
	$(GO) build -o $(NVML_OUT)/nvmlprobe ./hack/nvmlshim/nvmlprobe

## nvml-test: the library's own tests (they build it, cached under _output/nvml/cache) and the plugin's
## --nvml real e2e test on it (one control plane, two simulated nodes)
nvml-test:
	$(GO) test -count=1 ./hack/nvmlshim/...
	E2E_REQUIRED=1 $(GO) test -count=1 ./test/e2e -run 'TestSimulatedNVMLLibrary$$' -v

## nvml-stubs: regenerate hack/nvmlshim/zz_stubs.c (NOT_SUPPORTED for every nvml.h function not implemented)
nvml-stubs:
	cd hack/nvmlshim && $(GO) generate
