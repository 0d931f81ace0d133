"""What a base image holds (:func:`base_facts`: the interpreter with vLLM, its site dir, whether an engine can start)
and, from that, which checks of a pipeline build run at build time and which on the host (:func:`checks_plan`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3ops.config.images import REPO_ROOT, ImageError
from eagle3ops.images.engine import docker_client
from eagle3ops.images.tags import _sha256

#: where :func:`base_facts` keeps what it measured, per base image id and check-base.py
FACTS_CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "eagle3ops/base-facts"
#: runs check-base.py (given as ``$0``) with the first python3/python on the base's PATH
_CHECK_BASE_LAUNCH = ('for py in python3 python; do if command -v "$py" >/dev/null 2>&1; then exec "$py" -c "$0" "$@"; '
                      'fi; done; echo "base image error: no python3 or python on PATH ($PATH)" >&2; exit 1')


def base_facts(base_image: str, *, vllm_version: str = "0.16.0", client: Any = None, root: Path = REPO_ROOT,
               cache_dir: Path | None = None) -> dict[str, Any]:
    """What the pipeline build's first step will find in ``base_image``: the interpreter that has vLLM, its site
    dir, and whether a vLLM engine can start there (``engine``/``imports``/``platform``/``reason``).

    Runs ``images/pipeline/check-base.py --json`` (the very script the Dockerfile runs first) in a throw-away
    container of the base (``--network none``; a few seconds, ~10-20 s where torch is imported) and caches the
    answer per base image id and script bytes in :data:`FACTS_CACHE`.

    Raises:
        ImageError: the base is not on the engine, or check-base.py refused it (its message: no vLLM
        ``vllm_version`` on any interpreter, no pip, or vllm.platforms does not import).
    """
    import docker.errors

    client = client or docker_client()
    try:
        img = client.images.get(base_image)
    except docker.errors.ImageNotFound:
        raise ImageError(f"base image {base_image} is not on the docker engine; load it, pass --base-image, or build "
                         f"a stand-in with `make base` in a checkout of eagle3ops") from None
    script = (root / "images/pipeline/check-base.py").read_text()
    key = _sha256(f"{img.id}\0{vllm_version}\0{script}".encode())
    cache = (cache_dir or FACTS_CACHE) / f"{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    try:
        out = client.containers.run(img.id, [script, vllm_version, "--json"], entrypoint=["/bin/sh", "-c",
                                    _CHECK_BASE_LAUNCH], network_mode="none", remove=True, stdout=True, stderr=False)
    except docker.errors.ContainerError as exc:
        err = exc.stderr.decode(errors="replace").strip() if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise ImageError(f"images/pipeline/check-base.py refused {base_image}: {err}") from None
    facts = json.loads(out.decode().strip().splitlines()[-1])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return facts


def checks_plan(inputs: dict[str, Any], base_image: str, *, client: Any = None, root: Path = REPO_ROOT,
                facts: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Which checks a pipeline build with ``inputs`` runs at build time and which on the host
    (:func:`eagle3ops.imagecheck.plan` over :func:`base_facts` of ``base_image``). ``facts`` skips the measurement
    (tests). Raises ImageError as :func:`base_facts`."""
    from eagle3ops.imagecheck import plan

    args = inputs["build_args"]
    if facts is None:
        facts = base_facts(base_image, vllm_version=inputs["pins"]["vllm"], client=client, root=root)
    return plan(facts, args.get("VERIFY", "probes"), args.get("ENGINE_CHECKS", "auto"))
