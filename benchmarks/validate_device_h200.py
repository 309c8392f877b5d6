"""Predicted vs measured on a GPU we ran ourselves: training steps on one NVIDIA H200 SXM, 2026-11-30
(issue 30, "ground truth we make ourselves"; issue 29, today's hardware).

Run:  python benchmarks/validate_device_h200.py [--engine analytical|des] [--markdown] [--write-docs]
      [--system dgx-h200]

The measurements are ``benchmarks/data/device_h200_2026-11-30/`` (its README.md: the machine, the
versions, the commands): every ``llama_step.json`` (``benchmarks/device/llama_step.py``: a
torchtitan-style Llama 3.1 8B prefix of 8 or 16 layers, FSDP2 per block on a one-rank mesh with bf16
parameters and fp32 reductions, fused AdamW; activation checkpointing none, torchtitan's op-level
selective, or full; eager or each block compiled) and every ``resnet_step.json``
(``benchmarks/device/resnet_step.py``: torchvision's ResNet-50 with DeepLearningExamples' SGD, AMP
fp16 channels-last with a GradScaler or TF32 contiguous, the batch already on the device). Each
measured step is the median of 6-10 steps after warm-up, between host synchronisations.

Each is predicted with the settings it ran with, on ``--system`` (one GPU):

* Llama: ``llama-3.1-8b`` with the run's layers, ZeRO-3 over one rank, micro-batch and global
  batch = the run's batch, its sequence, ``recompute`` none / selective (torchtitan's op policy
  under the ``torchtitan-2025`` stack) / full; the ``torchtitan-2025`` stack with the attention
  kernel PyTorch 2.11 runs on this GPU: cuDNN's (``sdp_utils.cpp`` ``check_prefer_cudnn_attention``
  puts cuDNN first on sm90 once the bundled cuDNN is newer than 9.15; the run's is 9.19, and its
  Kineto trace shows ``cudnn`` attention kernels), torch's fused RMSNorm (``nn.RMSNorm`` calls
  ``aten._fused_rms_norm`` on CUDA since pytorch/pytorch#153666, 2025: one kernel per norm in the
  trace, where the 2024 stack's torchtitan ran its composite norm), the cuBLAS the wheel loads
  (13.1: ``gemm_library: cublas-13``), the checkpoint as ``llama_step.py`` wraps it (early stop
  on: ``LLAMA_STEP``), and ``compile: true`` for compiled variants;
* ResNet-50: the row's batch, ``fp16`` with a GradScaler and channels-last or ``tf32``
  contiguous, SGD, gradients zeroed in place, no input pipeline (the batch is made once on the
  device), weight decay on every parameter (the script's SGD), the default stack's kernels.

Nothing is fitted to these steps: they validate. The memory columns set ddlsim's peak per device
(its ``reserved``: what the caching allocator holds) beside the measured ``max_memory_reserved``
and ``max_memory_allocated``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from public_runs import (DATA, print_notes, print_table, result_cells, rows_summary,
                         run_script, time_record)

RUNS = DATA / "device_h200_2026-11-30"
#: the system the measurements ran on (``--system`` replaces it)
SYSTEM = "dgx-h200"
#: why only a process's first Llama variant has memory figures
MEMORY_NOTE = ("llama_step.py as run (before its gc.collect() after each variant) left each "
               "variant's model alive through FSDP2's reference cycles, so a later variant's peak "
               "counted the earlier ones' fp32 parameters (+10.4 GiB each: run6 re-measured "
               "selective_op and full at 8192 alone, 47.1 and 45.6 GiB allocated, against 57.5 "
               "and 66.5 as second and third variants of run1); the memory of a variant that "
               "was not its process's first is left out")
#: what PyTorch 2.11 (cu130) runs where the torchtitan-2025 stack (torch of 2024-12) ran other
#: kernels (module docstring)
TORCH_2_11 = {"attention": "cudnn", "fused_layernorm": True, "gemm_library": "cublas-13"}
#: how ``llama_step.py`` checkpoints a block, where it differs from torchtitan 07c00d9 (whose
#: ``activation_checkpoint.early_stop = False`` the torchtitan-2025 stack takes): its ``build``
#: calls ``checkpoint_wrapper`` without ``early_stop``, so torch.utils.checkpoint stops each
#: recomputation once the last saved tensor is packed again (torch's default; ddlsim's
#: ``non_reentrant_early_stop``, workloads/decoder/early_stop.py). The traces show it: the
#: ``full`` variant (run5/full_s2048) recomputes 6 of a block's 7 GEMMs (not ``w2``), the
#: ``selective_op`` one (run1/llama) one residual add per block, not two
LLAMA_STEP = {"activation_checkpoint": "non_reentrant_early_stop"}
#: ``llama_step.py``'s activation-checkpointing variants → ddlsim's ``train.recompute``
RECOMPUTE = {"none": "none", "selective_op": "selective", "full": "full"}


def llama_rows() -> list[dict]:
    """One row per measured Llama variant (skipped or failed variants left out)."""
    out = []
    for path in sorted(RUNS.glob("run*/**/llama_step.json")):
        run = json.loads(path.read_text())
        for i, v in enumerate(run["variants"]):
            if "step_s" not in v:
                continue
            clean = i == 0      # the process's first variant: see MEMORY_NOTE
            out.append({"kind": "llama", "file": str(path.relative_to(RUNS)),
                        "layers": run["layers"], "seq": run["seq"], "batch": run["batch"],
                        "variant": v["variant"], "measured_s": v["step_s"],
                        "allocated_GiB": v.get("peak_allocated_GiB") if clean else None,
                        "reserved_GiB": v.get("peak_reserved_GiB") if clean else None})
    return out


def resnet_rows() -> list[dict]:
    """One row per measured ResNet-50 variant."""
    out = []
    for path in sorted(RUNS.glob("run*/**/resnet_step.json")):
        for v in json.loads(path.read_text())["variants"]:
            if "step_s" not in v:
                continue
            precision, layout, batch = v["variant"].split("_")
            out.append({"kind": "resnet", "file": str(path.relative_to(RUNS)),
                        "precision": precision, "layout": layout, "batch": int(batch),
                        "variant": v["variant"], "measured_s": v["step_s"],
                        "allocated_GiB": v.get("peak_allocated_GiB"), "reserved_GiB": None})
    return out


def rows() -> list[dict]:
    return llama_rows() + resnet_rows()


def config(row: dict, system: str = SYSTEM) -> dict:
    """The ddlsim run config of a measured row, with the settings it ran with (module doc)."""
    one_gpu = {"preset": system, "nodes": 1, "devices_per_node": 1}
    if row["kind"] == "llama":
        compiled = row["variant"].startswith("compile_")
        software = {"stack": "torchtitan-2025", "kernels": {**TORCH_2_11, **LLAMA_STEP}}
        if compiled:
            software["compile"] = True
        return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": row["layers"]},
                "parallel": {"zero_stage": 3, "data_parallel_size": 1},
                "train": {"micro_batch_size": row["batch"], "global_batch_size": row["batch"],
                          "seq_length": row["seq"], "dtype": "bf16",
                          "recompute": RECOMPUTE[row["variant"].removeprefix("compile_")]},
                "system": {**one_gpu, "software": software}}
    amp = row["precision"] == "amp"
    return {"model": {"preset": "resnet50", "weight_decay": "all",
                      "memory_format": "channels_last" if row["layout"] == "nhwc"
                      else "contiguous",
                      "zero_grad": "zero", "input_pipeline": "none", "grad_scaler": amp},
            "parallel": {"data_parallel_size": 1},
            "train": {"micro_batch_size": row["batch"], "global_batch_size": row["batch"],
                      "seq_length": 1, "dtype": "fp16" if amp else "tf32", "optimizer": "sgd"},
            "system": one_gpu}


def evaluate(engine: str = "analytical", limits=None, system: str = SYSTEM) -> list[dict]:
    """Each row's record (:func:`public_runs.time_record`), the measured step as the reference."""
    return [time_record(r, config(r, system), engine, limits, r["measured_s"]) for r in rows()]


def _label(o: dict) -> str:
    r = o["row"]
    if r["kind"] == "llama":
        return f"Llama 3.1 8B x{r['layers']} s{r['seq']} b{r['batch']} {r['variant']}"
    return f"ResNet-50 {r['variant']}"


def _gib(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["step", "measured (ms)", "predicted (ms)", "error", "reserved GiB (meas.)",
            "allocated GiB (meas.)", "predicted peak GiB"]
    lines = []
    for o in out:
        cells = result_cells(o, 4)
        pred = f"{o['predicted'] * 1e3:.1f}" if "predicted" in o else cells[0]
        mem = o["result"].memory.reserved / 2 ** 30 if o["result"] and o["result"].memory else None
        lines.append([_label(o), f"{o['published'] * 1e3:.1f}", pred, cells[1],
                      _gib(o["row"]["reserved_GiB"]), _gib(o["row"]["allocated_GiB"]),
                      _gib(mem)])
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)
    print(("\n" if not markdown else "\n") + "Memory: " + MEMORY_NOTE + ".")


def memory_errors(out: list[dict]) -> list[float]:
    """Predicted peak (``reserved``) / measured ``max_memory_reserved`` − 1, per row that has both."""
    return [o["result"].memory.reserved / 2 ** 30 / o["row"]["reserved_GiB"] - 1 for o in out
            if o["result"] is not None and o["result"].memory is not None
            and o["row"]["reserved_GiB"]]


def summary(out: list[dict], engine: str) -> str:
    parts = []
    mem = memory_errors(out)
    if mem:
        parts.append(f"Peak reserved memory: mean |error| {100 * sum(map(abs, mem)) / len(mem):.1f}%, "
                     f"worst {100 * max(mem, key=abs):+.1f}%, signed mean "
                     f"{100 * sum(mem) / len(mem):+.1f}% ({len(mem)} Llama rows measured alone)")
    for kind, name in (("llama", "Llama steps"), ("resnet", "ResNet-50 steps")):
        sub = [o for o in out if o["row"]["kind"] == kind]
        if sub:
            parts.append(f"{name}: " + rows_summary(sub, engine, _label))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    system = SYSTEM
    if "--system" in argv:
        i = argv.index("--system")
        system = argv[i + 1]
        del argv[i:i + 2]
    return run_script("validate_device_h200", __doc__, argv,
                      lambda engine, limits=None: evaluate(engine, limits, system), _print,
                      summary)


if __name__ == "__main__":
    sys.exit(main())
