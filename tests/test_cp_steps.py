"""benchmarks/cp_steps.py: ddlsim's pieces of torch's ring attention on torchtitan's CP rows,
and how a measurement of ``benchmarks/device/ring_attention.py`` is matched to them."""

from __future__ import annotations

import csv

import pytest
from benchscripts import load_script

from ddlsim.configload import build_config

cs = load_script("cp_steps")
vt = load_script("validate_torchtitan")
CP2 = next(r for r in vt.rows() if r["table"] == "2" and r["set"] == "2024" and r["cp"] == "2")


@pytest.fixture(scope="module")
def cp2():
    cfg = build_config(vt.config(CP2))
    return cfg, cs.pieces(cfg)


def test_the_ring_of_one_layer_holds_its_steps(cp2):
    # CP 2: step 0 and one later step, each forward and backward; the rest of the ring (the
    # K/V pack and gather, the casts, the dK/dV transfers) only adds to their sum
    _, p = cp2
    fwd = p["flash fwd step 0"] + p["flash fwd later"] + p["merge"]
    bwd = p["flash bwd step 0"] + p["flash bwd later"] + p["accumulate"]
    assert fwd < p["ring fwd"] < fwd + 0.01
    assert fwd + bwd < p["ring fwd+bwd"] < fwd + bwd + 0.02
    # the unmasked 16k x 32k call does the causal 32k x 32k call's work in about its time:
    # measured on one H200 (benchmarks/data/device_h200_2026-11-30/run1/ring/kernels.csv),
    # 25.55 ms against step 0's 25.37 ms; the causal call's tiles are unequal, the unmasked
    # call's equal (kernels/attention_tiles.py), so neither rate is higher by much
    assert abs(p["flash fwd later"] / p["flash fwd step 0"] - 1) < 0.05


def test_rank_shape_is_heads_per_tp_rank_and_tokens_per_cp_rank(cp2):
    cfg, _ = cp2
    assert cs._shape_of(cfg) == (32, 1, 32768)     # Llama 3.1 8B, 65536 tokens over CP 2


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_measured_rows_match_by_piece_mode_shape_and_cp(tmp_path):
    kern = {"causal": "False", "batch": 1, "head_dim": 128, "s_q": 16384, "s_k": 32768,
            "heads": 32, "local_tokens": 32768, "pass": "fwd"}
    _write(tmp_path / "kernels.csv", [
        {**kern, "piece": "later_rank0", "mode": "eager", "seconds": 0.03},
        {**kern, "piece": "merge", "mode": "eager", "seconds": 0.004},
        {**kern, "piece": "merge", "mode": "compiled", "seconds": 0.001}])
    _write(tmp_path / "ring.csv", [
        dict(cp=cp, batch=1, heads=32, local_tokens=32768, head_dim=128, rotate=rot,
             mode=mode, fwd_s_slowest=0.1 * cp, fwd_s_fastest=0.1, fwd_bwd_s_slowest=0.4 * cp,
             fwd_bwd_s_fastest=0.4)
        for cp in (2, 4) for rot in ("allgather", "alltoall") for mode in ("eager", "compiled")])
    k, ring = cs.measured(tmp_path)
    shape = (32, 1, 32768)
    assert cs._measured_piece("flash fwd later", k, ring, 2, shape) == 0.03
    assert cs._measured_piece("merge", k, ring, 2, shape) == 0.001      # compiled first
    assert cs._measured_piece("flash bwd later", k, ring, 2, shape) is None
    assert cs._measured_piece("ring fwd+bwd", k, ring, 4, shape) == pytest.approx(1.6)
    assert cs._measured_piece("ring fwd", k, ring, 8, shape) is None     # no CP 8 run
    assert cs._measured_piece("flash fwd later", k, ring, 2, (16, 1, 32768)) is None


def test_a_measured_path_that_is_no_folder_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cs.main(["--measured", str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "not a folder" in capsys.readouterr().err
