"""``eagle3ops probe HOST``: run the pipeline image's deferred probes on the target host and record the result there.

A pipeline image built on a base that cannot start a vLLM engine (the real ``vllm/vllm-openai`` on a build host
without a GPU) defers its probes -- each applied patch's behavioural probe, on vLLM engines -- to the host; its label
``io.eagle3ops.verified`` says so (``build:...;host:probes``, :mod:`eagle3ops.imagecheck`). :func:`probe_host` runs
them in a container of the deployed image (pinned by image id) with the stage containers' settings of that host (all
GPUs on a GPU host; the inventory's ``stage_env``), records the result in ``<state_dir>/probes/<image id>.json``
(a record under ``<state_dir>/verify/``, written by versions that called this ``eagle3ops verify HOST``, is read
too) and returns it. ``deploy`` calls :func:`ensure_probed` before it records the deployment, so no window runs an
image whose deferred probes have not passed on that host. Every remote command comes from :mod:`eagle3ops.commands`
and runs through :class:`eagle3ops.remote.Remote`.

In the image, ``python3 -m eagle3ops.hostprobe`` (:func:`in_image_main`) is what that container runs: the probes of
every applied patch, fresh (no result cache), and one result line.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import hostprobe as hp
from eagle3ops.imagecheck import parse_verified

if TYPE_CHECKING:  # the in-image CLI registers `probe` too, and the image has no paramiko/fabric
    from eagle3ops.remote import Remote

#: seconds the deferred probes may take on a host (engine starts + probe bodies; ~1-3 min on 2 CPU cores)
HOST_PROBE_TIMEOUT_S = 1800.0
#: prefix of the result line the in-image run prints (vLLM's own log lines share stdout)
RESULT_PREFIX = "EAGLE3OPS-PROBE-RESULT"


class HostProbeError(Exception):
    """The deferred probes could not run or did not pass; the message names the host, the image and the fix."""


@dataclass
class HostProbeResult:
    """One host-probe run: ``ok``, the checks ``deferred`` by the build (from the label), per-probe ``outcomes``,
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
        raise HostProbeError(f"{r.host.name}: no pipeline image deployed yet; run {hint('deploy', r.host.name)} first")
    return json.loads(out.stdout)


def deferred_checks(r: Remote, image_id: str) -> list[str]:
    """The checks the image's build deferred to the host (``host:`` part of its ``io.eagle3ops.verified`` label,
    read from the host's engine).

    Raises:
        HostProbeError: the image is not on the host.
    """
    res = r.run(dk.inspect_format(r.host, image_id, "{{json .Config.Labels}}", kind="image"), check=False)
    if not res.ok:
        raise HostProbeError(f"{r.host.name}: image {image_id} is not on the host ({res.stderr.strip()}); run "
                             f"`eagle3ops deploy {r.host.name}`")
    labels = json.loads(res.stdout or "null") or {}
    return parse_verified(labels.get("io.eagle3ops.verified"))["host"]


def recorded(r: Remote, image_id: str) -> dict[str, Any] | None:
    """The result recorded on the host for ``image_id`` (None when the probes never ran there for it), with
    ``record_path`` (where it was found) added: under
    ``<state_dir>/probes/``, else under ``<state_dir>/verify/`` where versions before the rename recorded it
    (:func:`eagle3ops.commands.hostprobe.legacy_dir`)."""
    for legacy in (False, True):
        path = hp.result_path(r.host, image_id, legacy=legacy)
        out = r.run(hc.cat_if_exists(path), check=False)
        if out.stdout.strip():
            return dict(json.loads(out.stdout), record_path=path)
    return None


def probe_host(r: Remote, *, image: str | None = None, image_id: str | None = None,
               echo: Callable[[str], None] = print, timeout: float = HOST_PROBE_TIMEOUT_S) -> HostProbeResult:
    """Run the deferred probes of ``image`` (default: the host's deployed image) on the host; record and return.

    Args:
        r: an open :class:`Remote` to the host (dry run: the commands are printed, nothing runs, the result says
            ``ok`` with no outcomes).
        image, image_id: the pipeline image tag and its id; default: ``deployed.json``'s.
        echo: progress lines.
        timeout: seconds before the container is abandoned (:data:`HOST_PROBE_TIMEOUT_S`).

    Returns:
        :class:`HostProbeResult`; the same record (JSON) is written to ``<state_dir>/probes/<id hex>.json``.

    Raises:
        HostProbeError: no deployed image, image absent on the host, no GPU with half its memory free (a GPU host
        whose GPUs production serving holds), the probes ran past ``timeout`` (the container is removed), or the
        container gave no result line (it crashed before the probes: the message carries its last output lines).
    """
    h = r.host
    if image is None or image_id is None:
        dep = _deployed(r)
        image, image_id = dep["image"], dep["image_id"]
    deferred = [] if r.dry_run else deferred_checks(r, image_id)
    gpu = None
    if h.gpus:
        res = r.run(hp.gpu_memory(), check=False)
        rows = hp.parse_gpu_memory(res.stdout) if res.ok else []
        gpu = hp.pick_gpu(rows)
        if gpu is None and not r.dry_run:
            used = "; ".join(f"GPU {i}: {u}/{t} MiB used" for i, u, t in rows) or res.stderr.strip()
            raise HostProbeError(f"{h.name}: no GPU has {hp.PROBE_GPU_FRACTION:.0%} of its memory free for the probe "
                                 f"engines ({used}); production serving holds them. Run `eagle3ops probe {h.name}` "
                                 f"while serving is stopped, or free one GPU")
    argv = hp.probe_argv(h, image=image, image_id=image_id, gpu=gpu)
    echo(f"probe {h.name}: deferred probes of {image} ({image_id[:19]}) in a container "
         f"({f'GPUs: all, engines on GPU {gpu}' if gpu is not None else 'no GPUs'}); deferred by the build: "
         f"{', '.join(deferred) or 'none'}")
    r.run(dk.rm(h, hp.container_name(image_id), force=True), check=False)  # a leftover from an interrupted run
    from eagle3ops.remote import RemoteCommandError

    t0 = time.monotonic()
    try:
        res = r.run(argv, check=False, timeout=timeout)
    except RemoteCommandError as exc:  # the timeout: the container would go on holding a GPU
        r.run(dk.rm(h, hp.container_name(image_id), force=True), check=False)
        raise HostProbeError(f"{h.name}: the probes of {image} did not finish within {timeout:.0f} s ({exc}); "
                             f"the container {hp.container_name(image_id)} was removed. Look at the host's load and "
                             f"run `eagle3ops probe {h.name}` again") from None
    seconds = time.monotonic() - t0
    if r.dry_run:
        return HostProbeResult(h.name, image, image_id, True, deferred, seconds=0.0)
    found = [ln for ln in (res.stdout or "").splitlines() if ln.startswith(RESULT_PREFIX + " ")]
    tail = "\n".join(((res.stdout or "") + (res.stderr or "")).splitlines()[-30:])
    if not found:
        raise HostProbeError(f"{h.name}: the probe container of {image} exited {res.exited} without a result "
                             f"line; its last output:\n{tail}")
    out = json.loads(found[-1][len(RESULT_PREFIX) + 1:])
    outcomes = [dict(o, package=pkg) for pkg, v in out["packages"].items() for o in v["outcomes"]]
    record = {"host": h.name, "image": image, "image_id": image_id, "ok": bool(out["ok"]) and res.ok,
              "deferred": deferred, "checks": out["checks"], "platform": out.get("platform"),
              "files_changed": {p: v["files_changed"] for p, v in out["packages"].items() if v["files_changed"]},
              "outcomes": outcomes, "seconds": round(seconds, 1), "gpus": h.gpus,
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "by": getpass.getuser()}
    r.run(hc.mkdir_p(hp.probes_dir(h)))
    path = hp.result_path(h, image_id)
    r.run(hc.write_file(path), stdin=json.dumps(record, indent=2) + "\n")
    return HostProbeResult(h.name, image, image_id, record["ok"], deferred, outcomes, seconds, out.get("platform"),
                           path, log_tail="" if record["ok"] else tail)


def ensure_probed(r: Remote, image: str, image_id: str, labels: dict[str, str],
                  echo: Callable[[str], None] = print) -> HostProbeResult | None:
    """What ``deploy`` does before any window: when the image's labels defer probes to the host and no passing
    result is recorded there for this image id (:func:`recorded`), run :func:`probe_host`.

    Returns:
        None when nothing was deferred; else the result (``reused`` when a recorded pass was found).

    Raises:
        HostProbeError: the probes ran and failed (the message lists each failing probe), or as :func:`probe_host`.
    """
    deferred = parse_verified(labels.get("io.eagle3ops.verified"))["host"]
    if not deferred:
        return None
    rec = None if r.dry_run else recorded(r, image_id)
    if rec is not None and rec.get("ok"):
        echo(f"probe {r.host.name}: deferred probes ({', '.join(deferred)}) already passed for {image_id[:19]} "
             f"at {rec.get('at')} ({rec['record_path']})")
        return HostProbeResult(r.host.name, image, image_id, True, deferred, rec.get("outcomes", []),
                               rec.get("seconds", 0.0), rec.get("platform"), rec["record_path"], True)
    res = probe_host(r, image=image, image_id=image_id, echo=echo)
    if not res.ok:
        raise HostProbeError(failure_message(res))
    return res


def failure_message(res: HostProbeResult) -> str:
    """A failed run as text: each failing probe with its detail, where the record is, what to do."""
    bad = [f"  {o['package']} {o['patch']}: probe {o['probe']}: {o['detail']}" for o in res.outcomes if not o["ok"]]
    return (f"{res.host}: probes of {res.image} failed (recorded in {res.record_path}):\n"
            + ("\n".join(bad) or f"  (no failing probe reported; container output:)\n{res.log_tail}")
            + "\nfix the patch (or the host's GPU/driver setup) and deploy again; windows must not run this image")


def probe_command(
    host: str,
    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i",
                                             help="Inventory file (env EAGLE3OPS_INVENTORY, else deploy/hosts.yaml)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every remote command in order; execute none."),
    json_out: bool = typer.Option(False, "--json", help="Print the recorded result as JSON; with --dry-run, the "
                                  "plan (the commands go to stderr)."),
) -> None:
    """Run the deployed pipeline image's deferred probes (each patch's probe, on vLLM engines) on HOST in a container
    with the stage settings (GPUs on a GPU host), under the host's lock; record the result in <state_dir>/probes/
    and print it."""
    import contextlib
    import os
    import shlex

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
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.lock import holding_lock

    # --dry-run --json: what a dry run prints goes to stderr; stdout holds the plan alone
    quiet = contextlib.redirect_stdout(sys.stderr) if dry_run and json_out else contextlib.nullcontext()
    try:
        with quiet, executor.for_host(h, dry_run=dry_run, echo=(print if dry_run else None)) as r:
            # the probe container holds GPUs and its record is written: a change, made under the host's lock
            with holding_lock(r, "probe", shlex.join(["eagle3ops", *sys.argv[1:]]), "deferred probes"):
                res = probe_host(r, echo=console.print)
    except (HostProbeError, WindowError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    if dry_run:
        if json_out:
            print(json.dumps({"kind": "probe", "host": h.name, "image": res.image, "image_id": res.image_id,
                              "changes": list(r.changes)}, indent=2, sort_keys=True), flush=True)
        return
    if json_out:
        print(json.dumps(res.__dict__, indent=2))
    else:
        for o in res.outcomes:
            print(f"{'ok  ' if o['ok'] else 'FAIL'} {o['package']} {o['patch']}: probe {o['probe']}"
                  + (f" ({o['seconds']:.1f} s)" if o["ok"] else f": {o['detail']}"))
        print(f"{h.name}: probes {'passed' if res.ok else 'FAILED'} on platform {res.platform} in "
              f"{res.seconds:.1f} s (deferred by the build: {', '.join(res.deferred) or 'none'}); "
              f"recorded in {res.record_path}")
    if not res.ok:
        raise typer.Exit(1)


def in_image_main(argv: list[str] | None = None) -> int:
    """``python3 -m eagle3ops.hostprobe`` in the pipeline image (what :func:`eagle3ops.commands.hostprobe.probe_argv`
    runs): compare each patched file with the apply manifest (sha256), run the probes of every applied patch where
    this container runs (fresh: no result cache), and print one line ``EAGLE3OPS-PROBE-RESULT <json>`` (vLLM logs to
    stdout too) with ``{"ok", "deferred", "checks", "packages": {pkg: {"files_changed", "outcomes"}}, "seconds",
    "platform"}``. Which packages and which probe registry: the build's checks record
    (:data:`eagle3ops.imagecheck.CHECKS_RECORD`). Exit 0 when every probe passed and no file changed, 1 otherwise.
    Takes no arguments."""
    import importlib.util

    from eagle3ops.imagecheck import CHECKS_RECORD, ENGINE_CHECKS
    from eagle3ops.patches.installed import find_dist
    from eagle3ops.patches.proberun import probe_installed

    if argv:
        print("usage: python3 -m eagle3ops.hostprobe (no arguments)", file=sys.stderr)
        return 2
    record = json.loads(CHECKS_RECORD.read_text())
    t0 = time.monotonic()
    out: dict[str, Any] = {"ok": True, "deferred": record["host"], "checks": list(ENGINE_CHECKS),
                           "probes_module": record["probes_module"], "packages": {}}
    for pkg in record["results"]:
        dist = find_dist(pkg)
        changed, outcomes = probe_installed(dist.site_dir, pkg, probes_module=record["probes_module"])
        out["packages"][pkg] = {"files_changed": changed,
                                "outcomes": [{"patch": o.patch, "probe": o.probe, "ok": o.ok, "detail": o.detail,
                                              "seconds": round(o.seconds, 2)} for o in outcomes]}
        out["ok"] = out["ok"] and not changed and all(o.ok for o in outcomes)
    if importlib.util.find_spec("torch") is not None:  # vLLM's stack is there (not a torch-less test stand-in)
        from vllm.platforms import current_platform

        out["platform"] = type(current_platform).__name__
    out["seconds"] = round(time.monotonic() - t0, 1)
    print(f"{RESULT_PREFIX} {json.dumps(out)}", flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(in_image_main(sys.argv[1:]))
