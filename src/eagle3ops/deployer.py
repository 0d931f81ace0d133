"""``eagle3ops deploy HOST``: build the pipeline image if needed, push it over SSH, verify its id, preflight, and run
the probes the build deferred to the host (:func:`eagle3ops.hostprobe.ensure_probed`).

A pipeline image or environment that is a stand-in (built on a stand-in base, or the test environment: the marks of
:mod:`eagle3ops.config.standin`) is refused on a host that is not a sandbox, from the build plan, before anything is
built, sent or changed (:func:`refuse_standin_build`; ``--dry-run`` shows the same refusal).

Serving is not touched. The host records what was deployed in ``<state_dir>/deployed.json`` (image tag and id), which
the maintenance windows read to know which image to run and which id to expect.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from eagle3ops import executor
from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.config import HostConfig
from eagle3ops.config.standin import PIPELINE_FIX, SERVING_FIX, refusal, standin_reason
from eagle3ops.hostprobe import HostProbeError, HostProbeResult, ensure_probed
from eagle3ops.window.common import WindowError, paths
from eagle3ops.window.lock import holding_lock
from eagle3ops.window.preflight import preflight

if TYPE_CHECKING:
    from eagle3ops.images import BuildPlan, BuiltImage


class DeployError(Exception):
    """The image could not be built, pushed or its id verified, the host failed preflight, or the deferred probes
    failed there."""


@dataclass
class DeployResult:
    """What a deploy did: ``tag``/``image_id`` deployed, seconds spent building and pushing, push summary, and the
    deferred probes' result on the host (``probes``; None when the build ran them all). ``plan``: a dry run's plan
    as a JSON-ready value (what ``deploy --dry-run --json`` prints: the build, the push, the checks, the record and
    every change in order, the lock's first); None after a real run."""

    tag: str
    image_id: str
    build_s: float
    push_s: float
    push_summary: str
    probes: "HostProbeResult | None" = None
    plan: "dict[str, Any] | None" = None


def push_image(tag: str, h: HostConfig) -> str:
    """Push ``tag`` to host ``h`` with :func:`eagle3ops.transfer.push` (missing layers only, id verified).

    Returns:
        a one-line summary with layers and bytes sent and the wall time.

    Raises:
        DeployError: the push failed; the message carries the transfer's reason.
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from eagle3ops import transfer

    with Progress(TextColumn(f"push {h.name}"), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("layer inventory", total=None)

        def on_progress(p: transfer.Progress) -> None:
            desc = {"send": f"layer {p.layer}" if p.layer is not None else "metadata", "load": "docker load",
                    "verify": "verify image id"}.get(p.phase, p.phase)
            bar.update(task, description=desc, completed=p.done, total=p.total or None)

        res = transfer.push(tag, h, on_progress=on_progress)
    if not res.ok:
        raise DeployError(f"pushing {tag} to {h.name} failed: {res.reason}")
    if res.status != "ok":
        return f"{tag} on {h.name}: {res.status} (nothing to send)"
    return (f"{tag} → {h.name}: {res.layers_sent}/{res.layers_total} layers sent, {res.bytes_sent / 1e6:.1f} MB over "
            f"SSH ({res.transport}, {res.compression}), {res.wall_s:.1f} s, image id verified")


def refuse_standin_build(h: HostConfig, bp: BuildPlan, what: str) -> None:
    """Raise when the image ``bp`` plans is a stand-in and ``h`` is not a sandbox (the one rule,
    :func:`eagle3ops.config.standin.refusal`): built on a stand-in base (its labels on the build engine, which the
    image inherits, or its name), or of a stand-in profile. Decided from the plan: nothing is built, read on the host
    or sent.

    Raises:
        DeployError: the message names the image, its base and the mark, and the fix (build on the real base).
    """
    why = standin_reason(bp.base, bp.base_labels)
    why = f"built on {bp.base}: {why}" if why else standin_reason(bp.tag, bp.labels)
    msg = refusal(h, what, bp.tag, "stand-in image", why, PIPELINE_FIX if bp.name == "pipeline" else SERVING_FIX)
    if msg:
        raise DeployError(msg)


def _build_doc(bp: BuildPlan) -> dict[str, Any]:
    """A build plan as a JSON-ready value (``deploy --dry-run --json``'s ``build``)."""
    return {"name": bp.name, "profile": bp.profile, "base": bp.base, "tag": bp.tag, "exists": bp.exists,
            "build_args": dict(bp.build_args)}


def deploy_env(h: HostConfig, env_tarball: "Path | None", *, dry_run: bool = False,
               echo: Callable[[str], None] = print, profile: str | None = None,
               base_image: str | None = None, command: str = "") -> DeployResult:
    """Deploy to a venv host (``stage_runtime: venv``): deliver the pipeline environment (sent only when
    its digest is not there yet, verified by sha256 on the host before it is unpacked,
    :func:`eagle3ops.transfer.envdeliver.deliver_env`) and record it in ``deployed.json``. Serving untouched.

    The environment is ``env_tarball``, else the real one exported from the pipeline image (built first when
    missing, cached by content tag as for container hosts; the export is cached per image id and ``venv_python``:
    :func:`eagle3ops.transfer.envbuild.export_env`). Before anything is sent the host's ``venv_python`` is asked its
    version, which must be the image's Python minor version. The environment is checked against the host (reads:
    :func:`~eagle3ops.transfer.envdeliver.check_env`) before the host's deploy lock is taken; it is sent and recorded
    under the lock (``command``: this command line, recorded in it), released at the end.

    Raises:
        DeployError: the environment is a stand-in (the pipeline image planned on a stand-in base, or
            ``env_tarball``'s marker) and ``h`` is not a sandbox (nothing built, exported or sent), ``venv_python``
            does not run on the host, its Python minor version is not the image's (both named), the environment's
            compiled files are for another CPU architecture than the host's ``uname -m`` (:mod:`eagle3ops.window.arch`;
            checked before anything is sent), the image build or export failed, the host's lock is held by another
            run (its holder named) or the delivery failed (the host's words).
    """
    from eagle3ops.commands import venv as vc
    from eagle3ops.transfer import envbuild
    from eagle3ops.transfer.envdeliver import EnvDeliveryError, check_env, send_env

    build_s, image = 0.0, None
    with executor.for_host(h, dry_run=dry_run, echo=(print if dry_run else None)) as r:
        if env_tarball is None:
            v = r.run(vc.python_version(h), check=False)
            if not v.ok or not v.stdout.strip():
                raise DeployError(f"hosts.{h.name}.venv_python ({h.venv_python}) does not run on {h.name}: "
                                  f"{' '.join((v.stderr or v.stdout).split())[-160:] or f'exit {v.exited}'}; "
                                  f"install that Python there or point the key at the host's python3")
            from eagle3ops import images

            try:
                bp = images.plan_build("pipeline", base_image=base_image, profile=profile)
                refuse_standin_build(h, bp, "deploy")  # before the build and the export
                if dry_run:
                    for line in bp.lines():
                        print(line)
                    send = (f"export its venv as the pipeline environment for {h.venv_python} (Python "
                            f"{v.stdout.strip()}), cached under {envbuild.CACHE_DIR}, and send it if its sha256 "
                            f"is not on {h.name}")
                    print(f"# then {send}")
                    return DeployResult(tag="venv:<built>", image_id="", build_s=0.0, push_s=0.0,
                                        push_summary="dry run: nothing built or sent",
                                        plan={"kind": "deploy", "host": h.name, "runtime": "venv",
                                              "build": _build_doc(bp), "python": v.stdout.strip(), "send": send,
                                              "changes": list(r.changes)})
                built = images.build_image(ca_bundle=images.default_ca_bundle(), plan=bp)
                t0 = time.monotonic()
                env = envbuild.export_env(built.tag, h.venv_python or "", echo=echo)
                envbuild.check_python(env.python, v.stdout.strip(), venv_python=h.venv_python or "", host=h.name,
                                      source=built.tag)
            except (images.ImageError, envbuild.EnvBuildError) as exc:
                raise DeployError(str(exc)) from None
            build_s = env.build_s if not env.cached else round(time.monotonic() - t0, 1)
            env_tarball, image = env.path, env.image
            echo(f"{env.image} from {built.tag}: {env.size / 1e9:.2f} GB, Python {env.python}, "
                 + ("cached" if env.cached else f"exported in {env.build_s:.0f} s"))
        what = "deploy" if image is not None else "deploy --env-tarball"
        try:
            checked = check_env(r, env_tarball, image=image, what=what)  # reads: before the lock
            with holding_lock(r, "deploy", command or f"eagle3ops deploy {h.name}", f"deploy {checked.image}"):
                d = send_env(r, checked)
        except EnvDeliveryError as exc:
            raise DeployError(str(exc)) from None
        except WindowError as exc:  # the lock: held by another run, or not creatable
            raise DeployError(str(exc)) from None
    summary = (f"{d.image} → {h.name}:{d.env_dir}: " + (
        f"{d.sent_bytes / 1e6:.1f} MB {'would be sent' if dry_run else 'sent, sha256 verified on the host'}"
        if d.sent_bytes else "already there (sha256 marker), nothing sent") + f", {d.seconds:.1f} s")
    echo(summary)
    plan = {"kind": "deploy", "host": h.name, "runtime": "venv", "env": {
        "tarball": str(checked.tarball), "image": checked.image, "present": checked.present, "dir": d.env_dir},
        "changes": list(r.changes)} if dry_run else None
    return DeployResult(tag=d.image, image_id=d.image.removeprefix("venv:"), build_s=build_s, push_s=d.seconds,
                        push_summary=summary, plan=plan)


def deploy(h: HostConfig, *, dry_run: bool = False, profile: str | None = None, base_image: str | None = None,
           echo: Callable[[str], None] = print, engine_checks: str = "auto",
           env_tarball: "Path | None" = None, command: str = "") -> DeployResult:
    """Build (cached by content tag), push, verify the image id on the host, preflight, run the deferred probes,
    record the deployment.

    Facts, checks and plan first: the host is reached (before any build, so an unreachable host fails at once,
    within the connect bound), the build is planned (:func:`eagle3ops.images.plan_build`: base, profile, content
    tag, build args) and a stand-in refused, then the image is built here (no host change). Then, under the host's
    deploy lock (:func:`eagle3ops.window.lock.holding_lock`; ``command``, this command line, recorded in it;
    released at the end, also on failure): the push, the id check, preflight, the deferred probes and the record.
    ``dry_run`` prints the build plan and builds nothing, then the same steps on a dry executor: the lock's
    commands, the push plan (the commands :func:`eagle3ops.transfer.push` would run, from the host's real image
    inventory, when the image is already built; else only what it would send), the preflight checks (which run:
    read-only) and the commands that record the deployment; its :attr:`DeployResult.plan` holds them as one value.

    The probes (each patch's probe on vLLM engines) run at build time when the base can start an engine;
    otherwise (the real vllm/vllm-openai on a build host without a GPU; ``engine_checks="host"`` forces it) the
    image's label ``io.eagle3ops.verified`` defers them to the host, and they run there in a container of the pushed
    image with the stage settings (:func:`eagle3ops.hostprobe.ensure_probed`) unless a pass for this image id is
    recorded on the host already. ``deployed.json`` is written only after they passed, so no window runs an image
    whose deferred probes failed.

    Raises:
        eagle3ops.remote.ConnectFailed: the host cannot be reached (nothing was built).
        DeployError: a stand-in image planned for a host that is not a sandbox (:func:`refuse_standin_build`;
            nothing built or sent), build failure, the host's lock held by another run (its holder and command
            named; nothing sent), push failure, id mismatch on the host ("every layer pushed but the image is not
            there" included), a failed preflight check, or failed deferred probes (each failing probe named).
    """
    from eagle3ops import images

    from eagle3ops.commands import runtime as rt

    if not rt.for_host(h).engine:  # no engine, no image: the pipeline environment instead
        return deploy_env(h, env_tarball, dry_run=dry_run, echo=echo, profile=profile, base_image=base_image,
                          command=command)
    with executor.for_host(h) as reach:  # reachability first: a dead host must not cost a build
        reach.connection  # noqa: B018 - opens the connection (raises ConnectFailed)
    t0 = time.monotonic()
    try:
        bp = images.plan_build("pipeline", base_image=base_image, profile=profile, engine_checks=engine_checks)
        refuse_standin_build(h, bp, "deploy")  # before anything is built or sent
        if dry_run:
            for line in bp.lines():
                print(line)
            built = _planned_image(bp)
        else:
            built = images.build_image(ca_bundle=images.default_ca_bundle(), plan=bp)
    except images.ImageError as exc:
        raise DeployError(f"building the pipeline image failed: {exc}") from None
    build_s = time.monotonic() - t0
    if not dry_run:
        echo(f"pipeline image {built.tag} ({built.image_id[:19]}, {built.size / 1e9:.2f} GB) built/found in "
             f"{build_s:.1f} s")
    doc: dict[str, Any] = {"kind": "deploy", "host": h.name, "runtime": "container", "build": _build_doc(bp),
                           "image": built.tag, "image_id": built.image_id}
    with executor.for_host(h, dry_run=dry_run, echo=(print if dry_run else None)) as r:
        try:
            with holding_lock(r, "deploy", command or f"eagle3ops deploy {h.name}", f"deploy {built.tag}"):
                push_s, push_summary, pres = _push_check_record(r, bp, built, echo, doc)
        except WindowError as exc:  # the lock: held by another run, or not creatable
            raise DeployError(str(exc)) from None
    if dry_run:  # the changes in the order they would be made: the push's (its own executor) after the lock's
        at = doc.pop("changes_before_push")
        doc["changes"] = r.changes[:at] + doc["push"].pop("changes") + r.changes[at:]
    return DeployResult(built.tag, built.image_id, build_s, push_s, push_summary, pres, doc if dry_run else None)


def _push_check_record(r: Any, bp: BuildPlan, built: BuiltImage, echo: Callable[[str], None],
                       doc: dict[str, Any]) -> tuple[float, str, HostProbeResult | None]:
    """``deploy``'s steps under the host's lock: push, verify the id, preflight, the deferred probes, record the
    deployment. Fills ``doc`` (the dry run's plan: push, preflight, probes, record). Returns the push's seconds and
    summary and the probes' result.

    Raises:
        DeployError: as :func:`deploy`, for each step.
    """
    h, dry_run = r.host, r.dry_run
    t1 = time.monotonic()
    doc["changes_before_push"] = len(r.changes)
    if dry_run:
        push_summary, doc["push"] = _dry_push(bp, h)
    else:
        push_summary = push_image(built.tag, h)
    push_s = time.monotonic() - t1
    echo(push_summary)
    got = r.run(dk.image_id(h, built.tag), check=False).stdout.strip()
    if not dry_run and got != built.image_id:
        raise DeployError(f"{h.name}: after the push, {built.tag} has id {got or '(absent)'}, expected "
                          f"{built.image_id}; the image is not correctly on the host")
    # a host without serving (a work host) is deployed before its target arrives (`weights HOST --from P`)
    pf = preflight(r, image=built.tag, expected_image_id=built.image_id, need_serving=False,
                   target_later=not h.serving.managed)
    for name, ok, detail in pf.checks:
        echo(f"  preflight {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    doc["preflight"] = [{"check": name, "ok": ok, "detail": detail} for name, ok, detail in pf.checks]
    if not pf.ok and not dry_run:
        raise DeployError(f"{h.name}: preflight failed after the push:\n{pf.failures()}")
    echo(f"checks at build / deferred to the host: {built.labels.get('io.eagle3ops.verified')}")
    try:
        pres = ensure_probed(r, built.tag, built.image_id, built.labels, echo=echo)
    except HostProbeError as exc:
        raise DeployError(f"{exc}") from None
    doc["probes"] = {"deferred": pres.deferred if pres is not None else [], "reused": bool(pres and pres.reused)}
    if pres is not None and not pres.reused and not dry_run:
        echo(f"  deferred probes on {h.name}: {sum(o['ok'] for o in pres.outcomes)}/{len(pres.outcomes)} "
             f"passed on {pres.platform} in {pres.seconds:.1f} s (recorded in {pres.record_path})")
    record = {"image": built.tag, "image_id": built.image_id, "labels": built.labels,
              "deployed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "by": getpass.getuser()}
    r.run(hc.mkdir_p(h.state_dir))
    r.run(hc.write_file(paths(h)["deployed"]), stdin=json.dumps(record, indent=2))
    doc["record"] = {"path": paths(h)["deployed"], "image": built.tag, "image_id": built.image_id}
    return push_s, push_summary, pres


#: The image id a dry run shows for an image it did not build.
UNBUILT_ID = "<image id after the build>"


def _planned_image(bp: BuildPlan) -> BuiltImage:
    """The image a build plan names: the engine's image when its tag exists already, else a placeholder (id
    :data:`UNBUILT_ID`, size 0) carrying the labels it will have (its base's and the plan's)."""
    from eagle3ops.images import BuiltImage, docker_client

    if bp.exists:
        img = docker_client().images.get(bp.tag)
        return BuiltImage(bp.tag, img.id, int(img.attrs.get("Size", 0)), 0.0, dict(img.labels))
    return BuiltImage(bp.tag, UNBUILT_ID, 0, 0.0, dict(bp.image_labels))


def _dry_push(bp: BuildPlan, h: HostConfig) -> tuple[str, dict[str, Any]]:
    """Print the push plan of a dry run: :func:`eagle3ops.transfer.push` with ``dry_run`` when the image exists on
    the build engine (its plan from the host's real inventory), else what a push would send. Returns a summary and
    the plan as a value (``action``, ``summary``, the ``changes`` it would make).

    Raises:
        DeployError: the push would fail (its reason).
    """
    from eagle3ops import transfer

    if not bp.exists:
        print(f"# push {bp.tag} to {h.name} once built: `docker load` of an archive holding only the layers the "
              f"host lacks, then verify the image id")
        return (f"(dry run) would build {bp.tag}, then push it to {h.name}, sending only the layers it lacks",
                {"action": "load once built", "summary": "only the layers the host lacks", "changes": []})
    res = transfer.push(bp.tag, h, options=transfer.PushOptions(dry_run=True, attempts=1))
    print(f"# push {bp.tag} to {h.name}:")
    for line in res.plan:
        print(line)
    if not res.ok:
        raise DeployError(f"pushing {bp.tag} to {h.name} would fail: {res.reason}")
    plan = res.push_plan
    return (f"(dry run) push of {bp.tag} to {h.name}: {res.layers_sent}/{res.layers_total} layers to send",
            {"action": plan.action if plan else "", "summary": plan.summary() if plan else "",
             "layers_sent": res.layers_sent, "layers_total": res.layers_total, "changes": list(res.changes)})
