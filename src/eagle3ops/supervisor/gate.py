"""Verdicts of the health gate."""

from __future__ import annotations


class GateFailed(RuntimeError):
    """A health gate ran to its end on a container and failed (no answer in time, wrong answers, or the container
    crashed): the only kind of error that is a verdict on a release."""
