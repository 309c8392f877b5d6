"""benchmarks/search_winner.py: the bundled search's winner and its ablations (docs/search.md,
"How far to trust the winner"), checked on a grid of two plans so that it stays fast."""

from __future__ import annotations

import pytest

from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

sw = load_script("search_winner")
#: two plans of the bundled grid: its winner at 1 and 2 micro-batches
AXES = {"parallel.tensor_model_parallel_size": [4], "parallel.pipeline_model_parallel_size": [8],
        "parallel.virtual_pipeline_model_parallel_size": [6],
        "parallel.sequence_parallel": [True], "parallel.zero_stage": [1],
        "train.micro_batch_size": [1, 2], "train.recompute": ["none"]}


def test_an_option_it_does_not_take_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        sw.main(["--engine", "des"])
    assert exc.value.code == 2 and "--engine" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        sw.main(["--config", "no-such-file.yaml"])
    assert exc.value.code == 2 and "no-such-file.yaml" in capsys.readouterr().err


def test_the_software_override_keeps_the_stack_and_sets_the_kernel():
    (sets,) = sw.software_set(sw.CONFIG, {"gradient_accumulation_fusion": False})
    assert sets == ('system.software={"stack": "megatron-core-2024", "kernels": '
                    '{"gradient_accumulation_fusion": false}}')
    assert sw.change_sets(sw.CONFIG, sw.ABLATIONS["overlapped P2P"]) == [
        "parallel.overlap_p2p_comm=false"]


def test_switching_the_fusion_off_slows_the_winner():
    sets, row = sw.winner(sw.CONFIG, axes=AXES)
    assert sw.plan_label(row).startswith("TP4 PP8×6 DP32 b")
    out = sw.ablations(sw.CONFIG, sets, labels=["gradient-accumulation fusion"])
    base, unfused = out["(none)"], out["gradient-accumulation fusion"]
    # the fp32 main_grad pass is back: 12 B per weight per micro-batch, seconds on 175B
    assert unfused.iteration_time_s > base.iteration_time_s + 0.5
    assert unfused.mfu < base.mfu


def test_the_walk_steps_from_the_2022_stack_to_the_default():
    """``--walk``: every step of :data:`WALK` applied on top of the ones before it; checked on
    the 22B row of the same table (one pipeline stage: fast)."""
    import validate_recompute as vr
    row22 = next(r for r in vr.rows() if r["model"] == "22B" and r["scheme"] == "present")
    out = sw.walk(row22)
    labels = list(out)
    assert labels[0].startswith("2022 stack") and labels[-1] == "= megatron-core-2024"
    assert labels[1:-1] == list(sw.WALK)
    times = [t for t, _ in out.values()]
    # the fusion removes the fp32 accumulation pass that bf16 brought
    assert times[4] < times[3]
    assert all(0 < m < 1 for _, m in out.values())


def test_the_breakdown_accounts_for_the_winner():
    """``--breakdown``: the engine's exposed parts, the first rank's compute by kind (shares
    summing to 100 %) and the memory parts, whose total is the prediction's."""
    sets, _ = sw.winner(sw.CONFIG, axes={**AXES, "train.micro_batch_size": [1]})
    rows = sw.breakdown(sw.CONFIG, sets)
    compute = [float(r[2].split()[0]) for r in rows if r[0].startswith("compute: ")]
    assert abs(sum(compute) - 100) < 0.6 and any(r[0] == "compute: GEMM" for r in rows)
    assert any(r[0] == "exposed pp communication" for r in rows)
    total = next(r[1] for r in rows if r[0] == "memory: total")
    assert float(total.split()[0]) == round(sw.predict_plan(sw.CONFIG, sets).memory.total
                                            / sw.GiB, 2)
