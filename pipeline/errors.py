"""Why the job cannot run, for the user: the message says what to change, and is shown as is."""

from __future__ import annotations


class InsightsError(Exception):
    """The input cannot be read (no store given, unreachable, unknown scheme) or Spark cannot start."""


class NothingToAnalyse(InsightsError):
    """The input holds no dead letter: no such DLQ, or an empty one."""


class JobFailed(InsightsError):
    """Spark failed while the job ran: the message is one line, and names where the rest is."""
