"""The STAND-IN OpenAI server (``tests/data/standin_openai_server.py``, NOT vLLM) as a serving container's server.

Sandbox tests whose subject is the window, the container's configuration or a serving manager (Compose), not vLLM,
run it in the local vLLM base image with ``--entrypoint python3`` (the image's own Python; the server is standard
library only), the script bind-mounted read-only from the sandbox's root: a start takes about a second instead of a
vLLM start (40-100 s on this machine), and it answers what the health gate asks (``/health``, ``/v1/models``,
``/v1/completions``, ``--api-key`` required when given; unknown vLLM flags are accepted and ignored).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The container's entrypoint: the image's python3 running the mounted stand-in server.
ENTRYPOINT = ["python3", "/standin/standin_openai_server.py"]


def script_volume(h) -> str:
    """Copy the stand-in server into ``<sandbox root>/standin-serving/`` (owned by the SSH user) and return the
    ``HOST:CONTAINER:ro`` bind that puts it at ``/standin`` in the container."""
    app = Path(h.state_dir).parent / "standin-serving"
    app.mkdir(exist_ok=True)
    shutil.copy(REPO / "tests/data/standin_openai_server.py", app / "standin_openai_server.py")
    subprocess.run(["chown", "-R", "e3ops:e3ops", str(app)], check=True)
    return f"{app}:/standin:ro"


def model_mount(h) -> str:
    """The container path at which ``h.serving.volumes`` mounts the host's model (``h.model_path``).

    Raises:
        StopIteration: no volume binds ``h.model_path``.
    """
    return next(v.split(":")[1] for v in h.serving.volumes if v.split(":")[0] == h.model_path)


def args(port: int, model: str, require_file: str | None = None) -> list[str]:
    """The stand-in's arguments for ``port`` and the served ``model`` name; ``require_file``: a path in the
    container (the mounted model's ``config.json``) without which the server exits 1 at start, as vLLM does."""
    return ["--port", str(port), "--model", model, *(["--require-file", require_file] if require_file else [])]


def start_container(h, timeout_s: float = 120) -> None:
    """(Re)create ``h.serving.container`` on the host's engine from the inventory's spec (``h.serving``: image,
    :func:`args`, volumes with :func:`script_volume`) with :data:`ENTRYPOINT`, and wait (bounded) until it answers
    the health gate's probe on ``h.serving.port``.

    Raises:
        eagle3ops.health.GateFailed: not healthy within ``timeout_s`` seconds.
    """
    from eagle3ops import executor
    from eagle3ops.commands import docker as dk
    from eagle3ops.commands import serving as sv
    from eagle3ops.health import wait_healthy

    spec = {**sv.container_spec(h, release=1), "entrypoint": ENTRYPOINT}
    with executor.for_host(h) as r:
        r.run(dk.rm(h, h.serving.container, force=True), check=False)
        r.run(sv.run_argv(h, spec))
    wait_healthy(f"http://127.0.0.1:{h.serving.port}", h.serving.served_model_name, timeout_s=timeout_s,
                 interval_s=0.3)
