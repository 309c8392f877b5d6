"""NCCL's collectives as its tuning model times them: ring, tree, NVLS and CollNet (SHARP),
each with the LL, LL128 and Simple protocols, and NCCL's own choice among them.

The model follows ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` of the NCCL release the
machine runs (``NcclEnv.version``, by default 2.30.7; ``src/graph/tuning.cc``; constants per
release in :mod:`.versions`, 2.30.7's in :mod:`.tuning`): an algorithm and protocol take
``latency + bytes / algBw``, where ``algBw = busBw × ratio`` (ring: ``p / nsteps``; tree and
CollNet all-reduce: 1/2) and ``busBw`` is the bandwidth NCCL's topology search finds (its
channels × per-channel bandwidth) reduced per protocol (LL ½ capped at ``llMaxBw``, LL128
120/128 capped per channel, tree 0.92 capped per channel, …).

Where NCCL measures its machine, ddlsim derives it from the topology graph: the search's
``nChannels × bw`` is the bottleneck bandwidth of the group's links (:class:`GroupNet`, the
same links the discrete-event engine shares), times the share of an NVLink link NCCL expects
to fill (``NVLINK_EFFICIENCY``); the channel count is that bandwidth over the search's first
per-channel speed. Not modelled: PAT, the 0.85 tree-pattern factor (NCCL uses balanced trees
by default), graph ``latencyInter`` (0 here) and user tuner plugins.

Each algorithm's flows (its ``layout``) carry its bytes inflated by ``bottleneck / algBw``
and a given latency per step, so the discrete-event engine, replaying them over the same
links, reproduces this time when nothing else runs, and shares the links when something does.
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field
from typing import NamedTuple

from ..base import GroupNet
from . import tuning as T
from .measured import FILL_CHUNKS, FILL_EDGES, achieved_algbw_GBps, fill_levels, fill_us
from .channels import channel_bytes, channels_used
from .hops import nccl_inter_steps, ring_ll_levels, ring_steps
from .tree import tree_fill_levels
from .rules import algbw_ratio, col as _col, converts, has_nvls as _has_nvls, nvls_bus
from .rules import nvls_channels as _nvls_channels
from .versions import DEFAULT_VERSION, NcclTables, tables
# the vectorised time (importable from here as before)
from .arrays import nccl_seconds_array  # noqa: F401

__all__ = ["NcclEnv", "nccl_time", "busbw_GBps", "algbw_GBps", "latency_us", "best_protocol",
           "available", "ALGORITHMS", "NcclForm", "nccl_form",
           "nccl_seconds_array", "estimate_time", "taken_parts"]

#: NCCL algorithm per collective (tuning.cc: broadcast/reduce run ring only; all-gather and
#: reduce-scatter ring, NVLS, CollNet, PAT; all-reduce every algorithm but PAT)
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "collnet"),
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
}


def tuned_algorithm(op: str, name: str) -> str | None:
    """NCCL's own name for the registered algorithm ``name`` (``nccl_ring`` -> ``ring``, as
    :mod:`.flows` registers each of :data:`ALGORITHMS`) where NCCL's tuning model times it;
    None for another backend's algorithm and for NCCL's all-to-all (``nccl_p2p``, grouped
    sends, :mod:`.p2p`), which the model does not time."""
    algo = name.removeprefix("nccl_")
    return algo if algo != name and algo in ALGORITHMS.get(op, ()) else None


@dataclass(frozen=True, slots=True)
class NcclEnv:
    """What NCCL's tuning model needs to know of the machine.

    Parameters
    ----------
    arch : ``volta``, ``ampere``, ``hopper`` or ``blackwell`` (compute-capability class).
    intra : ``nvlink`` or ``pci``: the link class inside a node (tuning.cc ``intraHw``).
    nvswitch : the node has NVSwitches (NVLS and CollNet-direct need them).
    cpu : ``intel`` or ``amd`` (the multi-node LL cap and network overhead depend on it).
    sharp : in-network reduction (SHARP) is available: CollNet and multi-node NVLS.
    protocol : ``auto`` (NCCL's choice) or one of LL, LL128, Simple.
    nics_per_node : NICs of a node (CollNet's GPU/NIC ratio).
    version : the NCCL release whose tuning model applies (:mod:`.versions`).

    Raises
    ------
    ConfigError
        Where ``version`` is not tabulated, or has no rows for ``arch``.
    """

    arch: str
    intra: str = "nvlink"
    nvswitch: bool = True
    cpu: str = "intel"
    sharp: bool = False
    protocol: str = "auto"
    nics_per_node: int = 1
    version: str = DEFAULT_VERSION
    #: the release's tables (:func:`.versions.tables`), looked up and checked once
    tab: NcclTables = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tab", tables(self.version, self.arch))


def _link(net: GroupNet, env: NcclEnv) -> tuple[float, float]:
    """(physical bottleneck B/s, NCCL's busBw of its channels in GB/s)."""
    eff = env.tab.nvlink_efficiency[env.arch] if env.intra == "nvlink" else 1.0
    if not net.multi_node:
        return net.bw_intra_Bps, net.bw_intra_Bps * eff / 1e9
    bottleneck = min(net.bw_intra_Bps, net.bw_node_Bps)
    return bottleneck, min(net.bw_intra_Bps * eff, net.bw_node_Bps) / 1e9


def _channels(link_GBps: float, net: GroupNet, env: NcclEnv) -> float:
    return max(1.0, link_GBps / env.tab.top_speed_GBps[env.arch][1 if net.multi_node else 0])


def available(op: str, algo: str, proto: str, net: GroupNet, env: NcclEnv) -> bool:
    """Whether NCCL would run ``algo``/``proto`` here (tuning.cc's enable rules)."""
    if algo not in ALGORITHMS.get(op, ()):
        return False
    if algo in ("nvls", "nvls_tree", "collnet") and proto != "Simple":
        return False
    if proto == "LL128" and env.intra != "nvlink":  # LL128 needs NVLink inside (≤ PATH_NVB)
        return False
    if algo in ("nvls", "nvls_tree") and _nvls_channels(net) <= 2:
        return False  # src/transport/nvls.cc (2.26.2) ncclNvlsInit: none on <= 2 GPUs a node
    if algo == "nvls":
        ok = _has_nvls(env) and env.nvswitch
        return ok and (not net.multi_node or (env.sharp and op == "all_reduce"))
    if algo == "nvls_tree":  # NVLS inside nodes, trees across: several nodes, no SHARP needed
        return _has_nvls(env) and env.nvswitch and net.multi_node
    if algo == "collnet":  # CollNet-direct: SHARP, NVSwitch nodes, several nodes
        return env.sharp and env.nvswitch and net.multi_node
    return True


def busbw_GBps(op: str, algo: str, proto: str, net: GroupNet, env: NcclEnv) -> float:
    """NCCL's bus bandwidth for ``algo``/``proto`` (GB/s), before the tree correction."""
    _, link = _link(net, env)
    nch, col = _channels(link, net, env), _col(net.nodes)
    ppn = net.p / net.nodes
    tab = env.tab
    bus = nvls_bus(op, algo, link, net, env) if algo in ("nvls", "nvls_tree") else link
    ll_max = tab.ll_max_bw[env.arch if net.nodes == 1 else env.cpu][col]
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * 0.5)
    if algo == "ring" and proto == "LL128":
        factor = tab.ring_ll128_ppn1_factor if ppn < 2 else 0.92
        bus = min(bus * factor, nch * tab.per_ch_max_bw["ring_ll128"][env.arch][col])
    if algo == "tree" and op == "all_reduce":
        bus = min(bus * 0.92, nch * tab.per_ch_max_bw["tree"][env.arch][col])
    if algo == "tree" and proto == "LL":
        bus = min(bus / 3.8, ll_max)
    if algo == "tree" and proto == "LL128":
        bus = min(bus * (7.0 / 9.0 if net.nodes == 1 else 120.0 / 128.0),
                  nch * tab.per_ch_max_bw["tree_ll128"][env.arch][col])
    if algo == "collnet":
        factor = ppn / max(env.nics_per_node, 1)  # GPU/NIC ratio
        bus /= factor - (factor - 1) / 2
        if T.ARCHS.index(env.arch) >= T.ARCHS.index("hopper"):
            bus *= 0.85
    return bus


def algbw_GBps(op: str, algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv) -> float:
    """Algorithm bandwidth (GB/s): busBw × NCCL's ratio, with the tree's size correction."""
    bw = busbw_GBps(op, algo, proto, net, env)
    if converts(op, algo, env):
        bw *= algbw_ratio(op, algo, net.p, env)
    log_size = int(math.floor(math.log2(n / 64))) if n >= 64 else -1
    if algo == "tree" and op == "all_reduce" and 0 <= log_size < 23:
        bw *= T.TREE_CORRECTION[proto][log_size]
    return bw


def latency_us(op: str, algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv) -> float:
    """NCCL's latency (µs) for ``algo``/``proto`` (tuning.cc; ring plateau of
    ``ncclTopoGetAlgoTime``)."""
    lat, plateau, div = _latency_parts(op, algo, proto, net, env)
    return lat * plateau if n / div >= 64 else lat


def _latency_parts(op: str, algo: str, proto: str, net: GroupNet, env: NcclEnv
                   ) -> tuple[float, float, float]:
    """(:func:`latency_us` below the ring plateau, its factor on the plateau, the divisor of
    the size whose quotient ≥ 64 reaches it: channels × ranks; ``inf`` where there is none)."""
    pi, p, nodes, tab = T.PROTOCOLS.index(proto), net.p, net.nodes, env.tab
    ppn = p / nodes
    hw = tab.hw_latency_us
    intra = hw[env.intra][algo][pi]
    inter = hw["net"]["tree" if ppn == 1 and tab.ppn1_tree_net else algo][pi]
    lat = tab.base_latency_us[algo][pi]
    nsteps = ring_steps(op, p)
    if algo == "ring" and op in ("broadcast", "reduce"):
        cls = "net" if nodes > 1 else env.intra
        lat += nsteps * hw[cls]["tree" if proto == "Simple" else "ring"][pi]
    elif algo == "ring":
        overhead = tab.net_overhead_us[env.cpu] * (3 if proto == "Simple" else 1)
        intra = max(intra, overhead) if nodes > 1 else intra
        n_inter = nccl_inter_steps(op, nodes, tab.inter_steps_per_node)
        lat += (nsteps - n_inter) * intra + n_inter * inter
        if proto == "Simple" and nodes > 1 and op == "all_reduce":   # plateau effect of ring
            nch = _channels(_link(net, env)[1], net, env)
            return lat, 1.4 if T.ARCHS.index(env.arch) >= 1 else 1.9, nch * p
    elif algo == "tree":
        lat += 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    elif algo == "collnet":
        lat += 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    elif algo == "nvls":
        lat = intra + (inter if nodes > 1 else 0.0)
    elif algo == "nvls_tree":
        lat += intra + 2 * _log2i(nodes) * inter
    return lat, 1.0, math.inf


def _log2i(n: int) -> int:
    return int(n).bit_length() - 1 if n > 0 else 0


def nccl_time(op: str, algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv) -> float:
    """Seconds for ``algo``/``proto`` as nccl-tests measures it, ``inf`` where NCCL would not
    run it: NCCL's estimate (latency + bytes / algBw), with the NVLS all-reduce's measured
    plateau and pipeline fill (:mod:`.measured`), the tree's pipeline fill (:mod:`.tree`), the
    ring LL's NVLink steps as measured (:mod:`.hops`) and the channels NCCL drops for a small
    message (:mod:`.channels`), which the estimate misses."""
    if not available(op, algo, proto, net, env):
        return math.inf
    bw, lat = taken_parts(op, algo, proto, n, net, env)
    if bw <= 0:
        return math.inf
    return (lat + n / (1e3 * bw)) * 1e-6


def taken_parts(op: str, algo: str, proto: str, n: float, net: GroupNet,
                env: NcclEnv) -> tuple[float, float]:
    """(algorithm bandwidth GB/s, latency µs) of the time taken (:func:`nccl_time`): NCCL's
    estimate with the fills and the channels it drops; the DES's flows carry the same."""
    bw, levels = _achieved(op, algo, proto, n, net, env)
    bw = bw * _used_fraction(algo, proto, n, net, env)
    return bw, latency_us(op, algo, proto, n, net, env) + fill_us(n, levels)


def estimate_time(op: str, algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv) -> float:
    """Seconds NCCL's tuning model estimates for ``algo``/``proto`` (``ncclTopoGetAlgoTime``),
    what NCCL chooses by; ``inf`` where NCCL would not run it."""
    if not available(op, algo, proto, net, env):
        return math.inf
    bw = algbw_GBps(op, algo, proto, n, net, env)
    if bw <= 0:
        return math.inf
    return (latency_us(op, algo, proto, n, net, env) + n / (1e3 * bw)) * 1e-6


def _achieved(op: str, algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv):
    """(algorithm bandwidth GB/s as measured, fill levels or None) of ``algo``/``proto``: the
    NVLS plateau and fill (:mod:`.measured`), the tree all-reduce's fill (:mod:`.tree`), the
    ring LL's NVLink steps as measured (:mod:`.hops`); other rings and CollNet as NCCL
    estimates them."""
    return _achieved_and_estimate(op, algo, proto, n, net, env)[:2]


def _achieved_and_estimate(op: str, algo: str, proto: str, n: float, net: GroupNet,
                           env: NcclEnv):
    """:func:`_achieved`'s two parts and NCCL's estimate of the algorithm bandwidth they
    start from (GB/s): :func:`algbw_GBps` at ``n`` (at 0 under NVLS, whose estimate does not
    depend on the size), asked once (:func:`nccl_form` reads both)."""
    if algo == "tree" and op == "all_reduce":
        bw = algbw_GBps(op, algo, proto, n, net, env)
        return bw, _tree_levels(proto, net, env), bw
    if algo == "ring" and proto == "LL":
        levels = ring_ll_levels(op, net.p, net.nodes, env.arch, env.intra, env.cpu, FILL_EDGES,
                                env.version)
        bw = algbw_GBps(op, algo, proto, n, net, env)
        return bw, levels, bw
    if algo not in FILL_CHUNKS:
        bw = algbw_GBps(op, algo, proto, n, net, env)
        return bw, None, bw
    return _achieved_nvls(op, algo, proto, net, env)


@lru_cache(maxsize=1 << 12)
def _channel_rule(algo: str, proto: str, net: GroupNet, env: NcclEnv) -> tuple[float, int]:
    """(bytes a channel must get, NCCL's channels) of :mod:`.channels` for this group."""
    eff = env.tab.nvlink_efficiency[env.arch] if env.intra == "nvlink" else 1.0
    nch = max(1, int(round(_channels(_link(net, env)[1], net, env))))
    return channel_bytes(algo, proto, net.p, net.bw_intra_Bps * eff / 1e9), nch


def _used_fraction(algo: str, proto: str, n: float, net: GroupNet, env: NcclEnv) -> float:
    """Channels NCCL runs ``n`` bytes on over its channels (1 where it keeps them all)."""
    per_channel, nch = _channel_rule(algo, proto, net, env)
    return channels_used(n, per_channel, nch) / nch


@lru_cache(maxsize=1 << 12)
def _tree_levels(proto: str, net: GroupNet, env: NcclEnv):
    raw = algbw_GBps("all_reduce", "tree", proto, 0.0, net, env)  # before the size correction
    nch = _channels(_link(net, env)[1], net, env)
    return tree_fill_levels(proto, net.p, net.nodes, nch, raw, FILL_EDGES)


@lru_cache(maxsize=1 << 12)
def _achieved_nvls(op: str, algo: str, proto: str, net: GroupNet, env: NcclEnv):
    estimate = algbw_GBps(op, algo, proto, 0.0, net, env)  # NVLS: no size dependence
    bw = achieved_algbw_GBps(op, algo, estimate, net, env)
    return bw, fill_levels(op, algo, net, env, bw, estimate), estimate


class NcclForm(NamedTuple):
    """:func:`nccl_time` of one algorithm and protocol on one group, as its size-independent
    parts: ``latency_us`` below the ring's plateau threshold and ``plateau_latency_us`` at
    or above it (``n / plateau_div >= 64``; ``plateau_div`` is ``inf`` where there is no
    plateau), ``algbw_GBps`` (as measured) before the tree's size correction,
    ``corrected``: whether that correction (``TREE_CORRECTION[protocol]`` by
    ``floor(log2(n / 64))``) applies, the pipeline fill (:func:`.measured.fill_levels`;
    for the ring LL the latency of its measured steps, :func:`.hops.ring_ll_levels`)
    as :data:`~.measured.FILL_EDGES` size edges and one more fill in µs (``inf`` edges and
    zero fills where none is modelled), ``estimate_algbw_GBps``: NCCL's own estimate of
    the bandwidth, whose time (no fill) is what NCCL chooses by (:func:`estimate_time`), and
    ``fill_slope``: µs per byte that caps the fill (:func:`.tree.tree_fill_levels`; ``inf``:
    no cap), ``channel_bytes`` and ``channels``: below ``channels × channel_bytes`` NCCL runs
    on ``max(1, ⌊n / channel_bytes⌋)`` of its ``channels`` (:mod:`.channels`; 0: never)."""

    latency_us: float
    plateau_latency_us: float
    plateau_div: float
    algbw_GBps: float
    corrected: bool
    fill_edges: tuple
    fill_us: tuple
    estimate_algbw_GBps: float
    fill_slope: float = math.inf
    channel_bytes: float = 0.0
    channels: float = 1.0


@lru_cache(maxsize=1 << 16)
def nccl_form(op: str, algo: str, proto: str, net: GroupNet, env: NcclEnv) -> NcclForm | None:
    """The parts of :func:`nccl_time` that do not depend on the size, or None where NCCL
    would not run ``algo``/``proto`` (the time is ``inf``). :func:`nccl_seconds_array`
    evaluates them on arrays of sizes. Remembered per (op, algorithm, protocol, group,
    machine): a search's meshes share most of their groups."""
    if not available(op, algo, proto, net, env):
        return None
    # below 64 B: no tree correction (nccl_seconds_array applies it per size), in NCCL's
    # estimate likewise
    bw, levels, estimate = _achieved_and_estimate(op, algo, proto, 0.0, net, env)
    if bw <= 0:
        return None
    # latency_us below and on the ring plateau, whose threshold is n / (nch·p) >= 64
    lat, plateau, div = _latency_parts(op, algo, proto, net, env)
    high = lat * plateau if div < math.inf else lat   # latency_us at n = inf
    if high == lat:
        div = math.inf
    edges, fills, slope = levels or ((math.inf,) * FILL_EDGES, (0.0,) * (FILL_EDGES + 1),
                                     math.inf)
    return NcclForm(lat, high, div, bw, algo == "tree" and op == "all_reduce", edges, fills,
                    estimate, slope,
                    *_channel_rule(algo, proto, net, env))


def best_protocol(op: str, algo: str, n: float, net: GroupNet, env: NcclEnv) -> tuple[str, float]:
    """(protocol, seconds as measured): the configured protocol, or the one NCCL's estimate
    makes fastest (:func:`estimate_time`; ties: LL first, as NCCL keeps the first)."""
    protos = T.PROTOCOLS if env.protocol == "auto" else (env.protocol,)
    proto = min(protos, key=lambda pr: estimate_time(op, algo, pr, n, net, env))
    return proto, nccl_time(op, algo, proto, n, net, env)

