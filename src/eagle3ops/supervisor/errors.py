"""The supervisor's own exceptions, shared by the runner, the stage runner and the serving kinds."""

from __future__ import annotations


class Interrupted(Exception):
    """SIGTERM/SIGINT reached the supervisor: stop the current stage and restore serving."""


class EngineUnavailable(RuntimeError):
    """The Docker engine did not answer within the bounded wait: not a verdict on any release. The supervisor
    exits (status 75) without a result so that its restart policy resumes the window when the engine is back."""


class ServingRestarted(RuntimeError):
    """Serving was started again by something outside the window (a restart policy, a cron or systemd job, an
    operator) more often than a window tolerates while its stages run: the stages are stopped and serving restored."""
