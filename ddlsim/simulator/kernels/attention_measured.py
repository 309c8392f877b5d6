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

Each curve was measured on one launch shape a length (the table's ``batch`` × ``heads``
(sequence, head) pairs: 16k tokens, 2,048 / d heads, 1,024-4,096 query tiles), where a causal
kernel's unequal tiles fill the SMs in many waves. Given the launch's own pairs and its GPU's
SM count, η is scaled by ``U(launch) / U(reference)``, the tile utilisation of the launch
over that of the curve's own launch at the same length (past the table's lengths, at the end
length whose η it takes) on the measured GPU (:mod:`.attention_tiles`,
:data:`MEASURED_SM_COUNT`): 1 at the table's shapes, below where fewer pairs leave SMs idle.
A derived causal curve keeps the launch of the curves it comes from. Without pairs (or SMs)
η is the curve's.
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

from .attention import causal_fraction
from .attention_tiles import SCHEDULED_KERNELS, tile_utilisation

__all__ = ["AttentionKey", "measured_gpus", "measured_efficiency", "MEASURED_SM_COUNT"]

TABLE = "attention_measured.csv"
#: SMs of each measured GPU (the table's ``gpu``), for its launches' tile utilisation:
#: H100 SXM5, 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022, p. 20)
MEASURED_SM_COUNT = {"h100-sxm5": 132}


class AttentionKey(NamedTuple):
    """What selects one measured curve: GPU, kernel, pass (``fwd``/``bwd``), causal mask."""

    gpu: str
    kernel: str
    pass_: str
    causal: bool


class Curve(NamedTuple):
    """One measured curve: ``(log2 s, η)`` points sorted by length, η in ddlsim's FLOP
    count, and its launches' tokens (``batch × seqlen``) and heads."""

    points: tuple[tuple[float, float], ...]
    tokens: float
    heads: float


@lru_cache(maxsize=1)
def _curves() -> dict[AttentionKey, dict[int, Curve]]:
    """key -> head dim -> its :class:`Curve`."""
    text = resources.files("ddlsim.data").joinpath(TABLE).read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    table: dict[AttentionKey, dict[int, list[tuple[float, float]]]] = {}
    launch: dict[tuple[AttentionKey, int], set[tuple[float, float]]] = {}
    for row in csv.DictReader(lines):
        causal = row["causal"] == "true"
        s = float(row["seqlen"])
        eta = float(row["tflops"]) / float(row["peak_tflops"])
        if causal and row["flop_convention"] == "causal_half":
            eta *= causal_fraction(s) / 0.5
        key, d = AttentionKey(row["gpu"], row["kernel"], row["pass"], causal), int(row["head_dim"])
        table.setdefault(key, {}).setdefault(d, []).append((math.log2(s), eta))
        launch.setdefault((key, d), set()).add((float(row["batch"]) * s, float(row["heads"])))
    out: dict[AttentionKey, dict[int, Curve]] = {}
    for (key, d), shapes in sorted(launch.items()):
        if len(shapes) != 1:
            raise ValueError(f"{TABLE}: curve {key} head dim {d} mixes launches (batch x "
                             f"seqlen, heads) {sorted(shapes)}; expected one a curve")
        (tokens, heads), = shapes
        out.setdefault(key, {})[d] = Curve(tuple(sorted(table[key][d])), tokens, heads)
    return out


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


def _nearest(key: AttentionKey, d: float) -> tuple[int, Curve] | None:
    """``key``'s curve of the head dim nearest ``d`` (in ``log2 d``; the smaller on a tie)."""
    by_d = _curves().get(key)
    if not by_d:
        return None
    near = min(by_d, key=lambda h: (abs(math.log2(h / d)), h))
    return near, by_d[near]


def _curve_at(key: AttentionKey, d: float, s: float) -> float | None:
    """η on ``key``'s curve of the head dim nearest ``d``, at length ``s``; None if no curve."""
    found = _nearest(key, d)
    return None if found is None else _interp(found[1].points, math.log2(s))


@lru_cache(maxsize=4096)
def measured_efficiency(gpu: str, kernel: str, pass_: str, causal: bool, d: float,
                        s: float, pairs: float | None = None, sm_count: int | None = None,
                        s_k: float | None = None) -> float | None:
    """Fraction of ``gpu``'s peak FLOP/s at which ``kernel``'s ``pass_`` (``fwd``/``bwd``)
    runs on sequences of ``s`` queries with head dim ``d`` (module docstring), in ddlsim's
    FLOP count; None when the table has no curve for it. With ``pairs`` and ``sm_count``,
    scaled by the launch's tile utilisation over that of the curve's own launch.

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
    pairs : float, optional
        Sequences × query heads of the launch.
    sm_count : int, optional
        SMs of the GPU the launch runs on.
    s_k : float, optional
        Keys per sequence of the launch (default ``s``).

    Returns
    -------
    float or None
        Achieved / peak FLOP/s.

    References
    ----------
    Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608) §4.1, Figures 5 and 6;
    :func:`.attention_tiles.tile_utilisation`.
    """
    eta = _published(gpu, kernel, pass_, causal, d, s)
    ref = _nearest(AttentionKey(gpu, kernel, pass_, causal), d) or \
        _nearest(AttentionKey(gpu, kernel, pass_, False), d)
    sms = MEASURED_SM_COUNT.get(gpu)
    if eta is None or not pairs or not sm_count or ref is None or sms is None \
            or kernel not in SCHEDULED_KERNELS:
        return eta
    d_ref, curve = ref
    # the curve's launch at this length; past its ends, at the end whose rate it takes
    s_ref = min(max(s, 2.0 ** curve.points[0][0]), 2.0 ** curve.points[-1][0])
    pairs_ref = curve.tokens * curve.heads / s_ref
    own = tile_utilisation(kernel, pass_, causal, d, pairs, s, s if s_k is None else s_k,
                           sm_count)
    return eta * own / tile_utilisation(kernel, pass_, causal, d_ref, pairs_ref, s_ref, s_ref,
                                        sms)


def _published(gpu: str, kernel: str, pass_: str, causal: bool, d: float, s: float
               ) -> float | None:
    """η of the curve at the table's launch; a causal pass with no curve of its own: its
    non-causal curve times the forward's causal / non-causal ratio (module docstring)."""
    own = _curve_at(AttentionKey(gpu, kernel, pass_, causal), d, s)
    if own is not None or not causal:
        return own
    plain = _curve_at(AttentionKey(gpu, kernel, pass_, False), d, s)
    fwd_causal = _curve_at(AttentionKey(gpu, kernel, "fwd", True), d, s)
    fwd_plain = _curve_at(AttentionKey(gpu, kernel, "fwd", False), d, s)
    if plain is None or fwd_causal is None or fwd_plain is None:
        return plain
    return plain * fwd_causal / fwd_plain
