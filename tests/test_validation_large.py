"""The large-model validations' run settings (benchmarks/validate_bridge.py): each setting that
the published runs' scripts fix, mapped onto ddlsim's config as those scripts set it.

No accuracy bounds: the figures are reported in docs/validation.md.
"""

from __future__ import annotations

from benchscripts import load_script

vb = load_script("validate_bridge")


def test_bridge_runs_use_cudnn_attention_not_nemo_2407s_flash2():
    """Megatron-Bridge's performance scripts leave TransformerEngine's choice on (25.09 even
    exports NVTE_FUSED_ATTN=1), so Hopper runs cuDNN's fused attention; NeMo 24.07's launcher
    exported NVTE_FUSED_ATTN=0 (FlashAttention-2). Every Bridge row takes cuDNN, the NeMo
    24.07 rows keep FlashAttention-2."""
    for row in vb.rows():
        kernels = vb.config(row)["system"]["software"]["kernels"]
        assert kernels["attention"] == "cudnn", (row["release"], row["model"])
        assert vb.h100.config(row)["system"]["software"]["kernels"]["attention"] == "flash2"
