"""Drain that means drained, and the group's capacity check before anything is drained.

A host is *out* when its balancer does not send it new sessions: drained, in maintenance, or down by the balancer's
own health check (:class:`~eagle3ops.group.balancer.ServerState` not ``ready``). :func:`check_capacity` (pure) says
how many are out and whether taking one more out would exceed the group's ``max_out``; :func:`wait_for_capacity`
waits, bounded, for room rather than exceed it.

:func:`drain` sets a host to ``drain`` at the balancer and waits until it is *drained*: the balancer reports 0
sessions to it **and** vLLM's own queue is empty — ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``
from its ``/metrics`` (vLLM 0.16 gauges, summed over engines) — on every reading for ``quiet_s`` seconds in a row
(5 s by default: a request that arrived just before the drain flag, or a client's next turn on a kept-alive
connection, shows up within it). The balancer's count alone is not enough: a request sent to the host directly,
not through the balancer, never shows in it, and one whose client went away can still be queued or generating in
vLLM after the balancer closed its session. Past ``timeout_s``
the host is undrained (set back to ``ready``), nothing is stopped, and :class:`DrainTimeout` fails the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from eagle3ops.group.balancer import Balancer, ServerState

#: Seconds a drained host must read 0 sessions and 0 requests in a row before it counts as drained.
QUIET_S = 5.0


class GroupError(RuntimeError):
    """A step of a serving group could not be done; the message names the host or group and what to do."""


class CapacityTimeout(GroupError):
    """Taking a host out would exceed the group's ``max_out`` and no room came within the wait."""


class DrainTimeout(GroupError):
    """A host was not drained within the timeout; it was set back to ``ready`` and nothing was stopped."""


@dataclass(frozen=True)
class Capacity:
    """Whether ``host`` may be taken out now.

    Attributes:
        host: the host to take out. max_out: the group's ``max_out``.
        out: ``(host, state)`` of every host out now (state not ``ready``), by host name.
    """

    host: str
    max_out: int
    out: tuple[tuple[str, str], ...]

    @property
    def out_after(self) -> int:
        """Hosts out once ``host`` is out too (``host`` already out counts once)."""
        return len({h for h, _ in self.out} | {self.host})

    @property
    def allowed(self) -> bool:
        """True when taking ``host`` out keeps at most ``max_out`` hosts out."""
        return self.out_after <= self.max_out

    def describe(self) -> str:
        """One line: who is out and what taking ``host`` out would make of it."""
        now = ", ".join(f"{h} ({s})" for h, s in self.out) or "none"
        return f"out now: {now}; with {self.host} out: {self.out_after} of max_out {self.max_out}"


def check_capacity(states: Mapping[str, ServerState], host: str, max_out: int) -> Capacity:
    """The :class:`Capacity` of taking ``host`` out of a group whose hosts read ``states`` (host → state).

    Raises:
        ValueError: ``host`` is not among ``states``.
    """
    if host not in states:
        raise ValueError(f"{host}: not a host of the group (its hosts: {', '.join(states)})")
    return Capacity(host, max_out, tuple(sorted((h, s.state) for h, s in states.items() if s.state != "ready")))


def wait_for_capacity(balancer: Balancer, host: str, max_out: int, *, timeout_s: float, poll_s: float = 1.0,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      echo: Callable[[str], None] | None = None) -> Capacity:
    """Wait (at most ``timeout_s`` seconds, reading every ``poll_s``) until ``host`` may be taken out.

    Raises:
        CapacityTimeout: still no room after ``timeout_s``; the message says who is out and what to do.
        RuntimeError: the balancer cannot be read.
    """
    deadline = clock() + timeout_s
    said = False
    while True:
        cap = check_capacity(balancer.states(), host, max_out)
        if cap.allowed:
            return cap
        if clock() >= deadline:
            raise CapacityTimeout(f"{host}: not taken out: {cap.describe()}, still after {timeout_s:g} s. Bring a "
                                  f"host that is out back (undrain it, or fix what its health check fails on) and run "
                                  f"again; nothing was changed")
        if echo and not said:
            echo(f"{host}: waiting up to {timeout_s:g} s for room ({cap.describe()})")
            said = True
        sleep(poll_s)


def vllm_requests(metrics_text: str) -> float:
    """vLLM's running + waiting requests from a ``/metrics`` body (``vllm:num_requests_running`` +
    ``vllm:num_requests_waiting``, each summed over engines).

    Raises:
        ValueError: the body is not Prometheus text, or carries neither gauge (not a vLLM server's metrics).
    """
    from eagle3ops.gate.metrics import parse

    c = parse(metrics_text)
    if c.requests_running is None and c.requests_waiting is None:
        raise ValueError("no vllm:num_requests_running / vllm:num_requests_waiting in /metrics (not vLLM?)")
    return (c.requests_running or 0.0) + (c.requests_waiting or 0.0)


def metrics_requests(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> Callable[[], float]:
    """A reader of :func:`vllm_requests` from ``GET {base_url}/metrics`` (``Authorization: Bearer`` when
    ``api_key``), each read bounded by ``timeout_s``; raises :class:`httpx.HTTPError` or :class:`ValueError`."""
    import httpx

    from eagle3ops.serving_http import auth_headers

    headers = auth_headers(api_key)

    def read() -> float:
        resp = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        return vllm_requests(resp.text)

    return read


@dataclass(frozen=True)
class Drained:
    """A drained host: ``seconds`` from the drain flag to the end of the quiet span, ``capacity`` as checked."""

    host: str
    seconds: float
    capacity: Capacity


def _quiet(balancer: Balancer, host: str, requests: Callable[[], float]) -> tuple[bool, str]:
    """Whether ``host`` reads quiet now, and what it read (for the timeout's message)."""
    sessions = balancer.states()[host].sessions
    try:
        n = requests()
    except Exception as exc:  # noqa: BLE001 - an unreadable /metrics is not quiet; said in the message
        return False, f"{sessions} balancer sessions, vLLM requests unread ({exc})"
    return sessions == 0 and n == 0, f"{sessions} balancer sessions, {n:g} vLLM requests running or waiting"


def drain(balancer: Balancer, host: str, requests: Callable[[], float], *, max_out: int, timeout_s: float,
          quiet_s: float = QUIET_S, capacity_timeout_s: float = 600.0, poll_s: float = 0.5,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          echo: Callable[[str], None] | None = None) -> Drained:
    """Drain ``host``: wait for room under ``max_out`` (:func:`wait_for_capacity`, ``capacity_timeout_s``), set it
    to ``drain``, then wait until it reads 0 balancer sessions and 0 vLLM requests (``requests``: running + waiting,
    e.g. :func:`metrics_requests`) on every reading, ``poll_s`` apart, for ``quiet_s`` seconds in a row.

    Returns:
        :class:`Drained` (the host stays drained; :func:`undrain` gives it traffic again).

    Raises:
        CapacityTimeout: no room within ``capacity_timeout_s``; nothing was changed.
        DrainTimeout: not drained within ``timeout_s`` of the drain flag; the host was set back to ``ready`` (stop
            nothing, fail the step), the message says what it still read.
        RuntimeError: the balancer failed; the host was set back to ``ready`` when the balancer still answered.
    """
    cap = wait_for_capacity(balancer, host, max_out, timeout_s=capacity_timeout_s, clock=clock, sleep=sleep, echo=echo)
    balancer.set_state(host, "drain")
    start = clock()
    quiet_since: float | None = None
    try:
        while True:
            quiet, read = _quiet(balancer, host, requests)
            now = clock()
            quiet_since = (quiet_since if quiet_since is not None else now) if quiet else None
            if quiet_since is not None and now - quiet_since >= quiet_s:
                return Drained(host, now - start, cap)
            if now - start >= timeout_s:
                break
            sleep(poll_s)
    except BaseException:
        _undrain_quietly(balancer, host)
        raise
    failed = _undrain_quietly(balancer, host)
    back = "set back to ready" if failed is None else f"NOT set back to ready ({failed}): undrain it by hand"
    raise DrainTimeout(f"{host}: not drained within {timeout_s:g} s ({read}); {back}, nothing stopped. Let its long "
                       f"requests end (or raise the drain timeout) and run again")


def undrain(balancer: Balancer, host: str) -> None:
    """Give ``host`` traffic again (``ready`` at the balancer).

    Raises:
        RuntimeError: the balancer refused or cannot be reached (the host named).
    """
    balancer.set_state(host, "ready")


def _undrain_quietly(balancer: Balancer, host: str) -> str | None:
    """Undrain on the way out of a failed drain; returns None, or the undrain's own error (the drain's error is the
    one raised)."""
    try:
        undrain(balancer, host)
    except Exception as exc:  # noqa: BLE001 - reported in the drain's message
        return str(exc)
    return None


__all__ = ["QUIET_S", "Capacity", "CapacityTimeout", "DrainTimeout", "Drained", "GroupError", "check_capacity",
           "drain", "metrics_requests", "undrain", "vllm_requests", "wait_for_capacity"]
