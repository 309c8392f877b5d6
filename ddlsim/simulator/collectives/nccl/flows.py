"""NCCL's algorithms registered as the ``nccl`` backend's (``nccl_ring``, ``nccl_tree``, …):
each times itself with its best (or configured) protocol (:func:`.model.best_protocol`) and
lays out the flows the discrete-event engine replays, their bytes inflated by ``bottleneck /
algBw`` and their latency the time taken's (:func:`.model.taken_parts`), so that replayed
alone they take :func:`.model.nccl_time`."""

from __future__ import annotations

import math

import numpy as np

from ..base import GroupNet, Phase, _ring_pairs, register
from .hops import ring_steps
from .model import ALGORITHMS, NcclEnv, _link, best_protocol, taken_parts

__all__: list[str] = []


def _env(net: GroupNet) -> NcclEnv:
    if net.nccl is None:
        raise ValueError("no NCCL environment on this group net")
    return net.nccl


def _time_fn(op: str, algo: str):
    def time(n: float, net: GroupNet) -> float:
        if net.nccl is None:
            return math.inf
        return best_protocol(op, algo, n, net, net.nccl)[1]
    time.__doc__ = f"NCCL {algo} {op}, its best (or configured) protocol."
    return time


def _layout_fn(op: str, algo: str):
    def layout(n: float, net: GroupNet) -> list[Phase]:
        env = _env(net)
        proto, t = best_protocol(op, algo, n, net, env)
        if not math.isfinite(t):
            raise ValueError(f"NCCL {algo} does not run {op} here")
        bottleneck, _ = _link(net, env)
        bw, lat_us = taken_parts(op, algo, proto, n, net, env)
        lat_s = lat_us * 1e-6
        per_byte = bottleneck / (bw * 1e9)
        return _phases(op, algo, net.p, per_byte, lat_s)
    return layout


def _phases(op: str, algo: str, p: int, per_byte: float, lat_s: float) -> list[Phase]:
    """Flows whose bytes at the bottleneck rate take ``per_byte`` s per byte of bytes/B."""
    if algo == "ring" and op in ("all_reduce", "all_gather", "reduce_scatter"):
        steps = ring_steps(op, p)
        return [Phase(_ring_pairs(p), per_byte / steps, repeat=steps, latency_s=lat_s / steps)]
    chain = np.stack([np.arange(0, p - 1), np.arange(1, p)], axis=1)
    if algo == "ring":  # broadcast: a pipelined chain from the root; reduce: toward it
        pairs = chain if op == "broadcast" else chain[:, ::-1].copy()
        return [Phase(pairs, per_byte, latency_s=lat_s)]
    if algo == "tree":  # reduce up the tree, broadcast down, pipelined: every edge busy
        return [Phase(chain[:, ::-1].copy(), per_byte / 2, latency_s=lat_s / 2),
                Phase(chain, per_byte / 2, latency_s=lat_s / 2)]
    return [Phase(_ring_pairs(p), per_byte, latency_s=lat_s)]  # NVLS, CollNet: every link once


for _op, _algos in ALGORITHMS.items():
    for _algo in _algos:
        register(_op, f"nccl_{_algo}", backend="nccl",
                 layout=_layout_fn(_op, _algo))(_time_fn(_op, _algo))
