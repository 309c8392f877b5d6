"""Pausing Python's cyclic garbage collector around work that allocates many short-lived
objects and almost no reference cycles (a DES run's spans, a search grid's op lists and
copies): each collection their allocation triggers scans the heap again, at no gain."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for the block, then restore the state it was in
    (a collector the caller had disabled stays disabled, an error included). Objects in
    reference cycles made inside the block wait for the first collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
