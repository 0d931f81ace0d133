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


def ngram_args(*, num_speculative_tokens: int, cpu: bool) -> list[str]:
    """``--speculative-config`` for vLLM 0.16's n-gram (prompt lookup) proposer: no head, ``k`` proposed tokens,
    the lookup window :data:`NGRAM_LOOKUP`. On a CPU host also ``--override-generation-config {"temperature": 0.0}``
    (vLLM 0.16's rejection sampler for sampled requests is a Triton kernel: see :func:`speculative_args`)."""
    lo, hi = NGRAM_LOOKUP
    cfg = {"method": "ngram", "num_speculative_tokens": num_speculative_tokens, "prompt_lookup_min": lo,
           "prompt_lookup_max": hi}
    args = ["--speculative-config", json.dumps(cfg, sort_keys=True)]
    if cpu:
        args += ["--override-generation-config", json.dumps({"temperature": 0.0})]
    return args


def speculative_args(*, num_speculative_tokens: int, cpu: bool, model: str = HEAD_MOUNT,
                     draft_tp: int | None = None) -> list[str]:
    """``--speculative-config`` for vLLM 0.16: method ``eagle3``, the head at ``model`` (a container sees it mounted
    at :data:`HEAD_MOUNT`; a serving process reads it at its host path), ``k``; with ``draft_tp`` also
    ``draft_tensor_parallel_size`` (vLLM 0.16 takes 1 or the target's TP; default: the target's).

    On a CPU host (the sandbox's stand-in series, greedy only) also ``disable_padded_drafter_batch: true`` (the EAGLE
    proposer's torch path) and ``--override-generation-config {"temperature": 0.0}``: a request that leaves
    ``temperature`` unset (the health gate's, most clients') would otherwise sample, and vLLM 0.16's rejection
    sampler for sampled requests is a Triton kernel that kills the CPU engine (``TypeError: 'function' object is
    not subscriptable`` in ``expand_kernel``, then ``EngineDeadError``; measured on the sandbox). A client that asks
    for ``temperature > 0`` still does; the stand-in is never a production image.
    """
    cfg: dict[str, Any] = {"method": "eagle3", "model": model, "num_speculative_tokens": num_speculative_tokens}
    if draft_tp is not None:
        cfg["draft_tensor_parallel_size"] = draft_tp
    if cpu:
        cfg["disable_padded_drafter_batch"] = True
    args = ["--speculative-config", json.dumps(cfg, sort_keys=True)]
    if cpu:
        args += ["--override-generation-config", json.dumps({"temperature": 0.0})]
    return args
