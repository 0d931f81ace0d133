"""The ``speculate`` job on the host: its step table, carried out by the host's supervisor under the lock from
start to end, so that a driver that dies at any point leaves the host to finish.

Steps (each journaled in the window's ``journal.jsonl``; ``status`` shows where the job is, ``recover`` restarts a
dead supervisor, which resumes from the journal and the attempt folder's files):

1. **record** the live serving (the kind's ``record``: what a rollback returns to); then **drain**, the inventory's
   ``serving.drain_hook`` (clients off this server; bounded; its failure ends the job before any restart), whose
   ``undrain_hook`` runs at the end whatever happened;
1b. with ``control`` (``speculate --control``): **control**, the switch to the control release (the live serving
   on the speculative image, the speculative change's flags but ``--speculative-config``), health-gated, never made
   the live release; it is the baseline measured next (like for like: :mod:`eagle3ops.gate.like`);
2. **baseline**: :func:`eagle3ops.gate.measure.measure` against live serving over the host's loopback (the
   same code as the gate helper's), saved as ``baseline.json`` in the attempt folder with the measured release's
   identity (image, id, labels, argv, vLLM's ``/version``);
2b. with ``candidates`` (``speculate --method ... --k ...``): each candidate in turn, **candidate-<name>**
   (the kind's ``switch`` with its change, never made the live release) and **measure-<name>**
   (``candidate-<name>.json``), decided against the baseline at the corrected level
   (:func:`eagle3ops.gate.decide.candidate_level`); the best kept
   (:func:`~eagle3ops.supervisor.verdict.choose_candidate`) is the speculative release of step 3, measured afresh in
   step 4 (the confirmation); none kept: ``return_to`` and ``rollback``;
3. **switch** to the speculative release (the kind's ``switch`` with the plan's change, or the chosen candidate's,
   health-gated; a failed gate is rolled back by the kind and decides ``rollback``);
4. **measure** the speculative release the same way (``speculative.json``);
4b. with ``design: aba`` (``serving.gate_design``, the default; not with several candidates): the baseline was
   restarted before step 2 (**restart-baseline**, a never-live copy of the live release; with ``control`` the
   control release is that restart) and measured with half the passes, rounded up; after step 4 the baseline is
   restarted again (**rollback** to the release live before, or **control-again**) and measured again
   (**baseline-after**, ``baseline-after.json``), so that the decision sees every block after a restart and a
   linear drift cancels (:mod:`eagle3ops.gate.decide`, "The order of the passes"); a kept release is then served
   again (**keep-switch**, the kind's ``reinstate``), a rejected one needs no further restart;
5. **decide** (:func:`eagle3ops.gate.decide.decide`, pure); releases that are not like for like
   (:func:`eagle3ops.gate.like.unlike`: another image or vLLM version, other flags) are ``undecided``, with the
   figure that would have decided;
6. **keep**, or **rollback**: the kind's ``return_to`` the release live before (health-gated, earlier live releases
   tried when it fails); a failed measurement rolls back too, and a speculative release that fails the gate's
   traffic (a request failed, the server died: :class:`eagle3ops.gate.replay.ReleaseFailed`) is a ``rollback``
   whose reason names the endpoint and the failures. The verdict is written to the release history first
   (:meth:`~eagle3ops.supervisor.releases.Releases.mark_gate`): the speculative release became live only as
   measured, and a later ``rollback`` passes over it unless the gate kept it.

``release --gate`` (:mod:`eagle3ops.speculate.gated`) is the same job with ``rule="not_slower"``: no head, no
acceptance floor, no like-for-like check (its change is what is measured), results under ``<state_dir>/gates/``, audit
kind ``release-gate``.

The result (``result.json`` in the attempt folder ``runs/<run>/speculate/<sha256[:16]>/<window_id>/``, a copy at
``runs/<run>/speculate/result.json``) is written here, under the lock, before the window's own ``result.json`` and
the audit line (which carries the verdict and figures). The measurement and decision steps take only the plan's
:class:`~eagle3ops.config.plan.SpeculateJob` settings and the live serving: :func:`measure_serving` and
:func:`~eagle3ops.supervisor.verdict.decide_figures` (:mod:`eagle3ops.supervisor.verdict`, pure) measure and
decide any release, with or without a head.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3ops import redact
from eagle3ops.config.plan import Candidate, Plan, ReleaseChange, SpeculateJob
from eagle3ops.gate.like import ReleaseIdentity
from eagle3ops.supervisor.journal import Journal
from eagle3ops.supervisor.kinds.base import ServingKind
from eagle3ops.supervisor.releases import Releases
from eagle3ops.supervisor.verdict import (
    choose_candidate,
    decide_figures,
    decide_measured,
    failed_requests,
)


class SpeculateHost(Protocol):
    """What a speculate job uses of the window that runs it (the runner,
    :class:`eagle3ops.supervisor.runner.Supervisor`, is one).

    Attributes: ``plan`` (its ``speculate`` job, ``health``, ``secret_env``), ``journal``, ``releases``, ``kind``
    (the serving kind, which switches and returns releases), ``stop_requested`` (set by SIGTERM/SIGINT).
    Methods: the window's record and replace steps and the API key serving requires.
    """

    plan: Plan
    journal: Journal
    releases: Releases
    kind: ServingKind
    stop_requested: bool

    def warn(self, step: str, message: str) -> None:
        """Journal a warning for the window's result."""

    def record(self) -> None:
        """Record live serving, once."""

    def replace_serving(self) -> str:
        """Replace serving by the plan's release, health-gated; what was done, in words."""

    def api_key(self) -> str | None:
        """The API key serving requires (never logged); None when it requires none."""

__all__ = ["SpeculateHost", "SpeculateRun", "choose_candidate", "decide_figures", "decide_measured",
           "failed_requests", "measure_serving"]


def measure_serving(sup: SpeculateHost, job: SpeculateJob, passes: int | None = None) -> dict[str, Any]:
    """Measure the live serving as the job says (prompts in order, levels, passes), from this host, with the API
    key the health gate uses. ``passes``: this block's (default the job's). Returns
    :func:`eagle3ops.gate.measure.measure`'s answer.

    Raises:
        ReplayError: serving not idle before a level.
        ReleaseFailed: every request of a level failed, or serving stopped answering (:func:`eagle3ops.gate.
            measure.measure`).
    """
    from eagle3ops.gate.measure import measure

    assert sup.plan.health is not None
    return measure({"base_url": f"http://127.0.0.1:{sup.plan.health.port}", "model": sup.plan.health.model,
                    "prompts": job.prompts, "levels": job.levels, "max_tokens": job.max_tokens,
                    "passes": passes or job.passes, "api_key": sup.api_key(), "request_timeout_s": job.request_timeout_s,
                    "idle_timeout_s": job.idle_timeout_s, "warmup_prompts": job.warmup_prompts,
                    "traffic": job.traffic})


#: The result's fields the audit line carries.
AUDIT_FIGURES = (
    "throughput_ratio", "interval", "drift", "design", "gate_design", "power", "passes", "ttft_ratio",
    "ttft_ratio_max", "deciding", "spec_decode", "levels", "margin", "margin_is_negative_test_setting",
    "acceptance_floor", "production_concurrency", "live_release", "baseline_release", "speculative_release",
    "control", "control_release", "measured_releases", "sets", "drain", "rule", "change", "candidates",
    "ttft_ratio_p90", "ttft_breach", "traffic", "clients", "prefix_cache", "failed_requests", "answer_agreement")


class _Decided(Exception):
    """The job ends early with ``(verdict, reason)``, serving already where the verdict leaves it."""


@dataclass
class _GateState:
    """What one speculate job has done so far, carried through the steps of :meth:`SpeculateRun.run`.

    The result's fields: ``outcome``/``error`` (the window's), ``verdict``/``reason``/``figures``, the releases
    (``base_release``: live before; ``spec_release``: the speculative one once it serves; ``rollback``: the message
    of the return to the release live before). The flags that steer what the end must do:

    - ``transient``: serving runs a release that is not the live one (the control release, a candidate, the
      baseline's restart): an error returns to the release live before, and the kind's ``finish`` waits;
    - ``returning``: that return was tried (never twice);
    - ``drained``: the drain hook ran (a failed drain may have half-drained: undrain runs all the same);
    - ``ended``: the speculative release failed its health gate at the switch (the kind rolled back): no
      measurement follows.

    ``aba`` and the blocks' passes (``before_n``, ``after_n``) are the design's; ``returned`` is the ``aba``
    design's return to the baseline for its second block (serving on it since) and ``control_again`` that the
    control release serves that block."""

    aba: bool
    before_n: int
    after_n: int
    outcome: str = "ok"
    error: str = ""
    verdict: str = "error"
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    base_release: int | None = None
    spec_release: int | None = None
    rollback: str | None = None
    transient: bool = False
    returning: bool = False
    drained: bool = False
    ended: bool = False
    undrain_error: str | None = None
    returned: str | None = None
    control_again: bool = False
    baseline: dict[str, Any] = field(default_factory=dict)
    cand_figures: dict[str, Any] = field(default_factory=dict)
    change: ReleaseChange | None = None


class SpeculateRun:
    """One speculate job on ``sup`` (the window's runner: its journal, policy and serving kind)."""

    def __init__(self, sup: SpeculateHost):
        assert sup.plan.speculate is not None, "a speculate plan carries its job"
        self.sup, self.job = sup, sup.plan.speculate
        #: This attempt's folder: the head's results folder (made by the driver as the SSH user), then the window.
        self.dir = Path(self.job.results_dir) / sup.plan.window_id
        #: The owner of the head's results folder: files written here are given to them.
        self._owner = self._stat_owner(Path(self.job.results_dir))

    @staticmethod
    def _stat_owner(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_uid, st.st_gid

    def _write(self, path: Path, data: Any) -> None:
        """Write JSON atomically, owned like the run's ``speculate/`` folder, its secrets masked
        (:func:`eagle3ops.redact.value`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(redact.value(data, self.sup.plan.secret_env), indent=2) + "\n")
        tmp.replace(path)
        if self._owner:
            for p in (path, path.parent):
                try:
                    os.chown(p, *self._owner)
                except OSError:
                    pass

    def _measured(self, step: str, name: str, passes: int | None = None) -> dict[str, Any]:
        """A measurement step, once: reused from the attempt folder when the journal says it finished. The answer
        carries the measured release's identity (``release``: :meth:`ServingKind.identity` + ``/version``), read
        right after the measurement, while that release still serves. ``passes``: this block's (default the
        job's)."""
        path = self.dir / name
        if self.sup.journal.done(step) and path.is_file():
            return json.loads(path.read_text())
        self.sup.journal.log(step, "start", passes=passes or self.job.passes, levels=self.job.levels,
                             prompts=len(self.job.prompts), max_tokens=self.job.max_tokens)
        ans = measure_serving(self.sup, self.job, passes)
        ans["release"] = ReleaseIdentity.from_dict({**self.sup.kind.identity(),
                                                    "vllm_version": (ans.get("server") or {}).get("version")}
                                                   ).figures()
        self._write(path, ans)
        tps = {c: [round(f["output_tokens_per_s"], 2) for f in figs] for c, figs in ans["levels"].items()}
        self.sup.journal.log(step, "ok", output_tokens_per_s=tps, file=str(path))
        return ans

    def _hook(self, step: str, argv: list[str]) -> str | None:
        """Run ``argv`` (a drain or undrain hook) once, bounded by the job's ``hook_timeout_s``; journaled under
        ``step``. Returns None when it exited 0 (or the journal says it did), else why, in one line."""
        import subprocess

        journal = self.sup.journal
        if journal.done(step):
            return None
        journal.log(step, "start", argv=argv)
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=self.job.hook_timeout_s,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            why = f"{step} hook {argv[0]} ran past {self.job.hook_timeout_s:g} s (serving.hook_timeout_s) and was killed"
        except OSError as e:
            why = f"{step} hook {argv[0]} could not start: {e}"
        else:
            if res.returncode == 0:
                journal.log(step, "ok", rc=0)
                return None
            why = f"{step} hook {argv[0]} exited {res.returncode}: {(res.stderr or res.stdout).strip()[-300:]}"
        journal.log(step, "error", reason=why)
        return why

    def _identities(self) -> dict[str, Any]:
        """``{"baseline": identity, "speculative": identity}`` of the releases measured (from the attempt folder's
        measurement files; a side not measured is absent)."""
        out = {}
        for side, name in (("baseline", "baseline.json"), ("speculative", "speculative.json")):
            try:
                rel = json.loads((self.dir / name).read_text()).get("release")
            except (OSError, ValueError):
                continue
            if rel is not None:
                out[side] = rel
        return out

    def _candidates(self, baseline: dict[str, Any]) -> tuple[Candidate | None, bool, dict[str, Any]]:
        """Switch to each candidate in turn (journal step ``candidate-<name>``, never the live release), measure it
        (``candidate-<name>.json``) and decide it against ``baseline`` at the corrected level
        (:func:`eagle3ops.gate.decide.candidate_level`); a candidate that fails its health gate or its measurement
        is out (the kind's failed gate already went back to the live release). Resumes from the journal and the
        attempt folder like every step.

        Returns:
            (the candidate to confirm, or None; whether a candidate serves now; the figures: ``level``, one row per
            candidate with its verdict, reason, ratio, interval and acceptance, ``winner``).
        """
        from eagle3ops.gate.decide import candidate_level
        from eagle3ops.gate.replay import ReleaseFailed
        from eagle3ops.supervisor.errors import Interrupted

        journal, kind = self.sup.journal, self.sup.kind
        level = candidate_level(len(self.job.candidates))
        rows: list[dict[str, Any]] = []
        on_candidate = False
        for cand in self.job.candidates:
            step = f"candidate-{cand.name}"
            decided = journal.first(f"decide-{cand.name}", "ok")
            if decided is not None and decided.get("row"):  # a resumed supervisor: never measured again (what
                rows.append(decided["row"])                # serves now may be a later candidate)
                on_candidate = journal.done(step)
                continue
            if self.sup.stop_requested:
                raise Interrupted("stop requested between two candidates")
            row: dict[str, Any] = {"name": cand.name, "args": redact.argv(cand.change.args, self.sup.plan.secret_env),
                                   "image": cand.change.image}
            msg = kind.switch(step=step, change=cand.change, live=False)
            on_candidate = "rolled back" not in msg
            if not on_candidate:
                row.update(verdict="rollback", reason=f"failed its health gate ({msg})")
            else:
                try:
                    ans = self._measured(f"measure-{cand.name}", f"{step}.json")
                    verdict, reason, fig = decide_measured(self.job, baseline, ans, cand.change, level)
                    row.update(verdict=verdict, reason=reason, throughput_ratio=fig.get("throughput_ratio"),
                               interval=fig.get("interval"), ttft_ratio=fig.get("ttft_ratio"),
                               spec_decode=fig.get("spec_decode"), sets=fig.get("sets"))
                except Interrupted:
                    raise
                except ReleaseFailed as exc:
                    row.update(verdict="rollback", reason=f"failed the gate's traffic: {exc}")
                except Exception as exc:  # noqa: BLE001 - this candidate is out; the others still count
                    row.update(verdict="error", reason=f"measuring failed: {type(exc).__name__}: {exc}")
            journal.log(f"decide-{cand.name}", "ok", verdict=row["verdict"], reason=str(row["reason"])[-500:],
                        row=row)
            rows.append(row)
        best = choose_candidate(rows)
        winner = next((c for c in self.job.candidates if best and c.name == best["name"]), None)
        return winner, on_candidate, {"level": level, "rows": rows, "winner": winner.name if winner else None}

    def _design_figures(self, aba: bool) -> dict[str, Any]:
        """The order the passes ran in, for the result: the design asked for and used, the passes of each block
        (before, speculative, after), what the design cancels and what it leaves unmeasured."""
        from eagle3ops.gate.decide import ABA_DESIGN, BLOCK_DESIGN, block_passes

        used = "aba" if aba else "ab"
        out: dict[str, Any] = {"requested": self.job.design, "used": used,
                               "block_passes": list(block_passes(self.job.passes, used)),
                               **(ABA_DESIGN if aba else BLOCK_DESIGN)}
        if self.job.design == "aba" and not aba:
            out["why_ab"] = ("several candidates: each is measured in two blocks against the one baseline (the "
                             "confirmation too), so the block shift is not measured")
        return out

    def _second_block(self, st: _GateState) -> dict[str, Any]:
        """The ``aba`` design's third block: the baseline restarted as its first block was (the control release
        switched to again, or the release live before returned to) and measured (``baseline-after.json``).

        Sets ``st.returned`` to the return's message (None with a control release, whose switch is not a return)
        and ``st.control_again`` when the control release serves again.

        Raises:
            _Decided: the restart failed its health gate, or the measurement failed: ``undecided``, serving on the
                release live before (the kind went back to it).
        """
        from eagle3ops.supervisor.errors import Interrupted

        kind = self.sup.kind
        if self.job.control is not None:
            back = kind.switch(step="control-again", change=self.job.control, live=False)
            if "rolled back" in back:  # the kind went back to the live release: no third block
                st.returned = back
                raise _Decided("undecided", f"the control release failed its health gate when switched to again for "
                                            f"the baseline's second block ({back}); not decided on two blocks")
            st.control_again = True
        else:
            st.returned = kind.return_to(st.base_release, "the gate measures the baseline again after the "
                                                          "speculative release")
        try:
            return self._measured("baseline-after", "baseline-after.json", st.after_n)
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the baseline's second block: no decision without it
            raise _Decided("undecided", f"measuring the baseline again after the speculative release failed "
                                        f"({type(exc).__name__}: {exc}); not decided on two blocks") from None

    # --- the steps (module doc: 1 to 6), each on the one state -------------------------------------------------

    def _record_and_drain(self, st: _GateState) -> None:
        """Step 1: the live serving recorded (nothing changes before this succeeds), then the drain hook."""
        self.sup.record()
        st.base_release = self.sup.releases.current()
        if self.job.drain_hook:  # clients off this server before anything is measured or restarted
            why = self._hook("drain", self.job.drain_hook)
            st.drained = True  # a failed drain may have half-drained: undrain runs all the same
            if why:
                raise _Decided("error", f"{why}: nothing measured or restarted (serving.drain_hook)")

    def _restart_baseline(self, st: _GateState) -> None:
        """Step 1b / 4b's first restart: the control release (like for like: the speculative image without
        speculation), or with ``aba`` the baseline restarted, so that every measured block follows a restart and a
        restarted server's own speed cancels."""
        kind = self.sup.kind
        if self.job.control is not None:
            msg = kind.switch(step="control", change=self.job.control, live=False)
            if "rolled back" in msg:
                raise _Decided("rollback", f"the control release (the speculative image without "
                                           f"--speculative-config) failed its health gate ({msg}); nothing "
                                           "measured, the speculative release never started")
            st.transient = True
        elif st.aba:
            msg = kind.switch(step="restart-baseline", change=ReleaseChange(), live=False)
            if "rolled back" in msg:
                raise _Decided("rollback", f"the baseline restarted for the gate's first block failed its "
                                           f"health gate ({msg}); nothing measured, the speculative release "
                                           "never started")
            st.transient = True

    def _measure_baseline(self, st: _GateState) -> None:
        """Step 2: the baseline measured (its first block with ``aba``)."""
        st.baseline = self._measured("baseline", "baseline.json", st.before_n)

    def _choose(self, st: _GateState) -> None:
        """Step 2b, with several candidates: each measured, the best chosen as the speculative release; none kept
        returns to the release live before and decides ``rollback``."""
        if not self.job.candidates:
            return
        was_transient, st.transient = st.transient, True  # from the first switch on, a candidate may serve
        winner, on_candidate, st.cand_figures = self._candidates(st.baseline)
        st.transient = was_transient or on_candidate
        first = self.sup.journal.first(f"candidate-{self.job.candidates[0].name}", "start") or {}
        st.base_release = first.get("from_release", st.base_release)  # a process host adopts its live process
        if winner is None:
            if st.transient:  # a candidate (or the control release) serves: back to the release live before
                st.returning = True
                st.rollback = self.sup.kind.return_to(st.base_release, "no candidate cleared the gate")
                st.transient = False
            st.figures = {"candidates": st.cand_figures}
            raise _Decided("rollback", f"no candidate cleared the gate at the corrected "
                                       f"{st.cand_figures['level']:.1%} level: " + "; ".join(
                                           f"{r['name']}: {r['verdict']}" for r in st.cand_figures["rows"]))
        st.change = winner.change

    def _switch(self, st: _GateState) -> None:
        """Step 3: the kind's switch to the speculative release (a resumed one keeps its journaled target; a chosen
        candidate is switched to again); a failed health gate (rolled back by the kind) decides ``rollback``."""
        sup = self.sup
        msg = sup.replace_serving() if st.change is None else sup.kind.switch(change=st.change)
        st.transient = False  # the switch replaced it (or its failed gate rolled back to the live release)
        switched = sup.journal.first("switch", "start") or {}
        st.base_release = switched.get("from_release", st.base_release)
        if "rolled back" in msg:
            st.verdict, st.reason = "rollback", f"the speculative release failed its health gate ({msg})"
            st.figures = {"baseline_levels": st.baseline["levels"]}
            st.ended = True
        else:
            st.spec_release = sup.releases.current()

    def _measure_and_decide(self, st: _GateState) -> None:
        """Steps 4, 4b and 5: the speculative release measured, with ``aba`` the baseline's second block, and the
        verdict; a release that fails the gate's traffic is a ``rollback`` naming the failures, a failed
        measurement an ``error``."""
        from eagle3ops.gate.replay import ReleaseFailed

        journal = self.sup.journal
        try:
            speculative = self._measured("measure", "speculative.json")
            after = None
            if st.aba:  # the baseline's second block, restarted the same way as its first
                after = self._second_block(st)
                st.transient = st.control_again
            st.verdict, st.reason, st.figures = decide_measured(self.job, st.baseline, speculative, st.change,
                                                                after=after)
            if self.job.candidates:
                st.figures["candidates"] = st.cand_figures
                st.reason = f"candidate {st.cand_figures['winner']}, confirmed afresh: {st.reason}"
            journal.log("decide", "ok", verdict=st.verdict, reason=st.reason)
        except _Decided:
            st.rollback, st.transient = st.returned, st.control_again
            raise
        except ReleaseFailed as exc:  # it crashed or failed every request: a rollback, the failure named
            st.verdict, st.reason = "rollback", f"the speculative release failed the gate's traffic: {exc}"
            failed = [{"concurrency": exc.concurrency, "pass": None, "prompt": int(i), "error": str(why)}
                      for i, why in exc.failures]
            st.figures = {"baseline_levels": st.baseline["levels"], "traffic": st.baseline.get("traffic"),
                          "failed_requests": {"speculative": failed, "baseline": failed_requests(st.baseline)[0]}}
            journal.log("measure", "error", reason=st.reason[-800:])
            journal.log("decide", "ok", verdict=st.verdict, reason=st.reason)
        except Exception as exc:  # noqa: BLE001 - a failed measurement or decision rolls back
            st.verdict, st.reason = "error", f"measuring the speculative release failed: {type(exc).__name__}: {exc}"
            journal.log("decide", "error", reason=st.reason[-800:])

    def _keep_or_return(self, st: _GateState) -> None:
        """Step 6: the verdict in the release history first (a rollback after it never brings back what failed),
        then keep (with ``aba`` the speculative release served again: one more restart) or return to the release
        live before (with ``aba`` and no control release the baseline serves already)."""
        sup, kind, journal = self.sup, self.sup.kind, self.sup.journal
        if st.spec_release is not None and kind.keeps_release():
            sup.releases.mark_gate(st.spec_release, st.verdict, st.reason)
        if st.verdict == "keep" and st.aba and st.spec_release is not None:
            back = kind.reinstate(st.spec_release, f"speculation gate: {st.verdict}")
            st.transient = False
            if "rolled back" in back:
                st.verdict, st.reason = "rollback", (f"kept by the gate ({st.reason}), but the speculative release "
                                                     f"failed its health gate when switched to again ({back})")
                st.rollback = back
                sup.releases.mark_gate(st.spec_release, st.verdict, st.reason)
            else:
                journal.log("keep", "ok", release=st.spec_release)
        elif st.verdict == "keep":
            journal.log("keep", "ok", release=st.spec_release)
        elif st.returned is not None and self.job.control is None:
            st.rollback = st.returned
        else:
            st.rollback = kind.return_to(st.base_release, f"speculation gate: {st.verdict}")
            st.transient = False

    def _decided(self, st: _GateState, decided: _Decided) -> None:
        """A step ended the job with a verdict: journaled; a release that is not the live one (the control release
        serving the baseline's second block, a candidate) is returned from."""
        st.verdict, st.reason = decided.args
        self.sup.journal.log("decide", "ok", verdict=st.verdict, reason=st.reason)
        if st.transient and not st.returning:
            st.returning = True
            st.rollback = self.sup.kind.return_to(st.base_release, f"speculation gate: {st.verdict}")
            st.transient = False

    def _failed(self, st: _GateState, exc: Exception) -> None:
        """A step failed: recorded; a release that is not the live one is returned from (a failed return is
        recorded too: the kind set serving unhealthy)."""
        st.outcome, st.error = "failed", f"{type(exc).__name__}: {exc}"
        st.reason = st.reason or st.error
        self.sup.journal.log("supervisor", "error", reason=st.error[-1000:])
        if st.transient and not st.returning:
            st.returning = True
            try:
                st.rollback = self.sup.kind.return_to(st.base_release, f"speculate failed while the control release "
                                                                       f"or a candidate served: {st.error}")
                st.transient = False
            except Exception as back:  # noqa: BLE001 - recorded; the kind set unhealthy
                st.error += f"; returning to release {st.base_release} failed too: {back}"

    def _finish(self, st: _GateState) -> None:
        """Whatever happened: the kind's finish (not while a transient release serves: a process host's restore
        agent restores the recorded process once this supervisor ends), then the undrain hook."""
        if not st.transient:
            self.sup.kind.finish()
        if st.drained and self.job.undrain_hook:  # serving is on the decided release (or left as it was)
            st.undrain_error = self._hook("undrain", self.job.undrain_hook)
            if st.undrain_error:
                self.sup.warn("undrain", f"{st.undrain_error}: clients may still be off this server; undrain it by "
                                         "hand (serving.undrain_hook)")

    def run(self) -> tuple[str, str, dict[str, Any]]:
        """Carry out the job, step by step on one :class:`_GateState` (module doc); returns ``(outcome, error,
        extra)`` for the window's result, ``extra`` holding ``speculate`` (the attempt's result) and ``audit``
        (what the audit line adds)."""
        from eagle3ops.gate.decide import block_passes

        # the three-block order (the baseline before and after the speculative release); candidates are measured
        # in two blocks each (the result says so)
        aba = self.job.design == "aba" and not self.job.candidates
        before_n, _, after_n = block_passes(self.job.passes, "aba" if aba else "ab")
        st = _GateState(aba=aba, before_n=before_n, after_n=after_n)
        steps = (self._record_and_drain, self._restart_baseline, self._measure_baseline, self._choose,
                 self._switch, self._measure_and_decide, self._keep_or_return)
        try:
            for step in steps:
                step(st)
                if st.ended:
                    break
        except _Decided as d:
            self._decided(st, d)
        except Exception as exc:  # noqa: BLE001 - recorded; serving is the kind's to bring back
            self._failed(st, exc)
        finally:
            self._finish(st)
        if st.verdict == "error" and st.outcome == "ok":
            st.outcome, st.error = "failed", st.reason
        return self._report(st)

    def _report(self, st: _GateState) -> tuple[str, str, dict[str, Any]]:
        """The attempt's ``result.json`` (and its copy at ``latest``) and the audit line's figures, written."""
        sup, job, journal = self.sup, self.job, self.sup.journal
        result = {"host": sup.plan.host, "window_id": sup.plan.window_id, "verdict": st.verdict, "reason": st.reason,
                  **st.figures, **job.figures, "run": job.run, "head": job.head,
                  "head_sha256": job.head_sha256, "attempt_dir": str(self.dir),
                  "baseline_release": st.base_release, "speculative_release": st.spec_release,
                  "rollback": st.rollback, "live_release": sup.releases.current() if sup.kind.keeps_release() else None,
                  "gate_passes": job.passes, "gate_design": self._design_figures(st.aba),
                  "control": job.control is not None,
                  "control_release": (journal.first("control", "ok") or {}).get("to_release"),
                  "measured_releases": self._identities(),
                  "drain": ({"drain_hook": job.drain_hook, "undrain_hook": job.undrain_hook,
                             "undrain_error": st.undrain_error} if job.drain_hook else None)}
        if job.rule == "not_slower":  # a gated release: what changed, environment values and keys left out
            result["change"] = {**job.change.model_dump(exclude={"env"}), "env": sorted(job.change.env),
                                "args": redact.argv(job.change.args, sup.plan.secret_env)}
        self._write(self.dir / "result.json", result)
        if job.latest:
            self._write(Path(job.latest), result)
        audit = {"kind": "speculate" if job.rule == "faster" else "release-gate", "run": job.run,
                 "verdict": st.verdict, "reason": st.reason, "head_sha256": job.head_sha256,
                 "attempt_dir": str(self.dir),
                 "figures": {k: result.get(k) for k in AUDIT_FIGURES}}
        return st.outcome, st.error, {"speculate": result, "audit": audit}
