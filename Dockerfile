# One image with both binaries of the gpu.gpuaas.io DRA driver:
# /usr/bin/dra-kubelet-plugin (DaemonSet) and /usr/bin/dra-controller
# (Deployment); the Helm chart in deployments/helm/gpuaas-dra runs both.
#
#   docker build -t ghcr.io/gpuaas/gpu-dra-driver:0.1.0 .     (make image)

# Build stage. go-nvml needs cgo (it dlopens libnvidia-ml.so.1 from the
# driver root at run time, so no NVIDIA library is linked or shipped here).
FROM golang:1.26-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=1 \
    CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY config/ config/
COPY pkg/ pkg/
ARG VERSION=dev
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X github.com/gpuaas/gpu-dra-driver/pkg/cli.Version=${VERSION}" -o /out/ \
        ./cmd/dra-kubelet-plugin ./cmd/dra-controller

# Run stage: glibc (for the cgo binary), CA certificates, no shell, no
# package manager. The controller runs as the image's nonroot user; the
# kubelet plugin's pod asks for the privileges it needs.
FROM gcr.io/distroless/base-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="gpuaas-dra" \
      org.opencontainers.image.description="DRA driver for NVIDIA GPUs (gpu.gpuaas.io)" \
      org.opencontainers.image.source="https://github.com/gpuaas/gpu-dra-driver" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/dra-kubelet-plugin /out/dra-controller /usr/bin/
USER 65532:65532
ENTRYPOINT ["/usr/bin/dra-controller"]
