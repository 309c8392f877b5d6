"""The ``ddlsim`` command keeps freed C heap for its next call; a library import does not."""

import platform
from pathlib import Path

import pytest

from ddlsim import cli, hostmemory


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_keep_freed_memory_sets_glibc_thresholds():
    assert hostmemory.keep_freed_memory() is True


def test_the_command_sets_it_before_running(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append("mallopt"))
    monkeypatch.setattr(cli, "app", lambda: calls.append("app"))
    cli.main()
    assert calls == ["mallopt", "app"]


def test_only_the_command_and_the_reference_trainer_call_it():
    """A library import never changes the process's allocator: the call sits only in the
    command's ``main`` and in the reference trainer's own process set-up."""
    root = Path(hostmemory.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "keep_freed_memory()" in p.read_text() and p.name != "hostmemory.py")
    assert callers == ["cli.py", "reference/machine.py"]
