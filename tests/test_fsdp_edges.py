"""FSDP2's edge units without pipelining (workloads/decoder/fsdp_edges.py): the embedding, the
final norm and the output layer gathered and reduce-scattered as torchtitan 9dec370 (one root
unit) and 07c00d9 (an embedding unit and a [norm, output] unit) wrap them, bytes by hand on
Llama 3.1 8B cut to 2 layers, FSDP over 8 H100s."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective

BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
        "parallel": {"zero_stage": 3, "data_parallel_size": 8},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                  "dtype": "bf16", "recompute": "none"},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2025"}}
#: Llama 3.1 8B (its config.json): vocabulary 128,256, hidden 4096, untied output layer
EMB = 128256 * 4096
HEAD = 128256 * 4096 + 4096          # the output layer and the final norm's weight
#: one block: attention 2·4096² + 2·1024·4096, SwiGLU 3·4096·14336, two RMSNorm weights
LAYER = 2 * 4096 ** 2 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096


def config(stack="torchtitan-2025", **overlap):
    d = copy.deepcopy(BASE)
    d["system"]["software"] = {"stack": stack, "overlap": overlap} if overlap else stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def collectives(cfg, block: str) -> list[tuple[str, float]]:
    """(name, bytes) of the dp collectives of stage 0's ``block``, in issue order."""
    ops = build_workload(cfg).classes[0].program.blocks[block].ops
    return [(o.payload.name, o.payload.bytes) for o in ops
            if isinstance(o.payload, Collective) and o.payload.group == "dp"]


def test_torchtitan_2025_gathers_the_embedding_first_and_the_head_after_the_blocks():
    """Forward: the embedding unit and block 0 gathered at the start (one unit ahead), block 1
    after the embedding, the [norm, output] unit after block 0; bf16 (2 B)."""
    assert collectives(config(), "F0") == [
        ("param.all_gather.embedding", 2 * EMB), ("param.all_gather", 2 * LAYER),
        ("param.all_gather", 2 * LAYER), ("param.all_gather.head", 2 * HEAD)]


def test_torchtitan_2025_keeps_the_head_and_regathers_the_embedding_for_the_backward():
    """Backward: the head unit kept (reshard_after_forward False under the default policy),
    its fp32 gradients (4 B) reduce-scattered after its backward; each block gathered again
    and reduce-scattered; the embedding gathered behind block 0's backward and its gradients
    reduce-scattered at the end."""
    assert collectives(config(), "B0") == [
        ("param.all_gather", 2 * LAYER), ("grad.reduce_scatter.head", 4 * HEAD),
        ("param.all_gather", 2 * LAYER), ("grad.reduce_scatter", 4 * LAYER),
        ("param.all_gather.embedding", 2 * EMB), ("grad.reduce_scatter", 4 * LAYER),
        ("grad.reduce_scatter.embedding", 4 * EMB)]


@pytest.mark.parametrize("policy, head, embedding", [("always", 1, 1), ("never", 0, 0)])
def test_the_reshard_policy_decides_the_edges_backward_gathers(policy, head, embedding):
    got = [n for n, _ in collectives(config(zero3_reshard_after_forward=policy), "B0")]
    assert got.count("param.all_gather.head") == head
    assert got.count("param.all_gather.embedding") == embedding


def test_torchtitan_2024_gathers_the_root_once_and_reduce_scatters_it_after_the_backward():
    """9dec370: the root unit (embedding, norm, output) gathered before the embedding and kept;
    the last block kept too (not_with_pp_nor_last); the root's gradients reduce-scattered
    once the backward has run."""
    cfg = config("torchtitan-2024")
    assert collectives(cfg, "F0")[0] == ("param.all_gather.root", 2 * (EMB + HEAD))
    back = collectives(cfg, "B0")
    assert [n for n, _ in back].count("param.all_gather.root") == 0
    assert back[-1] == ("grad.reduce_scatter.root", 4 * (EMB + HEAD))


def test_the_edges_copy_passes_and_the_iteration_bytes():
    """FSDP2's copy-out (read + write 2 B) after each edge gather; per micro-batch the dp
    bytes are the blocks' and the edges' (two micro-batches per rank)."""
    cfg = config()
    ops = build_workload(cfg).classes[0].program.blocks["F0"].ops
    copies = [o.payload.bytes for o in ops if o.payload.name == "zero3.copy_out"]
    assert copies == [4 * EMB, 4 * LAYER, 4 * LAYER, 4 * HEAD]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ddlsim.predict(cfg).comm_bytes["dp"]
    per_micro_batch = LAYER * (2 * 2 + 2 * 2 + 4 * 2) + (EMB + HEAD) * (2 + 4) + 2 * EMB
    assert got == pytest.approx(cfg.num_microbatches * per_micro_batch, rel=1e-12)


def test_memory_counts_the_edge_units_as_they_are_kept():
    """2025: the [norm, output] unit kept gathered (2 B) unless resharded (``always``), its
    bf16 gradients and fp32 reduce-scatter input (2 + 4 B) the unit that counts at the
    backward's start, where a block's would; 2024: the root unit kept (2 B) and its output
    gradients (2 B) waiting for the root's reduce-scatter, beside a block's (2 + 4 B)."""
    def buffers(cfg):
        return build_workload(cfg).memory[0].buffers
    always = buffers(config(zero3_reshard_after_forward="always"))
    assert buffers(config()) - always == pytest.approx(2 * HEAD)
    root = buffers(config("torchtitan-2024"))
    assert root - always == pytest.approx(2 * (EMB + HEAD) + 2 * HEAD + 6 * LAYER - 6 * HEAD)


def test_fsdp1_of_the_megatron_stacks_gathers_its_root_unit_as_fsdp2s_2024_root():
    """FSDP1 (megatron-core-2024's ZeRO-3 as a what-if: the stack shards nothing, rule
    no_zero3, and its ZeRO-3 stand-in is PyTorch FSDP, layers auto-wrapped, the edges in the
    root, which _post_forward_reshard never frees): the root gathered before the embedding in
    bf16, no re-gather, its gradients reduce-scattered after the backward in the stack's
    gradient dtype (fp32 main gradients, 4 B); no copy passes."""
    d = copy.deepcopy(BASE)
    d["system"]["software"] = {"stack": "megatron-core-2024", "what_if": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(d)
    assert collectives(cfg, "F0")[0] == ("param.all_gather.root", 2 * (EMB + HEAD))
    back = collectives(cfg, "B0")
    assert back[-1] == ("grad.reduce_scatter.root", 4 * (EMB + HEAD))
    assert [n for n, _ in back].count("param.all_gather.root") == 0
    ops = build_workload(cfg).classes[0].program.blocks["F0"].ops
    assert not any(o.payload.name == "zero3.copy_out" for o in ops)
