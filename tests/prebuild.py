"""Build every image the test suites need, before pytest starts (``make prebuild``, run by ``make test``).

A cold build of the local vLLM base takes ~5 min on 2 cores and the upstream-layout stand-in ~4 min; inside pytest
that time counted against the first test's timeout, which therefore had to be 40 minutes. Here each build is timed
and printed instead, and the suites run with a per-test limit of 600 s. Every build is cached by its content tag,
so on a warm engine this step takes seconds.

Images (all built on this machine's build engine; none is pulled from a registry):
- the stand-in bases: the local vLLM 0.16 CPU base (stand-in for ``vllm/vllm-openai:v0.16.0``), the upstream-layout
  base (CUDA vLLM in the system python3, cannot start an engine here), the torch-less test stand-in bases (venv and
  system layouts) and the debootstrap minbase;
- the pipeline image on the local base (the sandbox's stages and the in-image suite run in it);
- the CPU stand-in serving image (patched vLLM), tagged as the sandbox inventory's ``speculative_image``;
- the pipeline image with its probes deferred to the host, and the pipeline image on the upstream-layout base (the
  host-probe tests' builds); the test stand-in pipeline image (:mod:`standin_images`); the real-systemd test host
  (:mod:`systemd_image`) and the stand-in pipeline environment with the speculation gate's imports its venv host
  gets (:func:`eagle3ops_dev.standin_env.build`, ``gate=True``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _standin_pipeline(ca) -> str:
    """The test stand-in pipeline image (:mod:`standin_images`; the containerd window test pushes it)."""
    import tempfile

    import standin_images

    with tempfile.TemporaryDirectory(prefix="e3-standin-pipeline-") as tmp:
        return standin_images.standin_pipeline_image(Path(tmp) / "repo", ca).tag


def main() -> int:
    from eagle3ops import images
    from eagle3ops.config import load_inventory
    from eagle3ops_dev import bases, standin_env

    import systemd_image

    ca = images.default_ca_bundle()
    sandbox = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    t_all = time.monotonic()
    steps = [
        ("minbase", lambda: bases.build_minbase()),
        ("local vLLM base", lambda: bases.build_local_base(ca_bundle=ca, quiet=True)),
        ("pipeline image", lambda: images.build_image("pipeline", base_image=images.LOCAL_BASE_TAG,
                                                       ca_bundle=ca, quiet=True).tag),
        ("CPU stand-in serving image", lambda: images.build_image(
            "serving", base_image=images.LOCAL_BASE_TAG, profile="vllm-0.16.0-serving-cpu-standin",
            ca_bundle=ca, quiet=True, extra_tags=[sandbox.serving.speculative_image]).tag),
        ("test stand-in base (venv)", lambda: bases.build_standin_base(ca_bundle=ca)),
        ("test stand-in base (system)", lambda: bases.build_standin_base(ca_bundle=ca, layout="system")),
        ("upstream-layout base", lambda: bases.build_base("upstream", ca, quiet=True)),
        # what tests/test_hostprobe.py builds: the pipeline image whose probes are deferred to the host (on the CPU
        # local base: ``engine_checks="host"``), and the pipeline image on the upstream-layout base
        ("pipeline image, probes deferred to the host", lambda: images.build_image(
            ca_bundle=ca, quiet=True, plan=images.plan_build("pipeline", base_image=images.LOCAL_BASE_TAG,
                                                             engine_checks="host")).tag),
        ("pipeline image on the upstream-layout base", lambda: images.build_image(
            "pipeline", bases.UPSTREAM_BASE_TAG, None, ca, quiet=True).tag),
        ("test stand-in pipeline image", lambda: _standin_pipeline(ca)),
        ("real-systemd test host", lambda: systemd_image.build()),
        # the stand-in pipeline environment with the gate's imports (tests/test_systemd_real.py's venv host)
        ("stand-in environment with the gate", lambda: standin_env.build("/usr/bin/python3", gate=True)[1]),
    ]
    for name, build in steps:
        t0 = time.monotonic()
        tag = build()
        print(f"[prebuild] {name}: {tag or ''} ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"[prebuild] all images ready in {time.monotonic() - t_all:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
