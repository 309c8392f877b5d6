"""``calibrate comm`` refuses more ranks per node than usable cores (issue #30)."""

from __future__ import annotations

import pytest

from ddlsim.calibration.comm_bench import check_cores
from ddlsim.calibration.schema import CalibrationError


class _Gathered:
    """An adapter whose allgather returns what each simulated rank reports."""

    def __init__(self, ranks: list[tuple[str, frozenset]]):
        self.ranks = ranks

    def hostname(self) -> str:
        return self.ranks[0][0]

    def allgather_obj(self, obj):
        return list(self.ranks)


def test_ranks_bound_to_one_core_each_count_every_core_of_the_node():
    got = check_cores(_Gathered([("a", frozenset({0})), ("a", frozenset({1})),
                                 ("b", frozenset({0, 1}))]))
    assert got == {"a": (2, 2), "b": (1, 2)}


def test_more_ranks_than_cores_is_refused_naming_ranks_cores_host_and_option():
    four = _Gathered([("node1", frozenset({0, 1}))] * 4)
    with pytest.raises(CalibrationError, match=r"4 ranks on host 'node1' share 2 usable CPU "
                                               r"cores.*at most 2 ranks.*--allow-shared-cores"):
        check_cores(four)
    assert check_cores(four, allow_shared=True) == {"node1": (4, 2)}
