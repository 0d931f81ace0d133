"""Before a release changes the serving image: whether the new image's vLLM starts in the live container's ``/dev/shm``.

vLLM's multiprocess executor puts a shared-memory ring in ``/dev/shm`` at start-up (``MessageQueue``: by default
``max_chunks`` = 10 chunks of ``max_chunk_bytes`` = 24 MiB). vLLM 0.16 created it sparse and started in Docker's
default 64 MiB; vLLM 0.32 checks the free space first (``check_shm_free_space``) and refuses to start ("Insufficient
space in /dev/shm ... (e.g. --shm-size or --ipc=host)"), so the new release fails its health gate and is rolled back
after a restart (benchmarks/vllm-upgrade-gate/). A release keeps the live container's ``/dev/shm``; so, before any
restart, the new image's own vLLM is asked (a throwaway container, no network) whether it checks and how much the
ring takes, and a container whose ``/dev/shm`` is smaller is refused, naming both sizes and the fix.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.executor import read_in_image

#: seconds the reading may take (it imports vLLM)
READ_TIMEOUT_S = 300
MIB = 2**20

SHM_SOURCE = (
    "import inspect, json\n"
    "from vllm.distributed.device_communicators import shm_broadcast as m\n"
    "p = inspect.signature(m.MessageQueue.__init__).parameters\n"
    "print(json.dumps({'checks': hasattr(m, 'check_shm_free_space'),\n"
    "                  'ring_bytes': p['max_chunk_bytes'].default * p['max_chunks'].default}))\n"
)


def shm_refusal(host: str, image: str, reading: dict[str, Any], shm_bytes: int | None, ipc_mode: str | None
                ) -> str | None:
    """The refusal when ``image``'s vLLM (``reading``: :data:`SHM_SOURCE`'s answer) checks ``/dev/shm`` and its
    ring does not fit the live container's (``shm_bytes``: ``HostConfig.ShmSize``; ``ipc_mode`` ``host``: the
    host's own ``/dev/shm``, not judged), else None (pure)."""
    need = reading.get("ring_bytes")
    if not reading.get("checks") or not isinstance(need, int) or ipc_mode == "host" or not shm_bytes:
        return None
    if shm_bytes >= need:
        return None
    return (f"{host}: the vLLM of {image} needs {need / MIB:.0f} MiB of /dev/shm at start-up (its shared-memory "
            f"ring) and refuses to start with less; the serving container has {shm_bytes / MIB:.0f} MiB, which a "
            f"release keeps. Nothing was restarted: give serving a larger /dev/shm first (hosts.{host}.serving."
            f"shm_size, e.g. 1g, applied when serving is created; or --ipc host), docs/vllm-profiles.md")


def check_shm(r: Any, image: str | None, spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """With a new ``image`` and the live serving container's inspect ``spec``: the new vLLM's ``/dev/shm`` need
    against the container's. Read-only; runs before any restart.

    Returns:
        figures (``{"ring_bytes", "checks", "shm_bytes", "ipc_mode"}``), ``{"not_compared": why}`` when the image
        gave no answer, or None (no image or no container).

    Raises:
        ValueError: the ring does not fit (:func:`shm_refusal`'s message).
    """
    if not image or not spec:
        return None
    got = read_in_image(r, image, SHM_SOURCE, timeout=READ_TIMEOUT_S)
    if got.answer is None:
        return {"not_compared": got.silence()}
    reading = got.answer
    hcfg = spec.get("HostConfig") or {}
    shm, ipc = hcfg.get("ShmSize"), hcfg.get("IpcMode")
    refusal = shm_refusal(r.host.name, image, reading, shm, ipc)
    if refusal:
        raise ValueError(refusal)
    return {"ring_bytes": reading.get("ring_bytes"), "checks": reading.get("checks"), "shm_bytes": shm,
            "ipc_mode": ipc}
