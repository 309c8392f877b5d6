"""Megatron-LM's MoE arguments read into parallel.moe and the expert grid (docs/moe.md)."""

from __future__ import annotations

from ddlsim.importers.megatron import read_megatron

#: the MoE block of Megatron-LM's Mixtral example (NVIDIA/Megatron-LM 9c1a5351
#: examples/mixtral/train_mixtral_8x7b_distributed.sh lines 51-56) plus the folding and
#: routing options of its MoE README
SCRIPT = """torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \\
    --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss \\
    --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \\
    --moe-permute-fusion --moe-router-force-load-balancing \\
    --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1 \\
    --expert-model-parallel-size 8 --sequence-parallel
"""


def test_moe_arguments_set_the_moe_options_and_the_expert_grid():
    draft = read_megatron(SCRIPT, "mixtral.sh")
    f = draft.fields
    assert f["parallel.moe.token_dispatcher_type"] == "alltoall"
    assert f["parallel.moe.router_load_balancing_type"] == "aux_loss"
    assert f["parallel.moe.grouped_gemm"] is True and f["parallel.moe.permute_fusion"] is True
    assert f["parallel.moe.router_force_load_balancing"] is True
    assert f["parallel.expert_tensor_parallel_size"] == 1
    assert f["parallel.expert_model_parallel_size"] == 8
    assert not draft.refused


def test_group_limited_routing_flags_set_the_routing_groups():
    """DeepSeek's group-limited routing as Megatron-LM's scripts pass it (d98e8a64
    examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh lines 98-99: 4 of 8 groups)."""
    draft = read_megatron(SCRIPT.replace("--sequence-parallel",
                                         "--sequence-parallel --moe-router-num-groups 8 "
                                         "--moe-router-group-topk 4"), "v3.sh")
    assert draft.fields["parallel.moe.router_num_groups"] == 8
    assert draft.fields["parallel.moe.router_group_topk"] == 4
    assert not draft.refused
