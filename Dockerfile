# eagle3ops pipeline image: a vLLM 0.16 base + pinned, patched speculators + eagle3ops (stage entrypoints).
#
# Build with `eagle3ops image build pipeline` (eagle3ops.images.build_image): it renders the build args from
# images/pipeline.yaml, computes the content tag and labels, and passes the proxy CA bundle as a BuildKit secret.
# By hand (BuildKit is required: secret, cache and bind mounts):
#   DOCKER_BUILDKIT=1 docker build --network host --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt \
#     --build-arg BASE_IMAGE=eagle3ops/vllm-openai-local:v0.16.0 -t eagle3ops/pipeline:dev .
#
# Layer order: heavy dependencies first, eagle3ops next, the patch series last, so a patch-only change re-runs only
# the last two steps (about a second when the probe results can be reused, see below). Nothing here hard-codes a site-packages path: `python3` is whatever the base puts
# first on PATH (/opt/venv in the local base, the system Python 3.12 with dist-packages in vllm/vllm-openai), and
# pip installs into that interpreter's own scheme.
ARG BASE_IMAGE=vllm/vllm-openai:v0.16.0
FROM ${BASE_IMAGE}

# Newer pip refuses system installs on PEP 668 interpreters without this; older pip ignores it.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

# Fail early, with a message, when the base has no usable python3/pip or no vLLM of the expected version.
ARG VLLM_VERSION=0.16.0
RUN --mount=type=bind,source=images/pipeline,target=/tmp/e3img \
    python3 /tmp/e3img/check-base.py "${VLLM_VERSION}"

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
# built in a temp dir removed in the same step, so no copy of it stays in a layer.
RUN --mount=type=bind,source=src,target=/tmp/e3ctx/src --mount=type=bind,source=pyproject.toml,target=/tmp/e3ctx/pyproject.toml \
    d=$(mktemp -d) && cp -r /tmp/e3ctx/src /tmp/e3ctx/pyproject.toml "$d"/ \
    && echo "eagle3ops: see the project repository's README.md" > "$d/README.md" \
    && python3 -m pip install --no-deps --no-build-isolation --no-cache-dir "$d" \
    && rm -rf "$d" \
    && python3 -m eagle3ops --help > /dev/null

# The patch series, applied strictly (pins checked, -p1, zero fuzz) and verified: each applied patch's behavioural
# probe (tiny models, vLLM engines on CPU) runs, or its pass is reused from a content-addressed result cache (a
# BuildKit cache mount, never in a layer) when every byte the probe depends on is identical to a run that passed:
# probe code, the installed patched files, the installed distributions, platform and the base image
# (eagle3ops.patches.probecache). A header-only patch edit therefore reuses passes; any change to patched code
# re-runs the probes. Failures are never cached: a failing apply or probe fails the build.
# VERIFY=probes (default, cache used), probes-fresh (every probe runs; passes still stored) or apply-only (fast dev
# rebuilds; the image is then labelled io.eagle3ops.verified=apply-only by eagle3ops.images). What ran and what was
# reused is recorded in the image: <site>/eagle3ops_patches/speculators.verify.json. PROBES_MODULE replaces the
# probe registry (tests). VLLM_CACHE_ROOT is a cache mount too: vLLM caches what it learns about a model class
# (modelinfos, keyed by the sha of the model's source file) and otherwise finds it out in a subprocess that imports
# vLLM again, one per architecture (~15 s per fresh probe run on 2 busy cores). PROBE_KEY_SALT (passed by
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
RUN --mount=type=cache,id=eagle3ops-probe-results,target=/var/cache/eagle3ops/probe-results \
    --mount=type=cache,id=eagle3ops-vllm-cache,target=/var/cache/eagle3ops/vllm \
    python3 -m eagle3ops patch apply --profile "${PROFILE}" \
    && verify() { VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_CACHE_ROOT=/var/cache/eagle3ops/vllm \
         python3 -m eagle3ops patch verify \
         --profile "${PROFILE}" --probes-module "${PROBES_MODULE}" --record \
         --result-cache /var/cache/eagle3ops/probe-results --salt "${PROBE_KEY_SALT}" "$@"; } \
    && case "${VERIFY}" in \
         probes) verify ;; \
         probes-fresh) verify --fresh ;; \
         apply-only) echo "VERIFY=apply-only: probes not run" ;; \
         *) echo "unknown VERIFY=${VERIFY} (probes, probes-fresh or apply-only)" >&2; exit 2 ;; \
       esac

WORKDIR /vllm-workspace
ENTRYPOINT ["python3", "-m", "eagle3ops"]
CMD ["--help"]
