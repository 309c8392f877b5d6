"""The tidy table, the nccl-tests bus-bandwidth factors and the size sweep."""

from __future__ import annotations

import math

import pytest

from ddlsim.calibration.adapters import buffer_layout, mpi_library, pingpong_partner
from ddlsim.calibration.comm_bench import default_sizes
from ddlsim.calibration.schema import (COLUMNS, OPS, CalibrationError, busbw_factor, comm_row,
                                       summarize, tidy_frame)
from ddlsim.errors import ConfigError


@pytest.mark.parametrize("op, n, factor", [
    # NVIDIA/nccl-tests doc/PERFORMANCE.md: 2(n-1)/n, (n-1)/n, 1
    ("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_reduce", 1, 0.0),
    ("all_gather", 8, 0.875), ("reduce_scatter", 16, 15 / 16), ("all_to_all", 4, 0.75),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("sendrecv", 2, 1.0),
])
def test_busbw_factor_matches_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


@pytest.mark.parametrize("op, ranks", [("allreduce", 2), ("all_reduce", 0), ("all_reduce", 2.5)])
def test_busbw_factor_rejects_bad_input_with_the_allowed_values(op, ranks):
    with pytest.raises(ConfigError) as err:
        busbw_factor(op, ranks)
    assert repr(op if op not in OPS else ranks) in str(err.value)


def test_summarize_statistics():
    s = summarize([1.0, 2.0, 3.0, 10.0])
    assert (s["time_mean_s"], s["time_median_s"], s["time_min_s"], s["time_max_s"], s["n"]) == \
        (4.0, 2.5, 1.0, 10.0, 4)
    assert s["time_std_s"] == pytest.approx(4.0825, rel=1e-4)  # sample std, ddof = 1
    assert summarize([2.0])["time_std_s"] == 0.0
    with pytest.raises(CalibrationError):
        summarize([])


def test_comm_row_bandwidths_use_the_median():
    stats = summarize([1e-3, 2e-3, 3e-3])
    row = comm_row(backend="mpi", library="x", library_version="1", op="all_reduce", ranks=4,
                   nodes=1, ranks_per_node=4, scope="intra", nbytes=4_000_000, stats=stats)
    assert row["algbw_Bps"] == pytest.approx(4e6 / 2e-3)
    assert row["busbw_Bps"] == pytest.approx(4e6 / 2e-3 * 1.5)
    df = tidy_frame([row])
    assert tuple(df.columns) == COLUMNS and df["bytes"].dtype.kind == "i"


def test_tidy_frame_rejects_unknown_scope():
    row = comm_row(backend="mpi", library="", library_version="", op="reduce", ranks=2, nodes=1,
                   ranks_per_node=2, scope="rack", nbytes=8, stats=summarize([1e-6]))
    with pytest.raises(CalibrationError, match="rack"):
        tidy_frame([row])


def test_default_sizes_are_powers_of_two():
    assert default_sizes(1024, 8) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert default_sizes(100, 10, 10) == [10, 100]
    with pytest.raises(CalibrationError):
        default_sizes(4, 8)
    with pytest.raises(CalibrationError):
        default_sizes(64, 8, 1.0)


@pytest.mark.parametrize("op, nbytes, ranks, expected", [
    ("all_reduce", 1000, 4, (250, 250, 1000)),
    ("all_gather", 1000, 3, (83, 249, 996)),        # whole 4-byte chunks per rank
    ("reduce_scatter", 8, 4, (4, 1, 16)),           # at least one element per rank
    ("all_to_all", 64, 2, (16, 16, 64)),
    ("sendrecv", 3, 2, (1, 1, 4)),
])
def test_buffer_layout_follows_the_nccl_tests_size_convention(op, nbytes, ranks, expected):
    assert buffer_layout(op, nbytes, ranks) == expected


def test_pingpong_pairs_cross_halves_and_odd_rank_idles():
    assert [pingpong_partner(r, 4) for r in range(4)] == [(2, True), (3, True), (0, False),
                                                         (1, False)]
    assert pingpong_partner(2, 3) is None
    assert not math.isnan(busbw_factor("sendrecv", 2))


@pytest.mark.parametrize("banner, expected", [
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11",
     ("Open MPI", "Open MPI v5.0.11")),
    ("MPICH Version:      4.1.2\nMPICH Release date: Wed Jun  7 15:22:45 CDT 2023",
     ("MPICH", "MPICH 4.1.2")),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n", ("Intel(R) MPI Library 2021.10 for Linux* OS",
                                                     "Intel(R) MPI Library 2021.10 for Linux* OS")),
])
def test_mpi_library_banner(banner, expected):
    assert mpi_library(banner) == expected
