"""``eagle3ops extract HOST HOST...`` (the fleet plan) and ``eagle3ops render k8s|slurm RUN``: the commands over several
hosts (issues 29, 30), registered on the main typer app by :mod:`eagle3ops.cli`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from eagle3ops import cli_common as common
from eagle3ops.cli_common import InventoryOpt


def fleet_extract(hosts: list[str], inventory: Path, dry_run: bool, offline: bool, run: str, pipeline: Path) -> None:
    """``extract`` over several hosts: print the fleet plan (reads only) or refuse to run it (see
    :mod:`eagle3ops.fleet.driver`)."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.config.pipeline import parse_pipeline_config
    from eagle3ops.fleet import driver
    from eagle3ops.fleet.plan import FleetPlanError, render

    if not dry_run:
        common.fail(driver.refuse_execution())
    try:
        inv = load_inventory(inventory)
        cfg = parse_pipeline_config(common.read_pipeline(pipeline), pipeline)
        plan = driver.plan_hosts(inv, hosts, run, cfg,
                                 reader=None if offline else (lambda h: common.remote(h, dry_run=True)))
    except (ConfigError, FleetPlanError) as exc:
        common.fail(str(exc), 2)
    print(render(plan))
    print(json.dumps(plan.as_dict(), indent=2))


def render(target: str = typer.Argument(..., metavar="k8s|slurm"),
           run: str = typer.Argument(..., metavar="RUN", help="The pipeline run (data_dir/runs/RUN)."),
           hosts: list[str] = typer.Option(..., "--host", "-H", help="The hosts (nodes) of the run, in shard "
                                           "order; the first one's deployed.json names the image."),
           inventory: Path = InventoryOpt,
           record: Optional[Path] = typer.Option(None, help="A deployed.json to take the image digest from "
                                                 "instead of reading the first host's."),
           samples: int = typer.Option(..., help="Samples of the run (prepare's count): the shards are cut from "
                                       "it."),
           nproc: int = typer.Option(1, help="Training processes per node (torchrun --nproc-per-node).")) -> None:
    """Print the run's stages as Kubernetes Jobs (extract: an Indexed Job, one completion per shard) or a Slurm batch
    script (srun + torchrun), the pipeline image named by digest."""
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.fleet.render import RenderError, RenderInput, image_by_digest, render_k8s, render_slurm
    from eagle3ops.fleet.shard import shard_ranges

    if target not in ("k8s", "slurm"):
        common.fail(f"render target {target!r}: use `k8s` or `slurm`", 2)
    try:
        inv = load_inventory(inventory)
        first = inv.host(hosts[0])
        for n in hosts[1:]:
            inv.host(n)
        if record is not None:
            deploy_record = json.loads(record.read_text())
        else:
            with common.remote(first) as r:
                deploy_record = common.deployed_record(r)
        image, source = image_by_digest(deploy_record)
        inp = RenderInput(run, image, source, tuple(shard_ranges(samples, hosts)), first.data_dir,
                          first.model_path, first.gpus, nproc, inv.fleet.rendezvous_port, inv.fleet.slurm_container,
                          inv.fleet.k8s_namespace)
        print(render_k8s(inp) if target == "k8s" else render_slurm(inp), end="")
    except (ConfigError, RenderError, ValueError, OSError) as exc:
        common.fail(str(exc), 2)
