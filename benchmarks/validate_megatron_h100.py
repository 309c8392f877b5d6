"""Predicted vs published iteration time of Megatron-Core r0.8.0's H100 weak-scaling runs.

Run:  python benchmarks/validate_megatron_h100.py [--engine analytical|des] [--markdown]
      [--write-docs] [--des-rank-ops N] [--mbs N] [--breakdown] [--strong]

``--breakdown`` adds three tables (never written to the docs): each row's predicted iteration by
part (compute, optimizer, exposed communication per group, bubble) with the error it would
read if every collective were hidden, its compute by kind (``kernel_breakdown.py``), and per
decoder layer its device time against Transformer Engine's host time per module call
(``print_host_check``). ``--strong`` adds the README's strong-scaling ends (the 177B model
from 96 to 4,608 GPUs at a batch of 1,152, MFU 47 -> 42 %: :data:`STRONG_ENDS`) with the MFU
kept between them; at 96 GPUs (DP 2, 576 micro-batches a pipeline) data-parallel time and the
bubble are small (2026-11-30: 0.08 s exposed DP, 4.1 s bubble of 103.7 s), and the row reads
-11.7 %: the compute the weak rows' compute-bound errors point at is too fast on its own.

The published table (NVIDIA/Megatron-LM README, GPT models from 1.7B to 462B on 48 to 6,144
H100 GPUs) and its provenance are in ``data/megatron_core_h100_weak.csv``. The README states
the vocabulary (131,072), sequence (4,096) and the overlaps (``--overlap-grad-reduce
--overlap-param-gather``, ``--tp-comm-overlap``, PP overlap by default); Megatron-LM r0.8.0's
arguments.py makes the rest of those flags' plan: ``--overlap-param-gather`` asserts
``--use-distributed-optimizer`` (ZeRO-1 here), ``--tp-comm-overlap`` asserts
``--sequence-parallel``. The model is Megatron's default GPT (``ffn = 4h``, GeLU, LayerNorm,
learned positions) with untied embeddings, which the "Model size" column implies.

What the source does not state is assumed and said so: BF16 (the MFU column is against the
BF16 peak), the micro-batch size (``--mbs``, default 1, Megatron's GPT example script's
value) and the interleaved schedule's chunk: the README's overlapped "pipeline-parallel
communication (enabled by default)" exists at core_r0.8.0 only under the interleaved schedule
(``arguments.py`` lines 271-277 turn ``overlap_p2p_comm`` off otherwise), so the PP rows run it,
one layer per virtual stage (:data:`LAYERS_PER_VIRTUAL_STAGE`, the only chunk that divides
every PP row's layers per stage). Until 2026-11-30 the rows ran 1F1B without interleaving,
whose bubble (70B 238 ms ... 462B 3.05 s) hid ddlsim's too-fast compute on those rows
(70B +2.5 -> -9.7 %, 119B +3.8 -> -13.2 %, 177B +2.5 -> -13.9 %, 314B +2.0 -> -15.1 %,
462B +9.8 -> -7.1 %; mean 9.3 -> 13.6 %). The error is ``predicted / published − 1`` of the
iteration time (positive: ddlsim is too slow), the published time being Megatron's own FLOP
count over the published TFLOP/s (the CSV's header).

The stack's host waits at that code (``host_syncs`` in software.yaml,
ddlsim/workloads/decoder/host_sync.py: the loss's NaN check and ``num_tokens.item()`` per
micro-batch, each gradient bucket's NaN check, the clip's grad-norm and the loss scale's
``.item()`` per step) are in every row; on the 1.7B row they cost 1.8 ms of its 0.45 s (37
buckets, 4 micro-batches), so they are not what its -23 % misses.

What was checked against the source (core_r0.8.0, ``baf94af3c6``; 2026-11-29):

* The plan's flags are those the code runs: ``--bf16`` forces ``accumulate_allreduce_grads_in_
  fp32`` (``arguments.py`` lines 300-305), so gradients are reduce-scattered in fp32; buckets
  of ``max(40e6, 1e6·DP)`` parameters (``distributed_data_parallel.py`` lines 51-53); the
  gradients are reduced only in the last micro-batch's backward (``schedules.py``
  ``forward_backward_no_pipelining``: the others run under ``no_sync``); attention and hidden
  dropout 0.1 (defaults; the example scripts do not change them).
* ``--breakdown``: every row but 462B reads too fast on compute alone (compute, optimizer and
  bubble: 1.7B -22.9 %, 7.1B -18.4 %, 16B -7.0 %, 32B -17.1 %, 70B -19.7 %, 119B-314B -6...-9 %);
  what brings 16B-314B near the table is exposed data-parallel time (32B 330 ms, 70B 387 ms).
  So the small rows' gap is compute, not communication (their DP groups span 8 and 4 GPUs a
  node: 1.7 and 3.9 ms exposed).
* GEMMs: the 1.7B's (M = 4,096 tokens; N, K of 2,048-8,192) run at 673-765 TFLOP/s by the
  shape model (the h x h projection's 673-686; OpenXLA's sm_90 table measures 4096x4096x2048
  at 739), all but the projection's capped at the 700 W sustained rate, 708 TFLOP/s, the
  rate of the 462B's GEMMs too: nothing in the GEMM model, nor in the published kernel tables
  it is checked against, makes h = 2,048 much slower. On the lent H200 (the same GH100 die,
  clocks and limit; 2026-11-30) a saturated back-to-back sweep holds such GEMMs at 626-678
  TFLOP/s (``benchmarks/device_compare.py``: ddlsim's GEMMs at the cap 5.4 % fast in bf16),
  but the GPU's own training step ran its GEMMs at 758 on average, ddlsim 7 % slow there
  (``benchmarks/kineto_vs_ddlsim.py``): a step does not saturate the board, and the cap stays
  (docs/compute.md, "Sustained clocks"); lowered to the sweep's 0.680 it would read these rows
  12.2 -> 11.3 %.
* Costs found uncharged or under-charged, each small (1.7B row, per iteration): the input
  embedding's backward (a dense ``[V/t, h]`` bf16 gradient, then
  ``param.main_grad.add_(param.grad)`` in the DDP hook, ``distributed_data_parallel.py`` line
  224), then no op of the trace, is charged since (``bwd.embedding``,
  ddlsim/workloads/decoder/embedding_grad.py: 1.8 ms a micro-batch on this row, which moved
  1.7B -23.8 -> -22.8 %, 7.1B -17.9 -> -17.3 % at d1fb503); Megatron-Core's unfused
  cross-entropy (core_r0.8.0 ``tensor_parallel/cross_entropy.py``: the passes ddlsim counts)
  ran 17 % (forward) and 9 % (backward) slower in Liger-Kernel's published H100 times at V =
  131,072 than those passes at the streaming bandwidth, charged since dcbb84c by its kernel
  class (``loss``, fitted to ``liger_h100_kernels.csv``'s unfused rows at V = 8,192, 32,768,
  131,072: 1.7B -22.5 -> -21.0 %, 7.1B -17.1 -> -16.7 %); attention dropout 0.1 costs cuDNN's
  fused attention 3.4 % in sbhd on an H200 (NVIDIA/TransformerEngine#3312, TE 2.15: 0.594 ->
  0.614 ms), charged since 3f88c4f (1.7B -21.0 -> -20.6 %, 7.1B -16.7 -> -16.4 %); the 8-byte
  loss all-reduce over DP per micro-batch and the grad-norm all-reduce (``pretrain_gpt.py``
  ``loss_func``; host_sync.py leaves them out) ~0.15 ms, not charged. The dataset's ``[1, s, s]`` attention
  mask (``gpt_dataset.py`` ``create_attention_mask`` True by default; bool, 16.8 MB), copied
  to the device on the compute stream per micro-batch, is charged since c87c66e
  (ddlsim/workloads/decoder/batch_input.py at dgx-h100's host_link, 50.4 GB/s: 1.7B -22.8 ->
  -22.5 %, 7.1B -17.3 -> -17.1 %). About 90 ms of the 1.7B's missing ~100 ms remain
  unexplained.
* Host dispatch (checked 2026-11-29, issue 29): is the eager Megatron-Core + TE step
  host-bound on the small rows? Each layer's forward calls 5 TE modules (``gpt_layer_specs.py``
  at core_r0.8.0); the largest published host time of a TE module call found is 99.66 us
  (te.Linear BF16 forward on GB200's Grace host, NVIDIA/TransformerEngine#2053, 2025; the
  issue reports the DGX H100's Xeon faster; #445, 2023, H100: ~57 us a call). At that bound a
  layer's forward is 0.50 ms of host against 0.84 ms of device on the 1.7B (``--breakdown``'s
  host table: 0.60; 7.1B 0.35, 16B 0.25, 32B 0.42), its backward 1.8 ms of device. The host
  runs ahead of the device, so the 1.7B row is not host-bound unless a module call cost
  ~170 us or more (fwd); closing its gap by the host alone would need ~360 us a call
  (forward and backward, 10 calls a layer, ~3.6 ms a layer against 2.6 ms of device). No
  published figure that large was found (searched: TE issues #445, #761, #836, #2053, #2126,
  PR #2146; Megatron-LM's CUDA-graph docs, which give no speedup figure; NeMo/Megatron-Bridge
  CUDA-graph pages, none either). So no per-module host time is modelled: at the published
  figures it would not bind on any row, and the 1.7B's ~90 ms stays unexplained.
* 32B (+22.9 %): its DP groups have one GPU per node (TP 8), so each rank reduce-scatters
  15.75 GB of fp32 gradients and gathers 7.83 GB of bf16 parameters through its own 400 Gb/s
  NIC: at least 0.31 + 0.15 s at line rate, against overlap windows of one micro-batch's
  backward (~0.12 s) and forward (~0.06 s). With ddlsim's compute (0.73 s, itself too fast on
  every other row) the step cannot be under ~1.01 s, 13 % over the published 0.892 s, whatever
  the collective model: the published row needs fewer micro-batches (``--mbs 2``: +2.7 %,
  ``--mbs 4``: -15.6 %, as its PP-1 neighbours read), or bf16 gradient reduction (which
  ``--bf16`` rules out at core_r0.8.0). In-network reduction (IB SHARP) would not help: a
  reduce-scatter through SHARP still sends each rank's whole fp32 buffer once through its NIC
  (the ring sends (DP-1)/DP of it), and NCCL's PXN cannot lend a busy rail's NIC, as all
  8 GPUs of a node reduce at once, each on its own rail. Megatron-Core r0.8.0's
  overlap is what ddlsim credits (checked 2026-11-30 at ``baf94af3c6``): the reduce-scatters
  bucket by bucket during the last micro-batch's backward only (``schedules.py``
  ``forward_backward_no_pipelining``: the others under ``no_sync``), the first bucket's
  parameter all-gather issued in ``optimizer.zero_grad()`` at the step's start
  (``optimizer/distrib_optimizer.py`` lines 1329-1337) and each next bucket's only in the
  forward pre-hook of the bucket before it (lines 1454-1475: one at a time, "since we run
  with CUDA_DEVICE_MAX_CONNECTIONS=1"), so the gather overlaps the first micro-batch's
  forward alone. The 32B's mbs is the one setting the source leaves open that moves it;
  Megatron-LM's earlier weak-scaling scripts (``examples/academic_paper_scripts/sc21/
  run_table_1.sh``, the A100 table's) used one micro-batch per DP rank on its three smallest
  rows (1.7B, 3.6B, 7.5B: MBS 16 = GBS / DP; 18B, PP 1 too, MBS 8 of 32), a precedent, not a
  statement about these runs, so mbs 1 stays.
"""

from __future__ import annotations

import sys

from public_runs import (DATA, print_notes, print_table, records, result_cells, rows_summary,
                         run_script)
from public_runs import read_csv

TABLE = DATA / "megatron_core_h100_weak.csv"
GPUS_PER_NODE = 8          # DGX H100
STACK = "megatron-core-2024"
VOCAB = 131072             # README: "vocabulary size of 131,072" (a multiple of 128·TP)
SEQ = 4096                 # README: "sequence length of 4096"
#: The micro-batch size the source leaves out: Megatron-LM's GPT pre-training example at
#: core_r0.8.0 (examples/gpt3/train_gpt3_175b_distributed.sh) passes --micro-batch-size 1
MBS = 1
#: Layers per virtual pipeline stage of the rows with PP > 1 (the interleaved schedule). The
#: README (f2e5db40 line 66; core_r0.8.0 ``baf94af3c6`` line 64) overlaps "pipeline-parallel
#: communication (enabled by default)": at core_r0.8.0 that is ``overlap_p2p_comm`` (default
#: on, ``--no-overlap-p2p-communication``, megatron/training/arguments.py lines 1405-1407),
#: which arguments.py turns off unless the schedule is interleaved (lines 271-277: "Setting
#: args.overlap_p2p_comm to False since non-interleaved schedule does not support overlapping
#: p2p communication"), so the PP rows ran the interleaved schedule. Its chunk size is not
#: stated; 1 is the only ``--num-layers-per-virtual-pipeline-stage`` that divides every PP
#: row's layers per stage (42, 23, 16, 12, 7: arguments.py lines 264-268 assert it divides
#: them; 23 and 7 are prime, so 119B and 462B admit 1 or no interleaving at all).
LAYERS_PER_VIRTUAL_STAGE = 1


def rows(table=TABLE) -> list[dict]:
    """The published table's rows."""
    return read_csv(table)


def _int(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def megatron_flops(row: dict) -> float:
    """FLOPs of one iteration by Megatron-LM's own count.

    References
    ----------
    NVIDIA/Megatron-LM core_r0.8.0, megatron/training/training.py,
    ``num_floating_point_operations``: ``12·B·s·l·h²·((2 + s/h) + ffn/h + V/(2·l·h))`` for a
    GPT without grouped-query attention or experts.
    """
    h, layers, gbs = _int(row, "hidden", "layers", "gbs")
    ffn = 4 * h
    return 12 * gbs * SEQ * layers * h * h * ((2 + SEQ / h) + ffn / h + VOCAB / (2 * layers * h))


def published_time(row: dict) -> float:
    """Seconds per iteration implied by the published per-GPU TFLOP/s."""
    return megatron_flops(row) / (float(row["tflops_per_gpu"]) * 1e12 * int(row["gpus"]))


def config(row: dict, mbs: int = MBS) -> dict:
    """The ddlsim run config of one row: the table's plan and the README's flags."""
    heads, h, layers, tp, pp, dp, gpus, gbs = _int(
        row, "heads", "hidden", "layers", "tp", "pp", "dp", "gpus", "gbs")
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "data_parallel_size": dp, "sequence_parallel": tp > 1,
                "zero_stage": 1,     # --overlap-param-gather needs the distributed optimizer
                "overlap_grad_reduce": True, "overlap_param_gather": True, "schedule": "1f1b"}
    if tp > 1:
        parallel["tp_comm_overlap"] = "pipelined"
    if pp > 1:   # PP communication overlapped: the interleaved schedule (LAYERS_PER_VIRTUAL_STAGE)
        parallel["schedule"] = "interleaved"
        parallel["virtual_pipeline_model_parallel_size"] = layers // pp // LAYERS_PER_VIRTUAL_STAGE
    model = {"name": row["model"], "architecture": "gpt", "num_hidden_layers": layers,
             "hidden_size": h, "num_attention_heads": heads, "intermediate_size": 4 * h,
             "vocab_size": VOCAB, "max_position_embeddings": SEQ, "tie_word_embeddings": False}
    return {"model": model, "parallel": parallel,
            "train": {"micro_batch_size": mbs, "global_batch_size": gbs, "seq_length": SEQ,
                      "dtype": "bf16", "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": gpus // GPUS_PER_NODE,
                       "software": {"stack": STACK}}}


def evaluate(engine: str = "analytical", only: list[dict] | None = None, limits=None,
             mbs: int = MBS) -> list[dict]:
    """One record per row: published and predicted iteration time, error, fit note."""
    return records(rows() if only is None else only, lambda r: config(r, mbs), published_time,
                   engine, limits)


def _label(o: dict) -> str:
    return f"{o['row']['model']} on {o['row']['gpus']} GPUs"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "GPUs", "TP", "PP", "DP", "GBS", "published TFLOP/s/GPU", "published (s)",
            "predicted (s)", "error"]
    lines = [[o["row"][k] for k in ("model", "gpus", "tp", "pp", "dp", "gbs", "tflops_per_gpu")]
             + [f"{o['published']:.3f}"] + result_cells(o) for o in out]
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error|, worst row and signed mean over the rows that ran."""
    return rows_summary(out, engine, _label)


#: the parts of an iteration (ddlsim.Breakdown), in the order they are printed
PARTS = ("compute", "optimizer", "exposed dp", "exposed tp", "exposed pp", "bubble")


def breakdown(o: dict) -> dict[str, float]:
    """Seconds of one row's predicted iteration by part (:class:`ddlsim.Breakdown` of the
    critical rank: they add up to the iteration time) and ``compute-bound error``, the error
    the row would read if every collective were hidden (compute, optimizer and bubble only)."""
    b = o["result"].breakdown
    exposed = b.exposed_comm_s
    parts = dict(zip(PARTS, (b.compute_s, b.optimizer_s, exposed.get("dp", 0.0),
                             exposed.get("tp", 0.0), exposed.get("pp", 0.0), b.bubble_s)))
    parts["compute-bound error"] = (b.compute_s + b.optimizer_s + b.bubble_s) / o["published"] - 1
    return parts


def compute_kinds(row: dict, mbs: int = MBS) -> dict[str, float]:
    """Seconds of the first rank class's compute by kind (GEMMs, output head, attention,
    element-wise, cross-entropy, optimizer, launch gaps and host, ...), as
    ``benchmarks/kernel_breakdown.py`` (``step_breakdown``) splits it."""
    import ddlsim
    from kernel_breakdown import step_breakdown
    kinds, _ = step_breakdown(ddlsim.load_config(config(row, mbs)))
    return dict(kinds.most_common())


#: Transformer Engine module calls in one decoder layer's forward at core_r0.8.0
#: (``gpt_layer_specs.py`` ``get_gpt_layer_with_transformer_engine_spec`` with the dense MLP
#: spec: linear_qkv and linear_fc1 TELayerNormColumnParallelLinear, core_attention
#: TEDotProductAttention, linear_proj and linear_fc2 TERowParallelLinear)
TE_MODULES_PER_LAYER = 5
#: Host (CPU) seconds of one TE module call, an upper bound: NVIDIA/TransformerEngine#2053
#: (2025-08-11, TE of that date) times te.Linear's BF16 forward (hidden 2048, 8192 tokens) at
#: 99.66 us of CPU a call on GB200 and 90.53 on GH200, the Grace hosts the issue reports as
#: slower than the DGX H100's Xeon 8480C for TE (its H100 row was not readable in the stored
#: copy); NVIDIA/TransformerEngine#445 (2023-10-16, an NVIDIA maintainer on H100, NGC 23.08)
#: reads 0.574 ms for 10 chained BF16 te.Linear forwards of 1024x1024x1024, a host-bound size
#: (~57 us a call, if its cost_time is per model call). No published TE 1.x backward or
#: TEDotProductAttention host figure was found: each is taken at the same bound.
TE_MODULE_HOST_S = 99.66e-6


def layer_device_s(row: dict, mbs: int = MBS) -> dict[str, float]:
    """Seconds of one decoder layer's forward and backward on the device (the trace's
    ``fwd.*``/``bwd.*`` layer ops on the first rank class, each by ``op_time``, so with the
    stack's per-kernel host and gaps), averaged over the layer calls."""
    import ddlsim
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device, op_time
    from ddlsim.workloads.trace import Compute
    cfg = ddlsim.load_config(config(row, mbs))
    dev, prog = kernel_device(cfg.system), build_workload(cfg).classes[0].program
    sums, layers = {"fwd": 0.0, "bwd": 0.0}, 0
    for step in prog.steps:
        for op in prog.blocks[step.block].flat.ops:
            p = op.payload
            if not isinstance(p, Compute) or p.contention is not None or p.seconds is not None:
                continue
            side, _, part = p.name.partition(".")
            if side in sums and part in ("attn", "mlp", "elementwise"):
                sums[side] += op_time(p, dev) * op.repeat
                layers += op.repeat if p.name == "fwd.attn" else 0
    return {side: total / layers for side, total in sums.items()}


def print_host_check(out: list[dict], markdown: bool, mbs: int = MBS) -> None:
    """The ``--breakdown`` host table: per decoder layer, the device time of its forward and
    backward against :data:`TE_MODULES_PER_LAYER` module calls at :data:`TE_MODULE_HOST_S`,
    and the host time a module call would need for the host to bind."""
    lines = []
    for o in (o for o in out if o["result"] is not None):
        dev = layer_device_s(o["row"], mbs)
        host = TE_MODULES_PER_LAYER * TE_MODULE_HOST_S
        lines.append([o["row"]["model"], f"{1e6 * dev['fwd']:.0f}", f"{1e6 * dev['bwd']:.0f}",
                      f"{1e6 * host:.0f}", f"{host / dev['fwd']:.2f}",
                      f"{1e6 * dev['fwd'] / TE_MODULES_PER_LAYER:.0f}"])
    print()
    print_table(["model", "layer fwd device (us)", "layer bwd device (us)",
                 "layer TE host bound (us)", "host/device fwd", "binds above (us/call)"],
                lines, markdown)


def print_breakdown(out: list[dict], markdown: bool, mbs: int = MBS) -> None:
    """The ``--breakdown`` tables: each row's iteration by part (ms) with its compute-bound
    error, then its compute by kind (ms)."""
    ran = [o for o in out if o["result"] is not None]
    head = ["model", "published (ms)", "predicted (ms)", *[f"{p} (ms)" for p in PARTS],
            "compute-bound error"]
    lines = []
    for o in ran:
        parts = breakdown(o)
        lines.append([o["row"]["model"], f"{1e3 * o['published']:.1f}",
                      f"{1e3 * o['predicted']:.1f}", *[f"{1e3 * parts[p]:.1f}" for p in PARTS],
                      f"{100 * parts['compute-bound error']:+.1f}%"])
    print()
    print_table(head, lines, markdown)
    kinds = {o["row"]["model"]: compute_kinds(o["row"], mbs) for o in ran}
    names = sorted({k for d in kinds.values() for k in d},
                   key=lambda k: -max(d.get(k, 0.0) for d in kinds.values()))
    print()
    print_table(["compute by kind (ms)", *kinds],
                [[k, *[f"{1e3 * d.get(k, 0.0):.1f}" for d in kinds.values()]] for k in names],
                markdown)
    print_host_check(ran, markdown, mbs)


#: The README's strong-scaling ends (f2e5db40 line 74, core_r0.8.0 line 72): "the standard GPT-3
#: model (our version has slightly more than 175 billion parameters due to larger vocabulary
#: size) from 96 H100 GPUs to 4608 GPUs, using the same batch size of 1152 sequences
#: throughout ... a reduction in MFU from 47% to 42%": (GPUs, MFU %, rounded). The plan is not
#: stated: taken as the weak table's 177B row (the same model, TP 8, PP 6), DP = GPUs / 48.
STRONG_ENDS = ((96, 47), (4608, 42))
#: the MFU's denominator, TFLOP/s (H100 SXM dense BF16; megatron_core_h100_weak.csv header)
BF16_PEAK_TFLOPS = 989


def strong_rows() -> list[dict]:
    """The strong-scaling ends as rows of the weak table (its 177B row, ``gpus``, ``dp`` and
    ``tflops_per_gpu`` = MFU × 989 replaced)."""
    base = next(r for r in rows() if r["model"] == "177B")
    per_dp = int(base["tp"]) * int(base["pp"])
    return [{**base, "gpus": str(gpus), "dp": str(gpus // per_dp), "mfu_pct": str(mfu),
             "tflops_per_gpu": str(mfu * BF16_PEAK_TFLOPS / 100)} for gpus, mfu in STRONG_ENDS]


def print_strong(engine: str, markdown: bool, mbs: int = MBS) -> None:
    """The ``--strong`` table: the strong-scaling ends (:data:`STRONG_ENDS`) predicted, with
    each one's compute-bound error, and the MFU kept from 96 to 4,608 GPUs, published (the
    band the rounding of 47 and 42 leaves) and predicted. At 96 GPUs (DP 2, 576 micro-batches
    a pipeline) data-parallel time and the bubble are small, so its error is the compute's."""
    out = evaluate(engine, only=strong_rows(), mbs=mbs)
    lines = [[o["row"]["gpus"], o["row"]["dp"], o["row"]["mfu_pct"], f"{o['published']:.3f}",
              *result_cells(o), f"{100 * breakdown(o)['compute-bound error']:+.1f}%"]
             for o in out]
    print()
    print_table(["177B GPUs", "DP", "published MFU (%)", "published (s)", "predicted (s)",
                 "error", "compute-bound error"], lines, markdown)
    (lo_g, lo_mfu), (hi_g, hi_mfu) = STRONG_ENDS
    kept = (out[0]["predicted"] * lo_g) / (out[1]["predicted"] * hi_g)
    print(f"\nMFU kept from {lo_g} to {hi_g} GPUs: published {hi_mfu / lo_mfu:.3f} "
          f"({(hi_mfu - 0.5) / (lo_mfu + 0.5):.3f}-{(hi_mfu + 0.5) / (lo_mfu - 0.5):.3f} by "
          f"rounding), predicted {kept:.3f}")


def _flag(argv: list[str], name: str, value: bool = False):
    """Remove option ``name`` (with its value when ``value``) from ``argv``; return the
    value, True for a present flag, None when absent."""
    if name not in argv:
        return None
    i = argv.index(name)
    got = argv[i + 1] if value else True
    del argv[i:i + 1 + value]
    return got


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mbs = int(_flag(argv, "--mbs", value=True) or MBS)
    show_breakdown = bool(_flag(argv, "--breakdown"))
    show_strong = bool(_flag(argv, "--strong"))
    done: list[dict] = []
    engines: list[str] = []

    def run(engine, limits=None):
        done[:] = evaluate(engine, limits=limits, mbs=mbs)
        engines[:] = [engine]
        return done
    rc = run_script("validate_megatron_h100", __doc__, argv, run, _print, summary)
    if show_breakdown:
        print_breakdown(done, "--markdown" in argv, mbs)
    if show_strong:
        print_strong(engines[0], "--markdown" in argv, mbs)
    return rc


if __name__ == "__main__":
    sys.exit(main())
