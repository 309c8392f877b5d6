"""GPT-OSS's attention with learnable sinks: which kernel runs it (ddlsim/simulator/kernels/
attention.py ``sink_kernel``, ``cudnn_runs_sinks``) and the one Megatron-Bridge's GPT-OSS rows
ran (benchmarks/validate_moe_models.py ``attention_as_run``, the containers' TE and cuDNN)."""

from __future__ import annotations

import pytest

from benchscripts import load_script
from ddlsim.simulator.kernels.attention import (CUDNN_SINKS_MIN, SINK_KERNELS, attention_kernels,
                                                attention_label, cudnn_runs_sinks, sink_kernel)

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

# one rank's attention of GPT-OSS 120B at TP1: 64 query heads, 8 KV heads, head dim 64, seq
# 4096, a 128-token window on half the layers
GPT_OSS = dict(b=1, heads=64, s=4096, d=64, dtype_bytes=2, dropout=False)


def _kernels(kind: str, backward: bool, sinks: bool, **kw):
    return attention_kernels(kind, **GPT_OSS, backward=backward, kv_heads=8, sinks=sinks, **kw)


@pytest.mark.parametrize("version, runs", [
    ((9, 11, 0, 98), False),      # NeMo 25.09
    ((9, 13, 0), False),          # cuDNN 9.13.0: TE's rule is 9.13.1 (cudnn_runtime_version 91301)
    ((9, 13, 1, 26), True),       # NeMo 25.11
    ((9, 18, 0, 50), True),       # 26.02
    ((9, 20, 0, 48), True),       # 26.04
])
def test_cudnn_runs_sinks_from_9_13_1(version, runs):
    """TransformerEngine's fused_attn.cpp: learnable softmax on sub-backend F16_arbitrary_seqlen
    needs cuDNN >= 9.13.1."""
    assert CUDNN_SINKS_MIN == (9, 13, 1)
    assert cudnn_runs_sinks(version) is runs


@pytest.mark.parametrize("backward", [False, True])
def test_cudnn_runs_the_sinks_in_its_kernel(backward):
    """cuDNN's fused kernel adds the sink in the kernel: one kernel, the windowed FLOPs,
    the same as without sinks (the sink's per-row work is not counted)."""
    window = dict(window=128, window_share=0.5)
    with_sinks = _kernels("cudnn", backward, True, **window)
    assert len(with_sinks) == 1 and with_sinks[0].variant.startswith("cudnn/")
    assert with_sinks == _kernels("cudnn", backward, False, **window)


@pytest.mark.parametrize("kind", ["flash2", "flash3"])
def test_flash_attention_refuses_sinks(kind):
    """FlashAttention takes no sink logit: TE disables it for a non-vanilla softmax."""
    with pytest.raises(ValueError, match=rf"attention = '{kind}' with attention sinks.*"
                                         r"allowed with sinks: \['cudnn', 'fused_softmax', "
                                         r"'unfused'\]"):
        _kernels(kind, False, True)
    with pytest.raises(ValueError, match="expected flash2, flash3, cudnn"):
        sink_kernel("sdpa")


@pytest.mark.parametrize("backward", [False, True])
def test_fused_softmax_with_sinks_runs_the_torch_softmax(backward):
    """Megatron-Core's FusedScaleMaskSoftmax runs its kernel only without an offset: with
    sinks its kernels are the unfused path's."""
    assert SINK_KERNELS["fused_softmax"][0] == "unfused"
    assert _kernels("fused_softmax", backward, True) == _kernels("unfused", backward, True)
    assert _kernels("fused_softmax", backward, True) != _kernels("fused_softmax", backward,
                                                                 False)


def test_unfused_sinks_add_the_sink_columns_passes():
    """The torch path concatenates the sink column (forward: read + write the b*a*s^2
    scores) and zero-fills and copies the slice's gradient (backward: 1 + 2 passes)."""
    S = GPT_OSS["b"] * GPT_OSS["heads"] * GPT_OSS["s"] ** 2
    for backward, extra in ((False, 2 * 2 * S), (True, 3 * 2 * S)):
        plain = sum(k.bytes for k in _kernels("unfused", backward, False))
        sunk = sum(k.bytes for k in _kernels("unfused", backward, True))
        assert sunk - plain == pytest.approx(extra)
        assert len(_kernels("unfused", backward, True)) == \
            len(_kernels("unfused", backward, False)) + (2 if backward else 1)


def test_the_plan_line_names_the_kernel_that_runs_the_sinks():
    assert attention_label("cudnn") == "cudnn"
    assert attention_label("cudnn", sinks=True) == "cudnn (sinks in kernel)"
    assert attention_label("fused_softmax", sinks=True) == "unfused (sinks: torch softmax)"


vmm = load_script("validate_moe_models")


def test_every_gpt_oss_row_ran_cudnn_with_its_sinks():
    """Each GPT-OSS row's container (25.11: TE 2.9, cuDNN 9.13.1.26; 26.02: TE 2.12, cuDNN
    9.18.0.50; 26.04: TE 2.14, cuDNN 9.20.0.48) runs the sinks in cuDNN's kernel, and the
    row's config asks for it; a row without sinks keeps its stack's attention."""
    gpt = [r for r in vmm.rows() if r["preset"] == "gpt-oss-120b"]
    assert len(gpt) == 5
    for row in gpt:
        kind, why = vmm.attention_as_run(row)
        assert kind == "cudnn" and "cuDNN 9." in why
        assert vmm.config(row)["system"]["software"]["kernels"]["attention"] == "cudnn"
    qwen = next(r for r in vmm.rows() if r["preset"] == "qwen3-235b-a22b")
    assert "attention" not in vmm.config(qwen)["system"]["software"]["kernels"]


def test_an_older_container_would_not_run_cudnn_with_sinks():
    """25.09's container (TE 2.7.0, cuDNN 9.11): TE < 2.8 takes no softmax_type, so
    Megatron-Core's local attention would run (unfused)."""
    kind, why = vmm.attention_as_run({"release": "25.09"})
    assert kind == "unfused" and "< 2.8" in why


# cuDNN's published sliding-window SDPA on the GPT-OSS head layout: NVIDIA/cudnn-frontend
# df73764a (v1.19.0) benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/
# gpt_oss_20260227_034819.csv: H200, cuDNN backend 91901, bf16, top_left (causal) mask with a
# 1,024-token window, batch 2, 64 query heads, 8 KV heads, head dim 64, non-deterministic
# backward, median of 10; no sinks. (s, forward ms, backward ms)
CUDNN_SWA_H200 = [(2048, 0.166, 0.488), (4096, 0.358, 1.042), (8192, 0.738, 2.149),
                  (16384, 1.499, 4.392), (32768, 3.021, 9.045)]


@pytest.mark.parametrize("s, fwd_ms, bwd_ms", CUDNN_SWA_H200)
def test_windowed_cudnn_against_cudnn_frontends_h200_benchmark(s, fwd_ms, bwd_ms):
    """ddlsim's cudnn kernel with a window (the band's tiles at the FA3 paper's causal rate,
    window.py) against cuDNN's own published runs of that kernel: the forward within 3 %;
    the backward 12-22 % short of it (ddlsim's causal backward is derived from the paper's
    MHA curves of a 2024 cuDNN; GQA's dK/dV reduction and the newer cuDNN are possible causes,
    not separated: a known gap, not corrected). Without the window the forward would be
    0.757 ms at 4k: the test fails if the band's tiles are not skipped."""
    import ddlsim
    from ddlsim.simulator.kernels.device import kernel_device, kernel_time
    cfg = ddlsim.load_config({"model": "gpt-oss-120b", "parallel": {}, "train": {
        "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
        "system": {"preset": "dgx-h200", "nodes": 1,
                   "software": {"stack": "megatron-core-2025"}}})
    dev = kernel_device(cfg.system)
    fwd, bwd = (1e3 * sum(kernel_time(k, dev) for k in attention_kernels(
        "cudnn", 2, 64, s, 64, 2, False, backward, kv_heads=8, window=1024, window_share=1.0,
        sinks=True)) for backward in (False, True))
    assert fwd == pytest.approx(fwd_ms, rel=0.03)
    assert 0.78 < bwd / bwd_ms < 0.88
