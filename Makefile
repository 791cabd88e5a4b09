# The two commands of the README. Each installs what is missing, builds, then runs.
PRESET ?= release
BUILD  := build
JOBS   ?= $(shell nproc)

.PHONY: all deps build demo test nvidia-peers test-asan test-tsan test-thread-safety bench image gpu-check gpu-bundle fuzz clean
.PHONY: lint format
.PHONY: cluster cluster-down e2e-cluster scale

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

# The main job: a simulated 8x H100 node, the agent, the kubelet emulator, the example pods.
demo: build
	$(BUILD)/bin/gpulet sim --simulate dgx-h100 examples/*.yaml

# NVIDIA's own plugin, GFD and toolkit as test peers for tests/compat (docs/compat.md): built when Go
# is there (cached; ~2 min cold), else the compat tests say they are skipped.
nvidia-peers:
	@if command -v go >/dev/null; then testing/nvidia/build $(BUILD); else echo "go not found: NVIDIA's peers not built, tests/compat will be skipped"; fi

test: build nvidia-peers
	ctest --preset release

# Sanitizer runs build only the unit tests and what they load (target unit_tests).
test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS) --target unit_tests
	ctest --preset asan

test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target unit_tests
	ctest --preset tsan

# The clang build with -Wthread-safety -Werror (preset thread-safety, build/clang): the mutex-guarded
# state's ABSL_GUARDED_BY annotations checked at compile time, over the unit tests and what they use.
test-thread-safety: deps
	@GPULET_FUZZ_DEPS=1 scripts/install-deps
	@cmake --preset thread-safety >/dev/null
	@cmake --build --preset thread-safety -j $(JOBS) --target unit_tests
	ctest --preset thread-safety

# clang-format and clang-tidy, checking only (scripts/lint); `make format` rewrites with clang-format.
# LINT_FILES="src/x.cc src/x.h" limits both to those files. clang-tidy also runs clang's
# -Wthread-safety analysis, so CI checks the ABSL_GUARDED_BY annotations without the clang build of
# test-thread-safety. Needs only a configured build tree (the generated proto headers, no compiling).
lint: deps
	@GPULET_LINT_DEPS=1 scripts/install-deps
	@scripts/lint

format:
	@scripts/lint format

bench: build
	@cmake --build --preset $(PRESET) --target benchmarks -j $(JOBS)
	scripts/bench

# The container image the manifests name, FROM scratch out of the build (Containerfile).
IMAGE ?= ghcr.io/gpulet/gpulet:0.1.0
image: build
	deploy/image/stage-rootfs.sh $(BUILD) $(BUILD)/image
	podman build -f Containerfile -t $(IMAGE) $(BUILD)/image

# Coverage-guided fuzzing of every untrusted-input parser (tests/fuzz), FUZZ_SECONDS each (clang,
# libFuzzer, ASan+UBSan). New inputs go to build/fuzz/corpus/<target>; crashes to build/fuzz/crash-*.
FUZZ_SECONDS ?= 60
fuzz: deps
	@GPULET_FUZZ_DEPS=1 scripts/install-deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS) --target fuzz_targets
	scripts/fuzz build/fuzz $(FUZZ_SECONDS)

# The real-GPU check (testing/gpu_check/check.sh): one table against the host's nvidia-smi. Prints
# "skipped: no NVIDIA GPU" and exits 0 on machines without one, so it needs no build there.
gpu-check:
	@testing/gpu_check/check.sh $(BUILD)

# What gpu-check runs, packed with its shared libraries for a GPU host without this build's libraries.
gpu-bundle: build
	@cmake --build --preset $(PRESET) --target nvml_rss -j $(JOBS)
	testing/gpu_check/bundle.sh $(BUILD) $(BUILD)/gpu-bundle

# A real one-node Kubernetes cluster on loopback (docs/cluster.md): kube-apiserver, controller-manager,
# scheduler, kubelet, etcd built from their Go modules (testing/k8s; cached, rebuilt when the pin
# changes), Debian's containerd 1.6, and 8 fake H100s through gpulet's device plugin. Needs root.
cluster:
	@testing/k8s/build $(BUILD)
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS) --target gpulet gpulet-sim gpulet-container-runtime gpulet_fake_nvml
	testing/k8s/cluster up $(BUILD)

cluster-down:
	testing/k8s/cluster down $(BUILD)

# The tests on that cluster (label `cluster`; `make test` skips them): on the cluster `make cluster`
# left running, else on one of their own that they stop and check for leftovers.
e2e-cluster:
	@testing/k8s/build $(BUILD)
	@testing/kwok/build $(BUILD)
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS) --target gpulet gpulet-sim gpulet-container-runtime gpulet_fake_nvml gpulet-container-hook gpulet-vcuda gpulet-kubelet-probe
	GPULET_E2E_CLUSTER=1 ctest --preset $(PRESET) -L cluster --output-on-failure

# The scale harness (tests/scale/run; README "Scale"): the real etcd, kube-apiserver and
# kube-scheduler, kwok playing SCALE_NODES fake nodes per set (whole GPUs, vGPU, DRA; 8 H100s each),
# gpulet's extender, and bursts of pods (SCALE_SCENARIOS, NAME:PODS) timed create -> bound and
# checked for over-commit. No root. The full version takes about an hour on 2 cores; its small
# version is the ctest cluster.scale_small of e2e-cluster.
SCALE_NODES ?= 1000
SCALE_SCENARIOS ?= whole:1000 binpack:1000 spread:1000 gpulet:1000 dra:1000 whole:5000 binpack:5000 spread:5000 gpulet:5000 dra:5000
scale:
	@testing/k8s/build $(BUILD)
	@testing/kwok/build $(BUILD)
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS) --target gpulet
	SCALE_NODES=$(SCALE_NODES) SCALE_SCENARIOS="$(SCALE_SCENARIOS)" tests/scale/run $(BUILD)

clean:
	rm -rf build
