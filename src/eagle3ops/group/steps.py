"""The real step callables of a group rollout (:class:`~eagle3ops.group.execute.StepFns`) over inventory hosts.

Each host is reached through its own executor (``remotes``: host name → an entered SSH executor) and changed only by
the existing locked, health-gated windows: ``switch`` is a ``release`` window (the change; for a speculative release
the one the canary's gate kept, :meth:`HostSteps.speculative`) or a ``rollback`` window (to the release the host had
before the rollout being rolled back), ``switch_back`` a ``rollback`` window to the release before the switch,
``gate`` the ``speculate`` job (:func:`eagle3ops.speculate.ship.speculate`). ``health`` probes serving as its
clients do (:func:`eagle3ops.health.wait_healthy`), ``acceptance`` replays the gate's prompts on the drained host
and reads the mean acceptance length from ``/metrics`` deltas (:func:`eagle3ops.speculate.cyclerun.measure_served`),
``bake_sample`` reads the canary's interval figures (:func:`eagle3ops.gate.metrics.interval_figures`).
``drain``/``undrain`` are :func:`eagle3ops.group.drain.drain` (drain that means drained: 0 balancer sessions and 0
vLLM requests for 5 s, bounded, undrained on timeout) and :func:`~eagle3ops.group.drain.undrain`.

Which release each host serves, in the group's terms, is a marker on the host: ``<state_dir>/groups/<group>/
live.json`` = ``{"target", "label", "release", "previous"}`` written after each switch (``previous``: the marker
before it, or only the release the switch's window found live when that marker no longer names it, so a return or a
group rollback restores what was serving; ``pending``, while a switch's window runs: the target and
the release before it, so a rerun after a killed driver keeps the right release to return to). A host is on a
target when its marker names it, the host's current release is still the marker's ``release`` (a release made
outside the group since is not), and what serves is that release (:func:`not_on_target`): files alone would skip a
host whose serving was recreated by hand, restarted from another release or stopped.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from eagle3ops.commands import host as hc
from eagle3ops.group.balancer import Balancer
from eagle3ops.group.execute import StepBusy, StepFailed, StepFns

__all__ = ["HostSteps", "live_not_release", "marker_path", "not_on_target", "on_target", "read_marker",
           "serving_not_release", "target_check"]


def marker_path(state_dir: str, group: str) -> str:
    """``<state_dir>/groups/<group>/live.json`` on a group host."""
    return f"{state_dir}/groups/{group}/live.json"


def read_marker(r: Any, group: str) -> dict[str, Any]:
    """The host's group marker (``{}``: none, or unreadable)."""
    out = r.run(hc.cat_if_exists(marker_path(r.host.state_dir, group)), check=False).stdout or ""
    try:
        return json.loads(out) if out.strip() else {}
    except ValueError:
        return {}


def not_on_target(marker: Mapping[str, Any], release: int | None, target: str, live: str | None) -> str | None:
    """Why a host does not serve ``target`` (pure), None when it does: its group ``marker``, its current ``release``
    (``releases/current``) and ``live``, why what serves is not that release (:func:`serving_not_release`; None: it
    is). The words are what ``--dry-run`` prints for a host the rollout does not skip."""
    if not marker.get("target"):
        return "no group marker: this group never switched it"
    if marker.get("target") != target:
        return f"its group marker names another release ({marker.get('label') or marker.get('target')})"
    if marker.get("release") is None or marker.get("release") != release:
        return (f"its current release is {release}, not the marker's {marker.get('release')}: released outside the "
                f"group since")
    if live:
        return f"what serves is not its current release {release}: {live}"
    return None


def on_target(marker: Mapping[str, Any], release: int | None, target: str, live: str | None = None) -> bool:
    """Whether a host with ``marker``, current ``release`` and ``live`` (see :func:`not_on_target`) serves
    ``target`` (pure)."""
    return not_on_target(marker, release, target, live) is None


def live_not_release(n: int, record: Mapping[str, Any], live: Mapping[str, Any] | None, looked_for: str,
                     adopted: Mapping[str, Any] | None = None) -> str | None:
    """Why the live serving container (``live``: its ``docker inspect``; None: none found, ``looked_for`` says what
    was looked for) is not release ``n`` (``record``: its release file; ``adopted``: ``adopted.json``), None when
    it is (pure): it must run, and be release ``n`` by the record step's own rule
    (:func:`eagle3ops.commands.serving.container_not_release`)."""
    from eagle3ops.commands import serving as sv

    if live is None:
        return f"no serving container ({looked_for})"
    state = live.get("State") or {}
    if not state.get("Running"):
        return f"its serving container {live.get('Name', '').lstrip('/')!r} is {state.get('Status') or 'not running'}"
    want = sv.release_container_id(n, record, adopted)
    why = sv.container_not_release(n, record, live, want)
    return f"{why} (recreated outside eagle3ops)" if why and want else why


def _read_json(r: Any, path: str) -> dict[str, Any]:
    out = r.run(hc.cat_if_exists(path), check=False).stdout or ""
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def serving_not_release(r: Any, n: int) -> str | None:
    """Why what serves on ``r``'s host now is not its release ``n``, None when it is (reads only). A host serving
    with a container: :func:`live_not_release` on the live container's ``docker inspect`` and release ``n``'s file;
    other serving kinds (a process, a unit), which record no identity: whether serving runs at all
    (:meth:`eagle3ops.window.kinds.DriverKind.live_state`)."""
    from eagle3ops.commands import docker as dk
    from eagle3ops.window.common import paths
    from eagle3ops.window.kinds import driver_kind, serving_container

    kind = driver_kind(r.host)
    if kind.record_form != "container":
        said, running = kind.live_state(r)
        return None if running else f"serving is not running ({said})"
    names, looked_for = serving_container(r)
    out = r.run(dk.inspect_container(r.host, names[0]), check=False) if names else None
    try:
        live = json.loads(out.stdout)[0] if out is not None and out.ok and out.stdout.strip() else None
    except (ValueError, IndexError):
        live = None
    rel = paths(r.host)["releases"]
    return live_not_release(n, _read_json(r, f"{rel}/{n:04d}.json"), live, looked_for,
                            _read_json(r, f"{rel}/adopted.json"))


def target_check(r: Any, marker: Mapping[str, Any], release: int | None, target: str) -> str | None:
    """:func:`not_on_target` of ``r``'s host (reads only): what serves is read only when the files say it is on the
    target."""
    why = not_on_target(marker, release, target, None)
    if why is None and release is not None:
        why = not_on_target(marker, release, target, serving_not_release(r, release))
    return why


@dataclass
class HostSteps:
    """The step callables of one rollout: ``kind`` (``speculate``/``release``/``rollback``), ``remotes``
    (entered executors by host name), ``balancer``, ``target``/``label`` (the release key and its words),
    ``window`` (keyword arguments every window gets: ``command``), ``images`` (host → ``(pipeline image, id)``),
    ``change`` (a release's :class:`~eagle3ops.config.plan.ReleaseChange`), ``speculate_options`` (host →
    :class:`~eagle3ops.speculate.prechecks.SpeculateOptions`), ``prompts`` (the acceptance step's requests),
    ``max_out``, ``drain_timeout_s``, ``out_wait_s`` and ``quiet_s`` (seconds; None: the drain's own
    :data:`eagle3ops.group.drain.QUIET_S`) for the drain; ``canary``: the host whose gate decides a speculative
    release."""

    group: str
    kind: str
    remotes: Mapping[str, Any]
    balancer: Balancer
    target: str
    label: str
    command: str
    images: Mapping[str, tuple[str, str | None]]
    change: Any = None
    speculate_options: Mapping[str, Any] = field(default_factory=dict)
    prompts: Sequence[Any] = ()
    max_out: int = 1
    drain_timeout_s: float = 600.0
    out_wait_s: float = 600.0
    quiet_s: float | None = None
    canary: str | None = None
    echo: Callable[[str], None] = print
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _urls: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    _last: dict[str, tuple[float, Any]] = field(default_factory=dict)
    _kept: dict[str, Any] | None = None

    def close(self) -> None:
        """Close the serving endpoints opened (SSH forwards)."""
        self._stack.close()

    def fns(self) -> StepFns:
        """The :class:`~eagle3ops.group.execute.StepFns` of this rollout."""
        return StepFns(drain=self.drain, undrain=self.undrain, switch=self.switch, switch_back=self.switch_back,
                       health=self.health, acceptance=self.acceptance, gate=self.gate, bake_sample=self.bake_sample)

    def _endpoint(self, host: str) -> tuple[str, str | None]:
        from eagle3ops.speculate.reach import serving_api_key, serving_endpoint

        if host not in self._urls:
            r = self.remotes[host]
            key = serving_api_key(r)
            url, _ = self._stack.enter_context(serving_endpoint(r, key))
            self._urls[host] = (url, key)
        return self._urls[host]

    def drain(self, host: str) -> dict[str, Any]:
        """Drain ``host`` so that it is drained (:func:`eagle3ops.group.drain.drain`: 0 balancer sessions and 0 vLLM
        requests for 5 s, bounded by ``drain_timeout_s``; past it the host is set ready again and the step fails)."""
        from eagle3ops.group.drain import QUIET_S, drain, metrics_requests

        url, key = self._endpoint(host)
        d = drain(self.balancer, host, metrics_requests(url, key), max_out=self.max_out,
                  timeout_s=self.drain_timeout_s, capacity_timeout_s=self.out_wait_s, echo=self.echo,
                  quiet_s=QUIET_S if self.quiet_s is None else self.quiet_s)
        return {"drained_s": round(d.seconds, 1)}

    def undrain(self, host: str) -> dict[str, Any]:
        """Let the balancer send ``host`` traffic again."""
        from eagle3ops.group.drain import undrain

        undrain(self.balancer, host)
        return {}

    def _window(self, host: str, kind: str, **kw: Any) -> dict[str, Any]:
        from eagle3ops.window.common import WindowError
        from eagle3ops.window.run import run_window

        image, image_id = self.images[host]
        try:
            res = run_window(self.remotes[host], kind=kind, image=image, expected_image_id=image_id,
                             command=self.command, message=f"group {self.group}: {self.label}", **kw)
        except WindowError as exc:
            raise StepFailed(f"{host}: {kind} window: {exc}") from None
        if res.get("outcome") not in ("ok", "nothing to do"):
            raise StepFailed(f"{host}: {kind} window ended {res.get('outcome')}: {res.get('error')}")
        return res

    def _write(self, host: str, marker: Mapping[str, Any]) -> None:
        r = self.remotes[host]
        r.run(hc.mkdir_p(f"{r.host.state_dir}/groups/{self.group}"))
        r.run(hc.write_file(marker_path(r.host.state_dir, self.group)), stdin=json.dumps(dict(marker)) + "\n")

    def _mark(self, host: str, release: Any, previous: Mapping[str, Any], before: Any) -> None:
        """The marker after a switch of ``host`` to ``release``: its ``previous`` is the marker before the switch when
        that one names ``before`` (the release the switch's window found live), else just ``{"release": before}``: a
        marker left from an earlier rollout whose host was released or provisioned again since would send a later
        return or group rollback to a release that was no longer serving."""
        prior = {k: v for k, v in previous.items() if k != "pending"}
        if prior.get("release") != before:
            prior = {"release": before} if before is not None else {}
        self._write(host, {"target": self.target, "label": self.label, "release": release, "previous": prior})

    @staticmethod
    def _found_live(res: Mapping[str, Any], key: str, before: Any) -> Any:
        """The release the window's record step found live (``res[key]``: a window's ``release_before``, the
        speculate job's ``baseline_release``), else ``before`` (the driver's read of ``releases/current`` before the
        window): the record step records serving recreated outside eagle3ops as a new release, which is then the
        one to return to."""
        found = res.get(key)
        return found if found is not None else before

    def switch(self, host: str) -> dict[str, Any]:
        """``host`` to the target release (a ``release`` window, or a ``rollback`` window to the release the
        marker says came before); the marker written."""
        from eagle3ops.window.common import current_release

        r = self.remotes[host]
        marker, before = read_marker(r, self.group), current_release(r)
        if target_check(r, marker, before, self.target) is None:  # a rerun after the window finished
            return {"release": before, "previous": (marker.get("previous") or {}).get("release"), "repeated": True}
        pending = marker.pop("pending", None) or {}
        resumed = pending.get("target") == self.target
        if resumed:  # a driver killed during the window: keep the release from before
            before = pending.get("before")
        else:
            self._write(host, {**marker, "pending": {"target": self.target, "before": before}})
        if self.kind == "release":
            res = self._window(host, "release", change=self.change)
        elif self.kind == "speculate":
            res = self._window(host, "release", change=self.speculative(host))
        else:
            res = self._window(host, "rollback", to_release=(marker.get("previous") or {}).get("release"))
        if not resumed:  # a rerun's window found the killed driver's release live: the one before stays pending's
            before = self._found_live(res, "release_before", before)
        self._mark(host, res.get("release"), marker, before)
        return {"release": res.get("release"), "previous": before}

    def kept(self) -> dict[str, Any]:
        """The result of the canary's gate that kept the target release (``num_speculative_tokens``,
        ``serving_image``, ...): this run's, else read on the canary (its marker's release, its audit's result).

        Raises:
            StepFailed: no canary, or no kept gate result on it for the target.
        """
        from eagle3ops.speculate.watch import gate_result_for

        if self._kept is None and self.canary:
            r = self.remotes[self.canary]
            marker = read_marker(r, self.group)
            res = gate_result_for(r, marker.get("release")) if marker.get("target") == self.target else None
            self._kept = res if res and res.get("verdict") == "keep" else None
        if self._kept is None:
            raise StepFailed(f"no kept gate result of the canary {self.canary} for this release: run the rollout "
                             f"from its canary (`eagle3ops group status {self.group}`)")
        return self._kept

    def speculative(self, host: str) -> Any:
        """The release the canary's gate kept, on ``host``: the same head (``--head DIR`` uploaded there, else the
        run's own head on ``host``), speculative length and image (pushed when missing):
        :func:`eagle3ops.speculate.ship.speculative_change`.

        Raises:
            StepFailed: ``host`` has no head of the run and no ``--head`` was given.
        """
        from eagle3ops.speculate.ship import ensure_image, speculative_change, upload_head

        r, opts, kept = self.remotes[host], self.speculate_options[host], self.kept()
        if opts.head is not None:
            head_dir, _ = upload_head(r, opts.head)
        else:
            head_dir = f"{r.host.data_dir}/runs/{opts.run}/train/final"
            if not r.run(hc.exists(f"{head_dir}/config.json"), check=False).ok:
                raise StepFailed(f"{host}: run {opts.run} has no trained head here ({head_dir}/config.json is "
                                 f"missing): roll a head trained elsewhere with --head DIR (uploaded to each host)")
        change = speculative_change(r.host, head_dir, int(kept.get("num_speculative_tokens") or 3),
                                    kept.get("serving_image") or "")
        if change.image:
            ensure_image(r, change.image, self.echo)
        return change

    def switch_back(self, host: str, previous: Any) -> dict[str, Any]:
        """``host`` back to release ``previous`` (a ``rollback`` window), its marker to the one before the switch."""
        r = self.remotes[host]
        marker = read_marker(r, self.group)
        res = self._window(host, "rollback", to_release=previous)
        prior = marker.get("previous") if marker.get("target") == self.target else marker
        if not (prior or {}).get("target"):  # only the release found live (:meth:`_mark`): no marker was there
            prior = {}
        self._write(host, {k: v for k, v in (prior or {}).items() if k != "pending"})
        return {"release": res.get("release")}

    def health(self, host: str) -> dict[str, Any]:
        """Serving of ``host`` answers as a client needs (bounded by its ``serving.health_timeout_s``)."""
        from eagle3ops import health

        h = self.remotes[host].host
        url, key = self._endpoint(host)
        try:
            health.wait_healthy(url, h.serving.served_model_name, timeout_s=h.serving.health_timeout_s, api_key=key)
        except health.GateFailed as exc:
            raise StepFailed(f"{host}: not healthy: {exc}") from None
        return {}

    def acceptance(self, host: str) -> float | None:
        """The served mean acceptance length of ``host`` over the gate's prompts (None: no draft round)."""
        from eagle3ops.speculate.cycle import CycleError
        from eagle3ops.speculate.cyclerun import measure_served

        h = self.remotes[host].host
        url, key = self._endpoint(host)
        try:
            v = measure_served(url, h.serving.served_model_name, list(self.prompts), 1.0, where=host, api_key=key,
                               max_tokens=h.serving.gate_max_tokens)  # as the gate measured the canary
        except CycleError:
            return None
        return float(v["mean_acceptance_length"])

    def gate(self, host: str) -> dict[str, Any]:
        """The ``speculate`` job on the drained canary; its verdict and the thresholds the bake is judged by."""
        from dataclasses import asdict

        from eagle3ops.speculate.ship import SpeculateError, speculate
        from eagle3ops.speculate.watch import gate_result_for, thresholds
        from eagle3ops.window.common import WindowError, current_release

        from eagle3ops.window.lock import lock_is_stale, read_lock

        r = self.remotes[host]
        before, marker = current_release(r), read_marker(r, self.group)
        held = read_lock(r)
        if held and not lock_is_stale(r, held):  # e.g. the gate an earlier, killed driver started still runs
            raise StepBusy(f"{host}: its deploy lock is held by a running window ({held.get('command', '?')}, window "
                           f"{held.get('window_id', '?')}): wait for it (`eagle3ops attach {host}`), then rerun; the "
                           f"canary stays drained, nothing else changed")
        pending = marker.pop("pending", None) or {}
        earlier = gate_result_for(r, before) if pending.get("target") == self.target and \
            pending.get("before") != before else None
        if earlier and earlier.get("verdict") == "keep":  # the earlier driver's gate kept this release meanwhile
            res, before = {**earlier, "live_release": before}, pending.get("before")
        else:
            self._write(host, {**marker, "pending": {"target": self.target, "before": before}})
            try:
                res = speculate(r, self.speculate_options[host], echo=self.echo)
            except (SpeculateError, WindowError) as exc:
                raise StepFailed(f"{host}: the gate: {exc}") from None
        live, before = res.get("live_release"), self._found_live(res, "baseline_release", before)
        if res.get("verdict") == "keep":
            self._kept = dict(res)
            self._mark(host, live, marker, before)
        else:
            self._write(host, marker)
        th = thresholds(r.host.serving.watch, r.host.serving, gate_result_for(r, live) or res)
        return {"verdict": res.get("verdict"), "reason": res.get("reason"), "release": live, "previous": before,
                "mean_acceptance_length": (res.get("spec_decode") or {}).get("mean_acceptance_length"),
                "thresholds": asdict(th)}

    def bake_sample(self, host: str) -> dict[str, Any] | None:
        """The canary's figures since the previous call (None on the first call, or when ``/metrics`` fails)."""
        import httpx

        from eagle3ops.gate.metrics import interval_figures, parse_server
        from eagle3ops.speculate.regenerate import auth_headers

        url, key = self._endpoint(host)
        try:
            resp = httpx.get(f"{url}/metrics", headers=auth_headers(key), timeout=30)
            resp.raise_for_status()
            cur = (time.time(), parse_server(resp.text))
        except Exception as exc:  # noqa: BLE001 - one missed reading; the bake goes on
            self.echo(f"{host}: /metrics not read ({type(exc).__name__}: {exc})")
            return None
        prev, self._last[host] = self._last.get(host), cur
        if prev is None:
            return None
        try:
            return interval_figures(prev[1], cur[1], cur[0] - prev[0])
        except ValueError:  # the server restarted between the readings
            return None
