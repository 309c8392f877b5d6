"""Errors ddlsim raises for bad input. The CLI prints them as one paragraph, never a traceback."""

from __future__ import annotations


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


class DeadlockError(DDLSimError, RuntimeError):
    """A simulated program can make no progress (unmatched send/recv or a cycle of waits)."""
