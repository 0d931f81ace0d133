"""The speculation gate's host commands as argv lists (pure): the host-side gate helper in the pipeline image,
the head's upload, and the speculative serving release's extra server arguments.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3ops.commands.docker import docker
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import HostConfig

#: Where a speculative release sees its draft head (read-only bind mount).
HEAD_MOUNT = "/eagle3ops/draft"


def gate_helper(host: HostConfig, image: str, action: str, *, head_dir: str | None = None,
                run_dir: str | None = None) -> Read:
    """``docker run --rm -i --network host`` of ``python3 -m eagle3ops.speculate.onhost ACTION`` in ``image`` (the
    pipeline image), reading its request on stdin.

    ``inspect`` mounts the head at ``/head``, the host's ``model_path`` at ``/target`` and the run dir at ``/run``
    (all read-only); ``measure`` and ``regenerate`` (the training prompts answered by serving, for a host whose
    sshd forbids port-forwarding) mount nothing and reach serving over the host's loopback (host network).
    """
    if action not in ("inspect", "measure", "regenerate"):
        raise ValueError(f"gate helper action {action!r}: inspect, measure or regenerate")
    argv = ["run", "--rm", "-i", "--network", "host", "--entrypoint", "python3"]
    if action == "inspect":
        if not head_dir:
            raise ValueError("inspect needs head_dir")
        argv += ["--volume", f"{head_dir}:/head:ro", "--volume", f"{host.model_path}:/target:ro"]
        if run_dir:
            argv += ["--volume", f"{run_dir}:/run:ro"]
    argv += ["--label", "io.eagle3ops.role=speculate-gate", image, "-m", "eagle3ops.speculate.onhost", action]
    return Read(docker(host, *argv))


def untar_into(path: str) -> Change:
    """Unpack a tar stream from stdin into ``path`` (an uploaded head)."""
    return Change(["tar", "-x", "-f", "-", "-C", path, "--no-same-owner"])


#: Speculation methods a ``speculate`` job can measure as candidates (``--method``): ``eagle3`` (the run's head)
#: and ``ngram`` (vLLM's prompt-lookup proposer: no head).
METHODS = ("eagle3", "ngram")
#: vLLM 0.16's n-gram proposer's match window (``prompt_lookup_min``..``prompt_lookup_max`` tokens of the context
#: searched for the last n-gram); vLLM's own defaults when only ``prompt_lookup_max`` is given are min = max.
NGRAM_LOOKUP = (2, 4)


#: The first vLLM (major, minor) whose CPU build serves EAGLE-3 with the plain speculative config, sampled requests
#: included (upstream vLLM PR #42468; its first release is not identified, 0.32.0 has it: docs/spikes/vllm-0.32-cpu.md
#: served the 0.16-trained head with ``{"method": "eagle3", ...}`` alone). Below it a CPU host takes the 0.16
#: stand-in series' settings (:func:`speculative_args`).
PLAIN_CPU_FROM = (0, 32)


def cpu_standin_keys(cpu: bool, vllm: str | None) -> bool:
    """Whether a speculative release on a CPU host (``cpu``) of vLLM ``vllm`` (the speculative image's version, e.g.
    ``0.32.0`` or ``0.16.0+cpu``; None: not known) needs vLLM 0.16's CPU-only settings (pure): True on CPU below
    :data:`PLAIN_CPU_FROM`, and on CPU when the version is not known or not numeric (the default profile's vLLM 0.16,
    the settings this project served with before vLLM 0.32); False on a GPU host.

    >>> cpu_standin_keys(True, "0.16.0+cpu"), cpu_standin_keys(True, "0.32.0"), cpu_standin_keys(False, None)
    (True, False, False)
    """
    if not cpu:
        return False
    try:
        release = tuple(int(x) for x in (vllm or "").split("+", 1)[0].split(".")[:2])
    except ValueError:
        return True
    return len(release) < 2 or release < PLAIN_CPU_FROM


def ngram_args(*, num_speculative_tokens: int, cpu: bool, vllm: str | None = None) -> list[str]:
    """``--speculative-config`` for vLLM's n-gram (prompt lookup) proposer: no head, ``k`` proposed tokens,
    the lookup window :data:`NGRAM_LOOKUP`. On a CPU host of vLLM 0.16 (``vllm``: :func:`cpu_standin_keys`) also
    ``--override-generation-config {"temperature": 0.0}`` (vLLM 0.16's rejection sampler for sampled requests is a
    Triton kernel: see :func:`speculative_args`)."""
    lo, hi = NGRAM_LOOKUP
    cfg = {"method": "ngram", "num_speculative_tokens": num_speculative_tokens, "prompt_lookup_min": lo,
           "prompt_lookup_max": hi}
    args = ["--speculative-config", json.dumps(cfg, sort_keys=True)]
    if cpu_standin_keys(cpu, vllm):
        args += ["--override-generation-config", json.dumps({"temperature": 0.0})]
    return args


def speculative_args(*, num_speculative_tokens: int, cpu: bool, model: str = HEAD_MOUNT,
                     draft_tp: int | None = None, vllm: str | None = None) -> list[str]:
    """``--speculative-config`` for the speculative image's vLLM ``vllm`` (its labelled version, a fact read by the
    caller; None: not known): method ``eagle3``, the head at ``model`` (a container sees it mounted at
    :data:`HEAD_MOUNT`; a serving process reads it at its host path), ``k``; with ``draft_tp`` also
    ``draft_tensor_parallel_size`` (vLLM 0.16 takes 1 or the target's TP; default: the target's).

    On a CPU host of vLLM 0.16 (the sandbox's stand-in series, greedy only; :func:`cpu_standin_keys`: below
    :data:`PLAIN_CPU_FROM`, or a version not known) also ``disable_padded_drafter_batch: true`` (the EAGLE
    proposer's torch path) and ``--override-generation-config {"temperature": 0.0}``: a request that leaves
    ``temperature`` unset (the health gate's, most clients') would otherwise sample, and vLLM 0.16's rejection
    sampler for sampled requests is a Triton kernel that kills the CPU engine (``TypeError: 'function' object is
    not subscriptable`` in ``expand_kernel``, then ``EngineDeadError``; measured on the sandbox). A client that asks
    for ``temperature > 0`` still does; the stand-in is never a production image. vLLM 0.32 on CPU takes the plain
    config (docs/vllm-profiles.md, compatibility matrix).
    """
    cfg: dict[str, Any] = {"method": "eagle3", "model": model, "num_speculative_tokens": num_speculative_tokens}
    if draft_tp is not None:
        cfg["draft_tensor_parallel_size"] = draft_tp
    standin = cpu_standin_keys(cpu, vllm)
    if standin:
        cfg["disable_padded_drafter_batch"] = True
    args = ["--speculative-config", json.dumps(cfg, sort_keys=True)]
    if standin:
        args += ["--override-generation-config", json.dumps({"temperature": 0.0})]
    return args
