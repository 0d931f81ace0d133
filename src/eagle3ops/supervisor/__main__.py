"""``python -m eagle3ops.supervisor PLAN_JSON``: run a window's plan on the host (in the supervisor container, or on
a venv host as a detached process that writes its pid to the window's ``supervisor.pid``)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from eagle3ops.commands import runtime as rt
from eagle3ops.config.plan import Plan
from eagle3ops.supervisor.runner import Interrupted, Supervisor


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m eagle3ops.supervisor PLAN_JSON``. Exit 0 when the run ended (any outcome)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m eagle3ops.supervisor PLAN_JSON", file=sys.stderr)
        return 2
    plan_path = Path(argv[0])
    plan = Plan.model_validate_json(plan_path.read_text())
    wdir = plan_path.parent
    if (wdir / "result.json").exists():
        print("window already finished; nothing to do", flush=True)
        return 0
    if not rt.for_plan(plan).engine:  # a detached process on a host without an engine: its pid says it runs
        tmp = wdir / "supervisor.pid.tmp"
        tmp.write_text(f"{os.getpid()}\n")
        tmp.replace(wdir / "supervisor.pid")
        client = None
    else:
        import docker

        client = docker.from_env(timeout=600)
    sup = Supervisor(plan, client, wdir)
    if client is not None:  # the engine's socket, as docker.from_env reads DOCKER_HOST: Supervisor.engine_up
        endpoint = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        sup.engine_socket = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else None

    def _term(signum: int, _frame: Any) -> None:
        # Raise once; later signals are ignored so the restore that follows is not cut short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sup.stop_requested = True
        raise Interrupted(f"supervisor received signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    sup.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
