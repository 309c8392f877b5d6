"""Collective algorithms: the registry, and what every algorithm is timed and laid out on.

Both engines read this one package. The analytical engine calls :meth:`Algorithm.time` with a
:class:`GroupNet` (what the group's links look like from where its ranks sit). The
discrete-event engine replays :meth:`Algorithm.phases`: each :class:`Phase` is a set of
concurrent point-to-point transfers between *member indices* of the group, repeated ``repeat``
times, plus ``latency_steps`` per-message latencies (or a given ``latency_s``). Without
contention, replaying the phases over the same links gives the closed form (this is tested).

Every algorithm belongs to one backend: ``mpi`` (the generic α-β set of
:mod:`.mpi`), ``nccl`` (:mod:`.nccl`) or ``openmpi`` (an algorithm only Open
MPI's rules pick, :mod:`.openmpi`); ``auto`` picks the cheapest of the configured backend's
algorithms only (``mpich`` and ``openmpi`` apply their library's rules, :mod:`.selection`). Adding an algorithm is one function pair plus
``@register(op, name)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...errors import ConfigError

__all__ = ["GroupNet", "Phase", "Algorithm", "register", "get_algorithm", "algorithms_for",
           "collective_time", "best_algorithm", "BUSBW_FACTOR", "register_uneven",
           "register_chooser",
           "split_matrix", "split_weights", "uneven_time", "best_uneven_algorithm", "BACKENDS",
           "LayoutFn",
           "register_parametric", "registry_generation"]


@dataclass(frozen=True, slots=True)
class GroupNet:
    """The links one group crosses, as the analytical engine sees them.

    Parameters
    ----------
    p : ranks in the group.
    g : members of the group per node, the most on any node (``p`` when it fits in one).
    alpha_intra_s, bw_intra_Bps : latency and per-device bandwidth inside a node.
    alpha_inter_s : latency of a message that crosses nodes (NIC + fabric).
    bw_node_Bps : bandwidth out of (and into) one node available to *this* group: the node's
        NICs divided among the groups of the same family that run at the same time there.
    """

    p: int
    g: int
    alpha_intra_s: float
    bw_intra_Bps: float
    alpha_inter_s: float = 0.0
    bw_node_Bps: float = math.inf
    nodes: int = 1
    #: what NCCL's tuning model needs to know of the machine (:class:`.nccl.NcclEnv`)
    nccl: object = None

    @property
    def uniform(self) -> bool:
        """Every node holds exactly ``g`` members (needed by hierarchical algorithms)."""
        return self.nodes * self.g == self.p

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def ring_step(self, chunk: float) -> float:
        """One ring step: every member sends ``chunk`` to its successor; one flow per node
        leaves the node."""
        if not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + chunk / min(self.bw_intra_Bps, self.bw_node_Bps)

    def exchange_step(self, chunk: float, distance: int) -> float:
        """Every member sends ``chunk`` to the member ``distance`` away (recursive doubling,
        pairwise all-to-all): intra-node if the partner shares the node, else all ``g``
        members of a node send out at once and share its NICs."""
        if distance < self.g or not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + max(chunk / self.bw_intra_Bps, chunk * self.g / self.bw_node_Bps)

    def single_step(self, chunk: float, distance: int) -> float:
        """One member sends ``chunk`` to one other (a tree edge); no sharing."""
        if distance < self.g or not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + chunk / min(self.bw_intra_Bps, self.bw_node_Bps)

    @property
    def bottleneck_Bps(self) -> float:
        return min(self.bw_intra_Bps, self.bw_node_Bps) if self.multi_node else self.bw_intra_Bps

    @property
    def alpha_s(self) -> float:
        return self.alpha_inter_s if self.multi_node else self.alpha_intra_s


@dataclass(frozen=True, slots=True)
class Phase:
    """Concurrent transfers ``pairs[k] = (src_member, dst_member)`` of ``bytes`` each,
    repeated ``repeat`` times; ``latency_steps`` per-message latencies per repetition."""

    pairs: np.ndarray
    bytes: float
    repeat: int = 1
    latency_steps: int = 1
    weights: np.ndarray | None = None  # per pair: × bytes (uneven all-to-all)
    #: a given latency per repetition (a tuned model's, e.g. NCCL's), instead of
    #: ``latency_steps`` × the slowest path's latency
    latency_s: float | None = None
    #: a transfer between nodes leaves through the sender's own NIC (its index in the node,
    #: modulo the node's NICs) instead of being striped over every NIC of the node as NCCL's
    #: channels are (DeepEP's and HybridEP's kernels: each GPU's RDMA traffic goes to the
    #: same-index GPU of the other node, :mod:`.flex`)
    own_rail: bool = False


TimeFn = Callable[[float, GroupNet], float]
PhaseFn = Callable[[float, int, int], list[Phase]]
#: ``layout(n, net)``: the phases of one collective of ``n`` bytes on ``net`` with their bytes
#: per collective byte, for algorithms whose layout depends on the size and the machine.
LayoutFn = Callable[[float, GroupNet], list[Phase]]
#: ``time(B, net)``: seconds for the bytes matrix ``B[i, j]`` (member i sends to member j).
UnevenTimeFn = Callable[[np.ndarray, GroupNet], float]
#: ``phases(W, g)``: phases whose pairs carry ``W[i, j]`` bytes per collective byte.
UnevenPhaseFn = Callable[[np.ndarray, int], list[Phase]]
#: ``layout(W, net)``: as :data:`UnevenPhaseFn`, for algorithms whose layout depends on the
#: machine (NCCL's all-to-all: its NVLink transfers at the share NCCL fills).
UnevenLayoutFn = Callable[[np.ndarray, GroupNet], list[Phase]]


@dataclass(frozen=True, slots=True)
class Algorithm:
    op: str
    name: str
    time: TimeFn
    phases: PhaseFn
    uneven_time: UnevenTimeFn | None = None
    uneven_phases: UnevenPhaseFn | None = None
    backend: str = "mpi"
    layout: LayoutFn | None = None
    uneven_layout: UnevenLayoutFn | None = None

    def phases_for(self, n: float, net: GroupNet) -> list[Phase]:
        """Phases of one collective of ``n`` bytes on ``net``, bytes per collective byte."""
        return self.layout(n, net) if self.layout is not None else self.phases(1.0, net.p, net.g)

    def uneven_phases_for(self, W: np.ndarray, net: GroupNet) -> list[Phase] | None:
        """Phases of one uneven collective whose member i sends ``W[i, j]`` of its bytes to
        member j, on ``net`` (its :attr:`uneven_layout`), or None where the algorithm's
        generic :attr:`uneven_phases` hold."""
        return self.uneven_layout(W, net) if self.uneven_layout is not None else None


#: the collective backends; ``auto`` picks among one backend's algorithms
BACKENDS = ("mpi", "nccl", "openmpi")

_REGISTRY: dict[tuple[str, str], Algorithm] = {}
#: how many times the algorithm registries have changed: a cache of choices made from them
#: keys on it (:func:`registry_generation`), so an algorithm registered later is seen
_GENERATION = [0]


def registry_generation() -> int:
    """A number that changes whenever an algorithm, phase decomposition, uneven form,
    parametric resolver or chooser is registered."""
    return _GENERATION[0]


def _changed() -> None:
    _GENERATION[0] += 1
    _parametric.cache_clear()


def register(op: str, name: str, backend: str = "mpi",
             layout: LayoutFn | None = None) -> Callable[[TimeFn], TimeFn]:
    """Register ``time(n, net)`` for ``backend``; its phases are set by :func:`phases_of`
    for the same key, or given as ``layout(n, net)``."""
    def wrap(fn: TimeFn) -> TimeFn:
        _REGISTRY[(op, name)] = Algorithm(op, name, fn, _NO_PHASES, backend=backend,
                                          layout=layout)
        _changed()
        return fn
    return wrap


def phases_of(op: str, name: str) -> Callable[[PhaseFn], PhaseFn]:
    def wrap(fn: PhaseFn) -> PhaseFn:
        from dataclasses import replace
        _REGISTRY[(op, name)] = replace(_REGISTRY[(op, name)], phases=fn)
        _changed()
        return fn
    return wrap


def _NO_PHASES(n: float, p: int, g: int) -> list[Phase]:  # pragma: no cover - guard
    raise NotImplementedError("this algorithm has no phase decomposition")


def register_uneven(op: str, name: str, time: UnevenTimeFn, phases: UnevenPhaseFn,
                    layout: UnevenLayoutFn | None = None) -> None:
    """Give the registered algorithm ``(op, name)`` its uneven (per-pair bytes) forms:
    ``layout`` where its flows depend on the machine (the discrete-event engine then lays
    them out by it, :meth:`Algorithm.uneven_phases_for`)."""
    from dataclasses import replace
    _REGISTRY[(op, name)] = replace(_REGISTRY[(op, name)], uneven_time=time,
                                    uneven_phases=phases, uneven_layout=layout)
    _changed()


#: name prefix → ``resolve(op, name)``: algorithms whose name carries their parameters (the
#: flex dispatcher's kernels per routing, :mod:`.flex`), made on first lookup from the name
#: alone; :func:`algorithms_for` does not list them and ``auto`` never picks them
_PARAMETRIC: dict[str, Callable[[str, str], Algorithm | None]] = {}


def register_parametric(prefix: str):
    """Register ``resolve(op, name)`` -> :class:`Algorithm` (or None) for the algorithm names
    starting with ``prefix``."""
    def wrap(fn):
        _PARAMETRIC[prefix] = fn
        _changed()
        return fn
    return wrap


@lru_cache(maxsize=None)
def _parametric(op: str, name: str) -> Algorithm | None:
    return next((resolve(op, name) for prefix, resolve in _PARAMETRIC.items()
                 if name.startswith(prefix)), None)


def get_algorithm(op: str, name: str) -> Algorithm:
    found = _REGISTRY.get((op, name)) or _parametric(op, name)
    if found is None:
        raise ConfigError(f"no algorithm {name!r} for collective {op!r}; allowed: "
                          f"{', '.join(algorithms_for(op))}")
    return found


def algorithms_for(op: str, backend: str | None = None) -> list[str]:
    """Names of the algorithms for ``op`` (of ``backend`` only, when given)."""
    return [name for (o, name), a in _REGISTRY.items()
            if o == op and (backend is None or a.backend == backend)]


def collective_time(op: str, algorithm: str, nbytes: float, net: GroupNet) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests size convention) on ``net``."""
    if net.p <= 1:
        return 0.0
    return get_algorithm(op, algorithm).time(nbytes, net)


#: backend -> its library's own choice among its algorithms, ``choose(op, n, net)`` -> name
#: or None (a backend without one, or a None, takes the cheapest)
_CHOOSERS: dict[str, Callable[[str, float, GroupNet], str | None]] = {}


def register_chooser(backend: str):
    """Register ``choose(op, n, net)``: the algorithm ``backend``'s library picks itself (NCCL
    by its tuning model's estimate, which is not the time it then takes)."""
    def wrap(fn):
        _CHOOSERS[backend] = fn
        _changed()
        return fn
    return wrap


def best_algorithm(op: str, nbytes: float, net: GroupNet,
                   backend: str = "mpi") -> tuple[str, float]:
    """``backend``'s own choice for ``op`` where it has a chooser (:func:`register_chooser`),
    else the cheapest of its algorithms (ties broken by name, deterministically); an
    algorithm that cannot run here times ``inf``."""
    names = algorithms_for(op, backend) or algorithms_for(op, "mpi")
    if net.p <= 1:
        return names[0], 0.0
    choose = _CHOOSERS.get(backend)
    picked = choose(op, nbytes, net) if choose is not None and names == algorithms_for(
        op, backend) else None
    if picked is not None:
        return picked, _REGISTRY[(op, picked)].time(nbytes, net)
    best = min((_REGISTRY[(op, name)].time(nbytes, net), name) for name in names)
    return best[1], best[0]


def split_matrix(split_bytes, by: str = "receiver") -> np.ndarray:
    """``B[i, j]``: bytes member i sends to member j (the diagonal stays on the device). With
    ``by="receiver"`` every member sends ``split_bytes[j]`` to member j (``B[i, j] = b_j``);
    with ``by="sender"`` member i sends ``split_bytes[i]`` to every member (``B[i, j] = b_i``),
    in group order (docs/trace.md)."""
    split = np.asarray(split_bytes, dtype=np.float64)
    matrix = np.tile(split, (len(split), 1))
    return matrix.T.copy() if by == "sender" else matrix


def split_weights(split_bytes, by: str = "receiver") -> np.ndarray:
    """:func:`split_matrix` per byte of the op (over ``sum(split_bytes)``, the op's
    ``bytes``): the weights an uneven layout lays its pairs out with."""
    return split_matrix(split_bytes, by) / max(float(sum(split_bytes)), 1e-300)


def uneven_time(op: str, algorithm: str, matrix: np.ndarray, net: GroupNet) -> float:
    """Seconds for ``op`` moving ``matrix[i, j]`` bytes from member i to member j, or inf if
    ``algorithm`` has no uneven form."""
    if net.p <= 1:
        return 0.0
    fn = get_algorithm(op, algorithm).uneven_time
    return math.inf if fn is None else fn(matrix, net)


def best_uneven_algorithm(op: str, matrix: np.ndarray, net: GroupNet,
                          backend: str = "mpi") -> tuple[str, float]:
    """The cheapest of ``backend``'s algorithms with an uneven form (ties broken by name), or
    of MPI's where ``backend`` has none: NCCL's all-to-all with uneven sizes is still its
    grouped sends and receives (``nccl_p2p``), not an MPI algorithm."""
    def uneven(b: str) -> list[str]:
        return [name for name in algorithms_for(op, b)
                if _REGISTRY[(op, name)].uneven_time is not None]
    names = uneven(backend) or uneven("mpi")
    best = min((uneven_time(op, name, matrix, net), name) for name in names)
    return best[1], best[0]


#: nccl-tests bus-bandwidth factors (``busbw = algbw × factor``), nccl-tests doc/PERFORMANCE.md.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "barrier": lambda p: 1.0,
}


def _log2(p: int) -> int:
    return max(1, math.ceil(math.log2(p)))


def _ring_pairs(p: int) -> np.ndarray:
    i = np.arange(p)
    return np.stack([i, (i + 1) % p], axis=1)


def _xor_pairs(p: int, d: int) -> np.ndarray:
    i = np.arange(p)
    j = i ^ d
    keep = j < p
    return np.stack([i[keep], j[keep]], axis=1)


