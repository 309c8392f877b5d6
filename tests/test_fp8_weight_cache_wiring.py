"""The plan's micro-batches reach the FP8 weight casts (Transformer Engine casts a weight once
per optimizer step: simulator/kernels/fp8recipe.py ``fp8_weight_share``): the dense layer's
kernels, and the search tier, which tells plans apart by them."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.builder import StageBuilder

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _cfg(recipe: str, gbs: int, dtype: str = "fp8") -> dict:
    return {"model": {"preset": "llama-3-8b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
            "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 4096,
                      "dtype": dtype},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"fp8_recipe": recipe}}}}


def _fc1_bytes(cfg: dict) -> float:
    run = ddlsim.load_config(cfg)
    kernels = StageBuilder.from_config(run, run.model.shape()).kernels["mlp.fc1"]
    return sum(k.bytes for k in kernels if k.kind == "memory")


@pytest.mark.parametrize("recipe", ["te_delayed", "te_current"])
def test_the_dense_layers_forward_carries_its_share_of_the_weight_cast(recipe):
    # Llama-3-8B fc1 on one of 2 TP ranks: 2 x 14,336 / 2 columns, hidden 4,096, 3 B each;
    # DP 4 on 8 GPUs: 4 and 16 micro-batches per step
    weight = 3 * 4096 * 14336
    got = _fc1_bytes(_cfg(recipe, 16)) - _fc1_bytes(_cfg(recipe, 64))
    assert got == pytest.approx(weight * (1 / 4 - 1 / 16))


def test_torchaos_forward_casts_the_whole_weight_at_any_microbatches():
    # torchao casts the weight in every forward (a what-if on Megatron-Core)
    cfg = [_cfg("tensorwise", gbs) for gbs in (16, 64)]
    for c in cfg:
        c["system"]["software"]["what_if"] = True
    assert _fc1_bytes(cfg[0]) == _fc1_bytes(cfg[1]) > 3 * 4096 * 14336


def test_the_search_tier_agrees_with_the_exact_tier_at_several_microbatches():
    from ddlsim.config import build_config
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    base = _cfg("te_current", 32)
    axes = {"parallel.tensor_model_parallel_size": [1, 2, 4],
            "parallel.pipeline_model_parallel_size": [1]}
    frame = evaluate_grid(base, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) >= 2
    for i in range(len(frame)):
        exact = ddlsim.predict(build_config(base, plan_overrides(frame.iloc[i], columns)),
                               check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-3)
