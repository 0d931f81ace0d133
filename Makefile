# eagle3ops make targets: each a thin call of the `eagle3ops` CLI, or of the development harness's
# `python -m eagle3ops_dev` (sandbox, base, demo: not in the eagle3ops wheel) (see README.md).
#   make demo                       the whole maintenance cycle on the embedded sandbox host
#   make test                       the test suite (the host and the in-image suites side by side)
#   make deploy  HOST=gpu-01        build + push the pipeline image, verify its id, preflight (serving untouched)
#   make extract HOST=gpu-01        window 1: prepare + extract hidden states
#   make extract HOSTS=a,b,c DRY=1  the fleet plan over several hosts (contiguous shards, windows, waves)
#   make extract HOSTS=a,b,c        run it: shards wave by wave, manifests merged (DEAD=b: b's shard moves)
#   make train   HOST=gpu-01        window 2: vocab (d2t/t2d) + train the draft head
#   make rollback HOST=gpu-01       bring back the previous serving release
#   make docs                       regenerate docs/reference/ (configuration keys and CLI) from the code
# INVENTORY=FILE (default deploy/hosts.yaml, the sandbox) and PIPELINE=FILE (extract/train; default
# deploy/pipeline.yaml, sized for the sandbox) point the targets at your own files (docs/howto/first-host.md).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
HOST ?= sandbox
RUN ?= default
comma := ,
INVENTORY ?= deploy/hosts.yaml
PIPELINE ?=
PIPELINE_FLAG := $(if $(PIPELINE),--pipeline $(PIPELINE),)
# The demo serves SmolLM2-135M-Instruct on the sandbox (deploy/hosts.yaml: the tests' tiny stand-in target).
DEMO_INVENTORY ?= deploy/sandbox-smollm2.yaml
PROFILE ?= speculators-0.3.0-vllm-0.16.0
E3 := .venv/bin/eagle3ops
PY := .venv/bin/python
# The development harness (src/eagle3ops_dev, importable in .venv through scripts/setup.sh's eagle3ops-dev.pth).
E3DEV := $(PY) -m eagle3ops_dev
# The sandbox has no registry to pull vllm/vllm-openai from: its pipeline image builds on the local stand-in base.
LOCAL_BASE := eagle3ops/vllm-openai-local:v0.16.0
ifeq ($(HOST),sandbox)
BASE_IMAGE ?= $(LOCAL_BASE)
endif
BASE_FLAG := $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE),)
export EAGLE3OPS_INVENTORY := $(INVENTORY)

.PHONY: setup docs prebuild sandbox base image deploy extract train release rollback regenerate speculate status audit demo test test-serial test-image \
        patch-check bench-rebuild bench-push bench-train-nodes bench-chunked bench-online bench-extract bench-probe-smollm2 bench-kimi-head bench-speculate-gpu-head gpu-round-pack gpu-round-finish bench-gate-aa bench-compile-cache bench-cycle-downtime clean-sandbox clean-demo clean-images

setup:
	bash scripts/setup.sh

sandbox: setup
	$(E3DEV) sandbox up

base: setup
	$(E3DEV) base

image: base
	$(E3) image build pipeline $(BASE_FLAG) --profile $(PROFILE)

deploy: setup
	$(E3) deploy $(HOST) -i $(INVENTORY) $(BASE_FLAG) --profile $(PROFILE) $(ARGS)

# one recipe line, so the command make echoes can be pasted as it is
EXTRACT_HOSTS = $(if $(HOSTS),$(subst $(comma), ,$(HOSTS)),$(HOST))
EXTRACT_DEAD = $(foreach d,$(subst $(comma), ,$(DEAD)),--dead $(d))
extract: setup
	$(E3) extract $(EXTRACT_HOSTS) -i $(INVENTORY) --run $(RUN) $(PIPELINE_FLAG) $(if $(DRY),--dry-run) $(EXTRACT_DEAD) $(ARGS)

train: setup
	$(E3) train $(HOST) -i $(INVENTORY) --run $(RUN) $(PIPELINE_FLAG) $(ARGS)

release: setup
	$(E3) release $(HOST) -i $(INVENTORY) $(ARGS)

rollback: setup
	$(E3) rollback $(HOST) -i $(INVENTORY) $(ARGS)

regenerate: setup
	$(E3) regenerate $(HOST) -i $(INVENTORY) --run $(RUN) $(ARGS)

speculate: setup
	$(E3) speculate $(HOST) -i $(INVENTORY) --run $(RUN) $(ARGS)

status: setup
	$(E3) status $(HOST) -i $(INVENTORY) $(ARGS)

audit: setup
	$(E3) audit $(HOST) -i $(INVENTORY) $(ARGS)

demo: setup
	$(E3DEV) demo --inventory $(DEMO_INVENTORY)

# Host tests need the sandbox and the images; the fixtures in tests/conftest.py build/start what is missing.
# Images first (tests/prebuild.py: cached by content, seconds when warm), so no cold build counts against a test's
# 600 s limit; then the host suite's two parts (pytest --part sandbox|rest) and the in-image suite side by side
# (scripts/test.sh: one test at a time leaves the CPUs half idle); the ten slowest tests of each are printed.
PIPELINE_TAG = $$($(E3) image build pipeline $(BASE_FLAG) --profile $(PROFILE) --tag-only)
test: setup prebuild
	bash scripts/test.sh "$(PIPELINE_TAG)"

# The same two suites one after the other (the host suite, then the in-image suite).
test-serial: setup prebuild
	$(PY) -m pytest -ra --durations=10 tests --ignore=tests/image
	$(MAKE) test-image

prebuild: setup
	$(PY) tests/prebuild.py

# Tests that need torch / vLLM / speculators run inside the built pipeline image (its /opt/venv).
test-image: image
	bash scripts/test-image.sh "$(PIPELINE_TAG)"

# The generated reference (docs/reference/config.md, cli.md); tests/test_docs_reference.py fails when it is stale.
docs: setup
	$(PY) scripts/gen_reference.py

patch-check: setup
	$(E3) patch check

bench-rebuild: base
	$(PY) benchmarks/patch-rebuild/rebuild.py --base-image $(LOCAL_BASE) --profile $(PROFILE)

# An A/A benchmark of `release --gate` (a no-op flag, gated RUNS times at deploy/sandbox-smollm2.yaml's settings on
# real SmolLM2): how often the gate's interval excludes 1.0 and how often the no-op change is kept. Holds the sandbox
# ~3-4 minutes a run.
RUNS ?= 10
bench-gate-aa: setup
	$(PY) benchmarks/gate-aa/gate_aa.py --runs $(RUNS) --json benchmarks/gate-aa/gate-aa-smollm2.json

# Restart time of a recreated serving release with the compile cache kept vs cold (SmolLM2 on the sandbox's CPU vLLM
# started without --enforce-eager; cold and kept starts alternating). Holds the sandbox ~20-30 minutes.
bench-compile-cache: setup
	$(PY) benchmarks/compile-cache/compile_cache.py --repeats 3

# Production's downtime as clients see it: today's two-window cycle against `eagle3ops cycle` with a production and a
# work host, one client streaming to production throughout (real vLLM CPU serving SmolLM2, real stages; two sandbox
# hosts sharing this machine's Docker engine). About 45 minutes on 2 cores (benchmarks/cycle-downtime/README.md).
bench-cycle-downtime: setup
	$(PY) benchmarks/cycle-downtime/cycle_downtime.py --json benchmarks/cycle-downtime/cycle-downtime.json $(ARGS)

bench-push: setup
	$(PY) benchmarks/push-transfer/push.py --repeat 3 --json benchmarks/push-transfer/push-medians.json

# Multi-node training over three netns sandbox hosts: the real pipeline environment exported from the
# pipeline image, the tiny Llama target, a reach-probe refusal, a node killed and resumed, a one-node reference.
bench-train-nodes: image
	$(PY) benchmarks/fleet-train-nodes/fleet_train_nodes.py --image "$$($(E3) image build pipeline $(BASE_FLAG) --profile $(PROFILE) --tag-only)"

# Bounded disk: a chunked run twice the data dir's free space (tmpfs) against one chunk, and the colocated
# online lever against extract + train on SmolLM2; both in containers of the pipeline image, this checkout's src mounted.
bench-chunked: image
	$(PY) benchmarks/chunked-disk/chunked_disk.py --json benchmarks/chunked-disk/chunked-disk-cpu.json

bench-online: image
	$(PY) benchmarks/online-lever/online_lever.py --json benchmarks/online-lever/online-lever-cpu.json

# The extract benchmark needs torch, vLLM and the patched speculators: it runs inside the pipeline image.
bench-extract: image
	docker run --rm --network host -e VLLM_CPU_KVCACHE_SPACE=2 -e HF_HUB_OFFLINE=1 -e PYTHONUNBUFFERED=1 \
	  -v "$$PWD/benchmarks:/e3/benchmarks" -w /e3 --entrypoint python3 \
	  "$$($(E3) image build pipeline $(BASE_FLAG) --profile $(PROFILE) --tag-only)" \
	  benchmarks/extract-vs-prefill/extract.py --json benchmarks/extract-vs-prefill/extract-cpu-tiny-llama.json

# The tiny Kimi-K2.5-class target served by vLLM CPU without and with a head trained by the stages (greedy identity,
# spec-decode counters, acceptance): benchmarks/kimi-trained-head/kimi_trained_head.py (was tests/test_kimi_serving.py).
bench-kimi-head: image
	$(PY) benchmarks/kimi-trained-head/kimi_trained_head.py --json benchmarks/kimi-trained-head/kimi-trained-head-cpu.json

clean-sandbox: setup
	$(E3DEV) sandbox down

# After the demo (docs/demo-machine.md): the sandbox stopped (sshd, its dockerd, production serving's container)
# and its state deleted (its engine's copies of the images, data_dir, state_dir, keys; the same sandbox
# as the tests', set up again by the next `make demo` or `make test`), then the demo's files in this checkout.
clean-demo: setup
	$(E3DEV) sandbox down --purge
	rm -rf reports/sandbox-* regenerated/sandbox-*

# Every image eagle3ops built in the build engine (the demo's and the tests'; the next build makes them again, minutes):
# their tags removed, then the untagged ones of ours left by rebuilds. Parent layers go with the last tag (docker rmi
# prunes untagged parents); an image a container still uses is refused by Docker, naming that container.
clean-images:
	docker image ls --format '{{.Repository}}:{{.Tag}}' --filter 'reference=eagle3ops/*' \
	  --filter 'reference=eagle3ops-test/*' | xargs -r docker image rm
	docker image ls -q --filter dangling=true --filter label=io.eagle3ops.base-inputs | xargs -r docker image rm

# The stage probe on the demo's real target (SmolLM2-135M-Instruct, provisioned by `make demo` into the sandbox's
# model directory): vLLM CPU hidden states vs transformers, within the dense tolerance of stages/probe.py.
SANDBOX_NAME ?= $(or $(EAGLE3OPS_SANDBOX),sandbox)
SMOLLM2_DIR ?= /var/lib/eagle3ops-sandbox/$(SANDBOX_NAME)/data/models/smollm2-135m-instruct
bench-probe-smollm2: image
	docker run --rm --network host -e VLLM_CPU_KVCACHE_SPACE=2 -e HF_HUB_OFFLINE=1 -e PYTHONUNBUFFERED=1 \
	  -v "$(SMOLLM2_DIR):/model:ro" -v "$$PWD/benchmarks:/e3/benchmarks" -w /e3 --entrypoint python3 \
	  "$$($(E3) image build pipeline $(BASE_FLAG) --profile $(PROFILE) --tag-only)" \
	  benchmarks/probe-smollm2/probe_smollm2.py --model /model --json benchmarks/probe-smollm2/probe-smollm2-cpu.json

# The EAGLE-3 head trained on an H200 for SmolLM2 (benchmarks/gpu-head-smollm2/gpu_head_smollm2.py; ROUND=r3, the default, is the
# head committed under benchmarks/gpu-head-smollm2/heads/, ROUND=r2 needs HEAD_SRC: not committed) shipped
# with `eagle3ops speculate --head --prompts-file` on held-out ShareGPT prompts on the sandbox serving SmolLM2
# (provisioned as `make demo` does); LEVELS=1 measures concurrency 1 only. Writes
# benchmarks/gpu-head-served/speculate-smollm2-gpu-head.json.
ROUND ?= r3
bench-speculate-gpu-head: setup
	$(PY) benchmarks/gpu-head-served/speculate_smollm2_gpu_head.py --round $(ROUND) $(if $(HEAD_SRC),--head-src $(HEAD_SRC)) \
	  --inventory $(DEMO_INVENTORY) $(if $(LEVELS),--levels $(LEVELS)) $(if $(SET),--set $(SET))

# A GPU round of the SmolLM2 heads in pieces (recipe and steps: benchmarks/gpu-head-smollm2/gpu_head_smollm2.py,
# README.md there). gpu-round-pack puts what the lent GPU machine needs into the ignored .whl/ and prints the device
# calls to make in order; gpu-round-finish takes the folders their files came back to (DEVICE_DIR, one or several),
# checks every head file's sha256 and writes the figures JSON and the heads (.whl/heads/). GPU_ROUND: the round's tag;
# PACK: another folder than .whl; WHEELS_FROM: a folder of wheels to take the pinned ones from before downloading;
# GEN_S: seconds of generation on the device (default 240); STEPS: training steps of each head (default 900).
GPU_SCRIPT := benchmarks/gpu-head-smollm2/gpu_head_smollm2.py
gpu-round-pack: setup
	$(PY) $(GPU_SCRIPT) pack $(if $(PACK),--dest $(PACK)) $(if $(GPU_ROUND),--round $(GPU_ROUND)) $(if $(WHEELS_FROM),--wheels-from $(WHEELS_FROM)) \
	  $(if $(GEN_S),--gen-budget-s $(GEN_S)) $(if $(STEPS),--steps $(STEPS))

gpu-round-finish: setup
	@test -n "$(DEVICE_DIR)" || { echo "make gpu-round-finish DEVICE_DIR='<files_at of the device calls>' [DEVICE_S='<status JSON>']"; exit 2; }
	$(PY) $(GPU_SCRIPT) finish-round $(DEVICE_DIR) $(if $(PACK),--pack $(PACK)) $(if $(DEVICE_S),--device-s '$(DEVICE_S)')
