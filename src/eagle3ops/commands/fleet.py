"""Command lines of runs over several nodes (argv only): the stages in the pipeline image, torchrun across nodes,
and the cross-node preflight trial (:mod:`eagle3ops.fleet.trial`, run in the pipeline image on each node).

torchrun flags as torch 2.9's ``torch.distributed.run`` takes them: ``--nnodes``, ``--nproc-per-node``,
``--node-rank``, ``--master-addr``/``--master-port`` (static rendezvous: the node's rank is given, so a trial that
times out names the nodes that never joined) or ``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID``
(elastic: ranks assigned on arrival).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3ops.commands.runtime import for_host
from eagle3ops.commands.stages import run_dir
from eagle3ops.commands.types import Change, Read

if TYPE_CHECKING:
    from eagle3ops.config import HostConfig

#: The interpreter of the pipeline image (vLLM's image: deadsnakes Python 3.12 as the system ``python3``).
PYTHON = "python3"


def stage_argv(stage: str, run: str) -> list[str]:
    """``python3 -m eagle3ops stage STAGE --run-dir /data/runs/RUN`` (inside the pipeline image)."""
    return [PYTHON, "-m", "eagle3ops", "stage", stage, "--run-dir", run_dir(run)]


def torchrun_c10d(nnodes: int, nproc: int, rdzv_id: str) -> list[str]:
    """torchrun with the c10d rendezvous; the caller appends ``--rdzv-endpoint=HOST:PORT`` (a shell expansion in a
    batch script) and the program. Raises ValueError for fewer than one node or process."""
    if nnodes < 1 or nproc < 1:
        raise ValueError(f"torchrun needs at least one node and one process per node, got {nnodes} x {nproc}")
    return [PYTHON, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-id={rdzv_id}"]


def trial_argv(image: str, *, master_addr: str, port: int, nnodes: int, node_rank: int, timeout_s: float,
               docker_host: str | None = None) -> Read:
    """The cross-node trial on one node: ``docker run --rm --network host IMAGE`` + torchrun (static rendezvous at
    ``master_addr:port``, one process, this node's rank) + ``-m eagle3ops.fleet.trial --timeout-s T``. Reads only
    (a throwaway container; nothing on the host changes).

    Raises:
        ValueError: ``node_rank`` outside ``[0, nnodes)`` or a timeout not above 0.
    """
    docker = ["docker", *(["-H", docker_host] if docker_host else []), "run", "--rm", "--network", "host",
              "--entrypoint", PYTHON, image]
    return Read([*docker, *_torchrun_trial(master_addr, port, nnodes, node_rank, timeout_s)])


def _torchrun_trial(master_addr: str, port: int, nnodes: int, node_rank: int, timeout_s: float) -> list[str]:
    """``-m torch.distributed.run`` (static rendezvous, one process, this node's rank) ``-m eagle3ops.fleet.trial
    --timeout-s T``: what follows the interpreter in both runtimes' trial.

    Raises:
        ValueError: ``node_rank`` outside ``[0, nnodes)`` or a timeout not above 0.
    """
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank must be in [0, {nnodes}), got {node_rank}")
    if timeout_s <= 0:
        raise ValueError(f"trial timeout must be above 0 seconds, got {timeout_s}")
    return ["-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1", f"--node-rank={node_rank}",
            f"--master-addr={master_addr}", f"--master-port={port}", "-m", "eagle3ops.fleet.trial",
            f"--timeout-s={timeout_s:g}"]


#: Seconds a trial process may outlive its own ``--timeout-s`` (torchrun's start and teardown) before ``timeout``
#: kills it: every wait of the trial is bounded.
TRIAL_GRACE_S = 30


def _python(host: "HostConfig", image: str) -> list[str]:
    """The host's pipeline interpreter: the environment's python with the stages' environment (offline switches, the
    inventory's ``stage_env`` — e.g. ``GLOO_SOCKET_IFNAME``) on a venv host, ``docker run --rm --network host`` of
    the pipeline image otherwise (the host's runtime's :meth:`~eagle3ops.commands.runtime.StageRuntime.python`)."""
    return for_host(host).python(host, image)


def trial_program(host: "HostConfig", image: str) -> list[str]:
    """``python -m eagle3ops.fleet.trial`` in the host's pipeline (:func:`_python`)."""
    return [*_python(host, image), "-m", "eagle3ops.fleet.trial"]


def reach_listen_argv(host: "HostConfig", image: str, *, port: int, seconds: float, expect: int) -> Read:
    """The reach probe's listening end on the first node (:func:`eagle3ops.fleet.trial.listen`: until ``expect``
    nodes connected or ``seconds`` passed), bounded by ``timeout``. Reads only (a socket open meanwhile)."""
    return Read(["timeout", "-s", "KILL", f"{seconds + TRIAL_GRACE_S:g}", *trial_program(host, image),
                 f"--timeout-s={seconds:g}", f"--listen={int(port)}", f"--expect={int(expect)}"])


def reach_argv(host: "HostConfig", image: str, *, addr: str, port: int, timeout_s: float) -> Read:
    """The reach probe on one node: one TCP connect to ``addr:port`` (:func:`eagle3ops.fleet.trial.reach`), bounded
    by ``timeout``. Reads only."""
    return Read(["timeout", "-s", "KILL", f"{timeout_s + TRIAL_GRACE_S:g}", *trial_program(host, image),
                 f"--timeout-s={timeout_s:g}", f"--reach={addr}:{int(port)}"])


def trial_argv_venv(host: "HostConfig", image: str, *, master_addr: str, port: int, nnodes: int, node_rank: int,
                    timeout_s: float) -> Read:
    """The cross-node trial on a venv host (``stage_runtime: venv``): the pipeline environment's python with the
    stages' environment (offline switches, the inventory's ``stage_env`` — e.g. ``GLOO_SOCKET_IFNAME``) running
    torchrun (static rendezvous, one process, this node's rank) + ``-m eagle3ops.fleet.trial``, under coreutils
    ``timeout`` (``timeout_s`` + :data:`TRIAL_GRACE_S`, then SIGKILL). Reads only.

    Raises:
        ValueError: ``node_rank`` outside ``[0, nnodes)`` or a timeout not above 0.
    """
    return Read(["timeout", "-s", "KILL", f"{timeout_s + TRIAL_GRACE_S:g}", *_python(host, image),
                 *_torchrun_trial(master_addr, port, nnodes, node_rank, timeout_s)])


def node_trial_argv(host: "HostConfig", image: str, *, master_addr: str, port: int, nnodes: int, node_rank: int,
                    timeout_s: float) -> Read:
    """The cross-node trial on one node in the host's runtime: :func:`trial_argv` (a throwaway container of
    ``image`` on the host's engine) or, without an engine, :func:`trial_argv_venv` (a process of the pipeline
    environment, bounded by ``timeout`` on the host).

    Raises:
        ValueError: ``node_rank`` outside ``[0, nnodes)`` or a timeout not above 0.
    """
    if for_host(host).engine:
        return trial_argv(image, master_addr=master_addr, port=port, nnodes=nnodes, node_rank=node_rank,
                          timeout_s=timeout_s, docker_host=host.docker_host)
    return trial_argv_venv(host, image, master_addr=master_addr, port=port, nnodes=nnodes, node_rank=node_rank,
                           timeout_s=timeout_s)


# --- hidden states moved to the training host (``train HOST --from-fleet``: :mod:`eagle3ops.transfer.hidden`) ---

#: Where files arriving on the training host land (inside the run's ``extract/``) until their sha256 is checked.
INCOMING = ".incoming"


def hidden_digests(extract_dir: str, *, incoming_only: bool = False) -> Read:
    """``sha256sum`` of every file under ``<extract_dir>/hidden`` and ``<extract_dir>/.incoming`` (only the latter
    with ``incoming_only``: the arrivals of a copy), one ``<hex>  <path>`` line each (``find`` exits 1 naming a folder
    that is absent: run with ``check=False``)."""
    roots = ([] if incoming_only else [f"{extract_dir}/hidden"]) + [f"{extract_dir}/{INCOMING}"]
    return Read(["find", *roots, "-type", "f", "-exec", "sha256sum", "{}", "+"])


def send_files(extract_dir: str) -> Read:
    """``tar -c`` to stdout of the files named on stdin (one path per line, relative to ``extract_dir``): the sending
    end of a hidden-state copy. Reads only."""
    return Read(["tar", "-cf", "-", "-C", extract_dir, "--verbatim-files-from", "-T", "-"])


#: The receiving end: a tar stream on stdin unpacked into the incoming folder (created first).
RECEIVE_FILES_SH = 'mkdir -p "$1" && exec tar -xf - -C "$1" --no-same-owner'


def receive_files(incoming_dir: str) -> Change:
    """Unpack the tar stream on stdin into ``incoming_dir`` (:data:`RECEIVE_FILES_SH`); nothing is trusted until its
    sha256 is checked (:func:`hidden_digests`) and it is moved into place (:func:`promote_files`)."""
    return Change(["sh", "-c", RECEIVE_FILES_SH, "eagle3ops-receive-hidden", incoming_dir])


#: Move each file named on stdin (relative paths, one a line) from ``$1`` to ``$2``, making its folder; exit 1 at the
#: first that fails.
PROMOTE_FILES_SH = ('while IFS= read -r f; do [ -n "$f" ] || continue; mkdir -p "$2/$(dirname "$f")" && '
                    'mv -f "$1/$f" "$2/$f" || exit 1; done')


def promote_files(incoming_dir: str, extract_dir: str) -> Change:
    """Move the verified files named on stdin from ``incoming_dir`` into ``extract_dir`` (same relative paths)."""
    return Change(["sh", "-c", PROMOTE_FILES_SH, "eagle3ops-promote-hidden", incoming_dir, extract_dir])


#: Remove each file named on stdin (relative to ``$1``).
REMOVE_FILES_SH = 'cd "$1" || exit 0; while IFS= read -r f; do [ -n "$f" ] && rm -f -- "$f"; done; exit 0'


def remove_files(root: str) -> Change:
    """Remove the files named on stdin (relative to ``root``): arrivals whose sha256 is not the manifest's."""
    return Change(["sh", "-c", REMOVE_FILES_SH, "eagle3ops-remove-hidden", root])
