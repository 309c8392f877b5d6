"""The memory torch's ring attention holds in its backward (``partition/torch_cp.py``
``backward_buffer_bytes``, counted by ``decoder/memory.py``): torchtitan's Table 2 rank, Llama
3.1 8B with 32768 tokens per CP rank, K/V repeated to its 32 query heads."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.partition import make_partitioner
from ddlsim.workloads.decoder.partition.torch_cp import backward_buffer_bytes
from ddlsim.workloads.decoder.plan import resolve_plan

E = 32768 * 32 * 128 * 2            # one bf16 query-side tensor of the rank: b·(s/cp)·a·d·2
MLP = 6 * 32768 * 14336             # the layer's SwiGLU tensors, freed before its attention's


def _config(cp: int, comm: str = "all_gather", stack: str = "torchtitan-2024") -> dict:
    return {"model": {"preset": "llama-3.1-8b", "max_position_embeddings": 32768 * cp},
            "parallel": {"zero_stage": 3, "data_parallel_size": 8 // cp,
                         "context_parallel_size": cp, "cp_comm_type": comm},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 // cp,
                      "seq_length": 32768 * cp, "recompute": "full"},
            "system": {"preset": "grand-teton-h100", "nodes": 1,
                       "software": {"stack": stack, "compile": True}}}


def _activations(data: dict) -> float:
    return ddlsim.memory_per_device(ddlsim.load_config(data)).activations


@pytest.mark.parametrize("cp, comm, compiled, units", [
    (8, "all_gather", True, 13 + 16), (4, "all_gather", True, 13 + 8), (8, "p2p", True, 15),
    (8, "all_gather", False, 22.5 + 16), (8, "p2p", False, 26.5)])
def test_ring_backward_buffers_count_the_gathered_kv_and_fp32_gradients(cp, comm, compiled,
                                                                         units):
    # compiled, step 0 (the flash backward on the full local q, k, v): dQ fp32 2E, dK/dV fp32
    # zeros 4E, K/V contiguous 2E, the rotater's K/V (all cp blocks gathered, 2·cp·E, or the
    # next block, 2E), the flash gradients dq, dk, dv 3E and FA2's fp32 dq_accum of 2c queries
    # 2E; eager, step 1 with the loop's references still alive: dQ 2E, the K/V held
    # ((2·cp + 2)·E or 6E), fp32 dK/dV sent, received and arriving 12E, step 0's gradients 3E,
    # step 1's (half the queries) 2.5E and its dq_accum E
    data = _config(cp, comm)
    data["system"]["software"]["compile"] = compiled
    cfg = ddlsim.load_config(data)
    part = make_partitioner(resolve_plan(cfg, cfg.model.shape()))
    assert backward_buffer_bytes(part) == pytest.approx(units * E)


def test_the_ring_adds_its_buffers_beyond_the_freed_mlp_to_the_peak():
    # CP 8 against CP 1 of the same rank shape (compiled): the same layer activations but the
    # ring's (13 + 16)·E less the MLP's tensors; the two rotations differ by (2·8 − 2)·E
    base = _activations(_config(1))
    gather = _activations(_config(8))
    assert gather - base == pytest.approx(29 * E - MLP, rel=1e-9)
    assert gather - _activations(_config(8, "p2p")) == pytest.approx(14 * E, rel=1e-9)


def test_transformer_engine_rings_keep_their_memory_as_before():
    # megatron-core's ring (TE's) is not torch's: no buffers added, either rotation; eager and
    # ZeRO-1, as Megatron-Core runs it (no torch.compile of the model, and its FSDP2 refuses
    # gradient accumulation fusion: rules no_torch_compile, fsdp2_no_grad_accum_fusion)
    te = []
    for cp, comm in ((8, "all_gather"), (8, "p2p")):
        data = _config(cp, comm, "megatron-core-2025")
        data["parallel"]["zero_stage"] = 1
        data["system"]["software"]["compile"] = False
        te.append(_activations(data))
    assert te[0] == te[1]
