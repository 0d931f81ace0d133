"""How the driver reaches a host's live serving to regenerate a dataset there, and where the result goes.

The pure part (settings, items, resume log, plan, the HTTP client and its retries) is
:mod:`eagle3ops.speculate.regenerate`; this module takes a :class:`eagle3ops.remote.Remote` and does the host side:

- :func:`serving_api_key`: the API key is read the way the health gate reads it (the serving container's own
  ``--api-key`` / ``VLLM_API_KEY``, else the file named by ``serving.api_key_file``, read on the host) and never
  reaches argv, logs or the manifest;
- :func:`serving_endpoint`: the serving port is used directly when the driver reaches it, else through an SSH
  port-forward on the same connection;
- :func:`host_relay`: else (the host's sshd forbids forwarding, as the sandbox's does) the requests are relayed on
  the host by the deployed pipeline image (the way the speculation gate measures), its rows streamed back over SSH
  into the same resume log; that helper container is a host change, so it runs under the host's deploy lock, held
  on through the upload;
- :func:`upload`: the dataset and its manifest go into ``<data_dir>/runs/<run>/regenerated/``, under the host's
  deploy lock (an extract window of that run reads the folder under it);
- :func:`regenerate_for_host`: all of the above around :func:`eagle3ops.speculate.regenerate.regenerate`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eagle3ops.speculate.regenerate import (
    DATASET,
    HOST_FOLDER,
    MANIFEST,
    ForwardRefused,
    GenSettings,
    Item,
    RegenerateError,
    RegeneratePlan,
    RowSource,
    regenerate,
)
from eagle3ops.serving_http import ServingClient, ServingHTTPError

__all__ = ["ForwardRefused", "RegenerateError", "host_paths", "host_relay", "regenerate_for_host",
           "serving_api_key", "serving_endpoint", "upload", "write_dataset"]


def serving_api_key(r: Any) -> str | None:
    """The API key production serving requires, taken as the health gate takes it: the serving container's own
    ``--api-key`` / ``VLLM_API_KEY`` (``docker container inspect`` over ``r``), else the first line of the file named
    by ``serving.api_key_file``, read on the host; None when serving needs none. Never logged.

    Raises:
        RegenerateError: ``serving.api_key_file`` is set but cannot be read on the host.
    """
    from eagle3ops import health
    from eagle3ops.commands import docker as dk
    from eagle3ops.commands import host as hc

    h = r.host
    out = r.run(dk.inspect_container(h, h.serving.container), check=False)
    if out.ok and out.stdout.strip():
        try:
            key = health.api_key_from_inspect(json.loads(out.stdout)[0])
        except (ValueError, IndexError, TypeError):
            key = None
        if key:
            return key
    if h.serving.api_key_file:
        got = r.run(hc.cat_if_exists(h.serving.api_key_file), check=False).stdout
        lines = [x.strip() for x in got.splitlines() if x.strip()]
        if not lines:
            raise RegenerateError(f"{h.name}: cannot read the API key file {h.serving.api_key_file} named by "
                                  "serving.api_key_file on the host (missing or empty); fix the path or the file")
        return lines[0]
    return None


def _serves(base_url: str, model: str, api_key: str | None, timeout: float = 3.0) -> bool:
    """True when ``base_url`` answers ``/v1/models`` listing ``model`` (the host's server, not some other one)."""
    try:
        return model in ServingClient(base_url, api_key, timeout_s=timeout).models()
    except ServingHTTPError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_forwarding(r: Any, port: int, url: str) -> None:
    """Open (and close) one ``direct-tcpip`` channel to the host's ``127.0.0.1:port``: a host whose sshd forbids
    forwarding (``AllowTcpForwarding no``, as the sandbox's) refuses it at once, instead of every request failing.

    Raises:
        RegenerateError: the host refuses the forward or nothing listens there; the message gives the fixes.
    """
    from paramiko.ssh_exception import ChannelException, SSHException

    h = r.host
    try:
        chan = r.connection.client.get_transport().open_channel(
            "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=15)
        chan.close()
    except (ChannelException, SSHException, OSError) as exc:
        raise ForwardRefused(
            f"{h.name}: the driver does not reach serving at {url}, and an SSH forward to 127.0.0.1:{port} on the "
            f"host was refused ({exc}); allow TCP forwarding for the SSH user in the host's sshd "
            "(AllowTcpForwarding local), deploy the pipeline image (the requests are then relayed by a helper on "
            "the host), or pass --endpoint URL with a route to the serving port the driver reaches") from None


@contextlib.contextmanager
def serving_endpoint(r: Any, api_key: str | None, *, direct: str | None = None, ssh_forward: bool = False
                     ) -> Iterator[tuple[str, str]]:
    """The host's serving endpoint as ``(base_url, how)``, open for the ``with`` block.

    Tried in order: ``direct`` when given (a URL; must answer), else ``http://<hostname>:<serving.port>`` when
    the driver reaches it and it lists ``serving.served_model_name`` (not tried with ``ssh_forward``), else an SSH
    local port-forward over ``r``'s connection to ``127.0.0.1:<serving.port>`` on the host (Fabric
    ``forward_local`` on a free local port: serving usually listens on the host's loopback only); waits at most
    30 s for the forward to answer.

    Raises:
        ForwardRefused: the host's sshd forbids the forward (the sandbox's does); :func:`regenerate_for_host` then
            relays through the host (:func:`host_relay`).
        RegenerateError: none of them answers with the served model (the message names what was tried).
    """
    h = r.host
    s = h.serving
    if direct:
        if not _serves(direct.rstrip("/"), s.served_model_name, api_key, timeout=10):
            raise RegenerateError(f"--endpoint {direct}: does not answer /v1/models with {s.served_model_name}")
        yield direct.rstrip("/"), f"direct {direct}"
        return
    url = f"http://{h.hostname}:{s.port}"
    if not ssh_forward and _serves(url, s.served_model_name, api_key):
        yield url, f"direct {url}"
        return
    _check_forwarding(r, s.port, url)
    port = _free_port()
    with r.connection.forward_local(port, remote_port=s.port, remote_host="127.0.0.1", local_host="127.0.0.1"):
        fwd = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not _serves(fwd, s.served_model_name, api_key, timeout=10):
            if time.monotonic() > deadline:
                raise RegenerateError(f"{h.name}: serving does not answer on {url} nor through an SSH forward to "
                                      f"127.0.0.1:{s.port} on the host (is production serving up? "
                                      f"`eagle3ops status {h.name}`)")
            time.sleep(1)
        yield fwd, f"ssh forward 127.0.0.1:{port} -> {h.name} 127.0.0.1:{s.port}"


def host_relay(r: Any, image: str, api_key: str | None, settings: GenSettings) -> RowSource:
    """A :data:`RowSource` that answers the items on the host, as the speculation gate measures: the pipeline
    ``image`` run there (``docker run --rm -i --network host``, :func:`eagle3ops.commands.speculate.gate_helper`
    ``regenerate``) asks serving over the host's loopback and prints each item's row as it finishes; the rows are
    read from the streamed output. The request, API key included, goes on stdin.

    Bounded by ``120 + ceil(items / concurrency) × user turns × request_timeout_s × attempts`` seconds.

    Raises (from the source):
        RegenerateError: the helper failed (its stderr tail), e.g. an image without the ``regenerate`` action;
            raised at once on a ``stage_runtime: venv`` host (no engine to run the helper in: not done yet).
    """
    from eagle3ops.commands import runtime as rt

    if not rt.for_host(r.host).engine:
        raise RegenerateError(f"{r.host.name}: `stage_runtime: venv` (no container engine): answering on the host "
                              f"needs the pipeline image's helper container, not done yet for venv hosts; "
                              f"reach serving from the driver instead (--endpoint URL or --ssh-forward)")
    from eagle3ops.commands import speculate as sc
    from eagle3ops.speculate.onhost import ROW_MARK, parse_answer

    def rows_from(items: list[Item], on_row: Callable[[dict[str, Any]], None]) -> str | None:
        req = {"base_url": f"http://127.0.0.1:{r.host.serving.port}", "api_key": api_key,
               "settings": asdict(settings), "items": [{"id": i.id, "turns": [list(t) for t in i.turns]}
                                                       for i in items]}
        turns = max(sum(role == "user" for role, _ in i.turns) for i in items)
        bound = 120 + -(-len(items) // settings.concurrency) * turns * settings.request_timeout_s * settings.attempts
        buf = [""]

        def stream(chunk: str) -> None:
            buf[0] += chunk
            *lines, buf[0] = buf[0].split("\n")
            for line in lines:
                if line.startswith(ROW_MARK):
                    on_row(json.loads(line[len(ROW_MARK):]))

        res = r.run(sc.gate_helper(r.host, image, "regenerate"), stdin=json.dumps(req), stream=stream,
                    check=False, timeout=bound)
        try:
            ans = parse_answer(res.stdout)
        except ValueError:
            raise RegenerateError(f"{r.host.name}: the regeneration helper in {image} failed: "
                                  f"{res.stderr.strip()[-600:]}; deploy a pipeline image of this eagle3ops "
                                  "version (eagle3ops deploy), then rerun (answered prompts are kept)") from None
        return ans.get("vllm_version")

    return rows_from


def host_paths(r: Any, run: str) -> dict[str, str]:
    """Where :func:`upload` puts the dataset and its manifest on the host (pure)."""
    base = f"{r.host.data_dir}/runs/{run}/{HOST_FOLDER}"
    return {"dir": base, "dataset": f"{base}/{DATASET}", "manifest": f"{base}/{MANIFEST}"}


def write_dataset(r: Any, run: str, out_dir: Path) -> dict[str, str]:
    """Write ``dataset.jsonl`` and its manifest from the local ``out_dir`` into ``<data_dir>/runs/<run>/regenerated/``
    on the host (data_dir only, never serving); returns :func:`host_paths`. The caller holds what keeps a reader of
    that folder out (:func:`upload`: the host's deploy lock); a dry run records the writes and reads nothing local.
    """
    from eagle3ops.commands import host as hc

    paths = host_paths(r, run)
    r.run(hc.mkdir_p(paths["dir"]))
    for name, key, timeout in ((DATASET, "dataset", 600), (MANIFEST, "manifest", None)):
        body = b"" if r.dry_run else (Path(out_dir) / name).read_bytes()
        r.run(hc.write_file(paths[key]), stdin=body, timeout=timeout)
    return paths


def upload(r: Any, run: str, out_dir: Path, command: str) -> dict[str, str]:
    """:func:`write_dataset` under the host's deploy lock (:func:`eagle3ops.window.lock.holding_lock`, taken for the
    writes alone and released after, ``command`` recorded as its holder's): an extract window of the same run holds
    that lock while it reads the folder, so it never reads a half-written dataset. Name
    ``regenerated/dataset.jsonl`` in ``prepare.datasets`` of the run's pipeline.yaml to train on it.

    Raises:
        LockHeld: another run holds the lock (nothing written; the message names its holder and command).
        WindowError: the lock could not be taken (the message says how to fix it).
    """
    from eagle3ops.window.lock import holding_lock

    with holding_lock(r, "regenerate", command, f"upload the regenerated dataset of run {run}"):
        return write_dataset(r, run, out_dir)


def _upload(r: Any, run: str, out_dir: Path, command: str) -> dict[str, str]:
    """:func:`upload`, its refusal (the lock held, or not takeable) raised as a :class:`RegenerateError` that says
    the answers are kept for a rerun."""
    from eagle3ops.window.common import WindowError

    try:
        return upload(r, run, out_dir, command)
    except WindowError as exc:  # LockHeld included: the answers are local, so nothing done is lost
        raise RegenerateError(f"{exc} -- the regenerated dataset was not uploaded and is kept in {out_dir}: rerun "
                              f"the same command once the lock is free (the answered conversations are not asked "
                              f"again; only the upload is left)") from None


def _relayed(r: Any, run: str, p: RegeneratePlan, image: str, key: str | None, command: str, *, where: str,
             extra_manifest: dict[str, Any] | None, progress: bool, echo: Callable[[str], None]
             ) -> tuple[dict[str, Any], dict[str, str]]:
    """Plan ``p`` answered on the host by :func:`host_relay` in ``image``, then :func:`write_dataset`, under one hold
    of the host's deploy lock: the relay starts a container on the host, a host change like any other, so it runs
    only while no window holds the lock, and no window starts under it (one stopping serving would fail the
    requests). Returns the manifest and :func:`host_paths`.

    Raises:
        RegenerateError: a ``stage_runtime: venv`` host (before the lock: no engine for the helper); the lock held
            or not takeable (nothing asked, nothing changed; the message names the holder and the lock-free ways);
            the helper failed (the lock released, the rows it streamed kept in the resume log).
    """
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.lock import holding_lock

    rows_from = host_relay(r, image, key, p.settings)
    how = f"relayed on the host by {image} (the SSH forward was refused)"
    echo(f"serving endpoint: {how}")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(holding_lock(r, "regenerate", command, f"answer (a relay helper container of "
                                             f"{image}) and upload the regenerated dataset of run {run}"))
        except WindowError as exc:  # LockHeld included: taken before anything is asked, so nothing is lost
            raise RegenerateError(
                f"{exc} -- answering on the host starts a helper container there, so it needs the host's lock: "
                f"nothing was asked or changed (conversations answered before are kept in {p.out_dir}); rerun the "
                "same command once the lock is free, or reach serving from the driver, which needs no lock "
                "(--endpoint URL, or allow TCP forwarding for the SSH user: AllowTcpForwarding local)") from None
        manifest = regenerate(p, None, endpoint=f"{where} ({how})", extra_manifest=extra_manifest,
                              progress=progress, rows_from=rows_from)
        return manifest, write_dataset(r, run, p.out_dir)


def _deployed_image(r: Any) -> str | None:
    """The host's pipeline image: ``pipeline_image`` in the inventory, else the one ``deploy`` recorded."""
    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import paths

    if r.host.pipeline_image:
        return str(r.host.pipeline_image)
    out = r.run(hc.cat_if_exists(paths(r.host)["deployed"]), check=False).stdout
    try:
        return json.loads(out)["image"] if out.strip() else None
    except (ValueError, KeyError, TypeError):
        return None


def regenerate_for_host(r: Any, run: str, p: RegeneratePlan, *, direct: str | None = None,
                        ssh_forward: bool = False, image: str | None = None,
                        extra_manifest: dict[str, Any] | None = None, progress: bool = True,
                        echo: Callable[[str], None] = print, command: str | None = None) -> dict[str, Any]:
    """Run plan ``p`` against host ``r``'s live serving (API key and endpoint as the module doc says), then upload
    the dataset into ``<data_dir>/runs/<run>/regenerated/`` under the host's deploy lock (:func:`upload`, taken for
    the upload alone: answering from the driver needs no lock, a window may run meanwhile; ``command`` names the
    holder, default ``eagle3ops regenerate HOST --run RUN``). ``direct``/``ssh_forward``: see
    :func:`serving_endpoint`; when the host refuses the SSH forward, the requests are relayed on the host
    (:func:`host_relay`) by ``image`` (default: the deployed pipeline image), the relay and the upload under one
    hold of the lock (its helper container is a host change). In a dry run (``r.dry_run``) print
    the plan and the upload's commands; nothing is sent.

    Returns:
        The manifest (plus ``host_paths``); in a dry run ``{"dry_run": True, "plan": ..., "doc": ...}``, ``doc``
        being the plan as one JSON-ready value (``regenerate --dry-run --json``: the plan, the host's paths and
        the upload's changes).

    Raises:
        RegenerateError: serving not reachable, the API key file unreadable, or the upload refused (the host's lock
            held by another run: its holder named; the dataset kept locally for a rerun that only uploads), or a
            relay refused the same way before asking anything.
    """
    command = command or f"eagle3ops regenerate {r.host.name} --run {run}"
    echo(p.describe())
    if r.dry_run:
        echo(f"# dry run: would ask {r.host.name}'s serving ({r.host.serving.served_model_name}, port "
             f"{r.host.serving.port}) directly or through an SSH forward, then upload under the host's lock (a "
             f"relay on the host, where the forward is refused, would answer under the lock too):")
        upload_paths = _upload(r, run, p.out_dir, command)
        return {"dry_run": True, "plan": p.describe(), "host_paths": upload_paths,
                "doc": {"kind": "regenerate", "host": r.host.name, "run": run, "plan": p.as_dict(),
                        "host_paths": upload_paths, "changes": list(r.changes)}}
    key = serving_api_key(r)
    where = f"{r.host.name} port {r.host.serving.port}"
    try:
        with serving_endpoint(r, key, direct=direct, ssh_forward=ssh_forward) as (url, how):
            echo(f"serving endpoint: {how}")
            manifest = regenerate(p, url, api_key=key, endpoint=f"{where} ({how})", extra_manifest=extra_manifest,
                                  progress=progress)
    except ForwardRefused:
        image = image or _deployed_image(r)
        if not image:
            raise
        manifest, paths = _relayed(r, run, p, image, key, command, where=where, extra_manifest=extra_manifest,
                                   progress=progress, echo=echo)
    else:
        paths = _upload(r, run, p.out_dir, command)
    echo(f"{manifest['answered']} of {manifest['conversations']} conversations answered "
         f"({manifest['answered_now']} now, {manifest['skipped_already_answered']} resumed, {manifest['failed']} "
         f"failed), {manifest['completion_tokens_now']} tokens in {manifest['wall_s']} s; uploaded to "
         f"{paths['dataset']} — name `{HOST_FOLDER}/{DATASET}` in prepare.datasets")
    return {**manifest, "host_paths": paths}
