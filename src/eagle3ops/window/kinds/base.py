"""The driver side's serving-kind interface, :class:`DriverKind`, and what several kinds share: the restore agent's
bounds and the kinds it serves (:class:`AgentKind`), the ``--dry-run`` previews (the health gate, the stages, a speculate job), the environment stages inherit
from live serving, whether the restore agent outlives the SSH session, and a host process's command line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from eagle3ops.commands import host as hc
from eagle3ops.commands import logind as lg
from eagle3ops.commands import process as pc
from eagle3ops.commands import runtime as rt
from eagle3ops.config import HostConfig
from eagle3ops.config.plan import Plan, ReleaseChange
from eagle3ops.window.common import WindowError
from eagle3ops.window.hostfacts import inherited_env

if TYPE_CHECKING:
    from eagle3ops.remote import Remote


class ServingFindings(Protocol):
    """What a kind's preflight writes (preflight's record, :class:`eagle3ops.window.preflight.Preflight`, is one):
    one check per :meth:`add`, and what it found of live serving for the plan.

    Attributes: ``serving_container`` (the container the window manages), ``process_pid`` (kind ``process``: the
    serving process found, else None), ``agent_detach`` (kinds ``process``/``systemd``: how the restore agent is
    detached, ``setsid`` or ``user-service``), ``serving_env`` (``{name: value}`` of the NCCL/CUDA environment the
    stages inherit from live serving).
    """

    serving_container: str
    process_pid: int | None
    agent_detach: str
    serving_env: dict[str, str]

    def add(self, name: str, ok: bool, detail: str) -> None:
        """Record one check: its name, whether it passed, and what was found in words."""


def agent_limit_s(plan: Plan) -> float:
    """How long (seconds) a ``process``/``systemd`` window's restore agent waits for the supervisor's restore request
    before it restores on its own: the window's budget plus the graceful stop and 600 s; a ``speculate`` plan adds
    both sides' measurement bound (:meth:`~eagle3ops.config.plan.SpeculateJob.measure_bound_s`), and the graceful
    stop and 600 s for each restart the ``aba`` order adds."""
    job = plan.speculate
    measuring = job.measurements() * job.measure_bound_s() if job is not None else 0.0
    extra = job.extra_restarts() * (plan.stop_timeout_s + 600.0) if job is not None else 0.0
    return plan.budget_s + plan.stop_timeout_s + 600.0 + measuring + extra


def agent_stop_wait_s(plan: Plan) -> float:
    """How long (seconds) the restore agent waits for the stop request: :data:`eagle3ops.commands.process.
    AGENT_STOP_WAIT_S`, plus a ``speculate`` plan's baseline measurement (it runs before the switch stops serving)."""
    return pc.AGENT_STOP_WAIT_S + (plan.speculate.measure_bound_s() if plan.speculate is not None else 0.0)


def _measure_preview(plan: Plan, side: str) -> list[str]:
    job = plan.speculate
    assert job is not None and plan.health is not None
    return ["# measure", side, f"http://127.0.0.1:{plan.health.port}: {len(job.prompts)} prompts x {job.max_tokens} "
            f"tokens at concurrency {job.levels}, {job.passes} passes (in the supervisor)"]


def speculate_preview(plan: Plan, release: list[list[str]], back: list[list[str]]) -> list[list[str]]:
    """A speculate plan's steps around the kind's release commands (``--dry-run``): baseline, the release, its
    measurement, the decision, and the switch back (``back``) when it is not kept."""
    job = plan.speculate
    assert job is not None
    rule = (f"x{1 + job.margin:.3f} and acceptance >= {job.acceptance_floor}" if job.rule == "faster"
            else f"x{1 - job.margin:.3f} (not slower beyond the margin)")
    cands = ([["# candidates", ", ".join(c.name for c in job.candidates), "each switched to (never live) and "
               f"measured; the best kept at the corrected level (x{len(job.candidates)} candidates) is the release "
               "below, measured afresh"]] if job.candidates else [])
    control = ([["# control", f"the live serving on {job.control.image} without --speculative-config, health-gated, "
                 "never live: the baseline measured next (one more restart)"]] if job.control else [])
    return [*control, _measure_preview(plan, "baseline"), *cands, *release,
            _measure_preview(plan, "speculative" if job.rule == "faster" else "changed"),
            ["# decide", f"keep when the {job.levels[0]}-concurrency throughput ratio's 90 % interval clears "
             f"{rule}; else:"], *back,
            ["# results", f"{job.results_dir}/{plan.window_id}"]]


def gate_preview(plan: Plan) -> list[str]:
    """The health gate's requests as one preview line (``--dry-run``): ``/health``, ``/v1/models``, one
    completion on the plan's port."""
    assert plan.health is not None  # every plan with serving has a gate
    port = plan.health.port
    return ["GET", f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/v1/models",
            f"POST http://127.0.0.1:{port}/v1/completions"]


def stage_previews(h: HostConfig, plan: Plan) -> list[list[str]]:
    """What the supervisor runs for each of the plan's stages, one argv each (the plan's runtime's
    :meth:`~eagle3ops.commands.runtime.StageRuntime.stage_preview`)."""
    runtime = rt.for_plan(plan)
    return [runtime.stage_preview(h, step.spec) for step in plan.stages]


def supervisor_words(h: HostConfig, plan: Plan) -> list[str] | None:
    """How a restore agent asks about the window's supervisor: None (``docker``, a container) or, on a venv host,
    :func:`eagle3ops.commands.venv.state_words` of the window directory (the plan's runtime's
    :meth:`~eagle3ops.commands.runtime.StageRuntime.state_words`)."""
    return rt.for_plan(plan).state_words(h, plan.window_id)


class DriverKind:
    """One serving manager as a window's driver sees it: the interface each kind's module implements
    (:mod:`.container` for ``container`` and ``compose``, :mod:`.process`, :mod:`.systemd`, :mod:`.none`). The
    defaults here are what a kind does unless it says otherwise: it refuses nothing, limits no release, runs nothing
    on the host before the supervisor, has nothing to say to ``config check``, and preflight's words for what it
    looks for name a container."""

    name = ""
    #: A release/rollback needs live serving found at preflight (the kinds whose driver records it before launch).
    records_before_release = False
    #: Said by ``--dry-run`` before the supervisor's commands (None: nothing to say).
    dry_run_note: str | None = None
    #: The form of this kind's release record, which the cycle's served acceptance replays on a work host
    #: (``container``: the container's configuration; ``process``: its command line; None: not replayed).
    record_form: str | None = None
    #: serving answers HTTP on ``serving.port`` (its ``/version`` is checked against the host's profile)
    answers_http: bool = True
    #: The window starts a host-side restore agent over SSH (kinds ``process`` and ``systemd``), which must outlive
    #: the driver's SSH session (:func:`check_session_kill`).
    restore_agent: bool = False

    def refuse(self, h: HostConfig, what: str) -> None:
        """Refuse ``what`` (``release``, ``rollback``, ``speculate``) on this kind of serving before the lock.

        Raises:
            WindowError: the kind cannot do ``what``; the message names the host, the inventory key and the fix.
        """

    def release_refusal(self, h: HostConfig, change: ReleaseChange | None) -> str | None:
        """Why a release with ``change`` cannot be made on this kind (None: it can)."""
        return None

    def host_refusal(self, r: "Remote") -> str | None:
        """Why this host cannot switch serving to another release (``release``, ``rollback``, ``speculate``), from
        what it says (read-only, before the lock); None: it can."""
        return None

    def preflight(self, r: "Remote", pf: ServingFindings, need_serving: bool) -> None:
        """Find live serving (read-only) and add its check to ``pf``."""
        raise NotImplementedError

    def plan_fields(self, h: HostConfig, window_id: str, serving_container: str | None,
                    process_pid: int | None) -> dict[str, Any]:
        """The :class:`~eagle3ops.config.plan.Plan` fields of this kind."""
        raise NotImplementedError

    def launch(self, r: "Remote", plan: Plan) -> None:
        """Run what must be on the host before the supervisor starts (nothing by default)."""

    def supervisor_commands(self, h: HostConfig, plan: Plan) -> list[list[str]]:
        """What the supervisor will do, as equivalent argv lists (``--dry-run``)."""
        raise NotImplementedError

    def speculative_change(self, h: HostConfig, head_dir: str, k: int, image: str,
                           draft_tp: int | None = None, vllm: str | None = None) -> ReleaseChange:
        """The speculative release of the live server with the head at ``head_dir`` (``k`` speculative tokens;
        ``vllm``: the serving image's vLLM version when known, which chooses the speculative config's keys).

        Raises:
            NotImplementedError: a kind that refuses ``speculate`` (:meth:`refuse`) makes none.
        """
        raise NotImplementedError(f"serving kind {self.name} makes no speculative release")

    def ngram_change(self, h: HostConfig, k: int, image: str, vllm: str | None = None) -> ReleaseChange:
        """vLLM's n-gram proposer as a speculative release of the live server (``vllm`` as for
        :meth:`speculative_change`).

        Raises:
            NotImplementedError: a kind that refuses ``speculate`` (:meth:`refuse`) makes none.
        """
        raise NotImplementedError(f"serving kind {self.name} makes no speculative release")

    def looked_for(self, h: HostConfig) -> str:
        """What preflight looks for, in words."""
        return f"container {h.serving.container!r}"

    def live_state(self, r: "Remote") -> tuple[str, bool | None]:
        """The live server as the host has it now (read-only): ``(words, running)``; ``running`` is None for a host
        without serving."""
        raise NotImplementedError

    def start_stopped(self, r: "Remote") -> tuple[str, list[Any]]:
        """``recover`` of serving stopped outside a window: ``(what is started, the commands)``.

        Raises:
            WindowError: serving cannot be started as it is; the message names the fix.
        """
        raise NotImplementedError

    def drift_note(self, h: HostConfig) -> str | None:
        """``config check HOST``: why there is no live container to compare (None: compare it)."""
        return None

    def served_argv(self, r: "Remote") -> tuple[list[str], Callable[[str], str | None], str] | None:
        """The live server's command line, a reader of a file as the server sees it (its text, or None when it
        cannot be read), and where it runs in words; None when no serving is found. Read-only."""
        raise NotImplementedError



class AgentKind(DriverKind):
    """A serving manager whose server the host-side restore agent stops and restores (``process``, ``systemd``):
    it has no image or binds, so a release of it, the speculative one included, differs from the live server by
    flags (``--arg``) and environment only, and it does windows, releases, rollbacks and speculation, nothing else.
    A subclass says in :meth:`serves_with` what serves and in :attr:`release_form` how a release is written."""

    restore_agent = True
    records_before_release = True
    #: How a release's flags reach the server, in words after "environment" (empty: said no further).
    release_form = ""

    def serves_with(self, h: HostConfig) -> str:
        """What serves on ``h``, in words after "serves with" (``a process``, ``systemd unit 'vllm.service'``)."""
        raise NotImplementedError

    def _serves(self, h: HostConfig) -> str:
        return f"host {h.name} serves with {self.serves_with(h)} (`hosts.{h.name}.serving.kind: {self.name}`)"

    def refuse(self, h: HostConfig, what: str) -> None:
        if what not in ("release", "rollback", "speculate"):
            raise WindowError(f"{self._serves(h)}: {what} is not supported for {self.name} serving (windows, "
                              f"release, rollback and speculate are); run serving as a container for {what}")

    def release_refusal(self, h: HostConfig, change: ReleaseChange | None) -> str | None:
        if change is None or not (change.image or change.binds):
            return None
        return (f"{self._serves(h)}: a release of it changes only server flags (--arg) and environment"
                f"{self.release_form}, not the image or binds (asked: {'--image' if change.image else 'binds'}); "
                f"drop --image/binds, or run serving as a container")

    def speculative_change(self, h: HostConfig, head_dir: str, k: int, image: str,
                           draft_tp: int | None = None, vllm: str | None = None) -> ReleaseChange:
        """The live server's command line plus ``--speculative-config`` naming the head at its host path (no image
        or binds: ``image`` is not used; the server's own vLLM must be the patched one); ``vllm``: that vLLM's
        version when known (its speculative config's keys on CPU: :func:`eagle3ops.commands.speculate.
        speculative_args`)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.speculative_args(num_speculative_tokens=k, cpu=h.gpus == 0, model=head_dir,
                                                      draft_tp=draft_tp, vllm=vllm))

    def ngram_change(self, h: HostConfig, k: int, image: str, vllm: str | None = None) -> ReleaseChange:
        """The live server's command line plus the n-gram proposer's ``--speculative-config`` (no head, no
        image; ``vllm`` as for :meth:`speculative_change`)."""
        from eagle3ops.commands import speculate as sc

        return ReleaseChange(args=sc.ngram_args(num_speculative_tokens=k, cpu=h.gpus == 0, vllm=vllm))

def add_inherited_env(pf: ServingFindings, pairs: list[str], source: str, host: str) -> None:
    """Set ``pf.serving_env`` from serving's environment ``pairs`` and say what the stages inherit (``--dry-run``
    shows it with the checks)."""
    pf.serving_env = inherited_env(pairs)
    if pf.serving_env:
        pf.add("stage environment", True, "stages inherit from " + source + ": " + " ".join(
            f"{k}={v}" for k, v in sorted(pf.serving_env.items())) + f" (hosts.{host}.stage_env overrides)")


def check_session_kill(r: "Remote", pf: ServingFindings, agent: bool = True) -> None:
    """Will what a window leaves running on the host outlive the driver's SSH session: the restore agent (kinds
    ``process``/``systemd``) and, on a ``stage_runtime: venv`` host, the window's supervisor (a process started over
    SSH there, not a container)? Reads systemd-logind's settings for the SSH user
    (:func:`eagle3ops.commands.logind.facts`, read-only) and sets ``pf.agent_detach``
    (:func:`eagle3ops.commands.logind.detach_mode`: both are detached the same way); a check fails when logind
    would end them with the session and no user service can hold them (the message names the fix). ``agent``:
    the serving kind starts a restore agent (:attr:`DriverKind.restore_agent`)."""
    venv = not rt.for_host(r.host).engine
    sup = "the window's supervisor (a process of the SSH session on this venv host)"
    who = {(True, False): "the restore agent", (True, True): f"the restore agent and {sup}",
           (False, True): sup}[(agent, venv)]
    harm = "leave serving stopped" if agent else "end the window's stages midway"
    sk = lg.parse(r.run(lg.facts(), check=False).stdout)
    mode, refusal = lg.detach_mode(sk, who=who, harm=harm)
    pf.agent_detach = mode
    name = "restore agent" if agent else "supervisor"
    if refusal:
        pf.add(name, False, refusal)
    elif mode == "user-service":
        runs = "runs as a user service" if who == "the restore agent" else "run as user services"
        pf.add(name, True, f"logind ends {sk.user}'s session processes at logout (KillUserProcesses): {who} {runs} "
                           f"(systemd-run --user; {sk.user} lingers)")


def proc_argv(r: "Remote", pid: int, where: str) -> tuple[list[str], Callable[[str], str | None], str] | None:
    """A host process's command line (``/proc/PID/cmdline``, NUL-separated) and a reader of files as it sees them
    (a relative path from ``/proc/PID/cwd``); None when its cmdline cannot be read. Read-only."""
    out = r.run(hc.cat(f"/proc/{pid}/cmdline"), check=False)
    if not out.ok:
        return None

    def read(path: str) -> str | None:
        res = r.run(hc.cat(path if path.startswith("/") else f"/proc/{pid}/cwd/{path}"), check=False)
        return res.stdout if res.ok else None

    return [a for a in out.stdout.split("\0") if a], read, where
