"""Sliding-window (local) causal attention: what a tiled attention kernel computes of it.

With a window of ``w`` each query ``q`` attends to the keys ``k`` with ``q − w < k ≤ q``
(Beltagy et al. 2020, "Longformer", arXiv:2004.05150, §3.1: cost ``O(s·w)``; Mistral 7B, Jiang
et al. 2023, arXiv:2310.06825, §2; GPT-OSS on every other layer with ``w = 128``, OpenAI 2025,
"gpt-oss-120b & gpt-oss-20b Model Card", §2.1). FlashAttention-2 (``window_size``, since 2.3)
walks the ``B × B`` tiles of the score matrix and skips every tile that lies wholly outside
the band, as it skips the tiles above the diagonal under a causal mask (Dao 2023,
arXiv:2307.08691, §3.1.1); a tile the band crosses is computed whole. So for the query tile
``i`` (queries ``iB … iB + B − 1``) the key tiles ``j_min(i) … i`` are computed, with
``j_min(i) = max(0, ⌊(iB − w + 1) / B⌋)`` the tile of the earliest key its first query sees.

Attention sinks (GPT-OSS: one learned logit per head added to each softmax row's
denominator) add one score per row, ``1/s_k`` of the row's work: not counted.
"""

from __future__ import annotations

import math

__all__ = ["band_tiles", "window_fraction", "window_keys"]


def band_tiles(s: float, window: int, block: int) -> int:
    """Tiles of ``block × block`` a causal kernel with a window of ``window`` keys computes
    for ``s`` queries against ``s`` keys (module docstring): the sum over query tiles
    ``i < n = ⌈s/B⌉`` of ``i − j_min(i) + 1``."""
    if window <= 0:
        raise ValueError(f"window = {window!r} must be a positive number of keys")
    n = max(1, math.ceil(s / block))
    return sum(i - max(0, (i * block - window + 1) // block) + 1 for i in range(n))


def window_fraction(s: float, window: int, block: int) -> float:
    """Fraction of the ``s × s`` score tiles computed with a causal window of ``window`` keys:
    :func:`band_tiles` over ``n²``. A window of ``s`` or more gives the causal fraction
    ``(n + 1)/(2n)``."""
    n = max(1, math.ceil(s / block))
    return band_tiles(s, min(window, n * block), block) / (n * n)


def window_keys(s: float, window: int | None) -> float:
    """Keys each query is counted against in the model FLOPs of one layer: ``s`` for full
    attention (Megatron's count, ``4·b·s²·a·d``, which does not discount the causal mask;
    Narayanan et al. 2021, §5.1), ``min(w, s)`` for a sliding window (the band,
    ``4·b·s·w·a·d``)."""
    return float(s) if window is None else float(min(window, s))
