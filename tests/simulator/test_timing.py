"""The one timing rule's gap attribution and class end (simulator/timing.py), by hand."""

from __future__ import annotations

import math

import numpy as np

from ddlsim.simulator.result import ClassTiming
from ddlsim.simulator.timing import attribute_gap, book, finish_class, split_gaps


def test_a_gap_waiting_for_a_transfer_is_exposed_up_to_the_transfer():
    T = ClassTiming()
    attribute_gap(T, 3.0, "pp", 1.0)      # waited 3 s for a 1 s transfer: 1 exposed, 2 bubble
    attribute_gap(T, 0.5, "dp", math.inf)  # waited on a stream: all exposed
    assert dict(T.exposed) == {"pp": 1.0, "dp": 0.5} and T.bubble == 2.0


def test_waiting_for_peers_or_compute_is_bubble():
    T = ClassTiming()
    attribute_gap(T, 2.0, "bubble", 0.0)
    attribute_gap(T, 1.0, "compute", 5.0)
    assert dict(T.exposed) == {} and T.bubble == 3.0


def test_split_gaps_is_the_array_form():
    exp, rest = split_gaps(np.array([3.0, 0.5, 0.0]), np.array([1.0, 2.0, 1.0]))
    assert exp.tolist() == [1.0, 0.5, 0.0] and rest.tolist() == [2.0, 0.0, 0.0]


def test_book_counts_compute_stream_time_only():
    T = ClassTiming()
    book(T, True, "compute", True, 2.0, 10.0, 0.0)
    book(T, True, "optimizer", True, 1.0, 1.0, 0.0)
    book(T, False, "compute", True, 4.0, 5.0, 0.0)   # another stream: FLOPs only
    book(T, True, "tp", False, 0.5, 0.0, 100.0)
    book(T, False, "dp", False, 3.0, 0.0, 200.0)
    assert (T.compute, T.optimizer, T.flops) == (2.0, 1.0, 16.0)
    assert dict(T.exposed) == {"tp": 0.5} and dict(T.comm_bytes) == {"tp": 100.0, "dp": 200.0}


def test_communication_after_the_last_compute_is_exposed():
    T = ClassTiming()
    finish_class(T, [5.0, 7.0, 7.0], ["", "dp", "pp"])   # streams 1 and 2 end together
    assert T.end == 7.0 and dict(T.exposed) == {"dp": 2.0}   # the lower-numbered one
    U = ClassTiming()
    finish_class(U, {0: 4.0, 3: 1.0}, {3: "dp"})
    assert U.end == 4.0 and dict(U.exposed) == {}
