"""Command lines of runs over several nodes (argv only): the stages in the pipeline image, torchrun across nodes,
and the cross-node preflight trial (:mod:`eagle3ops.fleet.trial`, run in the pipeline image on each node).

torchrun flags as torch 2.9's ``torch.distributed.run`` takes them: ``--nnodes``, ``--nproc-per-node``,
``--node-rank``, ``--master-addr``/``--master-port`` (static rendezvous: the node's rank is given, so a trial that
times out names the nodes that never joined) or ``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID``
(elastic: ranks assigned on arrival).
"""

from __future__ import annotations

from eagle3ops.commands.stages import run_dir
from eagle3ops.commands.types import Read

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
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank must be in [0, {nnodes}), got {node_rank}")
    if timeout_s <= 0:
        raise ValueError(f"trial timeout must be above 0 seconds, got {timeout_s}")
    docker = ["docker", *(["-H", docker_host] if docker_host else []), "run", "--rm", "--network", "host",
              "--entrypoint", PYTHON, image]
    return Read([*docker, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1",
                 f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={port}",
                 "-m", "eagle3ops.fleet.trial", f"--timeout-s={timeout_s:g}"])
