# eagle3ops pipeline image: a vLLM 0.16 base + pinned, patched speculators + eagle3ops (stage entrypoints).
#
# Build with `eagle3ops image build pipeline` (eagle3ops.images.build_image): it renders the build args from
# images/pipeline.yaml, computes the content tag and labels, and passes the proxy CA bundle as a BuildKit secret.
# By hand (BuildKit is required: secret, cache and bind mounts):
#   DOCKER_BUILDKIT=1 docker build --network host --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt \
#     --build-arg BASE_IMAGE=eagle3ops/vllm-openai-local:v0.16.0 -t eagle3ops/pipeline:dev .
#
# Layer order: heavy dependencies first, eagle3ops (and the probes' fixtures) next, the patch series last, so a
# patch-only change re-runs only the last two steps (about a second when the probe results can be reused, see
# below). Nothing here assumes an interpreter or a site-packages path: the first step finds the interpreter that has
# vLLM (images/pipeline/check-base.py: /opt/venv in the local base, the system Python's dist-packages in
# vllm/vllm-openai and the upstream-layout stand-in) and puts `python3`/`python` wrappers for it first on PATH
# (/opt/eagle3ops/bin), so every later step, the entrypoint and the stage/supervisor containers
# (`python3 -m eagle3ops ...`) run that interpreter, and pip installs into its own scheme.
ARG BASE_IMAGE=vllm/vllm-openai:v0.16.0
FROM ${BASE_IMAGE}

# Newer pip refuses system installs on PEP 668 interpreters without this; older pip ignores it.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

# Find the interpreter that has vLLM (fail early, with a message, when none has the expected version or it has no
# pip), record the base's facts -- interpreter, site dir, and whether an engine can start here (vLLM's platform:
# UnspecifiedPlatform on a CUDA build without a GPU) -- in /opt/eagle3ops/base.json, and install the wrappers.
# check-base.py itself runs with whichever python3/python the base has first on PATH.
ARG VLLM_VERSION=0.16.0
RUN --mount=type=bind,source=images/pipeline,target=/tmp/e3img \
    for py in python3 python; do \
      if command -v "$py" >/dev/null 2>&1; then \
        exec "$py" /tmp/e3img/check-base.py "${VLLM_VERSION}" --install /opt/eagle3ops/bin --record /opt/eagle3ops/base.json; \
      fi; \
    done; echo "base image error: no python3 or python on PATH ($PATH)" >&2; exit 1
ENV PATH=/opt/eagle3ops/bin:$PATH

# GNU patch applies the series (eagle3ops.patches.gnupatch); install it when the base lacks it (Debian/Ubuntu apt,
# the proxy CA from the secret when apt needs TLS).
RUN --mount=type=secret,id=ca \
    if ! command -v patch >/dev/null; then \
      ca=""; if [ -s /run/secrets/ca ]; then ca="-o Acquire::https::CAInfo=/run/secrets/ca"; fi; \
      apt-get $ca update -qq && DEBIAN_FRONTEND=noninteractive apt-get $ca install -y -qq --no-install-recommends patch \
      && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; \
    fi; patch --version | head -1

# Pinned speculators and its runtime requirements (minus deepspeed) and eagle3ops' in-image dependencies, all
# hash-pinned, --no-deps on top of the base's packages. The CA bundle is a BuildKit secret (never in a layer).
ARG SPECULATORS_VERSION=0.3.0
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=requirements,target=/tmp/req \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python3 -m pip install --no-deps --require-hashes -r "/tmp/req/pipeline-speculators-${SPECULATORS_VERSION}.lock" \
    && python3 -c "import importlib.metadata as m; v = m.version('speculators'); assert v == '${SPECULATORS_VERSION}', v; print('speculators', v)"

# eagle3ops itself (no network: --no-deps, build backend from the base's setuptools). The source is bind-mounted and
# built in a temp dir removed in the same step, so no copy of it stays in a layer. The probes' tiny models are part
# of it (eagle3ops.fixtures, the tiny Kimi's remote-code files as package data: the last command fails the build
# when they are missing); the development harness src/eagle3ops_dev is not in the build context at all.
RUN --mount=type=bind,source=src,target=/tmp/e3ctx/src --mount=type=bind,source=pyproject.toml,target=/tmp/e3ctx/pyproject.toml \
    d=$(mktemp -d) && cp -r /tmp/e3ctx/src /tmp/e3ctx/pyproject.toml "$d"/ \
    && echo "eagle3ops: see the project repository's README.md" > "$d/README.md" \
    && python3 -m pip install --no-deps --no-build-isolation --no-cache-dir "$d" \
    && rm -rf "$d" \
    && python3 -m eagle3ops --help > /dev/null \
    && python3 -c 'import eagle3ops.patches.fixtures as f, eagle3ops.fixtures.tinykimi as k; f.load(); assert k.PAT_STR'

# The patch series, applied strictly (pins checked, -p1, zero fuzz), then the checks (eagle3ops.imagecheck):
# BUILD_CHECKS run here, HOST_CHECKS are deferred to the target host (`eagle3ops probe HOST`, run by `deploy`);
# ENGINE_CHECKS (auto, build or host) says where the checks that need an engine go.
# Checks: pins + apply (`patch apply`), compile (every patched .py byte-compiles), import (every patched module
# imports; needs torch; with the probes at build it runs in the probe step's process, which imports that stack
# anyway: --import-check), manifest (installed files = the apply manifest), probes (each applied patch's behavioural
# probe: tiny models on vLLM engines -- the only check that needs an engine). eagle3ops.images passes both lists,
# decided before the build from the base's facts and labelled io.eagle3ops.verified (build:...;host:...);
# BUILD_CHECKS=auto (a build by hand) decides here from /opt/eagle3ops/base.json the same way: probes run here when
# the base can start an engine, else they are deferred. What ran is recorded in <site>/eagle3ops_patches/checks.json.
# Probes that run here reuse a pass from a content-addressed result cache (a BuildKit cache mount, never in a layer)
# when every byte the probe depends on is identical to a run that passed: probe code, the installed patched files,
# the installed distributions, platform and the base image (eagle3ops.patches.probecache). A header-only patch edit
# therefore reuses passes; any change to patched code re-runs the probes. Failures are never cached: a failing
# apply, check or probe fails the build.
# VERIFY=probes (default, cache used), probes-fresh (every probe runs; passes still stored) or apply-only (fast dev
# rebuilds: no probes anywhere; labelled so by eagle3ops.images). What ran and what was reused is recorded in the
# image: <site>/eagle3ops_patches/speculators.probes.json. PROBES_MODULE replaces the probe registry (tests).
# VLLM_CACHE_ROOT is a cache mount too: vLLM caches what it learns about a model class (modelinfos, keyed by the
# sha of the model's source file) and otherwise finds it out in a subprocess that imports vLLM again, one per
# architecture (~15 s per fresh probe run on 2 busy cores). The probes' fixtures -- the tiny targets and their
# transformers reference states, which no patch changes -- are a cache mount too (EAGLE3OPS_FIXTURES_CACHE,
# eagle3ops.patches.fixtures): built once per content hash of the code and installed packages that make them, so a
# patch edit re-runs the probes on them without building them again; like the probe results, never in a layer.
# `python3 -m eagle3ops.patches` is `eagle3ops patch` without the rest of the CLI (~1-2 s less to import per call).
# PROBE_KEY_SALT (passed by
# eagle3ops.images.probe_key_salt: the base's digest or id and a hash of every input of the layers below this step)
# salts the keys; empty when built by hand.
ARG PROFILE=speculators-0.3.0-vllm-0.16.0
ARG VERIFY=probes
ARG PROBES_MODULE=eagle3ops.patches.probes
ENV EAGLE3OPS_PATCHES_DIR=/opt/eagle3ops/patches \
    EAGLE3OPS_PROFILE=${PROFILE} \
    PYTHONUNBUFFERED=1
COPY patches /opt/eagle3ops/patches
ARG PROBE_KEY_SALT=
ARG ENGINE_CHECKS=auto
ARG BUILD_CHECKS=auto
ARG HOST_CHECKS=auto
RUN --mount=type=cache,id=eagle3ops-probe-results,target=/var/cache/eagle3ops/probe-results \
    --mount=type=cache,id=eagle3ops-vllm-cache,target=/var/cache/eagle3ops/vllm \
    --mount=type=cache,id=eagle3ops-probe-fixtures,target=/var/cache/eagle3ops/fixtures \
    case "${VERIFY}" in probes|probes-fresh|apply-only) ;; \
      *) echo "unknown VERIFY=${VERIFY} (probes, probes-fresh or apply-only)" >&2; exit 2 ;; esac \
    && python3 -m eagle3ops.patches apply --profile "${PROFILE}" \
    && python3 -m eagle3ops.imagecheck build --profile "${PROFILE}" --verify "${VERIFY}" \
         --probes-module "${PROBES_MODULE}" --engine-checks "${ENGINE_CHECKS}" \
         --build-checks "${BUILD_CHECKS}" --host-checks "${HOST_CHECKS}" \
    && probe() { VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_CACHE_ROOT=/var/cache/eagle3ops/vllm \
         EAGLE3OPS_FIXTURES_CACHE=/var/cache/eagle3ops/fixtures \
         python3 -m eagle3ops.patches probe \
         --profile "${PROFILE}" --probes-module "${PROBES_MODULE}" --record \
         --result-cache /var/cache/eagle3ops/probe-results --salt "${PROBE_KEY_SALT}" "$@"; } \
    && if python3 -m eagle3ops.imagecheck wants probes; then \
         if python3 -m eagle3ops.imagecheck wants import; then set -- --import-check; fi; \
         if [ "${VERIFY}" = probes-fresh ]; then probe --fresh "$@"; else probe "$@"; fi; \
       else echo "probes not run at build: $(python3 -m eagle3ops.imagecheck summary)"; fi

WORKDIR /vllm-workspace
ENTRYPOINT ["python3", "-m", "eagle3ops"]
CMD ["--help"]
