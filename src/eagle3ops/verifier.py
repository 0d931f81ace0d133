"""``eagle3ops verify HOST``: run the pipeline image's engine checks on the target host and record the result there.

A pipeline image built on a base that cannot start a vLLM engine (the real ``vllm/vllm-openai`` on a build host
without a GPU) defers its engine checks -- each applied patch's behavioural probe -- to the host; its label
``io.eagle3ops.verified`` says so (``build:...;host:probes``, :mod:`eagle3ops.imagecheck`). ``verify`` runs them in a
container of the deployed image (pinned by image id) with the stage containers' settings of that host (all GPUs on
a GPU host; the inventory's ``stage_env``), records the result in ``<state_dir>/verify/<image id>.json`` and
returns it. ``deploy`` calls :func:`ensure_verified` before it records the deployment, so no window runs an image
whose deferred checks have not passed on that host. Every remote command comes from :mod:`eagle3ops.commands` and
runs through :class:`eagle3ops.remote.Remote`.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import verify as vc
from eagle3ops.imagecheck import RESULT_PREFIX, parse_verified

if TYPE_CHECKING:  # the in-image CLI registers `verify` too, and the image has no paramiko/fabric
    from eagle3ops.remote import Remote

#: seconds the engine checks may take on a host (engine starts + probe bodies; ~1-3 min on 2 CPU cores)
VERIFY_TIMEOUT_S = 1800.0


class VerifyError(Exception):
    """The engine checks could not run or did not pass; the message names the host, the image and the fix."""


@dataclass
class VerifyResult:
    """One verify run: ``ok``, the checks ``deferred`` by the build (from the label), per-probe ``outcomes``,
    ``seconds`` (wall time of the container), the host-side ``record_path``, the ``platform`` vLLM found there."""

    host: str
    image: str
    image_id: str
    ok: bool
    deferred: list[str]
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    platform: str | None = None
    record_path: str = ""
    reused: bool = False
    log_tail: str = ""


def _deployed(r: Remote) -> dict[str, Any]:
    from eagle3ops.window.common import hint, paths

    out = r.run(hc.cat_if_exists(paths(r.host)["deployed"]), check=False)
    if not out.stdout.strip():
        raise VerifyError(f"{r.host.name}: no pipeline image deployed yet; run {hint('deploy', r.host.name)} first")
    return json.loads(out.stdout)


def deferred_checks(r: Remote, image_id: str) -> list[str]:
    """The checks the image's build deferred to the host (``host:`` part of its ``io.eagle3ops.verified`` label,
    read from the host's engine).

    Raises:
        VerifyError: the image is not on the host.
    """
    res = r.run(dk.inspect_format(r.host, image_id, "{{json .Config.Labels}}", kind="image"), check=False)
    if not res.ok:
        raise VerifyError(f"{r.host.name}: image {image_id} is not on the host ({res.stderr.strip()}); run "
                          f"`eagle3ops deploy {r.host.name}`")
    labels = json.loads(res.stdout or "null") or {}
    return parse_verified(labels.get("io.eagle3ops.verified"))["host"]


def recorded(r: Remote, image_id: str) -> dict[str, Any] | None:
    """The result recorded on the host for ``image_id`` (None when verify never ran for it)."""
    out = r.run(hc.cat_if_exists(vc.result_path(r.host, image_id)), check=False)
    return json.loads(out.stdout) if out.stdout.strip() else None


def verify(r: Remote, *, image: str | None = None, image_id: str | None = None,
           echo: Callable[[str], None] = print, timeout: float = VERIFY_TIMEOUT_S) -> VerifyResult:
    """Run the engine checks of ``image`` (default: the host's deployed image) on the host; record and return.

    Args:
        r: an open :class:`Remote` to the host (dry run: the commands are printed, nothing runs, the result says
            ``ok`` with no outcomes).
        image, image_id: the pipeline image tag and its id; default: ``deployed.json``'s.
        echo: progress lines.
        timeout: seconds before the container is abandoned (:data:`VERIFY_TIMEOUT_S`).

    Returns:
        :class:`VerifyResult`; the same record (JSON) is written to ``<state_dir>/verify/<id hex>.json``.

    Raises:
        VerifyError: no deployed image, image absent on the host, no GPU with half its memory free (a GPU host
        whose GPUs production serving holds), the checks ran past ``timeout`` (the container is removed), or the
        container gave no result line (it crashed before the checks: the message carries its last output lines).
    """
    h = r.host
    if image is None or image_id is None:
        dep = _deployed(r)
        image, image_id = dep["image"], dep["image_id"]
    deferred = [] if r.dry_run else deferred_checks(r, image_id)
    gpu = None
    if h.gpus:
        res = r.run(vc.gpu_memory(), check=False)
        rows = vc.parse_gpu_memory(res.stdout) if res.ok else []
        gpu = vc.pick_gpu(rows)
        if gpu is None and not r.dry_run:
            used = "; ".join(f"GPU {i}: {u}/{t} MiB used" for i, u, t in rows) or res.stderr.strip()
            raise VerifyError(f"{h.name}: no GPU has {vc.PROBE_GPU_FRACTION:.0%} of its memory free for the probe "
                              f"engines ({used}); production serving holds them. Run `eagle3ops verify {h.name}` "
                              f"while serving is stopped, or free one GPU")
    argv = vc.engine_check_argv(h, image=image, image_id=image_id, gpu=gpu)
    echo(f"verify {h.name}: engine checks of {image} ({image_id[:19]}) in a container "
         f"({f'GPUs: all, engines on GPU {gpu}' if gpu is not None else 'no GPUs'}); deferred by the build: "
         f"{', '.join(deferred) or 'none'}")
    r.run(dk.rm(h, vc.container_name(image_id), force=True), check=False)  # a leftover from an interrupted run
    from eagle3ops.remote import RemoteCommandError

    t0 = time.monotonic()
    try:
        res = r.run(argv, check=False, timeout=timeout)
    except RemoteCommandError as exc:  # the timeout: the container would go on holding a GPU
        r.run(dk.rm(h, vc.container_name(image_id), force=True), check=False)
        raise VerifyError(f"{h.name}: the engine checks of {image} did not finish within {timeout:.0f} s ({exc}); "
                          f"the container {vc.container_name(image_id)} was removed. Look at the host's load and "
                          f"run `eagle3ops verify {h.name}` again") from None
    seconds = time.monotonic() - t0
    if r.dry_run:
        return VerifyResult(h.name, image, image_id, True, deferred, seconds=0.0)
    found = [ln for ln in (res.stdout or "").splitlines() if ln.startswith(RESULT_PREFIX + " ")]
    tail = "\n".join(((res.stdout or "") + (res.stderr or "")).splitlines()[-30:])
    if not found:
        raise VerifyError(f"{h.name}: the engine-check container of {image} exited {res.exited} without a result "
                          f"line; its last output:\n{tail}")
    out = json.loads(found[-1][len(RESULT_PREFIX) + 1:])
    outcomes = [dict(o, package=pkg) for pkg, v in out["packages"].items() for o in v["outcomes"]]
    record = {"host": h.name, "image": image, "image_id": image_id, "ok": bool(out["ok"]) and res.ok,
              "deferred": deferred, "checks": out["checks"], "platform": out.get("platform"),
              "files_changed": {p: v["files_changed"] for p, v in out["packages"].items() if v["files_changed"]},
              "outcomes": outcomes, "seconds": round(seconds, 1), "gpus": h.gpus,
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "by": getpass.getuser()}
    r.run(hc.mkdir_p(vc.verify_dir(h)))
    path = vc.result_path(h, image_id)
    r.run(hc.write_file(path), stdin=json.dumps(record, indent=2) + "\n")
    return VerifyResult(h.name, image, image_id, record["ok"], deferred, outcomes, seconds, out.get("platform"), path,
                        log_tail="" if record["ok"] else tail)


def ensure_verified(r: Remote, image: str, image_id: str, labels: dict[str, str],
                    echo: Callable[[str], None] = print) -> VerifyResult | None:
    """What ``deploy`` does before any window: when the image's labels defer checks to the host and no passing
    result is recorded there for this image id, run :func:`verify`.

    Returns:
        None when nothing was deferred; else the result (``reused`` when a recorded pass was found).

    Raises:
        VerifyError: the checks ran and failed (the message lists each failing probe), or as :func:`verify`.
    """
    deferred = parse_verified(labels.get("io.eagle3ops.verified"))["host"]
    if not deferred:
        return None
    rec = None if r.dry_run else recorded(r, image_id)
    if rec is not None and rec.get("ok"):
        echo(f"verify {r.host.name}: deferred checks ({', '.join(deferred)}) already passed for {image_id[:19]} "
             f"at {rec.get('at')} ({vc.result_path(r.host, image_id)})")
        return VerifyResult(r.host.name, image, image_id, True, deferred, rec.get("outcomes", []),
                            rec.get("seconds", 0.0), rec.get("platform"), vc.result_path(r.host, image_id), True)
    res = verify(r, image=image, image_id=image_id, echo=echo)
    if not res.ok:
        raise VerifyError(failure_message(res))
    return res


def failure_message(res: VerifyResult) -> str:
    """A failed run as text: each failing probe with its detail, where the record is, what to do."""
    bad = [f"  {o['package']} {o['patch']}: probe {o['probe']}: {o['detail']}" for o in res.outcomes if not o["ok"]]
    return (f"{res.host}: engine checks of {res.image} failed (recorded in {res.record_path}):\n"
            + ("\n".join(bad) or f"  (no failing probe reported; container output:)\n{res.log_tail}")
            + "\nfix the patch (or the host's GPU/driver setup) and deploy again; windows must not run this image")


def verify_command(
    host: str,
    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i",
                                             help="Inventory file (env EAGLE3OPS_INVENTORY, else deploy/hosts.yaml)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every remote command in order; execute none."),
    json_out: bool = typer.Option(False, "--json", help="Print the recorded result as JSON."),
) -> None:
    """Run the deployed pipeline image's engine checks (each patch's probe, on vLLM engines) on HOST in a container
    with the stage settings (GPUs on a GPU host); record the result in <state_dir>/verify/ and print it."""
    import os

    from rich.console import Console

    from eagle3ops.config import ConfigError, load_inventory

    console = Console(stderr=True)
    inv_path = inventory or Path(os.environ.get("EAGLE3OPS_INVENTORY", "deploy/hosts.yaml"))
    try:
        h = load_inventory(inv_path).host(host)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    from eagle3ops import executor

    try:
        with executor.for_host(h, dry_run=dry_run, echo=(print if dry_run else None)) as r:
            res = verify(r, echo=console.print)
    except VerifyError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if dry_run:
        return
    if json_out:
        print(json.dumps(res.__dict__, indent=2))
    else:
        for o in res.outcomes:
            print(f"{'ok  ' if o['ok'] else 'FAIL'} {o['package']} {o['patch']}: probe {o['probe']}"
                  + (f" ({o['seconds']:.1f} s)" if o["ok"] else f": {o['detail']}"))
        print(f"{h.name}: engine checks {'passed' if res.ok else 'FAILED'} on platform {res.platform} in "
              f"{res.seconds:.1f} s (deferred by the build: {', '.join(res.deferred) or 'none'}); "
              f"recorded in {res.record_path}")
    if not res.ok:
        raise typer.Exit(1)
