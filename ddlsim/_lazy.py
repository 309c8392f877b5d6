"""Lazy package exports (PEP 562), so ``ddlsim predict`` does not import scipy, pandas or
networkx unless it needs them."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` resolving ``name`` from ``package + table[name]`` on first use."""
    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)
    return __getattr__
