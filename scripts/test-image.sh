#!/usr/bin/env bash
# Run tests/image inside a container of the pipeline image (its Python has torch, vLLM 0.16, patched speculators
# and eagle3ops). pytest (+ pytest-timeout: 600 s a test, as on the host) comes from hash-pinned wheels installed into a
# throwaway dir, not into the image; the ten slowest tests are printed at the end. The image's Python environment is
# read into the page cache first (python -m eagle3ops_dev warm).
# Usage: scripts/test-image.sh IMAGE_TAG [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
tag=$1; shift
mkdir -p .cache/test-wheels
.venv/bin/pip download -q --no-deps --require-hashes -r requirements/image-test.txt -d .cache/test-wheels
# The image's /opt/venv into the page cache first (eagle3ops_dev.pagecache: cold vLLM/torch starts here are
# disk-bound, and the host suite before this one filled the cache with the sandbox engine's copy of the layers).
.venv/bin/python -m eagle3ops_dev warm "$tag" || echo "[test-image] page cache not warmed: the suite starts from a cold cache"
# The image does not carry the development harness (src/eagle3ops_dev); the tests that use it (the trained sandbox
# target) get this checkout's copy mounted read-only and on PYTHONPATH, and test_probes checks that the image's own
# interpreter cannot import it.
# --cpu-shares 128: when this container and the sandbox engine's containers (vLLM serving for the sandbox part, of
# `make test`'s three streams the one with the least slack) want the CPUs at once, they get 8/9 (both engines put their containers under the
# /docker cgroup, cgroup v1, 1024 shares each by default); alone, this suite still gets both cores.
exec docker run --rm --network host --cpu-shares "${E3_TEST_IMAGE_CPU_SHARES:-128}" \
  -e HF_HUB_OFFLINE=1 -e TRANSFORMERS_OFFLINE=1 -e VLLM_CPU_KVCACHE_SPACE=1 -e PYTHONDONTWRITEBYTECODE=1 \
  -e PYTHONUNBUFFERED=1 \
  -v "$PWD/tests:/e3/tests:ro" -v "$PWD/patches:/e3/patches:ro" -v "$PWD/deploy:/e3/deploy:ro" \
  -v "$PWD/src/eagle3ops_dev:/e3/dev/eagle3ops_dev:ro" -v "$PWD/.cache/test-wheels:/wheels:ro" -w /e3 \
  --entrypoint bash "$tag" -c \
  'python3 -m pip install -q --no-index --no-deps --target /tmp/pt /wheels/*.whl \
   && PYTHONPATH=/tmp/pt:/e3/dev python3 -m pytest -p no:cacheprovider --timeout=600 --timeout-method=signal \
     --durations=10 -ra "$@" tests/image' test-image "$@"
