"""Megatron-Core's flex token dispatcher as a collective: DeepEP's and HybridEP's dispatch and
combine kernels, which send each routed token once per destination node and once per
destination GPU instead of once per routed expert (node-level deduplication).

One dispatch (or combine) on a group of ``p`` members, ``g`` per node on ``N = p/g`` nodes,
for ``E`` experts of which a token picks ``k`` (each expert held by ``r`` consecutive members:
expert TP), ``x = E·r/p`` experts per member. A member holds ``T`` tokens of ``h·b`` bytes;
the collective's ``bytes`` are ``n = T·k·h·b`` (the alltoall dispatcher's, nccl-tests
convention), so ``T·h·b = n/k``. With routing uniform over the experts (or forced balance):

* a token reaches a given node with probability ``q_node = 1 − C(E−e, k)/C(E, k)``, ``e``
  the experts on the node, and a given member with ``q_gpu`` (``e = x``);
* over RDMA (``N > 1``) each member sends ``(N−1)·q_node·T·h·b`` bytes: each token once to
  the same-index member of every remote node it is routed to;
* over NVLink each member receives ``p·q_gpu·T·h·b`` bytes: every token routed to it, once,
  forwarded by the node-mate that received it over RDMA (or sent directly inside a node).

Time: ``α + max(RDMA bytes / (η_nic · NIC per member), NVLink bytes / (η_nvl · NVLink per
member))`` (the two stages run pipelined in one kernel), the efficiencies of :data:`KERNELS`
derived from the published kernel tables below (measured at hidden 7168, with the SM counts
named there). The discrete-event engine replays the same flows as one phase (the RDMA pairs
and the NVLink forwarding pairs at once), each pair's bytes divided by the kernel's
efficiency on its link, each RDMA pair through the sender's own NIC (``Phase.own_rail``: the
kernels are rail-aligned, so no RDMA byte crosses NVLink to another GPU's NIC).

One algorithm per backend, kernel and routing (``k``, ``E``, ``r``), named by
:func:`flex_algorithm` and made from its name on lookup; ``auto`` never picks one.

References
----------
NVIDIA/Megatron-LM d7288711 (2026-04-09) ``megatron/core/transformer/moe/token_dispatcher.py``
``MoEFlexTokenDispatcher`` lines 1334-1383 (one group over expert TP × EP, the routing map
replicated over expert TP), ``_DeepepManager`` lines 1096-1332, ``_HybridEPManager`` lines
947-1094; ``fused_a2a.py`` (``FusedDispatch``/``FusedCombine``: the backward of a dispatch is a
combine and vice versa; ``HybridEPDispatch``: ``dispatch_with_permute``).
deepseek-ai/DeepEP 567632d README.md "Normal kernels with NVLink and RDMA forwarding" (H800,
CX7 400 Gb/s, 4096 tokens, hidden 7168, top-8 of 256 experts) and tests/test_internode.py
lines 58-61, 222-223 (RDMA bytes: tokens × distinct destination nodes, own node included;
NVLink bytes: tokens received); DeepEP hybrid-ep branch 7febc6e docs/README_Hybrid-EP.md
"H100 Platform" (4096 tokens, hidden 7168, top-8 uniform, 8 local experts, BF16, Torch API)
and tests/utils.py ``count_rdma_send_from_routing_map`` (the same RDMA count).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from math import comb

import numpy as np

from ...errors import ConfigError
from .base import Algorithm, GroupNet, Phase, register_parametric

__all__ = ["FlexKernel", "KERNELS", "KERNEL_SMS", "MIN_RATED_SMS", "hit_probability",
           "FlexTraffic", "flex_traffic", "flex_time", "flex_algorithm"]


def hit_probability(experts: int, held: int, top_k: int, groups: int = 1,
                    topk_groups: int = 1) -> float:
    """Probability that one token's ``top_k`` experts include at least one of ``held`` given
    experts (those of one node or one GPU), under uniform or group-limited routing.

    Uniform routing (``groups = 1``, or ``topk_groups = groups``): the ``k`` distinct experts
    are drawn uniformly from all ``E``, so ``q = 1 − C(E−e, k)/C(E, k)``.

    Group-limited routing (DeepSeek-V2's ``group_limited_greedy``, V3's ``noaux_tc``;
    Megatron-Core's ``--moe-router-num-groups``/``--moe-router-group-topk``): the ``E``
    experts form ``G`` groups of ``m = E/G`` consecutive experts; a token first picks
    ``M = topk_groups`` groups, then its ``k`` experts among their ``M·m``. Assumed (balanced
    routing, as the flex kernels' tables and forced balance are): the ``M`` groups are a
    uniform ``M``-subset of the ``G``, the ``k`` experts a uniform ``k``-subset of the chosen
    groups' experts. The held experts are consecutive (Megatron-Core and DeepEP lay the
    experts out contiguously over the expert-parallel ranks) and nested with the groups: they
    fill ``c = e/m`` whole groups (``s = m`` of each), or lie inside one group (``c = 1``,
    ``s = e``). If ``j`` of those ``c`` groups are picked (hypergeometric), the token misses
    the held experts when all ``k`` fall among the other ``M·m − j·s`` experts of its groups:

    ``1 − q = Σ_j C(c, j)·C(G−c, M−j)/C(G, M) · C(M·m − j·s, k)/C(M·m, k)``.

    With ``M = G`` only ``j = c`` remains and this is the uniform form. Every expert is still
    picked with probability ``(M/G)·k/(M·m) = k/E``, so each expert's tokens, and bytes that
    travel once per routed copy (the alltoall dispatcher's), are the same as under uniform
    routing; only deduplicated traffic (once per node or GPU reached) changes.

    Parameters
    ----------
    experts : E, the routed experts.
    held : e, the consecutive experts on the node (or GPU) in question, ``0 <= e <= E``.
    top_k : k, the experts each token is routed to, ``1 <= k <= M·m``.
    groups : G, the expert groups (``n_group``); divides E.
    topk_groups : M, the groups each token may use (``topk_group``), ``1 <= M <= G``.

    Returns
    -------
    float
        The probability (so ``N · q_node`` is the expected number of distinct nodes).

    Raises
    ------
    ValueError
        Out-of-range counts, or held experts that straddle a group boundary (neither whole
        groups nor inside one: that node's share of each group, and so its traffic, differs
        from its neighbours', which the flex model's one rate per member does not hold).

    References
    ----------
    DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, §2.1.2 (node-limited
    routing, at most M = 4 nodes per token) and the published config.json (n_group 8,
    topk_group 4); DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, §2.2.2 (device-limited
    routing, M = 3); NVIDIA/Megatron-LM d7288711 ``moe_utils.py`` ``group_limited_topk``
    (top groups by score, then top-k inside them).
    """
    if not 0 <= held <= experts or not 1 <= top_k <= experts:
        raise ValueError(f"hit_probability needs 0 <= held <= experts and 1 <= top_k <= "
                         f"experts, got experts={experts}, held={held}, top_k={top_k}")
    if groups < 1 or experts % groups or not 1 <= topk_groups <= groups:
        raise ValueError(f"hit_probability: {groups} expert groups, {topk_groups} per token, "
                         f"of {experts} experts; allowed: groups dividing the experts and "
                         f"1 <= topk_groups <= groups")
    m = experts // groups
    if top_k > topk_groups * m:
        raise ValueError(f"hit_probability: top_k = {top_k} exceeds the {topk_groups * m} "
                         f"experts of {topk_groups} groups of {m}")
    if topk_groups == groups:
        return 1.0 - comb(experts - held, top_k) / comb(experts, top_k)
    if held % m and (held == 0 or m % held):
        raise ValueError(f"group-limited routing: {held} consecutive experts on one node or "
                         f"GPU neither fill whole groups of {m} experts nor lie inside one; "
                         f"this layout is not modelled (use an expert-parallel size whose "
                         f"experts per GPU and per node divide, or are multiples of, {m})")
    c, s = (held // m, m) if held >= m else (1, held)
    pool = topk_groups * m
    miss = sum(comb(c, j) * comb(groups - c, topk_groups - j) * comb(pool - j * s, top_k)
               for j in range(min(c, topk_groups) + 1))
    return 1.0 - miss / (comb(groups, topk_groups) * comb(pool, top_k))


@dataclass(frozen=True)
class FlexKernel:
    """One flex kernel's achieved rates, as fractions of the links it runs on:
    ``nic_efficiency`` of the member's NIC share on the RDMA stage, ``nvl_efficiency`` of the
    member's NVLink bandwidth (per direction) for the bytes it receives on the NVLink stage
    between nodes (forwarding), ``intra_efficiency`` likewise inside one node; ``source``
    derives each from its kernel table."""

    nic_efficiency: float
    nvl_efficiency: float
    intra_efficiency: float
    source: str


_DEEPEP = ("deepseek-ai/DeepEP 567632d README 'Normal kernels' (H800: NVLink 200 GB/s per "
           "direction nominal, ~160 achievable, DeepEP issue #16; CX7 ~50 GB/s) with "
           "tests/test_internode.py's byte counts, under uniform top-8 of 256 experts: EP32 "
           "(4 nodes) dispatch 58 GB/s counted = 43.5 GB/s over the NIC (3/4 remote) = 0.870 "
           "of 50 GB/s, combine 57 -> 0.855; EP16 (2 nodes, NIC only 43% busy) 43 GB/s counted "
           "= 140.7 GB/s received per GPU over NVLink (x 16 q_gpu / 2 q_node = 3.27) = 0.704 "
           "of 200 GB/s; intranode EP8 153 / 158 GB/s received = 0.765 / 0.790 of 200 GB/s "
           "(issue #16: 337.35 GB/s intranode on H20, NVLink 450 GB/s per direction: 0.75). "
           "Measured with 24 SMs (test_internode.py test_loop num_sms = 24, the README's "
           "Buffer.set_num_sms(24)) and the best chunk sizes of a sweep; Megatron-Core runs "
           "20 SMs (KERNEL_SMS) with Buffer.get_dispatch_config's defaults: no published "
           "figure at 20 SMs, so the rates are kept")
_HYBRIDEP = ("DeepEP hybrid-ep 7febc6e docs/README_Hybrid-EP.md, 16 SMs (Megatron-Core's "
             "moe_hybridep_num_sms default), Torch API, BF16, with tests/utils.py's byte "
             "counts, under uniform top-8 of 8 experts per rank. 'H100 Platform' (NVLink 450 "
             "GB/s per direction, 400 Gb/s NICs): 32 ranks (4 nodes) dispatch 47.36 GB/s "
             "counted = 35.5 GB/s over the NIC = 0.710 of 50 GB/s, combine 52.53 -> 0.788; 16 "
             "ranks (2 nodes, NIC 54% busy) 54.47 / 53.35 GB/s counted = 180.2 / 176.5 GB/s "
             "received per GPU over NVLink (x 3.31) = 0.400 / 0.392 of 450 GB/s. No Hopper "
             "intranode figure is published: 'GB200 Platform' 8 ranks 550.10 / 538.44 GB/s "
             "(NVLink 5: 900 GB/s per direction) = 0.611 / 0.598")

#: (backend, kernel) → its rates; the backward of a dispatch runs the combine kernel
#: (Megatron-LM d7288711 fused_a2a.py ``FusedDispatch.backward``, ``HybridEPDispatch.backward``)
KERNELS: dict[tuple[str, str], FlexKernel] = {
    ("deepep", "dispatch"): FlexKernel(0.870, 0.704, 0.765, _DEEPEP),
    ("deepep", "combine"): FlexKernel(0.855, 0.704, 0.790, _DEEPEP),
    ("hybridep", "dispatch"): FlexKernel(0.710, 0.400, 0.611, _HYBRIDEP),
    ("hybridep", "combine"): FlexKernel(0.788, 0.392, 0.598, _HYBRIDEP),
}


#: backend → (SMs its dispatch and combine kernels hold while they run, source): each kernel
#: launches one CUDA block per SM it is given and holds it to the end (DeepEP's ``num_sms``
#: blocks; HybridEP's ``num_sms_dispatch_api``/``num_sms_combine_api``)
KERNEL_SMS: dict[str, tuple[int, str]] = {
    "deepep": (20, "Megatron-LM d7288711 transformer_config.py line 803, moe_deepep_num_sms "
                   "= 20, set on DeepEP's Buffer by token_dispatcher.py line 1158 "
                   "(set_deepep_num_sms); DeepEP's own Buffer.num_sms default is 20 too"),
    "hybridep": (16, "Megatron-LM d7288711 transformer_config.py line 806, "
                     "moe_hybridep_num_sms = 16, passed as num_sms_dispatch_api and "
                     "num_sms_combine_api (token_dispatcher.py lines 1049-1050); "
                     "Megatron-Bridge's performance scripts set 32 (v0.3.0/v0.4.0 "
                     "scripts/performance/utils/overrides.py), which a plan says with "
                     "parallel.moe.flex_dispatcher_num_sms"),
}

#: backend → (the fewest SMs at which its kernels' rates (:data:`KERNELS`) are modelled as
#: published, source): ``parallel.moe.flex_dispatcher_num_sms`` below it is refused, since the
#: kernels' speed at fewer SMs is not; at more, the published rates are kept (both tables are
#: bandwidth-bound there)
MIN_RATED_SMS: dict[str, tuple[int, str]] = {
    "deepep": (20, "DeepEP's rates are its README's at 24 SMs, taken for Megatron-Core's "
                   "default 20 (no published figure at 20; _DEEPEP above); fewer SMs than "
                   "Megatron-Core's default are not rated"),
    "hybridep": (8, "DeepEP hybrid-ep 7febc6e docs/README_Hybrid-EP.md: H100, 16 ranks, "
                    "57.74 / 54.47 GB/s at 8 / 16 SMs, the rate's plateau from 8 SMs"),
}


@dataclass(frozen=True)
class FlexTraffic:
    """Bytes one member moves in one flex dispatch (or combine): ``rdma_bytes`` sent to other
    nodes, ``nvl_bytes`` received over NVLink (the kernel tables' count: own share
    included), and the probabilities they follow from."""

    rdma_bytes: float
    nvl_bytes: float
    q_node: float
    q_gpu: float


def flex_traffic(token_bytes: float, experts: int, top_k: int, replicas: int,
                 p: int, g: int, groups: int = 1, topk_groups: int = 1) -> FlexTraffic:
    """The deduplicated traffic of one member (module docstring).

    Parameters
    ----------
    token_bytes : T·h·b, bytes of the member's tokens (each once).
    experts, top_k : E and k of the router.
    replicas : r, members holding each expert (expert TP; 1 keeps experts whole).
    p, g : members in the group and per node (node-major, every node holding ``g``).
    groups, topk_groups : G and M of group-limited routing (1, 1: uniform over all experts;
        :func:`hit_probability`).

    Returns
    -------
    FlexTraffic

    Raises
    ------
    ValueError
        When the experts do not split evenly over the members or the nodes, or a node's or
        member's experts straddle a group boundary (:func:`hit_probability`).
    """
    if p % replicas or experts % (p // replicas) or p % g or (g % replicas and replicas % g):
        raise ValueError(f"flex dispatch: {experts} experts held {replicas}x over {p} members "
                         f"({g} per node) do not split evenly over members and nodes")
    per_member = experts // (p // replicas)
    per_node = per_member * max(1, g // replicas)
    nodes = p // g
    q_node = hit_probability(experts, per_node, top_k, groups, topk_groups)
    q_gpu = hit_probability(experts, per_member, top_k, groups, topk_groups)
    return FlexTraffic((nodes - 1) * q_node * token_bytes, p * q_gpu * token_bytes,
                       q_node, q_gpu)


def flex_time(traffic: FlexTraffic, kernel: FlexKernel, net: GroupNet) -> float:
    """Seconds of one flex kernel: ``α + max(RDMA / (η_nic · NIC per member), NVLink /
    (η_nvl · NVLink per member))``; inside one node ``α + NVLink / (η_intra · NVLink)``.

    Parameters
    ----------
    traffic : the member's bytes (:func:`flex_traffic`).
    kernel : the kernel's rates (:data:`KERNELS`).
    net : the group's links (per-member NIC share ``bw_node_Bps / g``).

    Returns
    -------
    float
        Seconds.
    """
    if not net.multi_node:
        return net.alpha_intra_s + traffic.nvl_bytes / (kernel.intra_efficiency
                                                         * net.bw_intra_Bps)
    nic = kernel.nic_efficiency * net.bw_node_Bps / net.g
    nvl = kernel.nvl_efficiency * net.bw_intra_Bps
    return net.alpha_inter_s + max(traffic.rdma_bytes / nic, traffic.nvl_bytes / nvl)


def _pairs(p: int, g: int, traffic: FlexTraffic, nbytes: float, kernel: FlexKernel) -> Phase:
    """The flows of one flex kernel as one phase, weights in bytes per collective byte, each
    divided by the kernel's efficiency on its link so that the links' own rates replay the
    kernel's time (:func:`flex_time`): each member to the same-index member of every other
    node (RDMA), and its NVLink bytes (own share included, as the tables count them) spread
    over its ``g − 1`` node-mates."""
    i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    same_node = i // g == j // g
    rdma = ~same_node & (i % g == j % g)
    intra = same_node & (i != j)
    nodes = p // g
    nvl_eff = kernel.nvl_efficiency if nodes > 1 else kernel.intra_efficiency
    w = np.zeros((p, p))
    if nodes > 1:
        w[rdma] = traffic.rdma_bytes / (nodes - 1) / kernel.nic_efficiency
    if g > 1:
        w[intra] = traffic.nvl_bytes / (g - 1) / nvl_eff
    w /= nbytes
    src, dst = np.nonzero(w > 0)
    return Phase(np.stack([src, dst], axis=1), 1.0, weights=w[src, dst], own_rail=True)


_NAME = re.compile(r"^(deepep|hybridep)_(dispatch|combine)"
                   r"\[k=(\d+),E=(\d+),r=(\d+)(?:,G=(\d+),M=(\d+))?\]$")


def flex_algorithm(backend: str, kernel: str, top_k: int, experts: int, replicas: int,
                   groups: int = 1, topk_groups: int = 1) -> str:
    """The name of the all-to-all algorithm timing ``backend``'s ``kernel`` for this routing:
    ``f"{backend}_{kernel}[k=…,E=…,r=…]"``, with ``,G=…,M=…`` under group-limited routing,
    resolved from the name alone on lookup
    (:func:`~ddlsim.simulator.collectives.base.register_parametric`, backend ``flex``).

    Parameters
    ----------
    backend : ``deepep`` or ``hybridep``.
    kernel : ``dispatch`` or ``combine`` (the kernel that runs, forward or backward).
    top_k, experts, replicas : k, E and the members holding each expert (expert TP).
    groups, topk_groups : G and M of group-limited routing (named only when ``M < G``).

    Returns
    -------
    str
        The algorithm's name, for :attr:`ddlsim.workloads.trace.Collective.algorithm`.
    """
    if (backend, kernel) not in KERNELS:
        raise ValueError(f"flex kernel ({backend!r}, {kernel!r}): allowed "
                         f"{', '.join(f'{b}_{k}' for b, k in KERNELS)}")
    grouped = f",G={groups},M={topk_groups}" if topk_groups < groups else ""
    return f"{backend}_{kernel}[k={top_k},E={experts},r={replicas}{grouped}]"


def _resolve(op: str, name: str) -> Algorithm | None:
    """The :class:`Algorithm` a flex name stands for (None if the name is not one)."""
    match = _NAME.match(name)
    if op != "all_to_all" or match is None:
        return None
    backend, kernel = match[1], match[2]
    top_k, experts, replicas = (int(match[i]) for i in (3, 4, 5))
    groups, topk_groups = (int(match[i] or 1) for i in (6, 7))
    rates = KERNELS[(backend, kernel)]

    def traffic(n: float, net: GroupNet) -> FlexTraffic:
        try:
            return flex_traffic(n / top_k, experts, top_k, replicas, net.p, net.g, groups,
                                topk_groups)
        except ValueError as exc:   # a layout the traffic is not derived for: the user's plan
            raise ConfigError(f"{name} on {net.p} ranks, {net.g} per node: {exc}") from None

    def time(n: float, net: GroupNet) -> float:
        if net.p <= 1:
            return 0.0
        if not net.uniform:
            return math.inf   # members spread unevenly over nodes: not modelled
        return flex_time(traffic(n, net), rates, net)

    def layout(n: float, net: GroupNet) -> list[Phase]:
        return [_pairs(net.p, net.g, traffic(n, net), n, rates)]

    return Algorithm(op, name, time, _no_phases, backend="flex", layout=layout)


def _no_phases(n: float, p: int, g: int) -> list[Phase]:  # pragma: no cover - guard
    raise NotImplementedError("a flex kernel lays out its phases from the group's net")


register_parametric("deepep_")(_resolve)
register_parametric("hybridep_")(_resolve)
