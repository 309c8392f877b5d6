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
