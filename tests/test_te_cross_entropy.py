"""Transformer Engine's fused cross-entropy (Megatron-Core's ``--cross-entropy-loss-fusion
--cross-entropy-fusion-impl te``, ``kernels.cross_entropy_fusion_impl: te``), as TE v2.7
(fedd9ddc) ``pytorch/triton/cross_entropy.py`` runs it: the forward reads the 16-bit logits
twice (online max and sum, then the softmax gradient) and writes the gradient into them in
place; the backward scales it in place; the loss keeps the 16-bit logits only (2 B per logit
where Megatron-Core's own fusion keeps them and an fp32 copy, 6 B). Bytes by hand; the
passes and the framework's rule alone: tests/test_te_cross_entropy_passes.py."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.trace import Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

B, S, V, T = 2, 1024, 32000, 2


def _cfg(stack: str = "megatron-core-2025", impl: str | None = "te", fused: bool = True,
         pp: int = 1, tp: int = T) -> dict:
    kernels = {"fused_cross_entropy": fused}
    if impl is not None:
        kernels["cross_entropy_fusion_impl"] = impl
    return {"model": {"architecture": "gpt", "name": "gpt-4x1024", "num_hidden_layers": 4,
                      "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": V,
                      "max_position_embeddings": S},
            "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1,
                         "pipeline_model_parallel_size": pp},
            "train": {"micro_batch_size": B, "global_batch_size": 8 * B, "seq_length": S},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": stack, "kernels": kernels}}}


def test_the_stack_field_refuses_a_bad_value_naming_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"cross_entropy_fusion_impl.*'native'.*'te'"):
        ddlsim.load_config(_cfg(impl="triton"))


def _last_stage(cfg: dict):
    run = ddlsim.load_config(cfg)
    return max(run.family.memory(run), key=lambda m: m.stage)


def test_the_last_stage_holds_4_bytes_a_logit_less():
    # the vocab-parallel logits of one micro-batch, b·s·V/t, at 6 B (native) and 2 B (te)
    native, te = _last_stage(_cfg(impl="native", pp=2)), _last_stage(_cfg(pp=2))
    assert native.other - te.other == pytest.approx(4 * B * S * V / T, rel=1e-12)


def _loss_bytes(cfg: dict) -> dict[str, float]:
    """Bytes of the loss's forward and backward op of one micro-batch (each micro-batch's
    blocks carry the same ops)."""
    out: dict[str, float] = {}
    for block in ddlsim.build_workload(ddlsim.load_config(cfg)).classes[0].program.blocks.values():
        for op in block.flat.ops:
            if isinstance(op.payload, Compute) and op.payload.name in ("loss", "bwd.loss"):
                out.setdefault(op.payload.name, op.payload.bytes)
    return out


def test_the_trace_times_te_passes():
    # per micro-batch, forward 3·2 B and backward 2·2 B per logit
    logits = B * S * V / T
    assert _loss_bytes(_cfg()) == pytest.approx({"loss": 6 * logits, "bwd.loss": 4 * logits})
    # unset: the stack's default, Megatron-Core's own fusion (d + 20, d + 4)
    assert _loss_bytes(_cfg(impl=None)) == pytest.approx({"loss": 22 * logits,
                                                          "bwd.loss": 6 * logits})


@pytest.mark.parametrize("stack", ["megatron-core-2024", "megatron-lm-2021", "deepspeed",
                                   "torchtitan-2025"])
def test_a_stack_without_te_cross_entropy_refuses_it_by_name(stack):
    with pytest.raises(ConfigError, match=r"cross_entropy_fusion_impl = 'te' \(rule "
                                          r"no_te_cross_entropy; source: .*[0-9]"):
        ddlsim.load_config(_cfg(stack=stack, tp=1))
    # the impl is read under the fusion only (Megatron-LM's language_module.py)
    assert ddlsim.load_config(_cfg(stack=stack, fused=False, tp=1)).software.name == stack


def test_the_importer_maps_the_flag():
    from ddlsim.importers.megatron import read_megatron
    draft = read_megatron("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", "r.sh")
    assert draft.fields["system.software.kernels.cross_entropy_fusion_impl"] == "te"
    assert draft.fields["system.software.kernels.fused_cross_entropy"] is True
    bad = read_megatron("--cross-entropy-fusion-impl triton", "r.sh")
    assert any("native or te" in why for _, why in bad.refused)


def test_validate_moe_runs_te_where_the_recipes_set_it():
    from benchscripts import load_script
    vm, vmm = load_script("validate_moe"), load_script("validate_moe_models")
    rows = [vm.config(r) for r in (vm.rows() + vm.zoo_rows() + vm.ab_rows())]
    rows += [vmm.config(r) for r in vmm.rows()]
    for cfg in rows:
        kernels = cfg["system"]["software"]["kernels"]
        assert (kernels["fused_cross_entropy"], kernels["cross_entropy_fusion_impl"]) \
            == (True, "te")
    native = copy.deepcopy(rows[0])
    native["system"]["software"]["kernels"]["cross_entropy_fusion_impl"] = "native"
    assert ddlsim.predict(rows[0]).iteration_time_s < ddlsim.predict(native).iteration_time_s


def test_the_search_tier_keeps_the_same_bytes(monkeypatch):
    # the vectorised search's memory per plan equals the exact engine's with TE's loss, which
    # lowers the last stage's peak (PP 2: the last stage is the rank's peak here)
    from searchmemory import assert_search_memory_is_exact, pp4_config
    cfg = pp4_config("megatron-core-2025")
    cfg["system"]["software"]["kernels"] = {"fused_cross_entropy": True,
                                            "cross_entropy_fusion_impl": "te"}
    assert_search_memory_is_exact(monkeypatch, cfg)
    pp2 = {**cfg, "parallel": {**cfg["parallel"], "pipeline_model_parallel_size": 2,
                               "data_parallel_size": 2}}
    native = copy.deepcopy(pp2)
    native["system"]["software"]["kernels"]["cross_entropy_fusion_impl"] = "native"
    te_total, native_total = (ddlsim.memory_per_device(ddlsim.load_config(c)).total
                              for c in (pp2, native))
    assert te_total < native_total
