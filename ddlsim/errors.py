"""Errors ddlsim raises for bad input. The CLI prints them as one paragraph, never a traceback."""

from __future__ import annotations

from collections.abc import Iterable


class DDLSimError(Exception):
    """Base of every error ddlsim raises on purpose."""


class ConfigError(DDLSimError, ValueError):
    """A run configuration (or a piece of it) is invalid.

    The message names the field, the value given and what is allowed.
    """


class PlanDoesNotFitError(ConfigError):
    """The parallel plan needs more memory per device than the device has."""

    def __init__(self, message: str, memory: object | None = None):
        super().__init__(message)
        self.memory = memory


class OptionError(DDLSimError, ValueError):
    """A command-line option that is invalid, or does not apply with the other options."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`OptionError` with ``message`` unless ``condition``."""
    if not condition:
        raise OptionError(message)


class DeadlockError(DDLSimError, RuntimeError):
    """A simulated program can make no progress (unmatched send/recv or a cycle of waits)."""


class WorkTooLargeError(ConfigError):
    """A run would exceed a work budget (:class:`ddlsim.limits.Limits`); the message gives the
    estimate, the limit and the ``--limit NAME=VALUE`` option that raises it."""


class DDLSimWarning(UserWarning):
    """A value ddlsim accepts but finds unusual (a 100 Mb/s NIC, a 5 ms latency); the message
    names the field, the value and why it is unusual."""


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``" (did you mean 'x'?)"`` for the choice closest to ``word``, or ``""`` if none is close
    (:func:`difflib.get_close_matches`, cutoff 0.6)."""
    from difflib import get_close_matches

    names = {str(c): c for c in choices}
    close = get_close_matches(str(word), list(names), n=1, cutoff=0.6)
    return f" (did you mean {names[close[0]]!r}?)" if close else ""
