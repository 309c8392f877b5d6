"""Predicted vs published throughput gain of Megatron-LM's operator fusion (Narayanan et al.
2021, arXiv:2104.04473, §5.8: "throughput increased by 19%" for GPT-3 175B and "by 11%" for
the 530B model).

Run:  python benchmarks/validate_fusion.py

Fused is the ``megatron-lm-2021`` stack as the paper ran it; unfused turns off the three
fusions of §4.2 with Megatron-LM's own switches (6985e58 ``megatron/arguments.py`` lines
441-451: ``--no-masked-softmax-fusion``, ``--no-bias-gelu-fusion``, ``--no-bias-dropout-fusion``),
i.e. ``kernels: {attention: unfused, fused_bias_gelu: false, fused_bias_dropout_add: false}``
(LayerNorm stays apex's fused kernel: it has no switch). The gain is
``t_unfused / t_fused − 1``, the throughput ratio of one plan.

§5.8 names the models, not the plans. GPT-3 175B is run as every §5 experiment on it is, by
the paper's script for its largest such figure (NVIDIA/Megatron-LM 6985e58
``examples/sc21/run_figure_18.sh``: TP 8, PP 12, 12 nodes, micro-batch 1, two layers per
virtual stage, ``--DDP-impl local``, full recomputation), at the largest global batch that
script runs (60); 530B by Table 1's row (``run_table_1.sh``, as benchmarks/validate_megatron.py
reads it). Nothing here is tuned: what moves the gain is the kernel model
(docs/compute.md): the unfused softmax's fp32 passes over the ``s²`` scores, the separate
bias/GeLU and bias/dropout/add kernels, and each kernel's launch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import ddlsim  # noqa: E402
import validate_megatron as vm  # noqa: E402

#: §5.8's published gains (fraction)
PUBLISHED = {"GPT-3 175B": 0.19, "530B": 0.11}
#: Megatron-LM's three fusion switches turned off (arguments.py lines 441-451)
UNFUSED = {"attention": "unfused", "fused_bias_gelu": False, "fused_bias_dropout_add": False}


def gpt3_175b(global_batch: int = 60) -> dict:
    """GPT-3 175B as run_figure_18.sh runs it (module docstring)."""
    return {"model": {"name": "gpt3-175b", "architecture": "gpt", "num_hidden_layers": 96,
                      "hidden_size": 12288, "num_attention_heads": 96,
                      "vocab_size": vm.padded_vocab(8), "max_position_embeddings": vm.SEQ},
            "parallel": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 12,
                         "data_parallel_size": 1, "schedule": "interleaved",
                         "virtual_pipeline_model_parallel_size": 96 // 12 // 2,
                         "overlap_grad_reduce": False},
            "train": {"micro_batch_size": 1, "global_batch_size": global_batch,
                      "seq_length": vm.SEQ, "dtype": "fp16", "recompute": "full"},
            "system": {"preset": "dgx-a100", "nodes": 12, "software": "megatron-lm-2021"}}


def plans() -> dict[str, dict]:
    """Model name → its run config (fused)."""
    row = next(r for r in vm.rows() if r["model"] == "megatron-529.6b")
    return {"GPT-3 175B": gpt3_175b(), "530B": vm.config(row)}


def gain(cfg: dict) -> tuple[float, float, float]:
    """(fused seconds, unfused seconds, predicted gain) of one plan."""
    times = []
    for software in ("megatron-lm-2021", {"stack": "megatron-lm-2021", "kernels": UNFUSED}):
        run = {**cfg, "system": {**cfg["system"], "software": software}}
        times.append(ddlsim.predict(run, check_fit=False).iteration_time_s)
    return times[0], times[1], times[1] / times[0] - 1


def evaluate() -> list[dict]:
    """One record per model: its seconds fused and unfused, predicted and published gain."""
    out = []
    for name, cfg in plans().items():
        fused, unfused, g = gain(cfg)
        out.append({"model": name, "fused_s": fused, "unfused_s": unfused, "predicted": g,
                    "published": PUBLISHED[name]})
    return out


def main() -> int:
    out = evaluate()
    print(f"{'model':>11}  {'fused (s)':>9}  {'unfused (s)':>11}  {'published gain':>14}  "
          f"{'predicted gain':>14}  {'ratio':>5}")
    for o in out:
        print(f"{o['model']:>11}  {o['fused_s']:9.2f}  {o['unfused_s']:11.2f}  "
              f"{100 * o['published']:+13.1f}%  {100 * o['predicted']:+13.1f}%  "
              f"{o['predicted'] / o['published']:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
