"""Closed-form costs of single ops: compute (roofline), collectives (per algorithm of the
system's collective backend, NCCL's tuning model or α-β, on the links each group family
crosses, measured on the topology graph: :mod:`.netmodel`) and point-to-point transfers.

Compute: the kernel-level model of :mod:`.kernels` (docs/compute.md): an op made of kernels
(GEMM shapes, attention, memory passes) takes the sum of their times; an op given as FLOPs and
bytes only takes ``max(FLOPs / (peak[dtype] · η_max), bytes / achieved memory bandwidth)``. A
calibration profile's measured efficiency curve replaces the GEMM shape model where it has one.
"""

from __future__ import annotations

import math
from functools import lru_cache
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ..config import SystemConfig
from ..errors import ConfigError
from ..units import format_bytes
from ..workloads.trace import Collective, Compute, GroupFamily, P2P, Workload
from .backend_rules import resolve_backend
from .collectives import (GroupNet, Phase, best_algorithm, best_uneven_algorithm,
                          collective_time, get_algorithm, registry_generation, split_matrix,
                          split_weights, uneven_time)
from .profilesize import profile_size
from .sharedcopies import SharedCopies, node_copies

__all__ = ["CostModel", "CollectiveChoice", "place_ranks_on_system"]

#: group nets per (system, family layout): measuring them on the graph is the costly part
_NETS: dict[tuple, GroupNet] = {}
#: point-to-point bandwidth between nodes per system and family layout
#: (:func:`.netmodel.p2p_node_bw`)
_P2P: dict[tuple, float] = {}
#: the closed forms' choices (no calibration profile) per what they are a function of: the op,
#: its group's name (in the key it reports), size and split, the algorithm asked (the op's,
#: the plan's), the backend and the group's network (NCCL's view of the machine in it); plans
#: of a sweep, and a plan predicted again, share most of them (:meth:`CostModel.choice`).
#: The key holds the registries' generation (:func:`.collectives.registry_generation`), so an
#: algorithm or chooser registered after a choice was made is seen by the next one.
_CHOICES: dict[tuple, "CollectiveChoice"] = {}
_CHOICES_MAX = 4096


class CollectiveChoice(NamedTuple):
    """How one collective is timed: ``algorithm`` is the closed form laid out as flows (the
    DES) and ``label`` what the result's ``algorithms`` reports under ``key`` (the algorithm,
    or ``"<backend> (calibrated)"`` when a calibration profile timed it, with
    :func:`.profilesize.profile_size`'s note for an uneven all-to-all); ``closed_form_s``:
    when a profile timed it (``time_s``), the seconds the closed form of ``algorithm`` gives
    (the DES stretches the algorithm's flows by their ratio: :mod:`.des.calibrated`), else
    None."""

    key: str
    label: str
    algorithm: str
    time_s: float
    closed_form_s: float | None = None


class _Shape(NamedTuple):
    """What rank placement needs to know of a system (no graph to build)."""

    name: str
    num_nodes: int
    devices_per_node: int
    num_devices: int


def place_ranks_on_system(system: SystemConfig, num_ranks: int) -> np.ndarray:
    """Device id of each rank, by the system's placement policy (see
    :func:`ddlsim.topologies.place_ranks`; the same function places ranks for the DES)."""
    from ..topologies.placement import place_ranks

    shape = _Shape(system.name, system.nodes, system.devices_per_node, system.num_devices)
    return place_ranks(shape, num_ranks, system.placement)  # type: ignore[arg-type]


class CostModel:
    """Costs for one workload on one system (and optionally a calibration profile).

    Parameters
    ----------
    system : the cluster.
    workload : the trace (its group families are costed where their ranks sit).
    collective_algorithm : the algorithm per collective op (``"auto"``, the default, picks
        the cheapest of the backend's algorithms, ``system.collectives.backend``); an op's own
        ``algorithm`` overrides it.
    devices : device id of each rank (``place_ranks_on_system`` when None); compute it once
        per prediction and pass it to every cost model and the DES.
    profile, backend, bound : a calibration profile, its backend (``"auto"``: the fastest)
        and ``"lo"``/``"hi"`` to use its interval ends.
    system_key : ``system.model_dump_json()`` when the caller has it already.
    """

    def __init__(self, system: SystemConfig, workload: Workload,
                 collective_algorithm: Mapping[str, str] | None = None, *,
                 devices: np.ndarray | None = None, profile=None, backend: str | None = None,
                 bound: str | None = None, system_key: str | None = None):
        self.system = system
        self.collective_algorithm = dict(collective_algorithm or {})
        self.profile = profile
        self.backend = backend
        self.bound = bound  # None, "lo" or "hi": use the profile's interval ends
        #: a node's transfers at once share its memory, where the profile measured it
        self.copies = SharedCopies(profile, backend)
        if devices is None:
            devices = place_ranks_on_system(system, workload.world_size)
        self.devices = devices
        self.node_of_rank = devices // system.devices_per_node
        self.ranks_per_node = np.bincount(self.node_of_rank, minlength=system.nodes)
        self.comm_backend, self._nccl = resolve_backend(system, self.collective_algorithm)
        #: ``system.model_dump_json()``, the group networks' cache key (given by callers
        #: that build many cost models for one system)
        self._system_key = system_key
        self.nets = {name: self._group_net(fam) for name, fam in workload.groups.items()}
        self._families = workload.groups
        self._p2p_memo: dict[str, float] = {}
        self.kind = {name: fam.kind for name, fam in workload.groups.items()}
        self._coll = lru_cache(maxsize=None)(self._choice_uncached)
        #: (backend, op, scope) -> sizes asked outside the profile's measured range
        self.out_of_range: dict[tuple[str, str, str], dict] = {}
        from .kernels import kernel_device
        self._dev = kernel_device(system)
        self._peak = self._dev.peak
        self._measured = self._profile_efficiency if (
            profile is not None and profile.has_compute) else None
        #: (kernel, measured efficiency) -> seconds: a kernel met again (the same GEMM in
        #: several blocks or stages) timed once per cost model (:func:`.kernels.op_time`)
        self._kernels: dict = {}

    # ------------------------------------------------------------------ networks
    def _layout_key(self, fam: GroupFamily) -> tuple:
        """The cache key of a family's networks: the system and where its ranks sit."""
        if self._system_key is None:
            self._system_key = self.system.model_dump_json()
        return (self._system_key, self.devices[fam.members].tobytes(), fam.members.shape)

    def _group_net(self, fam: GroupFamily) -> GroupNet:
        """The family's links, measured on the topology graph (:func:`.netmodel.family_net`),
        cached per system and family layout."""
        key = self._layout_key(fam)
        net = _NETS.get(key)
        if net is None:  # NCCL's view of the machine follows from the system, in the key
            from .netmodel import family_net, topology_of   # here: a hit imports nothing
            topo = topology_of(self.system, self._system_key)
            net = family_net(self.system, topo, self.devices, fam.members, self._nccl)
            _NETS[key] = net
            if len(_NETS) > 256:
                _NETS.pop(next(iter(_NETS)))
        return net

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s of one device at ``dtype`` (the device's ``peak_flops`` entry)."""
        return self._peak[dtype]

    # ------------------------------------------------------------------ op costs
    def compute(self, op: Compute) -> float:
        """Seconds of one compute op (:func:`.kernels.op_time`; ``op.seconds`` as given)."""
        if op.seconds is not None:  # a given duration (proxy sleep, measured kernel)
            return op.seconds
        if op.contention is not None:  # overlapped GEMMs' extra time (.kernels.contention)
            return self._contention(op)
        from .kernels import op_time
        return op_time(op, self._dev, self._measured, self._kernels)

    def _contention(self, op: Compute) -> float:
        """Seconds of a contention op: its collectives' time on their groups, one after
        another, NCCL's channels the most any of their groups has
        (:func:`.kernels.contention.contention_seconds`)."""
        from .kernels.contention import contention_seconds, nccl_ring_ctas
        colls = op.contention.collectives
        comm = sum(k * self.collective(c) for c, k in op.contention.issues())
        ctas = max((nccl_ring_ctas(self.system, self.nets[c.group]) for c in colls), default=0) \
            if self.comm_backend == "nccl" else 0
        return contention_seconds(op, self._dev, ctas, comm)

    def _profile_efficiency(self, flops: float, dtype: str, shape=None,
                            batch: float = 1) -> float | None:
        """The calibration profile's GEMM efficiency at ``flops`` (of ``batch`` × ``shape``
        (M, N, K) where the profile measured that shape), None for an uncalibrated dtype
        (the kernel model's is kept)."""
        from ..calibration.schema import CalibrationError
        try:
            return self.profile.compute_efficiency(flops, dtype, shape=shape, batch=batch)
        except CalibrationError:
            return None

    def collective(self, op: Collective) -> float:
        """Seconds for one issue of ``op`` (0 on a group of one rank)."""
        choice = self.choice(op)
        return 0.0 if choice is None else choice.time_s

    def choice(self, op: Collective) -> CollectiveChoice | None:
        """How ``op`` is timed, or None on a group of one rank (nothing to choose)."""
        nbytes = op.bytes if op.split_bytes is None else float(sum(op.split_bytes))
        return self._coll(op.op, op.group, nbytes, op.algorithm, op.split_bytes, op.split_by)

    def _choice_uncached(self, kind: str, group: str, nbytes: float, algo: str | None,
                         split: tuple[float, ...] | None, split_by: str = "receiver"
                         ) -> CollectiveChoice | None:
        net = self.nets[group]
        if net.p <= 1:
            return None
        if self.profile is None:
            return self._closed_choice(kind, group, nbytes, algo, split, split_by, net)
        name, t = self._closed_form(kind, group, nbytes, algo, split, split_by)
        size, how = profile_size(nbytes, split)
        got, outside = self._profile_lookup(kind, size, net)
        if got is not None:
            backend, t_profile = got
            return CollectiveChoice(f"{kind}[{format_bytes(nbytes)}]",
                                    f"{backend} (calibrated){how}", name, t_profile, t)
        if outside:
            return CollectiveChoice(f"{group}.{kind}[{format_bytes(nbytes)}]",
                                    f"{name} (preset: outside profile range)", name, t)
        return CollectiveChoice(f"{group}.{kind}[{format_bytes(nbytes)}]",
                                self._label(kind, name, nbytes, net), name, t)

    def _closed_choice(self, kind: str, group: str, nbytes: float, algo: str | None,
                       split: tuple[float, ...] | None, split_by: str, net: GroupNet
                       ) -> CollectiveChoice:
        """The closed form's choice (no calibration profile), made once per what it depends
        on (:data:`_CHOICES`): another cost model asking it on an equal network takes it."""
        key = (kind, group, nbytes, algo, split, split_by, self.collective_algorithm.get(kind),
               self.comm_backend, net, registry_generation())
        got = _CHOICES.get(key)
        if got is None:
            name, t = self._closed_form(kind, group, nbytes, algo, split, split_by)
            got = CollectiveChoice(f"{group}.{kind}[{format_bytes(nbytes)}]",
                                   self._label(kind, name, nbytes, net), name, t)
            if len(_CHOICES) >= _CHOICES_MAX:
                _CHOICES.pop(next(iter(_CHOICES)))
            _CHOICES[key] = got
        return got

    def _label(self, kind: str, name: str, nbytes: float, net: GroupNet) -> str:
        """The algorithm, with the protocol NCCL would run for NCCL's."""
        from .collectives.nccl import best_protocol
        from .collectives.nccl.model import tuned_algorithm
        algo = tuned_algorithm(kind, name)
        if algo is None:      # not a tuned NCCL algorithm: no protocol (NCCL's all-to-all)
            return name
        return f"{name}/{best_protocol(kind, algo, nbytes, net, net.nccl)[0]}"

    def phases(self, op: Collective, algorithm: str,
               weights: np.ndarray | None = None) -> list[Phase] | None:
        """The flows the DES replays for ``op`` timed by ``algorithm``, bytes per collective
        byte (:meth:`Algorithm.phases_for`; uneven sizes: :meth:`Algorithm.uneven_phases_for`,
        None where the algorithm's generic uneven phases hold). ``weights``: the op's
        :func:`split_weights` where the caller has them already (else computed here)."""
        algo, net = get_algorithm(op.op, algorithm), self.nets[op.group]
        if op.split_bytes is not None:
            if weights is None:
                weights = split_weights(op.split_bytes, op.split_by)
            return algo.uneven_phases_for(weights, net)
        return algo.phases_for(op.bytes, net)

    def _closed_form(self, kind: str, group: str, nbytes: float, algo: str | None,
                     split: tuple[float, ...] | None, split_by: str = "receiver"
                     ) -> tuple[str, float]:
        """(algorithm, seconds): the op's own, the configured one, or the cheapest."""
        net = self.nets[group]
        matrix = None if split is None else split_matrix(split, split_by)
        choice = algo or self.collective_algorithm.get(kind, "auto")
        from .collectives.selection import LIBRARIES, library_algorithm
        if choice == "auto" and self.comm_backend in LIBRARIES and matrix is None:
            picked = library_algorithm(self.comm_backend, kind, nbytes, net.p, net.g)
            t = collective_time(kind, picked, nbytes, net) if picked else math.inf
            if math.isfinite(t):
                return picked, t
        if choice == "auto":
            backend = "mpi" if self.comm_backend in LIBRARIES else self.comm_backend
            return best_algorithm(kind, nbytes, net, backend) if matrix is None \
                else best_uneven_algorithm(kind, matrix, net, backend)
        algorithm = get_algorithm(kind, choice)
        if algorithm.backend == "nccl" and net.nccl is None:
            raise ConfigError(f"collective_algorithm.{kind} = {choice!r} is NCCL's and needs "
                              f"the GPU generation: device.name {self.system.device.name!r} "
                              "names none; set system.collectives.gpu_arch")
        t = collective_time(kind, choice, nbytes, net) if matrix is None \
            else uneven_time(kind, choice, matrix, net)
        if not math.isfinite(t):
            why = ("NCCL does not run it here (NVLS needs Hopper or later with NVSwitch and "
                   "more than 2 of the group's GPUs on a node, "
                   "CollNet needs system.collectives.sharp and several nodes; LL128 needs "
                   "NVLink)") if algorithm.backend == "nccl" \
                else "its ranks are not spread evenly over nodes" if matrix is None \
                else "it has no form for uneven (split_bytes) sizes"
            raise ConfigError(f"collective_algorithm.{kind} = {choice!r} cannot run on group "
                              f"{group!r} ({why}); choose another algorithm or 'auto'")
        return choice, t

    def profile_time(self, kind: str, nbytes: float, net: GroupNet) -> tuple[str, float] | None:
        """(backend, seconds) from the calibration profile (the fastest backend with
        ``auto``), or None if the profile does not cover this operation and scope, or did not
        measure this size (the closed forms are used; an unmeasured size is recorded in
        :attr:`out_of_range`)."""
        return self._profile_lookup(kind, nbytes, net)[0]

    def _profile_lookup(self, kind: str, nbytes: float, net: GroupNet
                        ) -> tuple[tuple[str, float] | None, bool]:
        """:meth:`profile_time`'s answer, and whether the size lay outside every measured
        range of the backends that cover this operation and scope."""
        prof = self.profile
        scope = "inter" if net.multi_node else "intra"
        explicit = self.backend not in (None, "auto")
        times, outside = [], []
        for backend in (self.backend,) if explicit else prof.backends:
            try:
                lo, hi = prof.measured_range(backend, kind, net.p, scope)
            except KeyError:
                continue
            if lo <= nbytes <= hi:
                times.append((prof.time_s(backend, kind, nbytes, net.p, scope), backend))
            else:
                outside.append((backend, lo, hi))
        if not times:
            for backend, lo, hi in outside:
                self._record_outside(backend, kind, scope, lo, hi, nbytes)
            return None, bool(outside)
        t, backend = min(times)
        if self.bound is not None:
            lo_t, hi_t = prof.interval_s(backend, kind, nbytes, net.p, scope)
            t = lo_t if self.bound == "lo" else hi_t
        return (backend, t), False

    def _record_outside(self, backend: str, op: str, scope: str, lo: float, hi: float,
                        nbytes: float) -> None:
        rec = self.out_of_range.setdefault((backend, op, scope), {
            "backend": backend, "op": op, "scope": scope, "measured_min_bytes": lo,
            "measured_max_bytes": hi, "sizes_bytes": []})
        if nbytes not in rec["sizes_bytes"]:
            rec["sizes_bytes"] = sorted([*rec["sizes_bytes"], nbytes])

    def out_of_range_report(self) -> list[dict]:
        """One record per (backend, op, scope) the profile was asked outside its measured
        sizes, sorted, each with its ``message`` (the warning :func:`ddlsim.predict` emits)."""
        name = getattr(getattr(self.profile, "doc", None), "name", None)
        what = f"calibration profile {name!r}" if name else "the calibration profile"
        out = []
        for key in sorted(self.out_of_range):
            rec = dict(self.out_of_range[key])
            sizes = [format_bytes(b) for b in rec["sizes_bytes"]]
            many = len(sizes) > 1
            rec["message"] = (
                f"{what} measured {rec['backend']} {rec['op']} ({rec['scope']}-node) from "
                f"{format_bytes(rec['measured_min_bytes'])} to "
                f"{format_bytes(rec['measured_max_bytes'])}; {', '.join(sizes)} "
                f"{'are' if many else 'is'} outside it, so the preset model is used for "
                f"{'them' if many else 'it'}")
            out.append(rec)
        return out

    def p2p(self, op: P2P, src: int, dst: int) -> float:
        """Seconds to move ``op.bytes`` from rank ``src`` to rank ``dst``. Between nodes the
        transfer goes through the receiver's rail only, as NCCL's send/recv does
        (:func:`.netmodel.p2p_node_bw`), not over every NIC as a collective's channels."""
        net = self.nets[op.group]
        if self.node_of_rank[src] != self.node_of_rank[dst]:
            return net.alpha_inter_s + op.bytes / min(net.bw_intra_Bps, self._p2p_bw(op.group))
        return net.alpha_intra_s + op.bytes / net.bw_intra_Bps

    def p2p_slowest(self, op: P2P, src: np.ndarray, dst: np.ndarray) -> float:
        """Seconds of the slowest of the transfers ``src[i] → dst[i]`` (ranks) of ``op``:
        the longer of the intra- and the inter-node time, among the kinds that occur (the
        group family's nets time every transfer of a kind alike)."""
        cross = self.node_of_rank[src] != self.node_of_rank[dst]
        firsts = {int(np.argmax(cross)), int(np.argmin(cross))}   # one of each kind present
        return max(self.p2p(op, int(src[i]), int(dst[i])) for i in firsts)

    def p2p_together(self, op: P2P, src: np.ndarray, dst: np.ndarray, alone_s: float
                     ) -> float:
        """Seconds of ``op``'s transfers ``src[i] → dst[i]`` (ranks), all sent at once, that
        take ``alone_s`` each on their own: at least the node's shared-copy floor for as many
        transfers as its most crowded node holds (:mod:`.sharedcopies`; both engines time a
        class's send by it)."""
        if not self.copies:
            return alone_s
        floor = self.copies.floor_s(op.bytes, node_copies(self.node_of_rank, src, dst))
        return alone_s if floor is None else max(alone_s, floor)

    def _p2p_bw(self, group: str) -> float:
        """:func:`.netmodel.p2p_node_bw` of family ``group``, cached like the group nets."""
        got = self._p2p_memo.get(group)
        if got is None:
            got = self._p2p_memo[group] = self._p2p_bw_uncached(group)
        return got

    def _p2p_bw_uncached(self, group: str) -> float:
        fam = self._families[group]
        key = self._layout_key(fam)
        bw = _P2P.get(key)
        if bw is None:
            from .netmodel import p2p_node_bw, topology_of
            topo = topology_of(self.system, key[0])
            bw = _P2P[key] = p2p_node_bw(topo, self.devices, fam.members)
            if len(_P2P) > 256:
                _P2P.pop(next(iter(_P2P)))
        return bw

