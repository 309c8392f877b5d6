"""benchmarks/torchtitan_pp.py: torch's Interleaved1F1B time-step grid and its lock-step timing,
derived by hand on a 2-rank case, and the async-TP split's arithmetic (no prediction runs)."""

from __future__ import annotations

import pytest
from benchscripts import load_script

pp = load_script("torchtitan_pp")


def _names(grid):
    return [None if a is None else f"{a[0]}{a[1]}.{a[2]}" for a in grid]


def test_the_grid_of_two_ranks_two_stages_each_two_microbatches():
    # per round 2; rank 0: warm-up min(1·2 + 2·1, 4) = 4 forwards, 4 + 2 − 4 − 0 = 2 idle
    # steps, no steady pairs, then (idle, backward) × 4; rank 1: one idle step, 2 warm-up
    # forwards, 4 + 0 − 2 − 1 = 1 idle step, 2 pairs, (idle, backward) × 2
    assert _names(pp.torch_grid(0, 2, 2, 2)) == [
        "F0.0", "F0.1", "F2.0", "F2.1", None, None,
        None, "B2.0", None, "B2.1", None, "B0.0", None, "B0.1"]
    assert _names(pp.torch_grid(1, 2, 2, 2)) == [
        None, "F1.0", "F1.1", None, "F3.0", "B3.0", "F3.1", "B3.1", None, "B1.0", None, "B1.1"]


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (4, 2, 4), (4, 2, 8), (8, 2, 8), (4, 3, 4)])
def test_every_action_comes_after_its_input_on_the_grid(p, v, m):
    grids = [pp.torch_grid(r, p, v, m) for r in range(p)]
    when = {a: t for g in grids for t, a in enumerate(g) if a}
    assert len(when) == 2 * p * v * m                       # each (kind, stage, mb) once
    for (kind, stage, mb), t in when.items():
        dep = pp._input_of(kind, stage, mb, p * v)
        assert dep is None or when[dep] < t


def test_lockstep_and_dataflow_times_of_the_two_rank_case():
    # forward 1 s, backward 2 s per stage, worked step by step on the grids above: the
    # lock-step run ends at 16 s (rank 0 idles at steps 4-6 until rank 1's B3.0 exchange),
    # the same actions waiting only for their inputs at 15 s
    assert pp.lockstep_time(2, 2, 2, 1.0, 2.0) == pytest.approx(16.0)
    assert pp.dataflow_time(2, 2, 2, 1.0, 2.0) == pytest.approx(15.0)


def test_lockstep_is_never_faster_and_pays_each_exchange():
    for p, v, m in [(4, 2, 4), (8, 2, 8)]:
        flow, grid = pp.dataflow_time(p, v, m, 1.0, 3.0), pp.lockstep_time(p, v, m, 1.0, 3.0)
        assert grid >= flow - 1e-12
        assert pp.lockstep_time(p, v, m, 1.0, 3.0, p2p_s=0.01) > grid


def test_the_split_record_and_the_measured_gain():
    o = pp.split_record({"table": "5"}, published=40.0, predicted=36.0, vanilla=40.8)
    assert o["error"] == pytest.approx(-0.1) and o["vanilla_error"] == pytest.approx(0.02)
    assert o["gain"] == pytest.approx(40.8 / 36.0 - 1)
    assert pp.measured_gain({"tps_per_gpu": "829"}, {"tps_per_gpu": "876"}) == \
        pytest.approx(876 / 829 - 1)


def test_the_vanilla_config_only_turns_async_tp_off():
    row = next(r for r in pp.pipelined_rows() if r["table"] == "5")
    cfg, off = pp.vt.config(row), pp.vanilla_config(row)
    assert cfg["parallel"].pop("tp_comm_overlap") == "torch_async"
    assert off == cfg
    vanilla, overlapped = pp.async_pair()
    assert (vanilla["async_tp"], overlapped["async_tp"]) == ("0", "1")
