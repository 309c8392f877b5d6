"""``benchmarks/torch_fsdp_inside.py``'s account of the ranks' arrivals at each collective
(the part that needs no torch): skew, span and first exit from every rank's entry and exit."""

from __future__ import annotations

import pytest

from benchscripts import load_script


def test_arrivals_sum_the_wait_for_the_last_rank_and_the_collective_after_it():
    mod = load_script("torch_fsdp_inside")
    # two ranks, one iteration of two collectives: rank 1 arrives 3 late at the first, both
    # leave 2 after it; at the second both arrive at once, one leaves 1 and the other 4 after
    every = [[[(0.0, 5.0), (10.0, 11.0)]],
             [[(3.0, 5.0), (10.0, 14.0)]]]
    ((skew, span, first),) = mod.arrivals(every)
    assert skew == pytest.approx((3.0 + 0.0) / 2 + 0.0)
    assert span == pytest.approx(2.0 + 4.0)
    assert first == pytest.approx(2.0 + 1.0)
