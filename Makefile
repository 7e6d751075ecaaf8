# Parley's build entry point: `make run` serves the chat on the test model, `make test` runs the whole suite.
#
# The cgo flags below must stay identical to scripts/env.sh (same variables, same values): the Go build cache is
# keyed on them, so any difference rebuilds llama.cpp (about 3 minutes on 2 cores).
#
#   make MARCH=native        build for this machine's best SIMD (default x86-64-v3: AVX2/FMA/F16C)
#   make run MODEL=path.gguf serve another model (ARGS='--ctx 4096' for more flags)
#
#   make cuda                the CUDA backend into lib/ollama (CUDA_ARCHITECTURES='80;86;89;90'; not part of test)
#
# Targets: setup build run test test-busy bench cuda bench-gpu ui fmt vet clean (see `make help`).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build
.DELETE_ON_ERROR:

GO ?= go
NPM ?= npm
# SIMD level for ggml's C/C++ kernels; PARLEY_MARCH is the variable scripts/env.sh reads.
MARCH ?= $(or $(PARLEY_MARCH),x86-64-v3)
# The model make run serves: the project's test copy of stories260K when it is beside the repository, else the same
# file from Hugging Face through Parley's own hf:// source (downloaded once into the model cache with progress,
# resumable, checked against MODEL_SHA256, the sha256 of the test copy).
SHARED_MODEL ?= ../shared/models/stories260K.gguf
MODEL_HF := hf://ggml-org/models/tinyllamas/stories260K.gguf
MODEL_SHA256 := 270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d
MODEL ?= $(if $(wildcard $(SHARED_MODEL)),$(SHARED_MODEL),$(MODEL_HF))
ARGS ?=
BIN := bin/parley

export PARLEY_MARCH := $(MARCH)
export CGO_ENABLED := 1
# PARLEY_NATIVE_INCLUDE: as in scripts/env.sh, one llm/native shared by several checkouts.
export CGO_CPPFLAGS := -I$(or $(PARLEY_NATIVE_INCLUDE),$(CURDIR)/llm/native)
export CGO_CFLAGS := -O3 -march=$(MARCH)
export CGO_CXXFLAGS := -O3 -march=$(MARCH)

# Debian packages the build and a run need (make run): the two header packages llama.cpp needs (NATIVE-BUILD.md),
# libffi8 for the current engine (yzma), cmake for its CPU backend. The tests add Python's websockets for the seed
# client, chromium for the browser test, redis-server and nginx, python3-jinja2 for the chat-template goldens, jq for
# the docs' runnable examples.
APT_RUN_PACKAGES := nlohmann-json3-dev libstb-dev libffi8 cmake ca-certificates curl
APT_PACKAGES := $(APT_RUN_PACKAGES) python3-websockets chromium redis-server nginx python3-yaml python3-jinja2 jq
# npm's own record of what `npm ci` installed; newer than the lock file means node_modules is current.
NODE_STAMP := scripts/node_modules/.package-lock.json

.PHONY: help setup setup-run setup-apt setup-apt-run setup-go setup-npm setup-engine setup-vision setup-engine-cuda setup-cuda setup-bench build run test test-busy bench cuda cuda-current bench-gpu ui fmt vet clean

help:
	@echo 'make setup   install Debian packages (only missing ones), Go modules, npm packages'
	@echo 'make build   build $(BIN) (MARCH=$(MARCH))'
	@echo 'make run     what running needs + build, then serve $(MODEL) (MODEL=..., ARGS=...)'
	@echo 'make test    setup + build, then scripts/test.sh (the full suite)'
	@echo 'make test-busy  the same suite while a CPU hog keeps every core busy (twice as many busy threads as cores)'
	@echo 'make bench   build ollama, llama-server and the synthetic models (F16, Q8_0, Q4_0), then tools/bench (BENCH_ARGS=...)'
	@echo 'make setup-vision  libmtmd beside the current engine'"'"'s libraries, for vision projectors (--mmproj)'
	@echo 'make setup-engine-cuda  the current engine'"'"'s CUDA build into lib/llama-current-cuda (143 MB; CUDA 13 runtime)'
	@echo 'make cuda    the CUDA backend into lib/ollama, where bin/parley finds it (CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES);'
	@echo '             installs Debian'"'"'s nvidia-cuda-toolkit if nvcc is missing; ~17 min per architecture on 2 cores)'
	@echo 'make cuda-current  the current engine'"'"'s CUDA and CPU backends built from its pinned source into lib/llama-current-cuda'
	@echo '             (CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES); NVIDIA'"'"'s nvcc 12 or 13; for a driver older than CUDA 13.1)'
	@echo 'make bench-gpu  the GPU benchmark (needs make cuda and a GPU): Parley vs raw decode vs Ollama'
	@echo 'make ui      rebuild the chat page bundle (npm run build-ui)'
	@echo 'make fmt | vet | clean'

setup: setup-apt setup-go setup-npm setup-engine setup-vision

# What make run needs, and nothing of the test tooling (npm's SDKs, chromium, redis, nginx): make test installs that.
setup-run: setup-apt-run setup-go setup-engine

# The current engine's libraries: the npm package pinned in scripts/engine, linked into lib/llama-current
# beside ggml's CPU backend compiled from the same source at $(MARCH) (about a minute on 2 cores; a re-run only checks):
# the package's prebuilt CPU variants took 1.7-2x as long over an F16 prompt (docs/notes/2026-11-27-cpu-backend-from-source.md).
# scripts/setup-current-engine.sh lays out the prebuilt variants instead, for a machine without a compiler.
ENGINE_STAMP := scripts/engine/node_modules/.package-lock.json
# The backend built for one MARCH, recorded beside it: a later make rebuilds it only when the package or the build
# script changed (the script would re-run cmake every time).
ENGINE_CPU_STAMP := lib/llama-current/.parley-cpu-$(MARCH)
setup-engine: $(ENGINE_CPU_STAMP)

$(ENGINE_CPU_STAMP): $(ENGINE_STAMP) scripts/build-current-backend.sh scripts/ggml-simd.sh
	scripts/build-current-backend.sh cpu
	@mkdir -p $(@D) && touch $@

# Vision: libmtmd from the same source, beside the current engine's libraries, so that a model's projector
# (--mmproj) runs. It compiles libllama from the source too, to link against, in the CPU backend's build folder:
# minutes on 2 cores the first time, a relink after. Part of the test setup (the image tests need it); not of
# setup-run (make run serves text models without it; `make setup-vision` adds it).
VISION_STAMP := lib/llama-current/.parley-mtmd-$(MARCH)
setup-vision: $(VISION_STAMP)

$(VISION_STAMP): $(ENGINE_CPU_STAMP) scripts/build-current-backend.sh
	scripts/build-current-backend.sh mtmd
	@touch $@

$(ENGINE_STAMP): scripts/engine/package.json scripts/engine/package-lock.json
	cd scripts/engine && $(NPM) ci --no-audit --no-fund --ignore-scripts
	@touch $@

# The current engine's CUDA build (143 MB download; NVIDIA's CUDA 13 runtime and a driver at run time): not part of
# setup or test. bin/parley takes lib/llama-current-cuda over lib/llama-current when it is there.
ENGINE_CUDA_STAMP := scripts/engine-cuda/node_modules/.package-lock.json
setup-engine-cuda: $(ENGINE_CUDA_STAMP)
	scripts/setup-current-engine.sh cuda

$(ENGINE_CUDA_STAMP): scripts/engine-cuda/package.json scripts/engine-cuda/package-lock.json
	cd scripts/engine-cuda && $(NPM) ci --no-audit --no-fund --ignore-scripts
	@touch $@

# apt only when something is missing, so that `make setup` works without root on a machine that has everything.
setup-apt: APT_WANT = $(APT_PACKAGES)
setup-apt-run: APT_WANT = $(APT_RUN_PACKAGES)
setup-apt setup-apt-run:
	@missing=""; \
	for p in $(APT_WANT); do \
	  case "$$(dpkg-query -W -f='$${db:Status-Abbrev}' "$$p" 2>/dev/null)" in ii*) ;; *) missing="$$missing $$p";; esac; \
	done; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -z "$$missing" ]; then echo "setup: Debian packages present"; exit 0; fi; \
	echo "setup: installing$$missing"; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null; then sudo="sudo"; \
	else echo "setup: need root to install:$$missing" >&2; exit 1; fi; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing

setup-go:
	@command -v $(GO) >/dev/null || { echo "setup: Go not found (need the version in go.mod; /usr/local/go/bin on PATH?)" >&2; exit 1; }
	$(GO) mod download

setup-npm: $(NODE_STAMP)

$(NODE_STAMP): scripts/package.json scripts/package-lock.json
	cd scripts && $(NPM) ci --no-audit --no-fund
	@touch $@

# go decides what is stale; `build` always asks it.
build:
	@mkdir -p bin
	$(GO) build -o $(BIN) ./cmd/parley

run: setup-run build
	@if [ "$(MODEL)" = "$(MODEL_HF)" ]; then \
	  echo "run: $(SHARED_MODEL) is not there: serving $(MODEL_HF) (downloaded once, sha256 $(MODEL_SHA256))"; \
	else echo "run: serving $(MODEL)"; fi
	./$(BIN) --model "$(MODEL)"$(if $(filter $(MODEL_HF),$(MODEL)), --model-sha256 $(MODEL_SHA256)) $(ARGS)

test: setup build
	scripts/test.sh

# The suite on a busy machine, as on a shared CI runner: scripts/busy.sh starts a bounded CPU hog of twice as
# many busy threads as cores (stress-ng when installed, else shell busy loops), runs the suite, and always stops it.
test-busy: setup build
	scripts/busy.sh scripts/test.sh

# The peers (ollama, same module version and CGO flags; llama-server and llama-quantize from a current llama.cpp
# snapshot, same SIMD level), the synthetic model and its Q8_0/Q4_0 copies (kept outside the repo, made once), then the
# measurements: the raw loop of each engine, Parley on each engine, llama-server and Ollama; writes BENCHMARKS.md.
# Not part of CI. BENCH_ARGS go to tools/bench after these and override them (e.g. BENCH_ARGS='-threads 2 -sessions 1,8').
# LLAMA_CPP_SRC: the llama.cpp checkout to build llama-server from (or PARLEY_LLAMA_CPP_SRC; required by make bench).
# BENCH_VOCAB: the synthetic models' vocabulary size, SmolLM2's by default (the donor's 512 tokens would make the output
# projection, log-probabilities and sampling nearly free); BENCH_VOCAB= measures the 512-token models of earlier runs.
BENCH_MODELS_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/parley/models
BENCH_VOCAB ?= 49152
BENCH_NAME := $(BENCH_MODELS_DIR)/synthetic-smollm2-135m$(if $(BENCH_VOCAB),-v$(BENCH_VOCAB))
BENCH_MODELS := $(BENCH_NAME)-f16.gguf,$(BENCH_NAME)-q8_0.gguf,$(BENCH_NAME)-q4_0.gguf
BENCH_ARGS ?=
bench: build setup-engine setup-bench
	scripts/build-ollama.sh
	scripts/build-llama-server.sh $(LLAMA_CPP_SRC)
	VOCAB_SIZE=$(BENCH_VOCAB) scripts/bench-models.sh $(BENCH_MODELS_DIR)
	$(GO) run ./tools/bench -parley $(BIN) -models '$(BENCH_MODELS)' \
	  -servers parley-embedded,parley-current,llama-server,ollama -raw-engines embedded,current -timeout 60m $(BENCH_ARGS)

# cmake for build-llama-server.sh (Debian's), installed only when missing.
setup-bench:
	@command -v cmake >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; \
	  else echo "bench: cmake is needed (apt-get install cmake)" >&2; exit 1; fi; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cmake; }

# The CUDA backend: ggml's CUDA source from the pinned module, compiled by nvcc into lib/ollama, which
# bin/parley finds as ../lib/ollama with no environment variable. Every kernel is compiled once per architecture:
# about 17 minutes per architecture on 2 cores, 3 on 16; the default covers Ampere (80, 86), Ada (89) and Hopper (90).
# CUDA_ARCHITECTURES=native builds for this machine's GPUs only. Never part of `make test`.
CUDA_ARCHITECTURES ?= 80;86;89;90
# Debian bookworm ships CUDA 11.8 as nvidia-cuda-toolkit in its non-free component; this source adds contrib and
# non-free for it (the default bookworm source has main only). Written only by `make cuda`, only when nvcc is missing.
CUDA_APT_SOURCE := /etc/apt/sources.list.d/parley-cuda.sources

cuda: setup-cuda
	CUDA_ARCHITECTURES='$(CUDA_ARCHITECTURES)' scripts/build-cuda.sh

# nvcc from NVIDIA's CUDA 12/13 (PATH, /usr/local/cuda or CUDACXX) is used as it is; without one, Debian's toolkit.
setup-cuda:
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || [ -n "$${CUDACXX:-}" ]; then 	  command -v cmake >/dev/null || { echo "cuda: cmake is needed (apt-get install cmake)" >&2; exit 1; }; 	  echo "cuda: using $$(command -v nvcc || echo $${CUDACXX:-/usr/local/cuda/bin/nvcc})"; exit 0; fi; 	. /etc/os-release; 	if [ "$${ID:-}" != debian ]; then echo "cuda: no nvcc; install NVIDIA's CUDA toolkit (12 or 13) and cmake" >&2; exit 1; fi; 	if [ "$$(id -u)" = 0 ]; then sudo=""; 	elif command -v sudo >/dev/null; then sudo="sudo"; 	else echo "cuda: need root to install nvidia-cuda-toolkit" >&2; exit 1; fi; 	echo "cuda: adding $(CUDA_APT_SOURCE) ($$VERSION_CODENAME contrib non-free) and installing nvidia-cuda-toolkit cmake"; 	printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' 	  "$$VERSION_CODENAME" "$$VERSION_CODENAME" | $$sudo tee $(CUDA_APT_SOURCE) >/dev/null; 	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q; 	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit cmake

# The current engine's CUDA backend compiled here (scripts/build-current-backend.sh): the prebuilt package above holds
# CUDA 13.1 PTX for Hopper and Ampere datacenter cards, which a driver for CUDA 13.0 or older cannot load. This
# compiles the same ggml source (node-llama-cpp's pinned bundle) with the toolkit at hand, beside the CPU libraries.
cuda-current: $(ENGINE_STAMP)
	CUDA_ARCHITECTURES='$(CUDA_ARCHITECTURES)' scripts/build-current-backend.sh cuda

bench-gpu:
	scripts/bench-gpu.sh $(BENCH_ARGS)

ui: setup-npm
	cd scripts && $(NPM) run build-ui

fmt:
	gofmt -l -w $$(find . -name '*.go' -not -path './scripts/node_modules/*' -not -path './.git/*')

vet:
	$(GO) vet ./...

clean:
	rm -rf bin test-results lib
