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


class Candidate(BaseModel):
    """One speculative release among several a ``speculate`` job chooses from: ``name`` (e.g.
    ``eagle3-k3``, ``ngram-k4``; journal steps and files are named after it) and its change of the live serving."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    change: ReleaseChange


class SpeculateJob(BaseModel):
    """A ``speculate`` plan's job, carried out by the host's supervisor under the lock from start to end
    (:mod:`eagle3ops.supervisor.speculate`): record → baseline measurement → the speculative release (``change``)
    → its measurement → decision (:func:`eagle3ops.gate.decide.decide`) → keep, or switch back to the release
    live before.

    ``rule``: ``faster`` (``speculate``: keep needs the interval's lower bound at ``1 + margin`` and acceptance at
    ``acceptance_floor``) or ``not_slower`` (``release --gate``: any serving change, kept unless slower
    beyond the margin; no head, no floor, and the change may be unlike the live release: that is what is measured).

    ``head_sha256``: the head's content digest (file names and contents); ``results_dir``: the head's results
    folder ``<data_dir>/runs/<run>/speculate/<head_sha256[:16]>`` (a gated release's: ``<state_dir>/gates``), each
    attempt in its own ``<window_id>/`` inside (no attempt overwrites another);
    ``latest``: where a copy of the newest result goes (``runs/<run>/speculate/result.json``, what the run report
    reads, for the run's own head; ``<results_dir>/result.json`` for a head from elsewhere, so that it never
    overwrites the run's own), or None. ``prompts`` are sent in this order on every pass (a string to
    ``/v1/completions``, a chat body to ``/v1/chat/completions``: :func:`eagle3ops.gate.replay.request_body`);
    ``levels``: concurrencies, the first one deciding; seconds for the timeouts. ``figures``: what the driver checked before (head check, prompts' source,
    warnings), copied into the result as they are.
    """

    #: The run and head shipped (``speculate``); None for a gated release (``rule: not_slower``), which has none.
    run: str | None = None
    head: str | None = None
    head_sha256: str | None = None
    results_dir: str
    rule: Literal["faster", "not_slower"] = "faster"
    latest: str | None = None
    change: ReleaseChange
    prompts: list[str | dict[str, Any]]
    levels: list[int]
    max_tokens: int
    passes: int
    margin: float
    #: Least mean acceptance length to keep; None: not checked (``rule: not_slower``, a change that need not speculate).
    acceptance_floor: float | None
    ttft_ratio_max: float | None = None
    request_timeout_s: float = 300.0
    idle_timeout_s: float = 120.0
    #: Prompts sent at each level before a side's measured passes, not measured (``serving.gate_warmup_prompts``).
    warmup_prompts: int = 0
    #: The control release (``speculate --control``, like for like): the live serving plus this change
    #: (the speculative image, the speculative change's flags but ``--speculative-config``), switched to and
    #: measured as the baseline before the speculative release; never made the live release. None: the live
    #: release is the baseline (refused by the driver, and undecided on the host, when its image differs).
    control: ReleaseChange | None = None
    #: ``serving.drain_hook`` / ``undrain_hook`` (argv run by the supervisor before the first measurement and at the
    #: end, whatever happened) and their bound in seconds; None: no hook.
    drain_hook: list[str] | None = None
    undrain_hook: list[str] | None = None
    hook_timeout_s: float = 60.0
    #: ``serving.gate_traffic``: ``idle`` (each pass waits for an idle server; another client's request makes the
    #: verdict undecided) or ``live`` (measured beside the clients' traffic: no idle wait, other requests recorded,
    #: not refused; :func:`eagle3ops.gate.decide.decide`'s ``traffic``).
    traffic: Literal["idle", "live"] = "idle"
    #: Prompt sets: name -> indices into ``prompts`` (e.g. ``chat``, ``code``); one table per set in the result,
    #: cut from the same passes (:func:`eagle3ops.gate.decide.set_tables`); the decision is the whole set's.
    prompt_sets: dict[str, list[int]] = Field(default_factory=dict)
    #: Several speculative releases to choose from (``speculate --method ... --k ...``); empty: the one
    #: ``change``. Each is switched to (never made the live release) and measured against the one baseline, and
    #: decided at the corrected level (:func:`eagle3ops.gate.decide.candidate_level`); the best that clears the rule
    #: is switched to again as the speculative release and measured afresh (the confirmation), which decides at
    #: the usual level; ``change`` is then the winner's.
    candidates: list[Candidate] = Field(default_factory=list)
    #: The order of the passes (:func:`eagle3ops.gate.decide.block_passes`): ``aba`` (the baseline restarted and
    #: measured, the speculative release measured, the baseline restarted and measured again: a linear drift and a
    #: restarted server's own speed cancel) or ``ab`` (the live baseline, then the speculative release: the result
    #: states the unmeasured block shift). The driver chooses it (``serving.gate_design``); a plan without it is
    #: ``ab``, the order every earlier plan ran.
    design: Literal["aba", "ab"] = "ab"
    figures: dict[str, Any] = Field(default_factory=dict)

    def measure_bound_s(self) -> float:
        """Longest one side's measurement may take (seconds): every pass and level (and the warm-up) at its request
        timeout plus its idle wait."""
        rounds = self.passes + (1 if self.warmup_prompts else 0)
        return rounds * len(self.levels) * (self.request_timeout_s + self.idle_timeout_s + 30.0)

    def measurements(self) -> int:
        """Measured sides of the job: the baseline and the speculative release, plus each candidate's, plus the
        baseline's second block (``aba`` with one speculative release)."""
        return 2 + len(self.candidates) + self.extra_restarts() // 2

    def extra_restarts(self) -> int:
        """Serving restarts the ``aba`` order adds to the two-block one's (the baseline restarted before its first
        block, and the kept release served again after the baseline's second), for the driver's and the restore
        agent's bounds; 0 for ``ab`` and for several candidates (measured ``ab``)."""
        return 2 if self.design == "aba" and not self.candidates else 0


class Plan(BaseModel):
    """Everything the supervisor needs, written by the driver as ``windows/<id>/plan.json``.

    ``kind``: ``window`` (stop, stages, restore), ``release`` (replace serving with a new release: the live
    container plus ``change``), ``rollback`` (replace serving with retained release ``to_release``) or
    ``speculate`` (the job in ``speculate``: measure, release, measure, decide, keep or switch back).

    ``budget_s`` (seconds) is the longest serving may be down, restore, health gate and rollbacks included, counted
    from the window's start. ``restore_reserve_s`` of it is kept for the restore: stages end by ``budget_s -
    restore_reserve_s`` (None: :func:`default_restore_reserve_s`).
    """

    window_id: str
    kind: Literal["window", "release", "rollback", "speculate"]
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
    #: Kinds ``container`` and ``compose``: the host folder (``<data_dir>/compile-cache``) that keeps serving's
    #: compile cache across the containers a release, a rollback or a gate's switch recreates
    #: (:func:`eagle3ops.commands.serving.keep_compile_cache`); None: not kept (another kind, whose server keeps its
    #: cache on the host's own filesystem, or a plan written before).
    compile_cache: str | None = None
    #: How the restore agent (kinds ``process`` and ``systemd``) and a venv host's supervisor are detached from the
    #: driver's SSH session (:data:`eagle3ops.commands.logind.DETACH_MODES`; ``user-service`` where systemd-logind
    #: ends a session's processes when it closes).
    agent_detach: Literal["setsid", "user-service"] = "setsid"
    stop_timeout_s: int = 120
    stages: list[StageStep] = Field(default_factory=list)
    budget_s: float = 7200.0
    #: None only when ``serving_kind`` is ``none`` (nothing to gate).
    health: HealthCheck | None
    change: ReleaseChange | None = None
    #: A ``speculate`` plan's job (None for every other kind).
    speculate: SpeculateJob | None = None
    to_release: int | None = None
    gpus: int = 0
    restore_reserve_s: float | None = None
    #: Where the stages and the supervisor run: ``container`` (the host's engine) or ``venv`` (``stage_runtime:
    #: venv``: processes of the pipeline environment; each stage's spec holds ``argv``, ``environment``,
    #: ``cwd``, see :func:`eagle3ops.commands.venv.stage_spec`).
    runtime: Literal["container", "venv"] = "container"
    #: The inventory's ``secret_env``: environment names whose values the supervisor masks in everything it writes
    #: and prints (:mod:`eagle3ops.redact`), beside the built-in ones.
    secret_env: list[str] = Field(default_factory=list)

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

