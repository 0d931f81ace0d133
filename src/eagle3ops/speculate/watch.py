"""``eagle3ops watch HOST``: judge the live serving release from vLLM's ``/metrics`` over time.

No window, no restart: the driver scrapes ``GET /metrics`` of the host's serving every ``--interval`` seconds for
``--duration`` seconds (the endpoint and the API key as ``regenerate`` reaches serving:
:func:`eagle3ops.speculate.reach.serving_endpoint`, :func:`~eagle3ops.speculate.reach.serving_api_key`) and for
each interval records, from counter deltas (:func:`eagle3ops.gate.metrics.interval_figures`), the mean
acceptance length and the acceptance rate per draft position, output tokens/s, requests/s, per-request output
tokens/s, mean time to first token and the queue. One JSON line per interval is appended to
``<state_dir>/watch/<release>.jsonl`` on the host (through the executor, like every host write).

**Policy** (``serving.watch``, :class:`eagle3ops.config.inventory.WatchPolicy`): an interval with traffic
*breaches* when its mean acceptance length is below the floor (a number, or ``break-even``: the gate's mean
acceptance length / its throughput ratio at production concurrency, from the ``speculate`` result that made this
release, :func:`thresholds`), or its per-request output tokens/s fell more than ``throughput_drop`` below the gate's
baseline. A condition breached in every interval with traffic for ``sustained_minutes`` is reported once (printed,
and an audit line ``kind: watch`` with the figures); with ``rollback: true`` the host is rolled back to the gate's
baseline release (the non-speculative one) through the usual locked, health-gated rollback window
(:func:`eagle3ops.window.run.run_window` ``kind="rollback"``) and the watch ends.

**Resumable**: ``<state_dir>/watch/state.json`` keeps the last scrape, when each condition started breaching and
the release's running totals, so a run started by cron or a systemd timer continues the previous one's interval
(unless the release changed, the server restarted, or the state is older than ``max(3 x interval, 900 s)``).
**One at a time**: an exclusive ``flock`` on ``watch-<host>.lock`` beside the driver's local audit log
(:func:`eagle3ops.window.common.local_audit_path`); a second instance exits at once with :data:`EXIT_LOCKED`.
**Calibration**: the release's pooled production acceptance goes to ``production.json`` in the folder of the gate
result that made the release (its attempt folder; ``<data_dir>/runs/<run>/speculate/`` for older results), where
``eagle3ops report`` reads it to plot it beside the offline estimate and the gate's figure.

Exit codes (:data:`EXIT_CODES`): 0 watched, no sustained breach; 1 error; 2 usage; 3 sustained breach reported
(rollback off); 4 breach, rolled back health-gated; 5 breach, rollback failed; 75 another watch of this host runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.gate.metrics import ServerSample, interval_figures, parse_server

__all__ = ["EXIT_CODES", "Thresholds", "Tracker", "WatchError", "WatchLocked", "WatchOptions", "gate_result_for",
           "judge", "thresholds", "watch", "watch_lock"]

EXIT_OK, EXIT_ERROR, EXIT_BREACH, EXIT_ROLLED_BACK, EXIT_ROLLBACK_FAILED, EXIT_LOCKED = 0, 1, 3, 4, 5, 75
#: Exit status -> meaning (``eagle3ops watch --help`` and docs/howto/watch.md list them).
EXIT_CODES = {EXIT_OK: "watched; no sustained breach", EXIT_ERROR: "error (serving not reached, bad input)",
              2: "usage error", EXIT_BREACH: "sustained breach reported (serving.watch.rollback is false)",
              EXIT_ROLLED_BACK: "sustained breach; rolled back to the baseline release, health-gated",
              EXIT_ROLLBACK_FAILED: "sustained breach; the rollback window failed (see the audit log)",
              EXIT_LOCKED: "another watch of this host is running (EX_TEMPFAIL: try again later)"}


class WatchError(RuntimeError):
    """The watch could not run (serving kind, endpoint, API key); the message says why and the fix."""


class WatchLocked(WatchError):
    """Another ``eagle3ops watch`` of the same host holds its lock file."""


@dataclass(frozen=True)
class WatchOptions:
    """One ``watch`` invocation: ``duration_s`` bounds it; ``interval_s`` overrides ``serving.watch.interval_s``;
    ``endpoint`` a URL the driver reaches serving at (else direct or an SSH forward); ``pipeline_image`` and its id
    run the rollback window's supervisor; ``command`` goes to the lock and the audit log."""

    duration_s: float
    interval_s: float | None = None
    endpoint: str | None = None
    pipeline_image: str | None = None
    pipeline_image_id: str | None = None
    command: str = "eagle3ops watch"
    #: Return the watch's plan (:func:`watch`'s ``plan``) once the facts are read: nothing scraped or written
    #: (``watch --dry-run --json``).
    plan_only: bool = False


@dataclass(frozen=True)
class Thresholds:
    """What an interval is judged against (:func:`thresholds`): ``acceptance_floor`` (None: not checked) and where
    it came from; ``request_tokens_per_s_min`` (None: not checked); the gate's ``baseline_release`` (the rollback
    target) and ``run`` when a ``speculate`` result names the live release."""

    acceptance_floor: float | None
    floor_source: str
    request_tokens_per_s_min: float | None
    baseline_release: int | None
    run: str | None


def thresholds(policy: Any, serving: Any, gate: dict[str, Any] | None) -> Thresholds:
    """The policy applied to the gate's result for the live release (pure).

    ``break-even``: a speculative step (draft proposals + one target verification) costs about the same whatever
    it accepts, so output tokens/s scale with the mean acceptance length; the gate measured ratio ``R`` at length
    ``A``, so the ratio would be 1 at ``A / R``. Without a gate result (or one without both figures) the floor is
    ``serving.acceptance_floor``. ``throughput_drop`` needs the gate's baseline output tokens/s at production
    concurrency ``c``: the minimum per-request figure is ``(1 - drop) x tokens/s / c``.
    """
    gate = gate or {}
    acc = (gate.get("spec_decode") or {}).get("mean_acceptance_length")
    ratio = gate.get("throughput_ratio")
    floor: float | None
    if policy.acceptance_floor is None:
        floor, source = None, "not checked (serving.watch.acceptance_floor: null)"
    elif policy.acceptance_floor == "break-even" and acc and ratio:
        floor, source = round(acc / ratio, 4), (f"break-even from the gate of run {gate.get('run')}: mean "
                                                f"acceptance length {acc:.3f} / throughput ratio x{ratio:.3f}")
    elif policy.acceptance_floor == "break-even":
        floor, source = float(serving.acceptance_floor), ("serving.acceptance_floor (no gate result with figures "
                                                          "names the live release)")
    else:
        floor, source = float(policy.acceptance_floor), "serving.watch.acceptance_floor"
    per_req = None
    c = gate.get("production_concurrency")
    base = ((gate.get("levels") or {}).get(str(c)) or {}).get("baseline") or {}
    if policy.throughput_drop is not None and c and base.get("output_tokens_per_s"):
        per_req = round((1 - policy.throughput_drop) * float(base["output_tokens_per_s"]) / int(c), 4)
    return Thresholds(floor, source, per_req, gate.get("baseline_release"), gate.get("run"))


def judge(fig: dict[str, Any], th: Thresholds) -> dict[str, bool | None]:
    """Per condition: True (breached), False (passed) or None (no traffic for it this interval, or not checked)."""
    acc = fig.get("mean_acceptance_length")
    speed = fig.get("request_output_tokens_per_s")
    return {"acceptance": None if th.acceptance_floor is None or acc is None else acc < th.acceptance_floor,
            "throughput": None if th.request_tokens_per_s_min is None or speed is None
            else speed < th.request_tokens_per_s_min}


@dataclass
class Tracker:
    """When each condition started breaching (epoch seconds; None: it is not breaching), and which breaches were
    already reported. An interval that passes clears its condition; one without traffic leaves it as it is."""

    sustained_s: float
    since: dict[str, float | None] = field(default_factory=lambda: {"acceptance": None, "throughput": None})
    reported: dict[str, float | None] = field(default_factory=lambda: {"acceptance": None, "throughput": None})

    def update(self, start: float, end: float, checks: dict[str, bool | None]) -> list[str]:
        """Take one interval (``start``..``end``) judged ``checks``; returns the conditions whose breach is now
        sustained (breached in this interval, and since at least ``sustained_s`` seconds)."""
        out = []
        for cond, bad in checks.items():
            if bad is False:
                self.since[cond] = self.reported[cond] = None
            elif bad:
                self.since[cond] = self.since.get(cond) or start
                if end - self.since[cond] >= self.sustained_s:
                    out.append(cond)
        return out


def _state_paths(h: Any, release: int | None) -> dict[str, str]:
    d = f"{h.state_dir}/watch"
    return {"dir": d, "state": f"{d}/state.json",
            "record": f"{d}/{release if release is not None else 'unrecorded'}.jsonl"}


def gate_result_for(r: Any, release: int | None) -> dict[str, Any] | None:
    """The ``speculate`` result that made ``release`` live: the newest audit entry ``kind: speculate`` whose
    ``speculative_release`` is ``release``, its attempt folder's ``result.json`` read (``attempt_dir``; entries
    older than attempt folders: ``runs/<run>/speculate/result.json``); None when none."""
    from eagle3ops.window.common import audit_entries

    if release is None:
        return None
    hits = [e for e in audit_entries(r) if e.get("kind") == "speculate"
            and (e.get("figures") or {}).get("speculative_release") == release]
    if not hits:
        return None
    where = (f"{hits[-1]['attempt_dir']}/result.json" if hits[-1].get("attempt_dir")
             else f"{r.host.data_dir}/runs/{hits[-1]['run']}/speculate/result.json")
    text = r.run(hc.cat_if_exists(where), check=False).stdout
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None


@contextlib.contextmanager
def watch_lock(host_name: str) -> Iterator[str]:
    """Hold ``watch-<host>.lock`` (exclusive, non-blocking ``flock``; released when the process ends, even killed).

    Raises:
        WatchLocked: another process holds it.
    """
    from eagle3ops.window.common import local_audit_path

    path = local_audit_path().parent / f"watch-{host_name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WatchLocked(f"another `eagle3ops watch {host_name}` is running (lock {path}); it ends within its "
                              "--duration") from None
        yield str(path)


def _scraper(base_url: str, api_key: str | None) -> Callable[[], ServerSample]:
    from eagle3ops.serving_http import ServingClient

    client = ServingClient(base_url, api_key, timeout_s=30)

    def scrape() -> ServerSample:
        return parse_server(client.metrics())

    return scrape


def _rollback(r: Any, opts: WatchOptions, th: Thresholds, reason: str) -> dict[str, Any]:
    """The rollback window (locked, health-gated), to the gate's baseline release (else the previously live one)."""
    from eagle3ops.window.run import run_window

    if not opts.pipeline_image:
        raise WatchError(f"{r.host.name}: serving.watch.rollback is on but no pipeline image is deployed to run the "
                         "rollback window: run `eagle3ops deploy` first")
    return run_window(r, kind="rollback", image=opts.pipeline_image, expected_image_id=opts.pipeline_image_id,
                      command=opts.command, run=th.run or "default", to_release=th.baseline_release,
                      message=f"watch: {reason}")


def _add(totals: dict[str, Any], fig: dict[str, Any]) -> None:
    if not fig.get("drafts"):
        return
    totals["drafts"] = totals.get("drafts", 0.0) + fig["drafts"]
    totals["accepted"] = totals.get("accepted", 0.0) + fig["accepted"]
    pos = totals.setdefault("accepted_per_pos", {})
    for k, v in (fig.get("acceptance_per_position") or {}).items():
        pos[k] = pos.get(k, 0.0) + v * fig["drafts"]
    totals["intervals"] = totals.get("intervals", 0) + 1
    totals["seconds"] = round(totals.get("seconds", 0.0) + fig["seconds"], 3)


def production_figure(release: int | None, run: str | None, totals: dict[str, Any]) -> dict[str, Any] | None:
    """The release's production acceptance pooled over every watched interval with draft rounds (None: none)."""
    d = totals.get("drafts")
    if not d:
        return None
    return {"release": release, "run": run, "mean_acceptance_length": round(1 + totals["accepted"] / d, 4),
            "acceptance_per_position": {k: round(v / d, 4) for k, v in sorted(totals["accepted_per_pos"].items())},
            "drafts": d, "intervals": totals["intervals"], "watched_s": totals["seconds"],
            "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _interval(r: Any, opts: WatchOptions, h: Any, th: Thresholds, tracker: Tracker, paths: dict[str, str],
              release: int | None, fig: dict[str, Any], start: float, end: float, totals: dict[str, Any],
              out: dict[str, Any], echo: Callable[[str], None]) -> None:
    """One interval: judge, record on the host, print; report a new sustained breach (audit) and roll back when the
    policy says so (``out`` updated in place)."""
    from eagle3ops.window.common import WindowError, append_audit

    checks = judge(fig, th)
    sustained = tracker.update(start, end, checks)
    _add(totals, fig)
    line = {"t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)), "epoch": end, "start": start,
            "release": release, **fig, "checks": checks, "breaching_since": dict(tracker.since)}
    r.run(hc.append_file(paths["record"]), stdin=json.dumps(line) + "\n")
    out["intervals"] += 1
    echo(f"{line['t']} {fig['seconds']:.0f}s: acceptance {fig.get('mean_acceptance_length')} per position "
         f"{fig.get('acceptance_per_position')}; {fig.get('output_tokens_per_s')} tok/s, "
         f"{fig.get('requests_per_s')} req/s, per request {fig.get('request_output_tokens_per_s')} tok/s, "
         f"waiting {fig.get('requests_waiting')}; breach {[c for c, b in checks.items() if b] or 'none'}")
    if sustained:
        out["exit_code"] = max(out["exit_code"], EXIT_BREACH)
    new = [c for c in sustained if tracker.reported.get(c) is None]
    if not new:
        return
    for c in new:
        tracker.reported[c] = end
    reason = "; ".join(
        f"{c} breached since {time.strftime('%H:%M:%S', time.gmtime(tracker.since[c] or end))} UTC" +
        (f" (acceptance {fig.get('mean_acceptance_length')} < {th.acceptance_floor})" if c == "acceptance"
         else f" (per-request {fig.get('request_output_tokens_per_s')} tok/s < {th.request_tokens_per_s_min})")
        for c in new)
    out["breaches"].append({"conditions": new, "reason": reason, "interval": line})
    echo(f"BREACH: {reason}")
    entry: dict[str, Any] = {"user": getpass.getuser(), "host": h.name, "command": opts.command, "kind": "watch",
                             "release": release, "run": th.run, "outcome": "breach", "reason": reason,
                             "thresholds": asdict(th), "figures": line}
    if h.serving.watch.rollback:
        try:
            rb = _rollback(r, opts, th, reason)
        except (WindowError, WatchError) as exc:
            rb = {"outcome": "error", "error": str(exc)}
        out["rollback"] = {k: rb.get(k) for k in ("window_id", "outcome", "release", "error")}
        entry["rollback"] = out["rollback"]
        out["exit_code"] = EXIT_ROLLED_BACK if rb.get("outcome") == "ok" else EXIT_ROLLBACK_FAILED
        echo(f"rollback to release {th.baseline_release or '(previous live)'}: {rb.get('outcome')} (window "
             f"{rb.get('window_id')}){': ' + str(rb.get('error')) if rb.get('error') else ''}")
    append_audit(r, entry)


def _check_policy(h: Any) -> None:
    """A host ``watch`` can follow, with a rollback its serving kind can make when the policy asks for one.

    Raises:
        WatchError: serving kind ``none``; rollback on for a kind that cannot roll back.
    """
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.kinds import require_serving

    if not h.serving.managed:
        raise WatchError(f"host {h.name} has no production serving (`serving: none`): nothing to watch")
    if h.serving.watch.rollback:
        try:
            require_serving(h, "rollback")
        except WindowError as exc:
            raise WatchError(f"{exc} (serving.watch.rollback is on)") from None


@dataclass
class _Watched:
    """What a watch carries from one interval to the next, and across a restarted watch through the host's
    ``watch/state.json``: the last scrape (``(epoch seconds, sample)``; None before the first), the breach tracker
    and the pooled acceptance totals of this release."""

    prev: tuple[float, ServerSample] | None
    tracker: Tracker
    totals: dict[str, Any] = field(default_factory=dict)

    def state(self, release: int | None) -> dict[str, Any]:
        """The state file's content (needs a scrape: ``prev``)."""
        assert self.prev is not None
        return {"release": release, "epoch": self.prev[0], "sample": self.prev[1].to_json(),
                "since": self.tracker.since, "reported": self.tracker.reported, "totals": self.totals}


def _resumed(r: Any, paths: dict[str, str], release: int | None, interval: float, sustained_s: float,
             now: Callable[[], float], echo: Callable[[str], None]) -> _Watched:
    """Where an earlier watch of the same release left off when its last scrape is recent (within three intervals,
    at least 15 minutes): its scrape, breaches and totals; else a fresh start."""
    w = _Watched(None, Tracker(sustained_s))
    try:
        st = json.loads(r.run(hc.cat_if_exists(paths["state"]), check=False).stdout or "{}")
    except ValueError:
        st = {}
    if st.get("release") == release and now() - float(st.get("epoch", 0)) <= max(3 * interval, 900):
        w.prev = (float(st["epoch"]), ServerSample.from_json(st["sample"]))
        w.tracker.since.update(st.get("since") or {})
        w.tracker.reported.update(st.get("reported") or {})
        w.totals = st.get("totals") or {}
        echo(f"resuming from the scrape of {time.strftime('%H:%M:%S', time.gmtime(w.prev[0]))} UTC")
    return w


def _follow(r: Any, opts: WatchOptions, th: Thresholds, paths: dict[str, str], release: int | None,
            interval: float, w: _Watched, out: dict[str, Any], scrape: Callable[[], ServerSample], *,
            deadline: float, now: Callable[[], float], sleep: Callable[[float], None],
            echo: Callable[[str], None]) -> None:
    """Scrape every ``interval`` seconds until ``deadline`` (epoch seconds) or a rollback: each interval judged and
    recorded (:func:`_interval`), the state saved after it. A failed scrape is said and retried next interval; a
    server restart (counters gone back) starts a new interval and a new breach tracker."""
    next_at = w.prev[0] + interval
    while now() < deadline and out["rollback"] is None:
        wait = min(next_at, deadline) - now()
        if wait > 0:
            sleep(wait)
        t = now()
        next_at = t + interval
        try:
            cur = scrape()
        except Exception as exc:  # noqa: BLE001 - serving down (a window?) or unreachable: try next interval
            echo(f"scrape failed ({type(exc).__name__}: {exc}); trying again next interval")
            out["scrape_errors"] = out.get("scrape_errors", 0) + 1
            continue
        try:
            fig = interval_figures(w.prev[1], cur, t - w.prev[0])
        except ValueError as exc:  # the server restarted: the deltas mean nothing; start again from here
            echo(f"{exc}: starting a new interval")
            w.tracker = Tracker(w.tracker.sustained_s)
            w.prev = (t, cur)
            continue
        _interval(r, opts, r.host, th, w.tracker, paths, release, fig, w.prev[0], t, w.totals, out, echo)
        w.prev = (t, cur)
        if out["rollback"] is None:
            r.run(hc.write_file(paths["state"]), stdin=json.dumps(w.state(release)) + "\n")


def _plan(h: Any, opts: WatchOptions, release: int | None, th: Thresholds, interval: float,
          paths: dict[str, str]) -> dict[str, Any]:
    """What ``watch --dry-run`` prints: the release watched, its thresholds, the interval and duration (seconds),
    the records' paths and what a sustained breach does."""
    policy = h.serving.watch
    return {"kind": "watch", "host": h.name, "release": release, "thresholds": asdict(th),
            "interval_s": interval, "duration_s": opts.duration_s, "sustained_minutes": policy.sustained_minutes,
            "endpoint": opts.endpoint or "direct, else an SSH forward", "records": paths,
            "on_breach": (f"rollback to release {th.baseline_release or '(previous live)'}: a locked, "
                          f"health-gated window" if policy.rollback else "reported (serving.watch.rollback off)")}


def watch(r: Any, opts: WatchOptions, *, echo: Callable[[str], None] = print, now: Callable[[], float] = time.time,
          sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Watch ``r``'s live release for ``opts.duration_s`` (see the module doc). ``now``/``sleep``: the clock (tests
    pass their own). Returns ``{"exit_code", "release", "thresholds", "intervals", "breaches", "rollback",
    "production"}``; with ``opts.plan_only``, the plan once the facts are read (:func:`_plan`), nothing scraped or
    written.

    Raises:
        WatchError: serving kind ``none``; rollback on for a kind that cannot roll back; the endpoint not reached
            or the API key file unreadable (from :mod:`.reach`).
    """
    from eagle3ops.speculate.reach import RegenerateError, serving_api_key, serving_endpoint
    from eagle3ops.window.common import current_release

    h = r.host
    policy = h.serving.watch
    _check_policy(h)
    interval = opts.interval_s or policy.interval_s
    release = current_release(r)
    gate = gate_result_for(r, release)
    th = thresholds(policy, h.serving, gate)
    echo(f"{h.name}: release {release}; acceptance floor {th.acceptance_floor} ({th.floor_source}); per-request "
         f"output tokens/s floor {th.request_tokens_per_s_min}; sustained {policy.sustained_minutes} min; rollback "
         f"{'on, to release ' + str(th.baseline_release) if policy.rollback else 'off'}")
    paths = _state_paths(h, release)
    if opts.plan_only:
        return _plan(h, opts, release, th, interval, paths)
    w = _resumed(r, paths, release, interval, policy.sustained_minutes * 60, now, echo)
    try:
        key = serving_api_key(r)
    except RegenerateError as exc:
        raise WatchError(str(exc)) from None
    out: dict[str, Any] = {"release": release, "thresholds": asdict(th), "intervals": 0, "breaches": [],
                           "rollback": None, "exit_code": EXIT_OK}
    deadline = now() + opts.duration_s
    with contextlib.ExitStack() as stack:
        try:
            url, how = stack.enter_context(serving_endpoint(r, key, direct=opts.endpoint))
        except RegenerateError as exc:
            raise WatchError(f"{exc}; or pass --endpoint URL") from None
        echo(f"serving endpoint: {how}")
        scrape = _scraper(url, key)
        if w.prev is None:
            try:
                w.prev = (now(), scrape())
            except Exception as exc:  # noqa: BLE001 - no answer (ServingHTTPError) or a body not Prometheus text
                raise WatchError(f"{h.name}: cannot read {url}/metrics: {exc}") from None
        r.run(hc.mkdir_p(paths["dir"]))  # the records' folder once serving answered: a watch refused writes nothing
        _follow(r, opts, th, paths, release, interval, w, out, scrape, deadline=deadline, now=now, sleep=sleep,
                echo=echo)
    # the state last: after a rollback the release is gone, and the next watch starts afresh on the new one
    r.run(hc.write_file(paths["state"]), stdin=json.dumps(w.state(release) if out["rollback"] is None else {}) + "\n")
    out["production"] = production_figure(release, th.run, w.totals)
    where = (gate or {}).get("attempt_dir") or (f"{h.data_dir}/runs/{th.run}/speculate" if th.run else None)
    if out["production"] and where:  # beside the gate's result.json: `eagle3ops report` reads both there
        r.run(hc.write_file(f"{where}/production.json"), stdin=json.dumps(out["production"], indent=2) + "\n")
        out["production"]["file"] = f"{where}/production.json"
    return out
