"""Predicted vs published iteration time of Megatron-Bridge's FP8 Llama runs on DGX H100.

Run:  python benchmarks/validate_bridge.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published rows (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary*.md, NeMo containers
25.09, 25.11 and 26.02, DGX-H100, FP8 current scaling: Llama 3 70B on 64 GPUs and Llama 3.1
405B on 1,024 GPUs) and their provenance are in ``data/bridge_h100_fp8.csv``; the settings the
tables leave out, read from that repository's performance recipes at the same releases, are in
``data/bridge_h100_settings.csv``. The rows are predicted exactly as ``validate_h100.py``
predicts NeMo 24.07's (``dgx-h100``, the same config mapping and the same marks), and 405B
with Megatron-Core's uneven pipeline split (embedding and loss counted as layers: 126 layers on
PP 8 × VPP 8). Three differences from NeMo 24.07: the stack (:data:`STACK`), the attention
kernel (:data:`ATTENTION`) and FP8 current scaling (:data:`FP8_RECIPE`). No per-row factors and
nothing tuned.
"""

from __future__ import annotations

import sys

from public_runs import DATA, records, run_script

import validate_h100 as h100

TABLE = DATA / "bridge_h100_fp8.csv"
SETTINGS = DATA / "bridge_h100_settings.csv"
#: The runs' Megatron-Core: the NeMo 25.09-26.02 containers ship Megatron-Core of 2025-26, whose
#: FP8 current scaling (--fp8-recipe tensorwise, megatron/core/fp8_utils.py) Megatron-Core of
#: 2024 (``megatron-core-2024``, NeMo 24.07's) does not have (stack rule no_te_current_scaling)
STACK = "megatron-core-2025"
#: The runs' attention kernel: cuDNN's fused attention, not NeMo 24.07's FlashAttention-2
#: (``validate_h100.ATTENTION``, which the launcher forced with NVTE_FUSED_ATTN=0). Megatron-
#: Bridge's performance scripts export NVTE_FLASH_ATTN=1 and NVTE_FUSED_ATTN=1 ("Enable cuDNN
#: fused attention") at 25.09 (fa0315ae scripts/performance/utils/executors.py lines 43-44) and
#: set neither at 25.11 (97ad8cc6) or 26.02 (c0b9a000), where TransformerEngine's default
#: holds; with both backends available TE's get_attention_backend disables FlashAttention on
#: compute capability >= 9.0 for the F16_arbitrary_seqlen sub-backend ("give FusedAttention
#: preference on Hopper+"): cuDNN on H100 in every release, the stack's own default.
ATTENTION = "cudnn"
#: The runs' FP8 recipe: current scaling (the tables' FP8-CS). Megatron-Bridge's performance
#: scripts build the fp8 "cs" precision from bf16_with_fp8_current_scaling_mixed (fp8_recipe
#: "tensorwise", i.e. Megatron-Core's Fp8Recipe.tensorwise, TransformerEngine's
#: Float8CurrentScaling) with first_last_layers_bf16 turned off (scripts/performance/utils/
#: overrides.py get_precision_config: "Disable BF16 Transformer layers in the performance
#: config"); simulator/kernels/fp8_current.py
FP8_RECIPE = "te_current"
#: The runs' cross-entropy: Transformer Engine's fused one, cross_entropy_fusion_impl "te" in
#: every release's performance settings (Megatron-Bridge v0.1.0rc3 scripts/performance/configs/
#: llama3/llama3_70b_llm_pretrain.yaml line 21 and llama31_405b line 21; v0.2.0
#: scripts/performance/utils/helpers.py line 108; v0.3.0 utils/overrides.py line 64; the Llama
#: provider's own default, llama_provider.py line 187; bridge_h100_settings.csv's header);
#: simulator/kernels/step_passes.py
CROSS_ENTROPY = "te"
#: The runs' parameters in FP8 (Megatron's --fp8-param-gather): bf16_with_fp8_current_scaling_mixed
#: sets fp8_param_gather = True (Megatron-Bridge src/megatron/bridge/training/mixed_precision.py
#: line 289 at 97ad8cc6 and c0b9a000, line 279 at fa0315ae) and the performance scripts'
#: get_precision_config does not turn it off (git grep fp8_param in scripts/performance at
#: those commits: none); simulator/kernels/fp8_weights.py
FP8_PARAM_GATHER = True


def rows() -> list[dict]:
    """The table's rows joined with their model's settings."""
    return h100.rows(TABLE, SETTINGS)


def config(row: dict) -> dict:
    """The ddlsim run config of one row: ``validate_h100.config`` with the runs' stack,
    attention, FP8 recipe, FP8 parameters and cross-entropy."""
    cfg = h100.config(row)
    cfg["system"]["software"]["stack"] = STACK
    cfg["system"]["software"]["kernels"].update(attention=ATTENTION, fp8_recipe=FP8_RECIPE,
                                                cross_entropy_fusion_impl=CROSS_ENTROPY,
                                                fp8_param_gather=FP8_PARAM_GATHER)
    return cfg


def evaluate(engine: str = "analytical", limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time, error, fit note."""
    return records(rows(), config, h100.published_time, engine, limits)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_bridge", __doc__, argv, evaluate, h100._print, h100.summary)


if __name__ == "__main__":
    sys.exit(main())
