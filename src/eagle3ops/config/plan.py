"""The plan of a maintenance window: written by the driver (:mod:`eagle3ops.window`) as ``windows/<id>/plan.json``,
read by the host-side supervisor (:mod:`eagle3ops.supervisor`). The one thing both sides share.

The timing constants the driver's watch bound is computed from (:data:`MIN_GATE_S`, :data:`RECORD_GATE_S`) live here
too, so the driver imports nothing else from the supervisor.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

#: What a window on a host without production serving (``serving: none``) leaves out; said in the dry-run, the
#: preflight, the supervisor's journal and the window's result.
NO_SERVING_NOTE = ("host has no production serving (serving: none): the window skips the stop, the restore and the "
                   "health gate")


class StageStep(BaseModel):
    """One stage of a window: its container spec and time limit (seconds)."""

    name: str
    spec: dict[str, Any]
    timeout_s: float


class HealthCheck(BaseModel):
    """The health gate: /health 200, /v1/models lists ``model``, one completion succeeds (seconds; ``port`` on the
    host's loopback)."""

    port: int
    model: str
    timeout_s: float
    interval_s: float = 2.0
    #: Host path of a file holding the API key serving requires (``serving.api_key_file``), read on the host by
    #: the supervisor when the serving container's own configuration names no key; only the path is in the plan.
    api_key_file: str | None = None


def default_restore_reserve_s(budget_s: float, health_timeout_s: float) -> float:
    """The restore's reserved share of a window's budget (seconds): ``min(health_timeout_s, budget_s / 2)``.

    Stages must end by ``budget_s`` minus this; the restore's start and health gate use the rest.
    """
    return min(health_timeout_s, budget_s / 2)


class ReleaseChange(BaseModel):
    """The intended change of a new serving release; everything else is the live container's, unchanged.

    ``args``: server flags to set (each replaces the same flag in the live command, then is appended); ``env``:
    variables to set; ``binds``: ``HOST:CONTAINER[:OPTS]`` binds replacing the bind of the same container path;
    ``image``: a new image reference (the old image's defaults give way to the new one's). See
    :func:`eagle3ops.commands.serving.apply_change`.
    """

    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    binds: list[str] = Field(default_factory=list)
    image: str | None = None

    def describe(self) -> str:
        """One line naming the change (environment values are not shown: they may be secrets)."""
        parts = ([f"args {' '.join(self.args)}"] if self.args else []) + (
            [f"env {', '.join(sorted(self.env))}"] if self.env else []) + (
            [f"binds {', '.join(self.binds)}"] if self.binds else []) + ([f"image {self.image}"] if self.image else [])
        return "; ".join(parts) or "no change (the live container recreated as it is)"


class Plan(BaseModel):
    """Everything the supervisor needs, written by the driver as ``windows/<id>/plan.json``.

    ``kind``: ``window`` (stop, stages, restore), ``release`` (replace serving with a new release: the live
    container plus ``change``) or ``rollback`` (replace serving with retained release ``to_release``).

    ``budget_s`` (seconds) is the longest serving may be down, restore, health gate and rollbacks included, counted
    from the window's start. ``restore_reserve_s`` of it is kept for the restore: stages end by ``budget_s -
    restore_reserve_s`` (None: :func:`default_restore_reserve_s`).
    """

    window_id: str
    kind: Literal["window", "release", "rollback"]
    host: str
    user: str
    command: str
    state_dir: str
    serving_container: str
    #: The host's serving kind (``serving.kind``); ``none``: a host that only trains: the supervisor skips the
    #: record, stop, restore and health gate (and says so in its journal and result).
    serving_kind: Literal["container", "compose", "process", "systemd", "none"] = "container"
    #: Kinds ``process`` and ``systemd``: the window's process dir on the host (the record and the files the
    #: supervisor and the host-side restore agent exchange, :mod:`eagle3ops.commands.process`); ``process``: the
    #: serving process's pid; ``systemd``: the unit's name.
    process_dir: str | None = None
    process_pid: int | None = None
    serving_unit: str | None = None
    stop_timeout_s: int = 120
    stages: list[StageStep] = Field(default_factory=list)
    budget_s: float = 7200.0
    #: None only when ``serving_kind`` is ``none`` (nothing to gate).
    health: HealthCheck | None
    change: ReleaseChange | None = None
    to_release: int | None = None
    gpus: int = 0
    restore_reserve_s: float | None = None

    def reserve_s(self) -> float:
        """Seconds of ``budget_s`` reserved for restore + health gate (see :func:`default_restore_reserve_s`)."""
        if self.health is None:  # no serving to restore (serving: none)
            return 0.0
        if self.restore_reserve_s is not None:
            return min(self.restore_reserve_s, self.budget_s)
        return default_restore_reserve_s(self.budget_s, self.health.timeout_s)


#: Once the budget is spent and serving has not passed a gate, each further gate (restore or rollback) still waits
#: this long (seconds): bringing serving back comes before the budget. Each such overrun is a warning in the result.
MIN_GATE_S = 120.0
#: Seconds the gate on the already-running serving container may take when it is first recorded as a release.
RECORD_GATE_S = 60.0

