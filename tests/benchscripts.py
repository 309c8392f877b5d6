"""The benchmark scripts (``benchmarks/*.py``) as modules, for the tests that check them: the
scripts are not a package, and they import their shared helper ``public_runs`` by name, so
the folder goes on ``sys.path`` once, here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["BENCH", "load_script"]

BENCH = Path(__file__).parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


def load_script(name: str):
    """``benchmarks/<name>.py`` imported as a module named ``name`` (each call a fresh one)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
