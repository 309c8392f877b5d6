"""The rejected plans of a grid, counted per reason, with masks laid on the grid's shape.

The search's rules judge a product of axes once per distinct value of the fields they read
(:attr:`~ddlsim.search.plans.PlanSet.grid`): their masks broadcast to the product's shape
without holding one flag per plan. :class:`Rejections` applies them in order to one reason
code per plan (the first rule that rejects a plan names it), so the rejection costs a few
passes over the plans per rule rather than a mask laid out in full per rule and per pass.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Rejections"]


class Rejections:
    """Per plan, the reason that rejected it (:attr:`reason`: an index into
    :attr:`reasons`, -1 while none has).

    Parameters
    ----------
    shape : the grid's shape (``(plans,)`` for plans without a grid).
    """

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)
        n = int(np.prod(self.shape, dtype=np.int64))
        #: one reason code per plan, in plan order (first axis slowest)
        self.reason = np.full(n, -1, dtype=np.int64)
        self.reasons: list[str] = []
        self._free = np.ones(self.shape, dtype=bool)   # not rejected yet, on the grid

    def reject(self, text: str, mask: np.ndarray) -> None:
        """Reject, for ``text``, the plans of ``mask`` not rejected yet: one flag per plan
        (in plan order) or an array that broadcasts to :attr:`shape`."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape == self.reason.shape and len(self.shape) != 1:
            mask = mask.reshape(self.shape)
        hit = mask & self._free
        if not hit.any():
            return
        if text not in self.reasons:
            self.reasons.append(text)
        np.copyto(self.reason.reshape(self.shape), self.reasons.index(text), where=hit)
        self._free &= ~hit

    @property
    def pending(self) -> np.ndarray:
        """Flags in :attr:`shape`: the plans no rule rejected yet (read-only view)."""
        view = self._free.view()
        view.setflags(write=False)
        return view

    def alive(self) -> np.ndarray:
        """Positions of the plans no rule rejected."""
        return np.flatnonzero(self._free)

    def counts(self) -> dict[str, int]:
        """Plans per reason, most first (ties in the order the reasons first rejected)."""
        n = np.bincount(self.reason + 1, minlength=len(self.reasons) + 1)[1:]
        return dict(sorted(((r, int(k)) for r, k in zip(self.reasons, n)),
                           key=lambda x: -x[1]))
