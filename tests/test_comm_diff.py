"""``ddlsim comm --diff-mpip``: a hand-written mpiP report of the GPT-2 large proxy against
``ddlsim comm``.

The report is what mpiP (LLNL/mpiP doc/UserGuide.md, "mpiP Output") would print for
``mpirun -n 4 ./gpt2 4 2`` (proxies/comm_only/gpt2_large.cpp: 4 layers in 2 stages, 2
replicas, 8 micro-batches, WARM_UP 10 + RUNS 256 = 266 calls of run_pipeline), derived by hand:

* stage 0 (ranks 0, 2) calls MPI_Isend at line 70 once per micro-batch: 8 × 266 = 2128 calls of
  P2PSIZE = 808,960 floats = 3,235,840 B, sum 6,885,867,520 B (mpiP: 6.89e+09);
  the last stage (ranks 1, 3) the same at line 95;
* stage 0's MPI_Allreduce at line 110 runs for BEGINSIZE (85,317,120 floats = 341,268,480 B)
  and one INTERSIZE (19,677,440 floats = 78,709,760 B): 2 × 266 = 532 calls, sum 266 ×
  419,978,240 = 111,714,211,840 B (1.12e+11); the last stage's at line 115 for INTERSIZE and
  ENDSIZE (84,008,960 floats = 336,035,840 B): sum 266 × 414,745,600 = 110,322,329,600 B
  (1.1e+11);
* MPI_Irecv sends nothing and is not in the section.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.api import build_workload
from ddlsim.cli import app
from ddlsim.commdiff import diff_mpip, read_mpip_sent
from ddlsim.commprofile import CommProfileError, comm_profile

runner = CliRunner()
SETS = ["model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=2",
        "parallel.data_parallel_size=2", "train.global_batch_size=16"]
CONFIG = "examples/proxies/gpt2_large.yaml"

REPORT = """@ mpiP
@ Command : ./gpt2 4 2
@ Version                  : 3.5.0
---------------------------------------------------------------------------
@--- Callsite Time statistics (all, milliseconds): 12 ---------------------
---------------------------------------------------------------------------
Name              Site Rank  Count      Max     Mean      Min   App%   MPI%
Allreduce            1    0    532     81.2     40.1     10.3  40.12  60.21
---------------------------------------------------------------------------
@--- Callsite Message Sent statistics (all, sent bytes) -------------------
---------------------------------------------------------------------------
Name              Site Rank   Count       Max      Mean       Min       Sum
Allreduce            1    0     532  3.41e+08   2.1e+08  7.87e+07  1.12e+11
Allreduce            1    2     532  3.41e+08   2.1e+08  7.87e+07  1.12e+11
Allreduce            1    *    1064  3.41e+08   2.1e+08  7.87e+07  2.23e+11
Allreduce            2    1     532  3.36e+08  2.07e+08  7.87e+07   1.1e+11
Allreduce            2    3     532  3.36e+08  2.07e+08  7.87e+07   1.1e+11
Allreduce            2    *    1064  3.36e+08  2.07e+08  7.87e+07  2.21e+11
Isend                3    0    2128  3.24e+06  3.24e+06  3.24e+06  6.89e+09
Isend                3    2    2128  3.24e+06  3.24e+06  3.24e+06  6.89e+09
Isend                4    1    2128  3.24e+06  3.24e+06  3.24e+06  6.89e+09
Isend                4    3    2128  3.24e+06  3.24e+06  3.24e+06  6.89e+09
Isend                *    *    8512  3.24e+06  3.24e+06  3.24e+06  2.75e+10
"""


@pytest.fixture(scope="module")
def profile():
    return comm_profile(build_workload(ddlsim.load_config(CONFIG, SETS)), "rank")


def test_report_is_read_per_rank_and_call_without_aggregates():
    got = read_mpip_sent(REPORT).set_index(["rank", "call"])
    assert len(got) == 8
    assert got.loc[(0, "Allreduce"), "calls"] == 532
    assert got.loc[(3, "Isend"), "sent_bytes"] == 6.89e9


def test_hand_written_report_matches_ddlsim(profile, tmp_path):
    diff = diff_mpip(profile, read_mpip_sent(REPORT), iterations=266)
    assert diff["match"].all() and len(diff) == 8
    row = diff.set_index(["rank", "call"]).loc[(0, "Allreduce")]
    assert row["sent_bytes_ddlsim"] == 266 * (341_268_480 + 78_709_760)
    path = tmp_path / "gpt2.mpiP"
    path.write_text(REPORT)
    res = runner.invoke(app, ["comm", CONFIG, *[a for s in SETS for a in ("--set", s)],
                              "--diff-mpip", str(path), "--iterations", "266", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["match"] is True


def test_a_missing_call_or_a_wrong_count_is_reported(profile, tmp_path):
    # rank 3's last-stage all-reduces cut to 531 calls, and rank 1's Isend lines dropped
    bad = REPORT.replace("Allreduce            2    3     532", "Allreduce            2    3     531")
    bad = bad.replace("Isend                4    1    2128  3.24e+06  3.24e+06  3.24e+06  6.89e+09\n",
                      "")
    diff = diff_mpip(profile, read_mpip_sent(bad), iterations=266).set_index(["rank", "call"])
    assert not diff.loc[(3, "Allreduce"), "match"]
    assert diff.loc[(1, "Isend"), "calls_mpip"] == 0 and not diff.loc[(1, "Isend"), "match"]
    assert diff["match"].sum() == 6
    path = tmp_path / "bad.mpiP"
    path.write_text(bad)
    res = runner.invoke(app, ["comm", CONFIG, *[a for s in SETS for a in ("--set", s)],
                              "--diff-mpip", str(path), "--iterations", "266"])
    assert res.exit_code == 1 and "2 of 8 (rank, call) rows differ" in res.output


def test_alltoall_counts_one_peer_and_bcast_every_rank():
    # mpiP records MPI_Alltoall's sendcount (one peer's share: B/p) and MPI_Bcast's count on
    # every rank, root or not (make-wrappers.py messParamDict)
    import pandas as pd
    from ddlsim.commdiff import mpip_expected
    prof = pd.DataFrame({"rank": [0, 0, 1, 1], "op": ["alltoall", "bcast", "alltoall", "bcast"],
                         "group_size": [2, 2, 2, 2], "calls": [1, 1, 1, 1],
                         "send_bytes": [80.0, 40.0, 80.0, 0.0],
                         "recv_bytes": [80.0, 0.0, 80.0, 40.0]})
    got = mpip_expected(prof).set_index(["rank", "call"])["sent_bytes"].to_dict()
    assert got == {(0, "Alltoall"): 40.0, (0, "Bcast"): 40.0, (1, "Alltoall"): 40.0,
                   (1, "Bcast"): 40.0}


def test_a_report_without_the_section_is_refused():
    with pytest.raises(CommProfileError, match="Callsite Message Sent statistics"):
        read_mpip_sent("@ mpiP\n@ Command : ./a.out\n")
