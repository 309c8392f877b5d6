"""ddlsim.calibration.linkfit: a link from a profile's send/recv fit."""

from __future__ import annotations

import pytest

from ddlsim.calibration.linkfit import measured_link
from ddlsim.calibration.profile import CalibrationProfile
from ddlsim.errors import ConfigError


def _profile(ranks: int, segments: list[dict]) -> CalibrationProfile:
    return CalibrationProfile.from_dict({"version": 1, "comm": [{
        "backend": "mpi", "op": "sendrecv", "scope": "intra", "ranks": ranks, "nodes": 1,
        "ranks_per_node": ranks, "segments": segments}]})


#: 3.3 us + B / 7.08 GB/s up to 64 KiB, then 40 us + B / 1.6 GB/s
SEGMENTS = [{"min_bytes": 8, "alpha_s": 3.3e-6, "beta_s_per_B": 1 / 7.08e9},
            {"min_bytes": 65536, "alpha_s": 40e-6, "beta_s_per_B": 1 / 1.6e9}]


@pytest.mark.parametrize("nbytes, want", [(4096, (7.08e9, 3.3e-6)),
                                          (8 << 20, (1.6e9, 40e-6))])
def test_the_segment_covering_the_size_is_the_link(nbytes, want):
    link = measured_link(_profile(4, SEGMENTS), nbytes, 4)
    assert (link.bandwidth_Bps, link.latency_s) == pytest.approx(want, rel=1e-12)
    assert "sendrecv fit" in link.source and "4 ranks" in link.source


def test_a_segment_without_bandwidth_is_refused():
    flat = [{"min_bytes": 8, "alpha_s": 1e-5, "beta_s_per_B": 0.0}]
    with pytest.raises(ConfigError, match="beta = 0.0: no bandwidth"):
        measured_link(_profile(2, flat), 1024, 2)
