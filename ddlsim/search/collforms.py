"""Collective costs for arrays of plans, from the registered closed forms and NCCL's model.

Two facts make this a reuse rather than a copy of the physics:

* **The generic (``mpi``) closed forms are affine in the message size** ``n`` on a fixed
  network (``α·steps + n·(per-byte terms)``; a ``max`` of two per-byte terms is still linear
  in ``n ≥ 0``). So ``time(n) = time(0) + n·(time(N) − time(0))/N``: two calls of the
  registered scalar function give the coefficients. :func:`affine_form` checks the affinity
  at a third size and refuses a form that is not affine.
* **NCCL's algorithms are not affine** (per protocol, the ring's Simple latency plateau above
  a size threshold and the tree's size-correction table), but their size-independent parts
  are (:func:`~ddlsim.simulator.collectives.nccl.model.nccl_form`), and
  :func:`~ddlsim.simulator.collectives.nccl.model.nccl_seconds_array` evaluates the scalar
  arithmetic on arrays. An NCCL algorithm is the minimum over its protocols (or the configured one).

``"auto"`` is the minimum over the backend's registered algorithms, as
:func:`~ddlsim.simulator.collectives.best_algorithm` takes it; with ``mpich`` or ``openmpi``,
the library's own rule (:func:`~ddlsim.simulator.collectives.selection.library_algorithm`)
is applied to each distinct (group size, members per node, message size), falling back to
the cheapest MPI algorithm where it names none or one that cannot run, as
:meth:`CostModel._closed_form` does. The networks themselves are the meshes'
(:func:`.netcost.mesh_networks`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError
from ..simulator.collectives import GroupNet, algorithms_for, collective_time
from ..simulator.collectives.nccl.choice import NCCL_ORDER
from ..simulator.collectives.nccl.measured import FILL_EDGES
from ..simulator.collectives.nccl.model import nccl_form, nccl_seconds_array, tuned_algorithm
from ..simulator.collectives.nccl.tuning import PROTOCOLS
from ..simulator.collectives.selection import LIBRARIES

__all__ = ["affine_form", "check_affine", "collective_seconds", "PROBE_BYTES"]

#: The size at which the slope of a closed form is probed (1 GiB: large enough that the
#: latency term does not swamp the per-byte term in float64).
PROBE_BYTES = float(2 ** 30)


@lru_cache(maxsize=65536)
def affine_form(op: str, algorithm: str, net: GroupNet) -> tuple[float, float]:
    """``(a, b)`` with ``time(n) = a + b·n`` for the registered form of ``op``/``algorithm``
    on ``net`` (``(inf, 0)`` where the form cannot run there, e.g. hierarchical on uneven
    placement). Cached: a pure function of the registered forms and a frozen network.
    :func:`check_affine` verifies the premise (``tests/test_search_costs.py`` runs it for
    every registered algorithm).
    """
    a = collective_time(op, algorithm, 0.0, net)
    if not math.isfinite(a):
        return math.inf, 0.0
    return a, (collective_time(op, algorithm, PROBE_BYTES, net) - a) / PROBE_BYTES


def check_affine(op: str, algorithm: str, net: GroupNet, rel: float = 1e-9) -> None:
    """Raise :class:`ConfigError` if the registered form is not affine in the message size
    on ``net`` (checked at a third size)."""
    a, b = affine_form(op, algorithm, net)
    if not math.isfinite(a):
        return
    mid = collective_time(op, algorithm, PROBE_BYTES / 3, net)
    if abs(mid - (a + b * PROBE_BYTES / 3)) > rel * max(mid, 1e-30):
        raise ConfigError(f"collective {op!r} algorithm {algorithm!r} is not affine in the "
                          "message size, so the vectorised search tier cannot time it; give "
                          "it a vectorised form in ddlsim/search/collforms.py or fix "
                          "parallel.collective_algorithm to another algorithm")


class _Forms(NamedTuple):
    """The candidate forms of one (op, family, choice) over the meshes: affine ``a + b·n``
    (arrays of shape (forms, meshes)) and NCCL's per algorithm and protocol, in the order
    NCCL's tuner scans them (``(order, proto or None, lat, plateau latency, plateau divisor,
    algBw, NCCL's estimated algBw, *fill edges, *fills)``, arrays of shape (meshes,)); the
    time is the minimum of the affine forms and of the NCCL form NCCL's estimate picks."""

    a: np.ndarray
    b: np.ndarray
    nccl: list[tuple]


def _distinct(fams: list[GroupNet]) -> tuple[list[GroupNet], np.ndarray]:
    """The distinct networks of ``fams`` and, per mesh, the index of its own among them.
    Meshes share most of a family's networks (the tp groups of every mesh with the same TP,
    …), mostly as one object: they are told apart by identity first, then by value."""
    by_id: dict[int, int] = {}
    by_value: dict[GroupNet, int] = {}
    spread = np.empty(len(fams), dtype=np.int64)
    for i, net in enumerate(fams):
        j = by_id.get(id(net))
        if j is None:
            j = by_id[id(net)] = by_value.setdefault(net, len(by_value))
        spread[i] = j
    return list(by_value), spread


def _nccl_forms(op: str, name: str, distinct: list[GroupNet], spread: np.ndarray) -> list[tuple]:
    """One entry per protocol NCCL may run ``name`` with (all of them with ``auto``); a
    group of one rank costs 0, an algorithm NCCL would not run there ``inf``. The forms are
    computed once per distinct network (:func:`_distinct`) and spread over the meshes."""
    # the networks' NCCL environments, told apart by identity (most share one object):
    # the same protocols as by value, without hashing each environment's fields
    envs = {id(net.nccl): net.nccl for net in distinct if net.nccl is not None}
    protos = set()
    for env in envs.values():
        protos |= set(PROTOCOLS if env.protocol == "auto" else (env.protocol,))
    out = []
    # the fill's edges, levels and slope, then the channel rule (bytes a channel, channels)
    no_fill = (math.inf,) * FILL_EDGES + (0.0,) * (FILL_EDGES + 1) + (math.inf, 0.0, 1.0)
    algo = name.removeprefix("nccl_")
    for proto in sorted(protos, key=PROTOCOLS.index):
        columns = []   # per distinct network: 4 parts, estimate, fill (one array at the end)
        corrected = False
        timed = False   # some network's latency is not infinite (else the form is dropped)
        for net in distinct:
            env = net.nccl
            runs = env is not None and (env.protocol in ("auto", proto))
            form = nccl_form(op, algo, proto, net, env) if runs and net.p > 1 else None
            if net.p <= 1:
                columns.append((0.0, 0.0, math.inf, math.inf, math.inf, *no_fill))
                timed = True
            elif form is None:
                columns.append((math.inf, math.inf, math.inf, 1.0, 1.0, *no_fill))
            else:
                columns.append((*form[:4], form.estimate_algbw_GBps, *form.fill_edges,
                                *form.fill_us, form.fill_slope, form.channel_bytes,
                                form.channels))
                corrected = form.corrected
                timed = timed or not math.isinf(form[0])
        if not timed:   # NCCL runs it on none of them (NVLS without NVSwitch's SHARP, …)
            continue
        parts = np.array(columns, dtype=float).reshape(len(distinct), 5 + len(no_fill)).T.copy()
        order = (NCCL_ORDER.index(algo), PROTOCOLS.index(proto))
        out.append((order, proto if corrected else None, *parts[:, spread]))
    return out


def _tuned(op: str, name: str) -> bool:
    """Whether ``name`` is timed by NCCL's tuning model's forms
    (:func:`~ddlsim.simulator.collectives.nccl.model.tuned_algorithm`); the others, NCCL's
    all-to-all (``nccl_p2p``) among them, are affine."""
    return tuned_algorithm(op, name) is not None


def _forms(op: str, family: str, nets: list[dict[str, GroupNet]], names: list[str]) -> _Forms:
    """The candidate forms of the algorithms ``names``. An affine form no faster than another
    on every mesh at every size (``a`` and ``b`` both no smaller) cannot be the minimum and
    is dropped."""
    distinct, spread = _distinct([per_mesh[family] for per_mesh in nets])
    affine = [n for n in names if not _tuned(op, n)]
    a = np.zeros((len(affine), len(distinct)))
    b = np.zeros_like(a)
    for j, net in enumerate(distinct):
        if net.p <= 1:
            continue
        for i, name in enumerate(affine):
            a[i, j], b[i, j] = affine_form(op, name, net)
    a, b = a[:, spread], b[:, spread]
    keep = [i for i in range(len(affine))
            if not any(np.all(a[i] >= a[k]) and np.all(b[i] >= b[k])
                       and (np.any(a[i] > a[k]) or np.any(b[i] > b[k]) or k < i)
                       for k in range(len(affine)) if k != i)]
    nccl = sorted((f for n in names if _tuned(op, n)
                   for f in _nccl_forms(op, n, distinct, spread)), key=lambda f: f[0])
    return _Forms(a[keep], b[keep], nccl)


def _min_time(forms: _Forms, nbytes: np.ndarray, mesh_index: np.ndarray,
              memo: dict | None = None) -> np.ndarray:
    """The minimum over ``forms`` of each plan's time (``inf`` where none runs), computed once
    per distinct (mesh, size): a grid's plans share far fewer of them than they number.
    ``memo`` keeps the distinct pairs of each array of sizes asked again (several collectives
    move the same bytes), per ``mesh_index`` object."""
    index_given = mesh_index
    nbytes, mesh_index = np.broadcast_arrays(np.asarray(nbytes, dtype=float),
                                             np.asarray(mesh_index))
    if nbytes.ndim == 1 and len(nbytes) > 64:
        key = ("distinct sizes", id(index_given), nbytes.tobytes())
        got = None if memo is None else memo.get(key)
        if got is None:
            got = (*_distinct_pairs(nbytes, mesh_index), index_given)  # keeps its id taken
            if memo is not None:
                memo[key] = got
        order, first, group, _ = got
        if group is not None:
            times = _min_time_each(forms, nbytes[order][first], mesh_index[order][first])
            out = np.empty(len(order))
            out[order] = times[group]
            return out
    return _min_time_each(forms, nbytes, mesh_index)


def _distinct_pairs(nbytes: np.ndarray, mesh_index: np.ndarray) -> tuple:
    """``(order, first, group)``: the plans sorted by (mesh, size), the first of each distinct
    pair in that order, and each sorted plan's pair; ``group`` None when fewer than half the
    plans repeat one (then the plans are timed one by one)."""
    order = np.lexsort((nbytes, mesh_index))
    n_s, m_s = nbytes[order], mesh_index[order]
    first = np.empty(len(order), dtype=bool)
    first[0] = True
    first[1:] = (n_s[1:] != n_s[:-1]) | (m_s[1:] != m_s[:-1])
    if first.sum() * 2 >= len(order):
        return order, first, None
    return order, first, np.cumsum(first) - 1


def _min_time_each(forms: _Forms, nbytes: np.ndarray, mesh_index: np.ndarray) -> np.ndarray:
    best = np.full(nbytes.shape, math.inf)
    if len(forms.a):
        best = (forms.a[:, mesh_index] + forms.b[:, mesh_index] * nbytes).min(axis=0)
    # NCCL's pick by its estimate, then the time taken by the picked form only (most forms
    # are picked nowhere: their time is not asked)
    least, pick = np.full(nbytes.shape, math.inf), np.full(nbytes.shape, -1)
    for i, (_, proto, lat, high, div, _, estimate, *_) in enumerate(forms.nccl):
        guess = nccl_seconds_array(nbytes, lat[mesh_index], high[mesh_index], div[mesh_index],
                                   estimate[mesh_index], proto)
        better = guess < least  # NCCL keeps the first of equal estimates
        least, pick = np.where(better, guess, least), np.where(better, i, pick)
    picked = np.full(nbytes.shape, math.inf)
    for i in np.unique(pick[pick >= 0]).tolist():
        _, proto, lat, high, div, bw, _, *fill, slope, q, nch = forms.nccl[i]
        edges, fills = fill[:len(fill) // 2], fill[len(fill) // 2:]
        took = nccl_seconds_array(nbytes, lat[mesh_index], high[mesh_index], div[mesh_index],
                                  bw[mesh_index], proto, [e[mesh_index] for e in edges],
                                  [f[mesh_index] for f in fills], slope[mesh_index],
                                  q[mesh_index], nch[mesh_index])
        picked = np.where(pick == i, took, picked)
    return np.minimum(best, picked)


def _library_time(backend: str, op: str, family: str, nbytes: np.ndarray,
                  mesh_index: np.ndarray, nets: list[dict[str, GroupNet]],
                  fallback: np.ndarray) -> np.ndarray:
    """The library's pick for each distinct (group size, members per node, size), timed by
    its affine form where it runs, else ``fallback`` (the cheapest MPI algorithm)."""
    from ..simulator.collectives.selection import library_algorithm

    p = np.array([per_mesh[family].p for per_mesh in nets])[mesh_index]
    g = np.array([per_mesh[family].g for per_mesh in nets])[mesh_index]
    keys, inverse = np.unique(np.stack([p.astype(float), g.astype(float), nbytes]), axis=1,
                              return_inverse=True)
    picked = np.array([library_algorithm(backend, op, n, int(q), int(h)) or ""
                       for q, h, n in keys.T])[inverse.ravel()]
    out = fallback.copy()
    for name in sorted(set(picked.tolist()) - {""}):
        t = _min_time(_forms(op, family, nets, [name]), nbytes, mesh_index)
        use = (picked == name) & np.isfinite(t)
        out[use] = t[use]
    return out


def collective_seconds(op: str, family: str, nbytes: np.ndarray, mesh_index: np.ndarray,
                       nets: list[dict[str, GroupNet]],
                       algorithms: Mapping[str, str] | None = None,
                       memo: dict | None = None, backend: str = "mpi") -> np.ndarray:
    """Seconds of one ``op`` of ``nbytes[i]`` bytes on family ``family`` of plan i's mesh
    (``mesh_index[i]`` into ``nets``), with the configured algorithm or, with ``auto``, the
    choice of ``backend`` (:attr:`MeshNets.backend`); ``memo`` keeps the forms of each
    (op, family, choice) between calls on the same ``nets``.

    The same numbers as :meth:`ddlsim.simulator.costs.CostModel.collective` to rounding
    (``tests/test_search_costs.py``).
    """
    choice = (algorithms or {}).get(op, "auto")
    key = (op, family, choice, backend)
    forms = None if memo is None else memo.get(key)
    if forms is None:
        if choice != "auto":
            names = [choice]
        else:
            generic = "mpi" if backend in LIBRARIES else backend
            names = algorithms_for(op, generic) or algorithms_for(op, "mpi")
        forms = _forms(op, family, nets, names)
        if memo is not None:
            memo[key] = forms
    nbytes = np.asarray(nbytes, dtype=float)
    times = _min_time(forms, nbytes, mesh_index, memo)
    if choice == "auto" and backend in LIBRARIES:
        times = _library_time(backend, op, family, nbytes, mesh_index, nets, times)
    return times
