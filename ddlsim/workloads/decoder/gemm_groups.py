"""The walk the TP overlap modes share over a partitioner's layer ops: each linear GEMM with
the TP collectives that feed it (before) and the ones it produces (after), every other op
kept whole (:mod:`.tp_overlap`'s TransformerEngine modes, :mod:`.torch_tp`'s ``torch_async``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ..trace import Op

__all__ = ["gemm_groups"]


def gemm_groups(body: list[Op], is_linear: Callable[[Op], bool],
                pre: Callable[[Op], Any], post: Callable[[Op], Any]
                ) -> Iterator[tuple[int | None, Op | None, list | None, list | None]]:
    """Yield ``(i, op, pres, posts)`` for each linear GEMM ``body[i]`` (``pres``: what
    ``pre`` returned for the collectives since the last GEMM, ``posts``: for the ones right
    after it), ``(i, op, None, None)`` for every other op kept in place, and a last
    ``(None, None, pres, None)`` for collectives left after the last GEMM. ``pre``/``post``
    return None for an op that is not one. Collectives after the layer's last GEMM feed the
    next layer's first and are walked first, as :func:`.tp_overlap.layer_body` moves them."""
    last = max(i for i, op in enumerate(body) if is_linear(op))
    trailing = [i for i in range(last + 1, len(body)) if pre(body[i]) is not None]
    order = trailing + [i for i in range(len(body)) if i not in trailing]
    pres: list = []
    k = 0
    while k < len(order):
        i = order[k]
        op = body[i]
        if (item := pre(op)) is not None:
            pres.append(item)
            k += 1
        elif not is_linear(op):
            yield i, op, None, None
            k += 1
        else:
            j, posts = k + 1, []
            while j < len(order) and (item := post(body[order[j]])) is not None:
                posts.append(item)
                j += 1
            yield i, op, pres, posts
            pres, k = [], j
    if pres:
        yield None, None, pres, None
