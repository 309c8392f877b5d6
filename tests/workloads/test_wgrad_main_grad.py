"""Weight-gradient GEMMs that accumulate into Megatron's ``main_grad``
(``gradient_accumulation_fusion``; ddlsim/workloads/decoder/wgrad.py): ``A`` and ``B`` in the
training dtype, ``C`` read and ``D`` written in the buffer's dtype (fp32: 8 bytes an element
where a plain GEMM writes 2). Bytes by hand; at 512 tokens the GEMM turns memory-bound; a stack
without the fusion keeps today's kernels.
"""

from __future__ import annotations

import pytest
from stage_ops import compute_ops

import ddlsim
from ddlsim.simulator.kernels import kernel_device, kernel_time
from ddlsim.simulator.kernels.gemm import gemm_bytes
from ddlsim.workloads.decoder.wgrad import into_main_grad
from ddlsim.workloads.trace import Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

FUSION = "system.software.kernels.gradient_accumulation_fusion"


def _dense(fusion: bool | None = None, cp: int = 1, reduce: str | None = None) -> dict:
    kernels = {} if fusion is None else {"gradient_accumulation_fusion": fusion}
    if reduce:
        kernels["grad_reduce_dtype"] = reduce
    return {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 32768, "max_position_embeddings": 4096},
            "parallel": {"context_parallel_size": cp},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 512 * cp},
            "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 8,
                       "software": {"stack": "megatron-core-2025", "kernels": kernels}}}


def _gemms(op) -> list[Kernel]:
    return [k for k in op.kernels or () if k.kind == "gemm"]


@pytest.fixture(scope="module")
def h100():
    return kernel_device(ddlsim.load_config(_dense()).system)


def test_accumulating_gemm_bytes_by_hand():
    # the weight gradient of a [512, 1024]·[1024, 4096] linear: D[1024, 4096] = Aᵀ·dC over
    # K = 512 tokens; A and B bf16, C read and D written in fp32
    A_B = (1024 * 512 + 512 * 4096) * 2
    assert gemm_bytes(1024, 4096, 512, 1, 2, 4) == A_B + 1024 * 4096 * 8
    assert gemm_bytes(1024, 4096, 512, 1, 2) == A_B + 1024 * 4096 * 2       # 16-bit out
    assert gemm_bytes(1024, 4096, 512, 3, 1) == 3 * (A_B / 2 + 1024 * 4096 * 2)  # fp8: bf16 out


def test_a_wgrad_gemm_at_512_tokens_turns_memory_bound(h100):
    # an expert's fc1 weight gradient at 512 tokens (Qwen3-235B-A22B: h 4096, gated 2 × 1536):
    # dW[4096, 3072] over K = 512, 12.9 GFLOP
    plain = (Kernel("gemm", (512, 4096, 3072)), Kernel("gemm", (4096, 3072, 512)))
    assert into_main_grad(plain, 0) is plain
    dgrad, wgrad = into_main_grad(plain, 4)
    assert dgrad is plain[0] and wgrad.shape == plain[1].shape
    assert wgrad.bytes == gemm_bytes(4096, 3072, 512, 1, 2, 4) == pytest.approx(108.0e6, rel=1e-2)
    arithmetic = 2 * 4096 * 3072 * 512 / (h100.peak_flops("bf16") * h100.ceiling("bf16"))
    written = gemm_bytes(4096, 3072, 512, 1, 2) / h100.memory_Bps
    # compute-bound writing bf16, memory-bound accumulating into fp32
    assert written < arithmetic < wgrad.bytes / h100.memory_Bps
    assert kernel_time(wgrad, h100) >= wgrad.bytes / h100.memory_Bps
    assert kernel_time(wgrad, h100) > 1.5 * kernel_time(plain[1], h100)


@pytest.mark.parametrize("cp, names", [      # the builder's linears, the partitioner's (CP)
    (1, ("bwd.mlp", "bwd.attn", "bwd.logits")),
    (2, ("bwd.fc2", "bwd.fc1", "bwd.proj", "bwd.qkv", "bwd.logits"))])
def test_dense_layer_and_head_weight_gradients_accumulate(cp, names):
    ops = compute_ops(_dense(cp=cp))
    for name in names:
        gemms = _gemms(ops[name])
        assert gemms and all(k.bytes == 0 for k in gemms[0::2])        # data gradients
        for k in gemms[1::2]:                                             # weight gradients
            assert k.bytes == gemm_bytes(*k.shape, 1, 2, 4)
    assert all(k.bytes == 0 for name, op in ops.items() if not name.startswith("bwd")
               and op.kernels for k in _gemms(op))


def test_without_the_fusion_the_kernels_are_unchanged():
    off = compute_ops(_dense(fusion=False))
    assert all(k.bytes == 0 for op in off.values() for k in _gemms(op))
    on = compute_ops(_dense())
    assert {n: [k.shape for k in _gemms(o)] for n, o in on.items()} == \
        {n: [k.shape for k in _gemms(o)] for n, o in off.items()}


def test_a_16_bit_main_grad_is_read_and_written_in_16_bits():
    # grad_reduce_dtype param: Megatron's wgrad_gemm_accum_fp16 into a bf16 main_grad
    wgrad = _gemms(compute_ops(_dense(reduce="param"))["bwd.mlp"])[1]
    assert wgrad.bytes == gemm_bytes(*wgrad.shape, 1, 2, 2)


def _mixtral(stack: str) -> dict:
    """Mixtral 8x7B cut to two layers on one DGX H100, EP1 (8 local experts of 1,024
    tokens), grouped GEMM."""
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def test_te_grouped_linear_rounds_share_the_experts_bytes():
    # megatron-core-2025: TEGroupedMLP, two rounds of four per-expert GEMMs (grouped_linear.py)
    ops = compute_ops(_mixtral("megatron-core-2025"))
    wgrads = _gemms(ops["bwd.experts.fc2"])[1::2]
    assert [k.batch for k in wgrads] == [4.0, 4.0]
    assert all(k.bytes == gemm_bytes(*k.shape, 4, 2, 4) for k in wgrads)
    assert _gemms(ops["bwd.router"])[1].bytes == 0        # the router's own autograd function


def test_legacy_grouped_mlp_writes_param_grad():
    # megatron-core-2024 (Megatron-LM 900f1b76): GroupedMLP's grouped_gemm launch, no main_grad
    ops = compute_ops(_mixtral("megatron-core-2024"))
    assert all(k.bytes == 0 for k in _gemms(ops["bwd.experts.fc1"]))
    assert all(k.bytes > 0 for k in _gemms(ops["bwd.qkv"])[1::2])         # TE's linears
