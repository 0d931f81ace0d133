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
   (:func:`eagle3ops.gate.decide.candidate_level`); the best kept (:func:`choose_candidate`) is the speculative
   release of step 3, measured afresh in step 4 (the confirmation); none kept: ``return_to`` and ``rollback``;
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
:func:`decide_figures` measure and decide any release, with or without a head.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3ops import redact
from eagle3ops.config.plan import Candidate, ReleaseChange, SpeculateJob
from eagle3ops.gate.like import ReleaseIdentity, flag_names, unlike

if TYPE_CHECKING:
    from eagle3ops.supervisor.runner import Supervisor

__all__ = ["SpeculateRun", "choose_candidate", "decide_figures", "decide_measured", "failed_requests",
           "measure_serving"]


def measure_serving(sup: "Supervisor", job: SpeculateJob, passes: int | None = None) -> dict[str, Any]:
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
                    "passes": passes or job.passes, "api_key": sup._api_key(), "request_timeout_s": job.request_timeout_s,
                    "idle_timeout_s": job.idle_timeout_s, "warmup_prompts": job.warmup_prompts})


def decide_figures(job: SpeculateJob, baseline: dict[str, Any], speculative: dict[str, Any],
                   level: float | None = None, after: dict[str, Any] | None = None) -> Any:
    """The pure decision (:func:`eagle3ops.gate.decide.decide`) on two :func:`measure_serving` answers (three with
    ``after``, the ``aba`` design's baseline measured again after the speculative release), its
    interval at ``level`` (default :data:`eagle3ops.gate.decide.LEVEL`); returns the
    :class:`~eagle3ops.gate.decide.Decision` with added figures: the per-level counter deltas
    (``spec_decode_per_level``), each side's TTFT p90 and failed requests per level (``levels[c][side]
    ["ttft_ms_p90"]``, pooled over the passes like the median beside it; ``["failures"]``), the TTFT p90 ratio at
    the production concurrency (``ttft_ratio_p90``), vLLM's prefix-cache queries, hits and hit rate per side and
    level (``prefix_cache``, :func:`eagle3ops.gate.measure.prefix_cache`) and the endpoints the prompts went to
    (``traffic``)."""
    from eagle3ops.gate.decide import LEVEL, decide
    from eagle3ops.gate.measure import prefix_cache, read_measurement, sum_deltas
    from eagle3ops.gate.replay import percentile

    base, _ = read_measurement(baseline)
    spec, deltas = read_measurement(speculative)
    again = read_measurement(after)[0] if after else None
    decision = decide(base, spec, sum_deltas(list(deltas.values())), production_concurrency=job.levels[0],
                      margin=job.margin, acceptance_floor=job.acceptance_floor,
                      ttft_ratio_max=math.inf if job.ttft_ratio_max is None else job.ttft_ratio_max, rule=job.rule,
                      level=LEVEL if level is None else level, after=again)
    decision.figures["spec_decode_per_level"] = {str(c): d.figures() for c, d in deltas.items()}

    def p90(passes: list[Any]) -> float | None:
        v = percentile([float(t) for p in passes for t in p.prompt_ttft_ms if t is not None], 0.9)
        return round(v, 3) if v is not None else None

    levels = decision.figures.get("levels") or {}
    for c, row in levels.items():
        for side, res in (("baseline", base), ("speculative", spec)):
            if isinstance(row.get(side), dict) and int(c) in res:
                row[side]["ttft_ms_p90"] = p90(res[int(c)])
                row[side]["failures"] = [{"pass": j, "prompt": int(i), "error": str(why)}
                                         for j, p in enumerate(res[int(c)]) for i, why in p.failures]
    c0 = job.levels[0]
    bp, sp = (p90(res[c0]) if c0 in res else None for res in (
        ({c: [*ps, *again.get(c, [])] for c, ps in base.items()} if again else base), spec))
    decision.figures["ttft_ratio_p90"] = round(sp / bp, 4) if bp and sp is not None else None
    decision.figures["prefix_cache"] = {"baseline": prefix_cache(baseline), "speculative": prefix_cache(speculative),
                                        **({"baseline_after": prefix_cache(after)} if after else {})}
    decision.figures["traffic"] = speculative.get("traffic") or baseline.get("traffic")
    return decision


def failed_requests(ans: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The failed requests of a :func:`measure_serving` answer (pure), warm-up included, and how many requests it
    sent: ``([{"concurrency", "pass" (index, or "warm-up"), "prompt" (index in the gate's order), "error"}], n)``."""
    out: list[dict[str, Any]] = []
    sent = 0
    for c, fails in ((ans.get("warmup") or {}).get("failures") or {}).items():
        out += [{"concurrency": int(c), "pass": "warm-up", "prompt": int(i), "error": str(why)} for i, why in fails]
    if ans.get("warmup"):
        sent += int(ans["warmup"].get("prompts") or 0) * len(ans.get("levels") or {})
    for c, passes in (ans.get("levels") or {}).items():
        for j, fig in enumerate(passes):
            sent += int(fig.get("requests") or 0)
            out += [{"concurrency": int(c), "pass": j, "prompt": int(i), "error": str(why)}
                    for i, why in fig.get("failures") or []]
    return out, sent


def _failures_line(failed: list[dict[str, Any]]) -> str:
    from eagle3ops.gate.replay import summary

    by_level: dict[int, list[tuple[int, str]]] = {}
    for f in failed:
        by_level.setdefault(f["concurrency"], []).append((f["prompt"], f["error"]))
    return "; ".join(f"at concurrency {c}: {summary(fs)}" for c, fs in sorted(by_level.items()))


def decide_measured(job: SpeculateJob, baseline: dict[str, Any], speculative: dict[str, Any],
                    change: ReleaseChange | None = None, level: float | None = None,
                    after: dict[str, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
    """``(verdict, reason, figures)`` from two measurements (pure): :func:`decide_figures` with one table per
    prompt set (``figures["sets"]``, :func:`eagle3ops.gate.decide.set_tables`, when the job names sets), except that releases
    which are not like for like (:func:`eagle3ops.gate.like.unlike` on the measurements' ``release`` identities,
    the speculative change's flags set aside) are ``undecided``, the verdict they would have had kept in
    ``figures["would_have_been"]``. The driver refuses unlike images before the job
    (:func:`eagle3ops.speculate.ship.check_like_for_like`); this is the host's own check of what it measured. A
    gated release (``rule: not_slower``) is not checked: its change (another image, a vLLM upgrade, NCCL settings)
    is what is measured; both identities stay in the result. ``change``: the measured release's change (a
    candidate's; default the job's); ``level``: the interval's (a candidate's corrected level); ``after``: the
    ``aba`` design's baseline measured again after the speculative release (:func:`decide_figures`; its failed
    requests are listed with the baseline's).

    A request that failed on the speculative release (:func:`failed_requests`: a non-2xx answer, a stream error, a
    stream cut short, a grammar failure) makes it ``rollback`` whatever else was measured, the reason naming the
    failures and ``figures["failed_requests"]`` listing both sides'; the verdict it would have had is kept in
    ``figures["would_have_been"]``. A time to first token above ``ttft_ratio_max`` is named in the reason whichever
    rule decided (an earlier rule, e.g. the acceptance floor, may have decided before the TTFT rule), with the p90
    ratio beside the median's, and recorded as ``figures["ttft_breach"]``.

    Raises:
        ValueError: from :func:`eagle3ops.gate.decide.decide` (a level or passes missing).
    """
    why = None if job.rule == "not_slower" else unlike(
        ReleaseIdentity.from_dict(baseline.get("release")), ReleaseIdentity.from_dict(speculative.get("release")),
        change_flags=flag_names((change or job.change).args))
    decision = decide_figures(job, baseline, speculative, level, after)
    verdict, reason, figures = decision.verdict, decision.reason, dict(decision.figures)
    if job.prompt_sets:
        from eagle3ops.gate.decide import set_tables
        from eagle3ops.gate.measure import read_measurement

        figures["sets"] = set_tables(read_measurement(baseline)[0], read_measurement(speculative)[0],
                                     job.prompt_sets, production_concurrency=job.levels[0],
                                     after=read_measurement(after)[0] if after else None)
    if why:
        figures["would_have_been"] = {"verdict": verdict, "reason": reason}
        verdict, reason = "undecided", (f"unlike releases measured ({why}): the ratio mixes the image's own speed "
                                        "with speculation's; speculate again with --control")
    failed, sent = failed_requests(speculative)
    if failed:  # a release that fails requests is not shipped, however fast the others went
        base_failed = failed_requests(baseline)[0] + (failed_requests(after)[0] if after else [])
        figures["failed_requests"] = {"speculative": failed, "baseline": base_failed}
        figures.setdefault("would_have_been", {"verdict": verdict, "reason": reason})
        verdict = "rollback"
        reason = (f"{len(failed)} of {sent} requests failed on the speculative release ({_failures_line(failed)}); "
                  + ("the baseline served every one" if not base_failed else
                     f"the baseline failed {len(base_failed)} ({_failures_line(base_failed)})"))
    ratio, most = figures.get("ttft_ratio"), job.ttft_ratio_max
    if ratio is not None and most is not None and ratio > most:
        p90 = figures.get("ttft_ratio_p90")
        tail = f" (p90 x{p90:.3f})" if p90 is not None else ""
        figures["ttft_breach"] = {"ttft_ratio": ratio, "ttft_ratio_p90": p90, "ttft_ratio_max": most,
                                  "concurrency": job.levels[0]}
        if "time to first token" in reason:
            reason += tail.replace("(p90", "(time to first token p90")
        else:
            reason += (f"; also: median time to first token x{ratio:.3f} of the baseline's{tail} at concurrency "
                       f"{job.levels[0]}, above x{most:g} (serving.gate_ttft_ratio_max)")
    return verdict, reason, figures


def choose_candidate(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate to confirm (pure): among ``rows`` (one per candidate: ``verdict``, ``interval`` at the
    corrected level, ``throughput_ratio``) those whose verdict is ``keep``, the one with the highest lower bound (then
    the highest point ratio, then the first); None when none is ``keep``."""
    kept = [r for r in rows if r.get("verdict") == "keep" and r.get("interval")]
    if not kept:
        return None
    return max(kept, key=lambda r: (r["interval"]["low"], r.get("throughput_ratio") or 0.0, -rows.index(r)))


class _Decided(Exception):
    """The job ends early with ``(verdict, reason)``, serving already where the verdict leaves it."""


class SpeculateRun:
    """One speculate job on ``sup`` (the window's runner: its journal, policy and serving kind)."""

    def __init__(self, sup: "Supervisor"):
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

    def _second_block(self, base_release: int | None, passes: int) -> dict[str, Any]:
        """The ``aba`` design's third block: the baseline restarted as its first block was (the control release
        switched to again, or the release live before returned to) and measured (``baseline-after.json``).

        Sets ``_returned`` to the return's message (None with a control release, whose switch is not a return).

        Raises:
            _Decided: the restart failed its health gate, or the measurement failed: ``undecided``, serving on the
                release live before (the kind went back to it).
        """
        from eagle3ops.supervisor.errors import Interrupted

        kind = self.sup.kind
        if self.job.control is not None:
            back = kind.switch(step="control-again", change=self.job.control, live=False)
            if "rolled back" in back:  # the kind went back to the live release: no third block
                self._returned = back
                raise _Decided("undecided", f"the control release failed its health gate when switched to again for "
                                            f"the baseline's second block ({back}); not decided on two blocks")
            self._control_again = True
        else:
            self._returned = kind.return_to(base_release, "the gate measures the baseline again after the "
                                                          "speculative release")
        try:
            return self._measured("baseline-after", "baseline-after.json", passes)
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the baseline's second block: no decision without it
            raise _Decided("undecided", f"measuring the baseline again after the speculative release failed "
                                        f"({type(exc).__name__}: {exc}); not decided on two blocks") from None

    def run(self) -> tuple[str, str, dict[str, Any]]:
        """Carry out the job; returns ``(outcome, error, extra)`` for the window's result, ``extra`` holding
        ``speculate`` (the attempt's result) and ``audit`` (what the audit line adds)."""
        sup, journal, kind = self.sup, self.sup.journal, self.sup.kind
        outcome, error = "ok", ""
        verdict, reason, figures = "error", "", {}
        base_release = spec_release = rollback = None
        #: Serving runs a release that is not the live one (the control release, a candidate): an error returns.
        transient = False
        cand_figures: dict[str, Any] = {}
        drained, undrain_error = False, None
        returning = False  # the return to the release live before was tried (never twice)
        from eagle3ops.gate.decide import block_passes

        # the three-block order (the baseline before and after the speculative release); candidates are measured
        # in two blocks each (the result says so)
        aba = self.job.design == "aba" and not self.job.candidates
        before_n, _, after_n = block_passes(self.job.passes, "aba" if aba else "ab")
        returned = None  # aba: the return to the baseline for its second block (serving on it since)
        self._returned: str | None = None
        self._control_again = False  # aba with a control release: the control serves the second block
        try:
            sup.record()  # nothing changes before this succeeds
            base_release = sup.releases.current()
            if self.job.drain_hook:  # clients off this server before anything is measured or restarted
                why = self._hook("drain", self.job.drain_hook)
                drained = True  # a failed drain may have half-drained: undrain runs all the same
                if why:
                    raise _Decided("error", f"{why}: nothing measured or restarted (serving.drain_hook)")
            if self.job.control is not None:  # like for like: the speculative image without speculation first
                msg = kind.switch(step="control", change=self.job.control, live=False)
                if "rolled back" in msg:
                    raise _Decided("rollback", f"the control release (the speculative image without "
                                               f"--speculative-config) failed its health gate ({msg}); nothing "
                                               "measured, the speculative release never started")
                transient = True
            elif aba:  # every measured block follows a restart: a restarted server's own speed cancels
                msg = kind.switch(step="restart-baseline", change=ReleaseChange(), live=False)
                if "rolled back" in msg:
                    raise _Decided("rollback", f"the baseline restarted for the gate's first block failed its "
                                               f"health gate ({msg}); nothing measured, the speculative release "
                                               "never started")
                transient = True
            baseline = self._measured("baseline", "baseline.json", before_n)
            change = None
            if self.job.candidates:  # several speculative releases: measure each, confirm the best
                was_transient, transient = transient, True  # from the first switch on, a candidate may serve
                winner, on_candidate, cand_figures = self._candidates(baseline)
                transient = was_transient or on_candidate
                first = journal.first(f"candidate-{self.job.candidates[0].name}", "start") or {}
                base_release = first.get("from_release", base_release)  # a process host adopts its live process
                if winner is None:
                    if transient:  # a candidate (or the control release) serves: back to the release live before
                        returning = True
                        rollback = kind.return_to(base_release, "no candidate cleared the gate")
                        transient = False
                    figures = {"candidates": cand_figures}
                    raise _Decided("rollback", f"no candidate cleared the gate at the corrected "
                                               f"{cand_figures['level']:.1%} level: " + "; ".join(
                                                   f"{r['name']}: {r['verdict']}" for r in cand_figures["rows"]))
                change = winner.change
            # the kind's switch (a resumed one keeps its journaled target); a chosen candidate switched to again
            msg = sup.replace_serving() if change is None else kind.switch(change=change)
            transient = False  # the switch replaced it (or its failed gate rolled back to the live release)
            switched = journal.first("switch", "start") or {}
            base_release = switched.get("from_release", base_release)
            if "rolled back" in msg:
                verdict, reason = "rollback", f"the speculative release failed its health gate ({msg})"
                figures = {"baseline_levels": baseline["levels"]}
            else:
                spec_release = sup.releases.current()
                from eagle3ops.gate.replay import ReleaseFailed

                try:
                    speculative = self._measured("measure", "speculative.json")
                    after = None
                    if aba:  # the baseline's second block, restarted the same way as its first
                        after = self._second_block(base_release, after_n)
                        returned, transient = self._returned, self._control_again
                    verdict, reason, figures = decide_measured(self.job, baseline, speculative, change,
                                                               after=after)
                    if self.job.candidates:
                        figures["candidates"] = cand_figures
                        reason = f"candidate {cand_figures['winner']}, confirmed afresh: {reason}"
                    journal.log("decide", "ok", verdict=verdict, reason=reason)
                except _Decided:
                    rollback, transient = self._returned, self._control_again
                    raise
                except ReleaseFailed as exc:  # it crashed or failed every request: a rollback, the failure named
                    verdict, reason = "rollback", f"the speculative release failed the gate's traffic: {exc}"
                    failed = [{"concurrency": exc.concurrency, "pass": None, "prompt": int(i), "error": str(why)}
                              for i, why in exc.failures]
                    figures = {"baseline_levels": baseline["levels"], "traffic": baseline.get("traffic"),
                               "failed_requests": {"speculative": failed, "baseline": failed_requests(baseline)[0]}}
                    journal.log("measure", "error", reason=reason[-800:])
                    journal.log("decide", "ok", verdict=verdict, reason=reason)
                except Exception as exc:  # noqa: BLE001 - a failed measurement or decision rolls back
                    verdict, reason = "error", f"measuring the speculative release failed: {type(exc).__name__}: {exc}"
                    journal.log("decide", "error", reason=reason[-800:])
                if spec_release is not None and kind.keeps_release():  # before the return: a rollback after
                    sup.releases.mark_gate(spec_release, verdict, reason)    # it never brings back what failed
                if verdict == "keep" and aba and spec_release is not None:  # the baseline serves: one more restart
                    back = kind.reinstate(spec_release, f"speculation gate: {verdict}")
                    transient = False
                    if "rolled back" in back:
                        verdict, reason = "rollback", (f"kept by the gate ({reason}), but the speculative release "
                                                       f"failed its health gate when switched to again ({back})")
                        rollback = back
                        sup.releases.mark_gate(spec_release, verdict, reason)
                    else:
                        journal.log("keep", "ok", release=spec_release)
                elif verdict == "keep":
                    journal.log("keep", "ok", release=spec_release)
                elif returned is not None and self.job.control is None:  # aba: the baseline serves already
                    rollback = returned
                else:
                    rollback = kind.return_to(base_release, f"speculation gate: {verdict}")
                    transient = False
        except _Decided as d:
            verdict, reason = d.args
            journal.log("decide", "ok", verdict=verdict, reason=reason)
            if transient and not returning:  # aba: the control release serves the baseline's second block
                returning = True
                rollback = kind.return_to(base_release, f"speculation gate: {verdict}")
                transient = False
        except Exception as exc:  # noqa: BLE001 - recorded; serving is the kind's to bring back
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            reason = reason or error
            journal.log("supervisor", "error", reason=error[-1000:])
            if transient and not returning:  # the control release or a candidate serves: back to the release
                returning = True                    # live before
                try:
                    rollback = kind.return_to(base_release, f"speculate failed while the control release or a "
                                                            f"candidate served: {error}")
                    transient = False
                except Exception as back:  # noqa: BLE001 - recorded; the kind set unhealthy
                    error += f"; returning to release {base_release} failed too: {back}"
        finally:
            if not transient:  # else no finish: a process host's restore agent restores the recorded process
                kind.finish()  # once this supervisor ends
            if drained and self.job.undrain_hook:  # serving is on the decided release (or left as it was)
                undrain_error = self._hook("undrain", self.job.undrain_hook)
                if undrain_error:
                    sup.warn("undrain", f"{undrain_error}: clients may still be off this server; undrain it by "
                                        "hand (serving.undrain_hook)")
        if verdict == "error" and outcome == "ok":
            outcome, error = "failed", reason
        result = {"host": sup.plan.host, "window_id": sup.plan.window_id, "verdict": verdict, "reason": reason,
                  **figures, **self.job.figures, "run": self.job.run, "head": self.job.head,
                  "head_sha256": self.job.head_sha256, "attempt_dir": str(self.dir),
                  "baseline_release": base_release, "speculative_release": spec_release,
                  "rollback": rollback, "live_release": sup.releases.current() if kind.keeps_release() else None,
                  "gate_passes": self.job.passes, "gate_design": self._design_figures(aba),
                  "control": self.job.control is not None,
                  "control_release": (journal.first("control", "ok") or {}).get("to_release"),
                  "measured_releases": self._identities(),
                  "drain": ({"drain_hook": self.job.drain_hook, "undrain_hook": self.job.undrain_hook,
                             "undrain_error": undrain_error} if self.job.drain_hook else None)}
        if self.job.rule == "not_slower":  # a gated release: what changed, environment values and keys left out
            result["change"] = {**self.job.change.model_dump(exclude={"env"}), "env": sorted(self.job.change.env),
                                "args": redact.argv(self.job.change.args, self.sup.plan.secret_env)}
        self._write(self.dir / "result.json", result)
        if self.job.latest:
            self._write(Path(self.job.latest), result)
        audit = {"kind": "speculate" if self.job.rule == "faster" else "release-gate", "run": self.job.run,
                 "verdict": verdict, "reason": reason, "head_sha256": self.job.head_sha256,
                 "attempt_dir": str(self.dir),
                 "figures": {k: result.get(k) for k in (
                     "throughput_ratio", "interval", "drift", "design", "gate_design", "power", "passes", "ttft_ratio", "ttft_ratio_max", "deciding",
                     "spec_decode", "levels", "margin", "margin_is_negative_test_setting", "acceptance_floor",
                     "production_concurrency", "live_release", "baseline_release", "speculative_release",
                     "control", "control_release", "measured_releases", "sets", "drain", "rule", "change",
                     "candidates", "ttft_ratio_p90", "ttft_breach", "traffic", "prefix_cache", "failed_requests")}}
        return outcome, error, {"speculate": result, "audit": audit}
