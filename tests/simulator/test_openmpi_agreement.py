"""Open MPI's allgather_reduce all-reduce (``backend: openmpi``) in the DES: its phases
replay its closed form within 1 % without contention, as every MPI algorithm's do
(test_agreement.py covers the ``mpi`` backend's set only)."""

from __future__ import annotations

import pytest

from scenarios import run_case


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("nbytes", [64e3, 256e6])
def test_allgather_reduce_agrees(p, nbytes):
    for g in (1, p):  # one rank per node behind one switch; one node of p devices
        case = run_case("all_reduce", "allgather_reduce", nbytes, p, g, "switch")
        assert case.des_s == pytest.approx(case.analytical_s, rel=0.01), case
