"""The inventory's ``fleet:`` section: how runs over several hosts (``eagle3ops extract HOST...``, ``train HOST
HOST...``, ``eagle3ops render``) use them. Part of :class:`eagle3ops.config.inventory.Inventory`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle3ops.config.base import StrictModel


class FleetConfig(StrictModel):
    """How a run over several hosts (`eagle3ops extract HOST...`, `eagle3ops render`) uses them."""

    max_down_per_model: int | None = Field(
        None, ge=1, description="Most hosts serving one model (`serving.served_model_name`) whose windows may keep "
        "serving down at once. Default: one fewer than the inventory's hosts serving that model (never all of "
        "them); a model with a single serving host goes down alone, as in a one-host window.")
    split_windows: bool = Field(
        True, description="A window whose estimated downtime (from the host's measured rates) is over its "
        "`maintenance_budget_s` is split into consecutive windows over smaller sample ranges; `false` refuses the "
        "plan instead. Either way before anything stops.")
    rendezvous_port: int = Field(29500, ge=1, le=65535, description="TCP port of torchrun's c10d rendezvous on the "
                                 "first host (multi-node training, the cross-node preflight trial, `render slurm`).")
    rendezvous_host: str | None = Field(None, description="Address of the first node as the others reach it (multi-"
                                        "node `train HOST HOST...`; torchrun's --master-addr). Default: its `hostname`.")
    trial_timeout_s: float = Field(60.0, gt=0, description="Seconds the cross-node trial (one gloo all-reduce) waits.")
    slurm_container: Literal["pyxis", "apptainer", "docker"] = Field(
        "pyxis", description="How `render slurm` runs the pipeline image: `pyxis` (`srun --container-image`, "
        "enroot), `apptainer` (`apptainer exec docker://IMAGE@DIGEST`; both pull by deployed.json's `repo_digest`) "
        "or `docker` (`docker run` of the image id on each node's engine; Slurm's cgroups do not confine it).")
    k8s_namespace: str = Field("default", description="Namespace of the Jobs `eagle3ops render k8s` writes.")
    k8s_claim: str | None = Field(
        None, description="PersistentVolumeClaim (ReadWriteMany) whose root is the hosts' `data_dir`, mounted at /data "
        "by every pod `render k8s` writes: the pods of a Job run on several nodes, where a hostPath is another "
        "directory, so hostPath is refused. `render --claim` overrides it.")
    k8s_model_claim: str | None = Field(
        None, description="PersistentVolumeClaim holding the target's weights (mounted read-only at /model). Default: "
        "`k8s_claim`, at `model_path`'s place below `data_dir`.")
    link_mb_per_s: float | None = Field(None, gt=0, description="Link MB/s of unmeasured `--from-fleet` copies (12.5).")
