"""Sequence parallelism and selective recomputation against full recomputation: predicted vs
published iteration times (Korthikanti et al. 2022, Table 5).

Run:  python benchmarks/validate_recompute.py [--engine analytical|des] [--markdown]
      [--write-docs] [--des-rank-ops N]

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023,
arXiv:2205.05198) timed four GPT models (22B, 175B, 530B, 1T) on Selene (DGX A100 80 GB) two
ways: full activation recomputation without sequence parallelism, and sequence parallelism with
selective recomputation ("present work"); Section 6.3 adds the 530B model with 8-way data
parallelism. ``data/korthikanti2022.csv`` holds Table 5 with Table 3's configurations and the
settings Section 6 states (sequence 2,048, vocabulary 51,200, TP 8, three virtual stages for
175B and 530B, no data parallelism). No per-row factors and nothing tuned: ``dgx-a100``
preset, the ``megatron-lm-2021`` stack with the one feature of its layers that Megatron-LM
had gained by then: the backward's asynchronous sequence-parallel communication
(``tp_async_backward``; ``megatron/mpu/layers.py`` lines 239-308 at
739cb43dae21ec975938422949a449de654f15ab, ``LinearWithGradAccumulationAndAsyncCommunication``),
and the GEMM library of 2022's container: 739cb43's README asks for "the latest release of NGC's
PyTorch container" (22.04/22.05 at that commit: CUDA 11.6-11.7), where the 2021 runs' README
named NGC 20.12 (CUDA 11.1), so ``gemm_library: cublas-11.6``, whose A100 ceiling is a 2022
measurement at the DGX A100's 400 W (ddlsim/data/systems.yaml; docs/compute.md, "Sustained
clocks"). Table 1 of 2021 and this table ran the same plan per pipeline for 530B and 1T (TP 8,
PP 35/64, the same virtual stages, micro-batch 1, 280/512 micro-batches per pipeline) and differ
only in data parallelism and software, yet 2022's times are 7-8 % shorter after its measured
data-parallel cost (Section 6.3: 1.32 s for DP 8 on 530B).

What the paper leaves unstated, and the choice made:

* precision — "mixed precision": ``--fp16``, as Megatron-LM's own GPT-3 175B example of the
  time (``examples/pretrain_gpt3_175B.sh`` at 739cb43dae21ec975938422949a449de654f15ab,
  2022-05-24, a commit of the sequence-parallel work).
  With fp16 and no ``--accumulate-allreduce-grads-in-fp32``, that commit's ``arguments.py``
  (lines 182-188) turns gradient-accumulation fusion off, as the stack has it;
* the schedule of the 1T model (no interleaving is stated for it): plain 1F1B;
* the 2,240-GPU row's data-parallel all-reduce: not overlapped (the paper says so).

Not modelled: Megatron's ``--async-tensor-model-parallel-allreduce`` (on by default there,
off under sequence parallelism), which overlaps the backward's input-gradient all-reduce with
the weight-gradient GEMM in the full-recomputation rows (no sequence parallelism); ddlsim runs
it blocking there.
"""

from __future__ import annotations

import sys

from public_runs import (DATA, error_stats, gpt_model_flops, print_notes, print_table, read_csv,
                         run_script, time_record)

TABLE = DATA / "korthikanti2022.csv"
LAYER_TABLE = DATA / "korthikanti2022_layer.csv"
SEQ = 2048                 # Section 6: s = 2048
VOCAB = 51200              # Section 6: v = 51200 (a multiple of 128·TP for TP 8)
GPUS_PER_NODE = 8          # DGX A100
PEAK = 312e12              # A100 fp16/bf16 dense tensor-core FLOP/s (A100 datasheet), Table 5's MFU
#: Megatron-LM of May 2022: the 2021 layers plus the asynchronous SP backward (module docstring);
#: a what-if of the 2021 stack, whose commit (6985e58) has no sequence parallelism (its rule
#: no_sequence_parallel, docs/stacks.md), which 739cb43 had
SOFTWARE = {"stack": "megatron-lm-2021", "overlap": {"tp_async_backward": True},
            "kernels": {"gemm_library": "cublas-11.6"}, "what_if": True}


def rows() -> list[dict]:
    """Table 5's rows (and Section 6.3's 2,240-GPU row) with Table 3's configurations."""
    return read_csv(TABLE)


def config(row: dict) -> dict:
    """The ddlsim run config of one row."""
    gpus, tp, pp = int(row["gpus"]), int(row["tp"]), int(row["pp"])
    present = row["scheme"] == "present"
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "data_parallel_size": gpus // (tp * pp), "sequence_parallel": present,
                "overlap_grad_reduce": False, "schedule": "1f1b"}
    if row["virtual_stages"]:
        parallel.update(schedule="interleaved",
                        virtual_pipeline_model_parallel_size=int(row["virtual_stages"]))
    model = {"name": f"gpt-{row['model']}", "architecture": "gpt",
             "num_hidden_layers": int(row["layers"]), "hidden_size": int(row["hidden"]),
             "num_attention_heads": int(row["heads"]), "vocab_size": VOCAB,
             "max_position_embeddings": SEQ}
    return {"model": model, "parallel": parallel,
            "train": {"micro_batch_size": int(row["micro_batch"]),
                      "global_batch_size": int(row["global_batch"]), "seq_length": SEQ,
                      "dtype": "fp16", "recompute": "selective" if present else "full"},
            "system": {"preset": "dgx-a100", "nodes": gpus // GPUS_PER_NODE,
                       "software": SOFTWARE}}


def layer_rows() -> list[dict]:
    """Table 4: one 22B layer's forward and backward milliseconds, five configurations."""
    return read_csv(LAYER_TABLE)


def layer_config(row: dict) -> dict:
    """The 22B plan of Table 5 with Table 4's sequence parallelism and recomputation."""
    base = next(r for r in rows() if r["model"] == "22B" and r["scheme"] == "full")
    cfg = config(base)
    cfg["parallel"]["sequence_parallel"] = row["sequence_parallel"] == "true"
    cfg["train"]["recompute"] = row["recompute"]
    return cfg


def layer_seconds(cfg: dict) -> tuple[float, float, float]:
    """(forward, backward) seconds of one layer, and the iteration's. These plans run one
    micro-batch on one stage with no data parallelism, so the forward's ops run one after
    another on the compute stream: a layer's forward is the sum of its ops, timed by the cost
    model both engines use. The backward overlaps its sequence-parallel collectives
    (``tp_async_backward``), so it is taken from the analytical engine: the iteration, less
    everything outside the layers (embedding, head, optimizer: serial) and the layers'
    forwards, per layer."""
    from collections import Counter, defaultdict

    import ddlsim
    from ddlsim.api import _placement, build_workload
    from ddlsim.config import build_config
    from ddlsim.simulator.costs import CostModel
    from ddlsim.workloads.trace import Collective, Compute

    run = build_config(cfg)
    workload = build_workload(run)
    cost = CostModel(run.system, workload, run.parallel.collective_algorithm,
                     devices=_placement(run, workload))
    program = workload.classes[0].program
    if list(getattr(program.steps, "names", ())) != ["F0", "B0", "update"]:
        raise ValueError("layer_seconds times one micro-batch on one stage only")
    layers = run.model.num_hidden_layers
    count, seconds = Counter(), defaultdict(float)
    for name in ("F0", "B0", "update"):
        for op in program.blocks[name].flat.ops:
            p = op.payload
            if name == "F0" and op.stream != "compute":
                raise ValueError("layer_seconds needs a forward without overlaps")
            if op.stream != "compute" or not isinstance(p, (Compute, Collective)):
                continue
            count[name, p.name] += op.repeat
            seconds[name, p.name] += op.repeat * (cost.compute(p) if isinstance(p, Compute)
                                                  else cost.collective(p))
    in_layers = {key for key, n in count.items() if n == layers}
    forward = sum(seconds[k] for k in in_layers if k[0] == "F0") / layers
    outside = sum(t for k, t in seconds.items() if k not in in_layers)
    total = ddlsim.predict(run, check_fit=False).iteration_time_s
    return forward, (total - outside) / layers - forward, total


def evaluate_layers() -> list[dict]:
    """Table 4's rows with ddlsim's forward and backward milliseconds and their errors."""
    out = []
    for row in layer_rows():
        fwd, bwd, _ = layer_seconds(layer_config(row))
        out.append({"row": row, "forward": 1e3 * fwd, "backward": 1e3 * bwd,
                    "forward_error": 1e3 * fwd / float(row["forward_ms"]) - 1,
                    "backward_error": 1e3 * bwd / float(row["backward_ms"]) - 1})
    return out


def score_pass_efficiency() -> tuple[float, float, float]:
    """The A100's score-pass efficiency (``device.score_pass_efficiency``) from Table 4: the
    selective recomputation's cost in the 22B layer's backward (13.2 − 11.9 ms) is one forward
    of its attention core, whose kernels are all memory-bound, so its bytes over that time
    are the bandwidth they achieve. Returns (efficiency, low, high), the bounds from the
    table's rounding to 0.1 ms (±0.05 on each time)."""
    from ddlsim.api import build_workload
    from ddlsim.config import build_config
    from ddlsim.config_types import DTYPE_BYTES
    from ddlsim.simulator.kernels.device import SCORE_VARIANTS

    rows = {r["experiment"]: r for r in layer_rows()}
    row = rows["Selective Recompute"]
    run = build_config(layer_config(row))
    core = next(op.payload for op in build_workload(run).classes[0].program.blocks["B0"].flat.ops
                if op.payload.name == "recompute.attn_core")
    scores = [k for k in core.kernels if k.variant in SCORE_VARIANTS]
    nbytes = sum(k.bytes if k.kind == "memory" else
                 (k.shape[0] * k.shape[2] + k.shape[2] * k.shape[1] + k.shape[0] * k.shape[1])
                 * k.batch * DTYPE_BYTES[k.dtype] for k in scores)
    peak = run.system.device.memory_bandwidth_Bps
    # the rest of the core's forward (the context's layout copy) streams at the device's
    # memory efficiency: its time is not the score passes'
    rest = sum(k.bytes for k in core.kernels if k.variant not in SCORE_VARIANTS) / (
        peak * run.system.device.memory_efficiency)
    overhead = 1e-3 * (float(row["backward_ms"])
                       - float(rows["Baseline no recompute"]["backward_ms"])) - rest
    return (nbytes / (peak * overhead), nbytes / (peak * (overhead + 1e-4)),
            nbytes / (peak * (overhead - 1e-4)))


def model_flops(row: dict) -> float:
    """The paper's model FLOPs of one iteration (its Appendix A):
    ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``."""
    return gpt_model_flops(int(row["global_batch"]), SEQ, int(row["layers"]),
                           int(row["hidden"]), VOCAB)


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time, error, MFU."""
    out = []
    for row in rows() if only is None else only:
        rec = time_record(row, config(row), engine, limits, float(row["iteration_s"]))
        if rec["result"] is not None:
            rec["mfu"] = model_flops(row) / rec["predicted"] / int(row["gpus"]) / PEAK
        out.append(rec)
    return out


def _label(o: dict) -> str:
    return f"{o['row']['model']} {o['row']['scheme']} on {o['row']['gpus']} GPUs"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "scheme", "GPUs", "TP", "PP", "VPP", "DP", "batch", "published (s)",
            "predicted (s)", "error", "published MFU", "predicted MFU"]
    lines = []
    for o in out:
        row, r = o["row"], o["result"]
        dp = int(row["gpus"]) // (int(row["tp"]) * int(row["pp"]))
        cells = [row["model"], row["scheme"], row["gpus"], row["tp"], row["pp"],
                 row["virtual_stages"] or "-", str(dp), row["global_batch"],
                 f"{o['published']:.2f}"]
        if r is None:
            cells += ["not run (work limit)", "-", "-", "-"]
        else:
            note = " (does not fit; check_fit=False)" if o["refused"] else ""
            cells += [f"{o['predicted']:.2f}{note}", f"{100 * o['error']:+.1f}%",
                      f"{row['mfu_pct']}%" if row["mfu_pct"] else "-",
                      f"{100 * o['mfu']:.1f}%"]
        lines.append(cells)
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)
    print("\nOne layer of the 22B model (Table 4), milliseconds:\n")
    head = ["experiment", "SP", "recompute", "published forward", "predicted forward", "error",
            "published backward", "predicted backward", "error"]
    lines = [[o["row"]["experiment"], o["row"]["sequence_parallel"], o["row"]["recompute"],
              o["row"]["forward_ms"], f"{o['forward']:.2f}", f"{100 * o['forward_error']:+.1f}%",
              o["row"]["backward_ms"], f"{o['backward']:.2f}",
              f"{100 * o['backward_error']:+.1f}%"] for o in evaluate_layers()]
    print_table(head, lines, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error| and worst row, and the predicted gain of the present work over full
    recomputation against the published one."""
    ran = {(o["row"]["model"], o["row"]["gpus"], o["row"]["scheme"]): o for o in out
           if o["result"] is not None}
    gains = []
    for (model, gpus, scheme), o in ran.items():
        full = ran.get((model, gpus, "full"))
        if scheme == "present" and full is not None:
            gains.append(f"{model} {full['predicted'] / o['predicted'] - 1:+.1%} "
                         f"(published {full['published'] / o['published'] - 1:+.1%})")
    return (f"{error_stats(out, _label)} ({engine} engine, {len(ran)} of {len(out)} rows; "
            f"positive error = ddlsim too slow); throughput gain of the present work: "
            + ", ".join(gains))


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_recompute", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
