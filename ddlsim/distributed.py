"""Run independent pieces of work on a Dask distributed cluster (``--dask``).

The work is a list of calls ``fn(*shared, item)``; :func:`run_on_dask` submits them in small
batches with :meth:`distributed.Client.submit` (Dask's own scheduler and futures), collects
them with :func:`distributed.as_completed` so a progress callback can follow, and returns the
results in the order of the items, whatever order they finished in. The cluster is

* ``"local"``: a :class:`distributed.LocalCluster` of ``workers`` processes with one thread
  each, started here and closed afterwards;
* a scheduler address (``"tcp://host:8786"``): connected to with a timeout of
  :data:`CONNECT_TIMEOUT_S`; its workers must be able to import ``ddlsim``;
* a :class:`distributed.Client`: used as it is and left open.

``dask`` is imported only here, so the CLI's cold start does not pay for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import DDLSimError

__all__ = ["run_on_dask", "DistributedError", "CONNECT_TIMEOUT_S", "DEFAULT_WORKERS"]

#: Seconds allowed to reach a scheduler address before giving up.
CONNECT_TIMEOUT_S = 5.0
#: Worker processes of ``dask="local"`` unless ``workers`` says otherwise.
DEFAULT_WORKERS = 2
#: Most tasks one run submits: items are grouped in batches so that there are no more.
MAX_TASKS = 200


class DistributedError(DDLSimError):
    """Dask is missing, the scheduler cannot be reached, or a task failed."""


def _import_distributed():
    try:
        import distributed
    except ImportError as exc:
        raise DistributedError(
            f"--dask (dask=) runs the work on a Dask cluster, but Dask distributed cannot be "
            f"imported ({exc}); install it with pip install 'ddlsim[dask]', or run without "
            f"--dask") from None
    return distributed


@contextmanager
def dask_client(dask: Any, workers: int | None = None):
    """A :class:`distributed.Client` for ``dask`` (``"local"``, an address or a Client),
    closed (with its local cluster) on exit unless it was given."""
    if not isinstance(dask, str):
        if not hasattr(dask, "submit") or not hasattr(dask, "scatter"):
            raise DistributedError(f"dask = {dask!r} is not allowed; give None, 'local', a "
                                   f"scheduler address or a distributed.Client")
        if workers is not None:
            raise DistributedError("workers (--dask-workers) applies only to dask='local'")
        yield dask
        return
    distributed = _import_distributed()
    if dask == "local":
        n = DEFAULT_WORKERS if workers is None else workers
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise DistributedError(f"--dask-workers (workers=) = {n!r}: the local cluster "
                                   f"needs a whole number of worker processes >= 1")
        with distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            yield client
        return
    if workers is not None:
        raise DistributedError(f"--dask-workers (workers=) applies only to --dask local, not "
                               f"to the scheduler {dask!r}, whose workers are its own")
    try:
        client = distributed.Client(dask, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise DistributedError(
            f"--dask {dask!r}: no Dask scheduler could be reached there (connection timeout "
            f"{CONNECT_TIMEOUT_S:g} s; {type(exc).__name__}: {exc}); give 'local' for a "
            f"cluster on this machine, or the address a scheduler prints, e.g. "
            f"tcp://host:8786") from None
    with client:
        yield client


def _batch(fn: Callable, shared: tuple, items: Sequence[Any]) -> list[Any]:
    """``[fn(*shared, item) for item in items]``, run on a worker; an exception carries the
    position of its item in ``ddlsim_item``."""
    out = []
    for k, item in enumerate(items):
        try:
            out.append(fn(*shared, item))
        except Exception as exc:
            exc.ddlsim_item = k
            raise
    return out


def run_on_dask(fn: Callable, shared: Sequence[Any], items: Sequence[Any], dask: Any,
                workers: int | None = None, describe: Callable[[Any], str] = repr,
                progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``[fn(*shared, item) for item in items]`` computed on a Dask cluster.

    Parameters
    ----------
    fn : a module-level function (workers import it by name).
    shared : arguments every call gets first; sent to the workers once (scattered).
    items : the last argument of each call, in the order the results are returned.
    dask : ``"local"``, a scheduler address, or a :class:`distributed.Client`.
    workers : worker processes of ``"local"`` (default :data:`DEFAULT_WORKERS`).
    describe : names an item in the message of a task that failed.
    progress : called with (items done, total) as batches complete.

    Returns
    -------
    list
        The results, in the order of ``items``.

    Raises
    ------
    DistributedError
        Dask missing, the scheduler unreachable, or a call that raised (the message names its
        item and the exception; the original is its ``__cause__``).
    """
    items = list(items)
    size = max(1, math.ceil(len(items) / MAX_TASKS))
    starts = range(0, len(items), size)
    results: list[Any] = [None] * len(items)
    with dask_client(dask, workers) as client:
        distributed = _import_distributed()
        # hash=False: unique keys, so a second sweep on the same client cannot lose the data
        # when the first one releases its (otherwise identical, content-hashed) keys
        sent = client.scatter(list(shared), broadcast=True, hash=False)
        futures = {client.submit(_batch, fn, tuple(sent), items[i:i + size], pure=False): i
                   for i in starts}
        done = 0
        for future in distributed.as_completed(futures):
            i = futures[future]
            try:
                results[i:i + size] = future.result()
            except Exception as exc:
                for f in futures:
                    f.cancel()
                item = items[i + getattr(exc, "ddlsim_item", 0)]
                raise DistributedError(
                    f"a Dask task failed on {describe(item)}: {type(exc).__name__}: {exc}"
                ) from exc
            done += len(items[i:i + size])
            if progress is not None:
                progress(done, len(items))
    return results

