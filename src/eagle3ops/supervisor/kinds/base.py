"""The interface every serving kind implements on the host side (the supervisor's view of production serving).

A window's runner (:class:`eagle3ops.supervisor.runner.Supervisor`) owns the policy every kind shares: the journal
(each step journals ``start`` before it calls the kind, and is skipped when already done), the budget (each gate's
limit), Docker engine waits and the health poller. A kind owns only what differs between serving managers: how the
live serving is recorded, stopped, restored and switched to another release, where its API key is read, how a crash
shows during a gate, and whether it runs. The kind is chosen once, from the plan's ``serving_kind``
(:func:`eagle3ops.supervisor.kinds.for_plan`); nothing else in the supervisor looks at the kind's name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from eagle3ops.config.plan import Plan
from eagle3ops.supervisor.journal import Journal
from eagle3ops.supervisor.releases import Releases


class KindHost(Protocol):
    """What a serving kind uses of the window that drives it (the runner,
    :class:`eagle3ops.supervisor.runner.Supervisor`, is one; a test may pass any object with these members).

    Attributes: ``plan`` (the window's plan), ``journal``, ``releases`` (``<state_dir>/releases``), ``client`` (the
    docker SDK ``DockerClient``; None on a venv host), ``wdir`` (the window's folder), ``unhealthy`` (set by the kind
    when neither a restore nor a rollback brought serving back). Methods: the window's shared policy.
    """

    plan: Plan
    journal: Journal
    releases: Releases
    client: Any
    wdir: Path
    unhealthy: bool

    def warn(self, step: str, message: str) -> None:
        """Journal a warning for the window's result."""

    def gate_through_signal(self, timeout_s: float | None = None) -> None:
        """Health gate on serving, finished through a first stop signal; raises ``GateFailed``."""

    def wait_out_engine(self, step: str, exc: BaseException) -> bool:
        """After ``exc``: True when the Docker engine was away and is back (retry), False when it answered."""


class ServingKind:
    """One serving manager as the supervisor drives it.

    ``sup`` is what the kind uses of the window (:class:`KindHost`): it reads its ``plan``, ``journal``,
    ``releases``, ``wdir`` and ``client``, and calls back into its policy (``gate_through_signal``,
    ``wait_out_engine``, ``warn``); it sets ``sup.unhealthy`` when neither a restore nor a rollback brought serving
    back.

    Subclasses set :attr:`name` and override the steps; the defaults here refuse (a kind without production serving
    inherits them unchanged, see :class:`eagle3ops.supervisor.kinds.none.NoServing`).
    """

    #: The plan's ``serving_kind`` this class implements.
    name = ""
    #: False for a host without production serving: the runner then journals ``serving skip`` and runs only the
    #: stages (no record, stop, restore or gate).
    manages = True

    def __init__(self, sup: KindHost):
        self.sup = sup
        self.plan = sup.plan

    def _refuse(self, what: str) -> RuntimeError:
        return RuntimeError(f"serving kind {self.name!r} on host {self.plan.host} cannot {what}")

    def record(self) -> None:
        """Record the live serving (what a restore brings back) and journal ``record ok`` with what was recorded.
        Nothing is stopped before this succeeds.

        Raises:
            RuntimeError: there is nothing to record (e.g. the serving container does not exist).
        """
        raise self._refuse("record serving")

    def stop(self) -> None:
        """Stop the recorded serving (graceful, bounded) and journal ``stop ok``; the runner journaled ``start``.

        Raises:
            RuntimeError: the stop was not confirmed in time.
        """
        raise self._refuse("stop serving")

    def restore(self) -> str:
        """Bring the recorded serving back and health-gate it (the runner journaled ``restore start``).

        Returns:
            ``"restored"`` or ``"rolled back to release N"``.

        Raises:
            RuntimeError: serving did not come back (``sup.unhealthy`` is set).
        """
        raise self._refuse("restore serving")

    def switch(self, step: str = "switch", change: Any | None = None, live: bool = True) -> str:
        """A ``release``/``rollback`` plan: replace live serving with the target release, health-gated, rolling back
        on a failed gate (the runner ran :meth:`record` first). ``step``/``change``/``live``: a speculate job's
        control release (its own journal step, the recorded serving plus ``change``, never made the live release);
        kinds without images need none and refuse it.

        Returns:
            ``"serving release N"`` or ``"release N failed its health gate; rolled back to release M"``.

        Raises:
            RuntimeError: no target, or neither the target nor any fallback passed the gate.
        """
        raise self._refuse(f"switch releases ({self.plan.kind})")

    def return_to(self, release: int | None, why: str) -> str:
        """A ``speculate`` job's rollback: after a :meth:`switch` that passed its gate, bring back ``release`` (the
        one live before the switch), health-gated; the runner's journal gets ``rollback start``/``ok``.

        Returns:
            ``"rolled back to release N"``.

        Raises:
            RuntimeError: neither ``release`` nor a fallback passed the gate (``sup.unhealthy`` set).
        """
        raise self._refuse("switch back to an earlier release")

    def reinstate(self, release: int, why: str, step: str = "keep-switch") -> str:
        """A ``speculate`` job of the ``aba`` design: after the baseline's second block, serve again ``release``
        (the speculative release the gate kept, from its retained record), health-gated, made the current release;
        on a failed gate the release live before comes back (the kind's rollback). Journaled under ``step``;
        a resumed supervisor whose journal has it done returns it.

        Returns:
            ``"serving release N"`` or ``"release N failed its health gate; rolled back to release M"``.

        Raises:
            RuntimeError: neither ``release`` nor a fallback passed the gate (``sup.unhealthy`` set).
        """
        raise self._refuse("serve a kept release again")

    def finish(self) -> None:
        """End of a ``speculate`` job, whatever happened (e.g. the process kind tells its restore agent that it is
        done); nothing for most kinds."""

    def api_key(self) -> str | None:
        """The API key the live serving's own configuration requires (``--api-key``/``VLLM_API_KEY``), None when
        it names none (the runner then reads ``health.api_key_file``). Never logged."""
        return None

    def crash_check(self) -> Callable[[], str | None] | None:
        """For one health gate: a callable that says why serving crashed (the gate then fails at once), else
        None; or None when this kind cannot tell a crash from a slow start."""
        return None

    def running(self) -> bool | None:
        """Whether serving runs now, for the result (None: no serving to run)."""
        return None

    def started_again(self) -> str | None:
        """During the stages (serving stopped by this window): when serving runs again, stop it again and say what
        was found, in words; None when it is still stopped, or when this kind cannot see it from the supervisor
        (a process or unit: the host-side agent stopped it)."""
        return None

    def keeps_release(self) -> bool:
        """Whether the result names a retained release (``result.json`` ``release``) for this plan."""
        return False

    def live_container(self) -> Any | None:
        """The serving container (docker SDK object) for kinds that serve with one, else None."""
        return None

    def identity(self) -> dict[str, Any]:
        """What the live release runs, for the gate's like-for-like record (:class:`eagle3ops.gate.like.
        ReleaseIdentity` fields but ``vllm_version``, which the measurement reads from ``/version``): ``image``,
        ``image_id``, ``labels`` (the image's ``io.eagle3ops.*``), ``argv``. ``{}`` when this kind cannot tell."""
        return {}
