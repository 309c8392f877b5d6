"""The attention kernels' fraction of peak as measured, by pass, causal mask, head dim and
sequence length (``ddlsim/data/attention_measured.csv``; docs/compute.md, "Attention").

A device names the GPU whose published measurements time its fused attention kernels
(``device.attention_measured``); a kernel of the stack's attention (``flash2``, ``flash3``,
``cudnn``) then runs at

    η(kernel, pass, causal, d, s) = the measured TFLOP/s / the measured GPU's peak,

interpolated linearly in ``log2 s`` between the table's sequence lengths and clamped at its
ends, on the curve of the nearest measured head dim (in ``log2 d``; the smaller on a tie).
The published TFLOP/s count a causal kernel's work as half the full ``4·b·a·s²·d``
(FlashAttention's benchmark convention, the table's ``flop_convention``); ddlsim counts the
blocks the kernel computes, ``(n+1)/(2n)`` of them (:func:`.attention.causal_fraction`), so a
causal row's fraction is scaled by ``causal_fraction(s) / 0.5``: the kernel time is the
measured one. A causal pass with no measured curve (the FlashAttention-3 paper publishes no
causal backward) takes its non-causal curve times the forward's causal / non-causal ratio at
the same head dim and length, derived from the same figures. A kernel, device or pass
with no rows returns None: the caller falls back to ``device.attention_efficiency``.
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

from .attention import causal_fraction

__all__ = ["AttentionKey", "measured_gpus", "measured_efficiency"]

TABLE = "attention_measured.csv"


class AttentionKey(NamedTuple):
    """What selects one measured curve: GPU, kernel, pass (``fwd``/``bwd``), causal mask."""

    gpu: str
    kernel: str
    pass_: str
    causal: bool


@lru_cache(maxsize=1)
def _curves() -> dict[AttentionKey, dict[int, tuple[tuple[float, float], ...]]]:
    """key -> head dim -> ``(log2 s, η)`` points sorted by length, η in ddlsim's FLOP count."""
    text = resources.files("ddlsim.data").joinpath(TABLE).read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    table: dict[AttentionKey, dict[int, list[tuple[float, float]]]] = {}
    for row in csv.DictReader(lines):
        causal = row["causal"] == "true"
        s = float(row["seqlen"])
        eta = float(row["tflops"]) / float(row["peak_tflops"])
        if causal and row["flop_convention"] == "causal_half":
            eta *= causal_fraction(s) / 0.5
        key = AttentionKey(row["gpu"], row["kernel"], row["pass"], causal)
        table.setdefault(key, {}).setdefault(int(row["head_dim"]), []).append(
            (math.log2(s), eta))
    return {k: {d: tuple(sorted(p)) for d, p in by_d.items()} for k, by_d in table.items()}


def measured_gpus() -> frozenset[str]:
    """The GPUs the table has measurements of (the values ``device.attention_measured`` takes)."""
    return frozenset(k.gpu for k in _curves())


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear ``η`` at ``x = log2 s``, clamped to the end points."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def _curve_at(key: AttentionKey, d: float, s: float) -> float | None:
    """η on ``key``'s curve of the head dim nearest ``d``, at length ``s``; None if no curve."""
    by_d = _curves().get(key)
    if not by_d:
        return None
    near = min(by_d, key=lambda h: (abs(math.log2(h / d)), h))
    return _interp(by_d[near], math.log2(s))


@lru_cache(maxsize=4096)
def measured_efficiency(gpu: str, kernel: str, pass_: str, causal: bool, d: float,
                        s: float) -> float | None:
    """Fraction of ``gpu``'s peak FLOP/s at which ``kernel``'s ``pass_`` (``fwd``/``bwd``)
    runs on sequences of ``s`` queries with head dim ``d`` (module docstring), in ddlsim's
    FLOP count; None when the table has no curve for it.

    Parameters
    ----------
    gpu : str
        The table's GPU (``device.attention_measured``).
    kernel : str
        ``flash2``, ``flash3`` or ``cudnn``.
    pass_ : str
        ``fwd`` or ``bwd``.
    causal : bool
        With a causal mask.
    d : float
        Head dimension.
    s : float
        Query length of the kernel, tokens.

    Returns
    -------
    float or None
        Achieved / peak FLOP/s.

    References
    ----------
    Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608) §4.1, Figures 5 and 6.
    """
    own = _curve_at(AttentionKey(gpu, kernel, pass_, causal), d, s)
    if own is not None or not causal:
        return own
    plain = _curve_at(AttentionKey(gpu, kernel, pass_, False), d, s)
    fwd_causal = _curve_at(AttentionKey(gpu, kernel, "fwd", True), d, s)
    fwd_plain = _curve_at(AttentionKey(gpu, kernel, "fwd", False), d, s)
    if plain is None or fwd_causal is None or fwd_plain is None:
        return plain
    return plain * fwd_causal / fwd_plain
