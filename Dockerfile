# syntax=docker/dockerfile:1
# Parley in a container: a builder stage compiles the cgo binary (the embedded llama.cpp inside), an engine stage lays
# out the current engine's libraries as `make setup-engine` does, and a slim runtime stage runs the binary as a non-root
# user with the model on a volume. The libraries sit in /usr/local/lib/llama-current, lib/llama-current beside the
# binary's bin/, where bin/parley looks for them, so the image runs the engine `make run` runs (--engine auto: the
# current one on the CPU); -e PARLEY_ENGINE=embedded picks the built-in one.
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
# runs the binary with the runtime ENV and the HEALTHCHECK command, laid out with the current engine beside it as the
# runtime stage lays it out. The cgo flags match scripts/env.sh.

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

# The current engine (llm/current.go): the pinned prebuilt llama.cpp libraries (npm ci in scripts/engine) beside ggml's
# CPU backend compiled from their own source at MARCH by scripts/build-current-backend.sh, as `make setup-engine` does
# (about a minute on 2 cores); cp -L turns the folder's links into the pinned package's files.
FROM golang:1.26-bookworm AS engine
ARG MARCH=x86-64-v3
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/engine/package.json scripts/engine/package-lock.json scripts/engine/
RUN cd scripts/engine && npm ci --no-audit --no-fund --ignore-scripts
COPY scripts/build-current-backend.sh scripts/ggml-simd.sh scripts/
RUN PARLEY_MARCH=${MARCH} BUILD_DIR=/tmp/current-build scripts/build-current-backend.sh cpu /src/lib/llama-current \
 && cp -rL /src/lib/llama-current /llama-current \
 && rm -rf /tmp/current-build

FROM debian:bookworm-slim
# The binary links libstdc++ and libgcc_s besides libc (ldd) and loads libffi at start (the current engine's calls go
# through it); ca-certificates for model downloads over HTTPS.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libstdc++6 libgcc-s1 libffi8 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/parley parley \
 && mkdir /models \
 && chown parley:parley /models
COPY --from=builder /parley /usr/local/bin/parley
COPY --from=engine /llama-current /usr/local/lib/llama-current
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
