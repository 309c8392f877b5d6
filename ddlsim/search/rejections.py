"""The rejected plans of a grid, counted per reason, with masks laid on the grid's shape.

The search's rules judge a product of axes once per distinct value of the fields they read
(:attr:`~ddlsim.search.plans.PlanSet.grid`): their masks broadcast to the product's shape
without holding one flag per plan. :class:`Rejections` applies them in order (the first rule
that rejects a plan names it) to one flag per plan, still free or rejected, and counts each
rule's plans as it goes: a rule costs a pass or two over the flags, and no reason is written
per plan (the grid reports counts).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Rejections"]


class Rejections:
    """The plans no rule rejected yet (:attr:`free`), and how many each reason rejected.

    Parameters
    ----------
    shape : the grid's shape (``(plans,)`` for plans without a grid).
    """

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)
        self.reasons: list[str] = []
        self._counts: list[int] = []
        self._free = np.ones(self.shape, dtype=bool)   # not rejected yet, on the grid
        self._hit = np.empty(self.shape, dtype=bool)   # each rule's plans, written in place

    def reject(self, text: str, mask: np.ndarray) -> None:
        """Reject, for ``text``, the plans of ``mask`` not rejected yet: one flag per plan
        (in plan order) or an array that broadcasts to :attr:`shape`."""
        mask = np.asarray(mask, dtype=bool)
        if not mask.any():   # on the mask's own (often broadcast, small) shape
            return
        if mask.ndim == 1 and len(self.shape) != 1 and mask.shape == (self._free.size,):
            mask = mask.reshape(self.shape)
        hit = _and_on_grid(mask, self._free, self._hit)
        n = int(np.count_nonzero(hit))
        if not n:
            return
        if text not in self.reasons:
            self.reasons.append(text)
            self._counts.append(0)
        self._counts[self.reasons.index(text)] += n
        self._free ^= hit   # hit lies within the free plans: clears exactly those

    @property
    def pending(self) -> np.ndarray:
        """Flags in :attr:`shape`: the plans no rule rejected yet (read-only view)."""
        view = self._free.view()
        view.setflags(write=False)
        return view

    @property
    def free(self) -> np.ndarray:
        """One flag per plan, in plan order: not rejected (so far; a read-only view that
        follows later rejections)."""
        view = self._free.reshape(-1)
        view.setflags(write=False)
        return view

    def alive(self) -> np.ndarray:
        """Positions of the plans no rule rejected."""
        return np.flatnonzero(self._free)

    def counts(self) -> dict[str, int]:
        """Plans per reason, most first (ties in the order the reasons first rejected)."""
        return dict(sorted(zip(self.reasons, self._counts), key=lambda x: -x[1]))


#: The fewest flags :func:`_and_on_grid` hands numpy's inner loop at once.
_INNER = 64


def _and_on_grid(mask: np.ndarray, flags: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.logical_and(mask, flags, out=out)`` for ``mask`` broadcasting to the grid's
    ``flags`` (C-contiguous, as ``out``): numpy runs its inner loop over the last axis alone
    when a broadcast operand stops it merging axes, and a grid's last axis often holds 2
    values (~0.9 ms a rule on the speed grid's 221,760 plans, 2026-11-30); the mask's
    trailing axes are laid out in full instead (a copy of a few hundred flags), so that the
    loop runs over at least :data:`_INNER` flags at a time. The same flags."""
    shape = flags.shape
    if mask.shape == shape or len(shape) < 2:
        return np.logical_and(mask, flags, out=out)
    mask = mask.reshape((1,) * (len(shape) - mask.ndim) + mask.shape)
    t = len(shape) - 1
    while t > 0 and math.prod(shape[t:]) < _INNER:
        t -= 1
    lead = mask.shape[:t]
    tail = np.ascontiguousarray(np.broadcast_to(mask, lead + shape[t:])).reshape(lead + (-1,))
    np.logical_and(tail, flags.reshape(shape[:t] + (-1,)), out=out.reshape(shape[:t] + (-1,)))
    return out
