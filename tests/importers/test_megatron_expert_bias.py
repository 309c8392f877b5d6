"""Megatron-LM's auxiliary-loss-free balancing flags read into parallel.moe:
``--moe-router-score-function``, ``--moe-router-enable-expert-bias`` and
``--moe-router-bias-update-rate`` (docs/moe.md)."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers.common import nested
from ddlsim.importers.megatron import read_megatron
from ddlsim.workloads.decoder.moeplan import resolve_moe

#: the router block of Megatron-LM's DeepSeek-V3 Megatron-FSDP script (NVIDIA/Megatron-LM
#: d98e8a64 examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh lines 91-104, without its
#: dispatcher and forced balance)
SCRIPT = """torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 8 \\
    --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 4 --moe-router-num-groups 8 \\
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias \\
    --moe-router-bias-update-rate 1e-3 --expert-model-parallel-size 8
"""


def _moe(script: str) -> dict:
    draft = read_megatron(script, "v3.sh")
    assert not draft.refused, draft.refused
    return {k: v for k, v in draft.fields.items() if k.startswith("parallel.moe.")}


def test_the_expert_bias_flags_set_the_plan_options():
    moe = _moe(SCRIPT)
    assert moe["parallel.moe.router_score_function"] == "sigmoid"
    assert moe["parallel.moe.router_enable_expert_bias"] is True
    assert moe["parallel.moe.router_bias_update_rate"] == 1e-3
    assert moe["parallel.moe.router_load_balancing_type"] == "seq_aux_loss"


def test_the_imported_router_runs_the_bias_in_a_plan():
    """The flags, loaded over a 2-layer Qwen3-30B-A3B (128 experts in 8 groups of 16; top-8
    from 4 groups) at EP 8: the expert-bias router's derived hot rank, its sequence loss."""
    d = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
         "parallel": {"tensor_model_parallel_size": 1},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}
    imported = nested(_moe(SCRIPT) | {"parallel.expert_model_parallel_size": 8})
    d["parallel"].update(copy.deepcopy(imported["parallel"]))
    d["parallel"]["moe"].update(token_dispatcher_type="alltoall", grouped_gemm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = resolve_moe(ddlsim.load_config(d))
    assert plan.expert_bias and plan.score_function == "sigmoid"
    assert plan.imbalance_basis == "derived" and plan.balancing == "seq_aux_loss"
    assert "expert-bias router" in plan.routing_phrase()


def test_a_score_function_ddlsim_does_not_know_is_refused_by_name():
    draft = read_megatron(SCRIPT.replace("sigmoid", "tanh"), "v3.sh")
    assert [a for a, _ in draft.refused] == ["--moe-router-score-function tanh"]


def test_the_bias_without_sigmoid_is_refused_when_loaded():
    """Megatron-Core's own ValueError (d98e8a64 transformer_config.py lines 2617-2625),
    raised by the plan's checks, not silently accepted by the importer."""
    d = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
         "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                      "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                              **nested(_moe(SCRIPT.replace(
                                  "--moe-router-score-function sigmoid", "")))["parallel"]["moe"]}},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match="needs the sigmoid or sqrtsoftplus"):
            ddlsim.load_config(d)


def test_deepseek_v3s_other_router_flags_are_read():
    """The same script's --moe-router-pre-softmax (the same kernels) and
    --moe-router-topk-scaling-factor 2.5 (a small product, accepted as not modelled)."""
    draft = read_megatron(SCRIPT.replace(
        "--moe-router-topk 8", "--moe-router-topk 8 --moe-router-pre-softmax "
        "--moe-router-topk-scaling-factor 2.5"), "v3.sh")
    assert not draft.refused
    assert any(a.startswith("--moe-router-topk-scaling-factor") for a in draft.unmodelled)
