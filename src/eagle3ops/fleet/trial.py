"""The cross-node preflight trial: one bounded gloo all-reduce across the nodes, before any serving stops; and the
reach probe before it (a plain TCP connect from every node to the first node's rendezvous port, which names the
nodes that cannot reach it: when one node cannot, torchrun's static rendezvous leaves every node waiting, so the
all-reduce alone cannot tell which).

In the pipeline image, on every node, under torchrun (static rendezvous; :func:`eagle3ops.commands.fleet.trial_argv`):
``python3 -m eagle3ops.fleet.trial --timeout-s T``. Each rank joins the process group (``gloo``, ``timeout=T``),
all-reduces a one-hot vector of its rank, and prints one line ``TRIAL {"rank": r, "world": n, "seen": [...]}``: the
ranks whose contribution arrived. A node that cannot reach the rendezvous prints no such line (its torchrun fails
or times out), and every other node's join times out. :func:`parse_trial` (pure, on the driver) turns each node's
exit status and output into the nodes that did not join, by name. torch is imported only in :func:`main`.

A node whose trial program never ran (its pipeline's python cannot import torch or eagle3ops, a library torch loads
is missing, the interpreter or image is missing) says nothing about the network: :func:`start_failure` tells it from
a node that could not reach the rendezvous, and the verdict names what failed, the pipeline and the fix.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from typing import Mapping

#: The prefix of the trial's one result line.
TAG = "TRIAL "


#: What an interpreter prints when the module it was asked to run, or one that module imports, cannot be loaded:
#: CPython's ``-m`` lookup (``Error while finding module specification for 'torch.distributed.run'
#: (ModuleNotFoundError: No module named 'torch')``), a traceback's last line, and the loader's error for a shared
#: library torch links (``OSError: libcudart.so.12: cannot open shared object file``).
_IMPORT_FAILED = (
    re.compile(r"Error while finding module specification for '[\w.]+' \((\w+Error: [^\n]*)\)"),
    re.compile(r"^(?:\S*\.)?((?:ModuleNotFoundError|ImportError): [^\n]*)", re.M),
    re.compile(r"^(OSError: [^\n]*cannot open shared object file[^\n]*)", re.M),
)
#: Exit statuses of a command that never started: the engine's own error (``docker run``: 125, e.g. the image is
#: missing), a command that cannot be run (126) or is not found (127; also a venv's missing python).
_NOT_STARTED = {125: "the engine could not start it", 126: "it cannot be run", 127: "its program was not found"}


def start_failure(rc: int | None, out: str) -> str | None:
    """Why a node's trial program (or reach probe) never ran, from its exit status ``rc`` and output ``out`` (pure);
    None when it ran (it joined, or it failed at the network).

    An import failure is recognised by its own words (:data:`_IMPORT_FAILED`), whatever the exit status; a command
    that never started by its exit status (:data:`_NOT_STARTED`, the shell's and ``docker run``'s conventions)."""
    if rc == 0:
        return None
    for rx in _IMPORT_FAILED:
        m = rx.search(out)
        if m:
            return f"its python could not import what the trial runs ({m.group(1).strip()[:200]})"
    if rc in _NOT_STARTED:
        last = out.strip().splitlines()[-1][:200] if out.strip() else "no output"
        return f"the trial did not start: {_NOT_STARTED[rc]} (exit {rc}; {last})"
    return None


@dataclass(frozen=True)
class TrialResult:
    """``ok``: every node joined and saw every rank; ``unreachable``: nodes (by name) with no complete result whose
    trial ran; ``detail``: one line per node; ``not_started``: node → why its trial program never ran
    (:func:`start_failure`, with its pipeline when known): those nodes are not counted unreachable."""

    ok: bool
    unreachable: tuple[str, ...]
    detail: tuple[str, ...]
    not_started: Mapping[str, str] = field(default_factory=dict)

    def message(self) -> str:
        """The preflight line: ok; the nodes whose trial never ran, what failed and the fix (their pipeline, not the
        network); else the nodes that cannot reach the rendezvous and the fix."""
        if self.ok:
            return "cross-node trial: every node reached the rendezvous (gloo all-reduce complete)"
        if self.not_started:
            nodes = ", ".join(self.not_started)
            why = "; ".join(f"{n}: {w}" for n, w in self.not_started.items())
            return (f"cross-node trial did not run on {nodes}, so nothing about the network was learned: {why}. The "
                    f"trial runs torch.distributed and eagle3ops in each node's pipeline: deploy a pipeline that has "
                    f"both on {nodes} (`eagle3ops deploy NODE`), then run again")
        return (f"cross-node trial: {', '.join(self.unreachable)} cannot reach the rendezvous; check that node's "
                f"route to the first node and the inventory's fleet.rendezvous_port (open in its firewall)")


def _not_started(name: str, rc: int | None, out: str, pipelines: Mapping[str, str] | None) -> str | None:
    """:func:`start_failure` of node ``name``, its pipeline (image or environment) named when known."""
    why = start_failure(rc, out)
    where = (pipelines or {}).get(name)
    return f"{why} in its pipeline {where}" if why and where else why


def parse_trial(nodes: list[str], outputs: dict[str, tuple[int, str]],
                pipelines: Mapping[str, str] | None = None) -> TrialResult:
    """The trial's verdict from each node's ``(exit status, output)`` (node order = rank order); ``pipelines``:
    node → its pipeline image (or environment), named where a node's trial never ran.

    A node whose trial never ran (:func:`start_failure`) is ``not_started``. Otherwise a node is unreachable when it
    has no output, exited non-zero, printed no ``TRIAL`` line, reported another rank or world size, or did not see
    every rank.
    """
    world = len(nodes)
    bad, detail, broken = [], [], {}
    for rank, name in enumerate(nodes):
        rc, out = outputs.get(name, (None, ""))
        lines = [ln[len(TAG):] for ln in out.splitlines() if ln.startswith(TAG)]
        try:
            rec = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            rec = None
        good = (rc == 0 and isinstance(rec, dict) and rec.get("rank") == rank and rec.get("world") == world
                and rec.get("seen") == list(range(world)))
        why = None if good else _not_started(name, rc, out, pipelines)
        if why:
            broken[name] = why
            detail.append(f"{name} (rank {rank}): exit {rc}; {why}")
        elif not good:
            bad.append(name)
            last = out.strip().splitlines()[-1] if out.strip() else "no output"
            detail.append(f"{name} (rank {rank}): exit {rc}; {last[:200]}")
        else:
            detail.append(f"{name} (rank {rank}): saw ranks {rec['seen']}")
    return TrialResult(not bad and not broken, tuple(bad), tuple(detail), broken)


#: The prefix of the reach probe's one result line.
REACH_TAG = "REACH "


def listen(port: int, seconds: float, expect: int | None = None) -> int:
    """The reach probe's listening end on the first node: accept connections on ``port`` for ``seconds`` (or until
    ``expect`` were accepted), each closed once its client closed it (so the port is left without TIME_WAIT for
    the rendezvous that binds it next), then print ``REACH {"listened": true, "accepted": n}``; exit 1 when the port
    cannot be bound (in use: the rendezvous port must be free before training)."""
    import socket
    import time

    try:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("", port))
        srv.listen(64)
    except OSError as exc:
        print(REACH_TAG + json.dumps({"listened": False, "error": f"port {port}: {exc}"}), flush=True)
        return 1
    srv.settimeout(0.2)
    n, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline and (expect is None or n < expect):
        try:
            conn, _ = srv.accept()
        except OSError:
            continue
        try:
            conn.settimeout(5.0)
            conn.recv(1)  # b"" once the client closed: it takes the TIME_WAIT
        except OSError:
            pass
        conn.close()
        n += 1
    srv.close()
    print(REACH_TAG + json.dumps({"listened": True, "accepted": n}), flush=True)
    return 0


def reach(addr: str, port: int, timeout_s: float) -> int:
    """The reach probe on every node: a TCP connect to ``addr:port``, tried until one succeeds or ``timeout_s`` pass
    (the listener may start later); prints
    ``REACH {"ok": bool, "error": ...}``; exit 0 when it connected."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while True:  # refused while the listener starts: tried again until the deadline
        left = deadline - time.monotonic()
        try:
            socket.create_connection((addr, port), timeout=max(0.1, min(2.0, left))).close()
            break
        except OSError as exc:
            if time.monotonic() + 0.3 >= deadline:
                print(REACH_TAG + json.dumps({"ok": False, "error": f"{addr}:{port}: {exc}"}), flush=True)
                return 1
            time.sleep(0.3)
    print(REACH_TAG + json.dumps({"ok": True}), flush=True)
    return 0


def parse_reach(nodes: list[str], outputs: dict[str, tuple[int, str]], pipelines: Mapping[str, str] | None = None,
                listener: tuple[int, str] | None = None) -> TrialResult:
    """The reach probe's verdict (pure): nodes whose connect to the rendezvous failed, by name; nodes whose probe
    never ran (:func:`start_failure`: e.g. eagle3ops not importable in the pipeline) are ``not_started``, their
    pipeline (``pipelines``: node → image or environment) named; so is the first node when its listening end
    (``listener``: its ``(exit status, output)``) never ran."""
    bad, detail, broken = [], [], {}
    first = _not_started(nodes[0], *listener, pipelines) if listener is not None and nodes else None
    if first:
        broken[nodes[0]] = first
        detail.append(f"{nodes[0]}: the listening end did not run ({first})")
    for name in nodes:
        rc, out = outputs.get(name, (None, ""))
        why = _not_started(name, rc, out, pipelines)
        if why:
            broken.setdefault(name, why)
            detail.append(f"{name}: the probe did not run ({why})")
            continue
        lines = [ln[len(REACH_TAG):] for ln in out.splitlines() if ln.startswith(REACH_TAG)]
        try:
            rec = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            rec = {}
        if rc == 0 and rec.get("ok") is True:
            detail.append(f"{name}: reached the rendezvous port")
        else:
            bad.append(name)
            why = rec.get("error") or (out.strip().splitlines()[-1][:200] if out.strip() else f"exit {rc}")
            detail.append(f"{name}: cannot connect ({why})")
    return TrialResult(not bad and not broken, tuple(bad), tuple(detail), broken)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - runs in the pipeline image (torch)
    """Join, all-reduce, print the ``TRIAL`` line; exit 0, or 1 when the group could not be formed in time. With
    ``--listen PORT --seconds S`` / ``--reach HOST:PORT``: the reach probe's two ends (:func:`listen`,
    :func:`reach`; no torch)."""
    ap = argparse.ArgumentParser(prog="python -m eagle3ops.fleet.trial")
    ap.add_argument("--timeout-s", type=float, required=True)
    ap.add_argument("--listen", type=int, help="accept connections on this port for --timeout-s seconds")
    ap.add_argument("--expect", type=int, help="with --listen: stop once this many connections were accepted")
    ap.add_argument("--reach", metavar="HOST:PORT", help="connect once to HOST:PORT within --timeout-s")
    args = ap.parse_args(argv)
    if args.listen is not None:
        return listen(args.listen, args.timeout_s, args.expect)
    if args.reach is not None:
        host, _, port = args.reach.rpartition(":")
        return reach(host, int(port), args.timeout_s)

    import datetime

    import torch
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
        rank, world = dist.get_rank(), dist.get_world_size()
        t = torch.zeros(world)
        t[rank] = 1.0
        dist.all_reduce(t)
        print(TAG + json.dumps({"rank": rank, "world": world,
                                "seen": [i for i in range(world) if t[i].item() == 1.0]}), flush=True)
        dist.destroy_process_group()
        return 0
    except Exception as exc:  # noqa: BLE001 - the node's verdict is its output; the driver names it
        print(f"trial failed: {type(exc).__name__}: {exc}", flush=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
