# syntax=docker/dockerfile:1
# Parley in a container: a builder stage compiles the cgo binary (llama.cpp inside), a slim runtime stage runs it as
# a non-root user with the model on a volume.
#
#   docker build -t parley .                               # SIMD x86-64-v3 (AVX2/FMA/F16C): runs on most x86-64
#   docker build --build-arg MARCH=native -t parley .      # the build host's best; runs only on CPUs like it
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/models:/models:ro" parley    # serves /models/model.gguf
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/models:/models:ro" -e PARLEY_MODEL=/models/other.gguf parley
#   docker run ... parley --ctx 4096 --threads 8                                  # flags after the image name
#
# The examples publish on the host's loopback only: inside the container Parley listens on every interface (a
# container's loopback is its own), so -p decides who reaches it. Before publishing beyond the host, give it a key:
#   docker run --rm -p 8000:8000 -e PARLEY_API_KEY="$(openssl rand -hex 16)" -v "$PWD/models:/models:ro" parley
#
# Docker cannot run on the project's own machines, so scripts/dockerfile-check.sh (part of `make test`) runs this
# file's go build with the same flags, checks that the runtime stage's packages satisfy the binary's libraries, and
# runs the binary with the runtime ENV and the HEALTHCHECK command. The cgo flags match scripts/env.sh.

FROM golang:1.26-bookworm AS builder
# SIMD level for ggml's C/C++ kernels (gcc -march).
ARG MARCH=x86-64-v3
# llama.cpp's headers that Go module zips leave out (see NATIVE-BUILD.md); miniaudio's stand-in is in llm/native.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nlohmann-json3-dev libstb-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ENV CGO_ENABLED=1 \
    CGO_CPPFLAGS="-I/src/llm/native" \
    CGO_CFLAGS="-O3 -march=${MARCH}" \
    CGO_CXXFLAGS="-O3 -march=${MARCH}"
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build cache mount keeps the compiled llama.cpp (about 3 minutes on 2 cores) across image builds.
RUN --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -o /parley ./cmd/parley

FROM debian:bookworm-slim
# The binary links libstdc++ and libgcc_s besides libc (ldd); ca-certificates for model downloads over HTTPS.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libstdc++6 libgcc-s1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/parley parley \
 && mkdir /models \
 && chown parley:parley /models
COPY --from=builder /parley /usr/local/bin/parley
USER parley
WORKDIR /home/parley
VOLUME /models
EXPOSE 8000
ENV PARLEY_ADDR=0.0.0.0:8000 \
    PARLEY_MODEL=/models/model.gguf
# `parley healthcheck` GETs /health on PARLEY_ADDR (503 while the model loads); slim images have no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=2m --retries=3 \
    CMD ["/usr/local/bin/parley", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/parley"]
