"""ddlsim's kernel model of one BERT-large layer on a V100 in fp16 against a published
measurement of that layer (issue 29: is the V100 AMP BERT rows' optimism in the device's
kernels or in the host?).

Run:  python benchmarks/bert_layer_v100.py

The measurement (``data/mli_bert_layer_v100.csv``, with its provenance: mli/transformers-
benchmarks ``micro_bench.ipynb``, Tesla V100-SXM2-16GB, PyTorch 1.13, CUDA 11.7) times Hugging
Face's ``BertLayer`` forward and forward + backward at 128 and 512 tokens, 4 to 128 sequences.
ddlsim's layer is :func:`ddlsim.workloads.bert.kernels.layer_kernels` on ``dgx1-v100``'s device
(V100-SXM2, eager dispatch, CUDA 11's cuBLAS), each op timed by
:func:`ddlsim.simulator.kernels.op_time` (kernels, launch gaps, the per-kernel host rule), with
what the measured layer does not run taken out: the attention mask's add (no mask is passed:
its pass forward and backward) and the query, key and value projections' data gradients (the
input ``X`` does not require a gradient). Nothing is fitted.

Two regimes show in the measurement itself. At 128 tokens and 4 or 8 sequences the layer's
time does not grow with its work (the forward + backward takes the same ~2.9 ms at 4 and at 8
sequences, twice the FLOPs): the host, not the device, sets it. There ddlsim's figure is far
shorter: its host time per kernel (``device.launch``: 3.8 µs launch + 2 µs eager dispatch)
is an order of magnitude under what eager PyTorch and this module's Python cost per kernel on
that machine. Everywhere else the device sets it, and ddlsim's device model is compared.
"""

from __future__ import annotations

import sys
import warnings

from public_runs import DATA, read_csv

TABLE = DATA / "mli_bert_layer_v100.csv"
#: the system whose device times the layer: V100-SXM2 (the measured part), eager PyTorch on
#: CUDA 11's cuBLAS (the notebook ran CUDA 11.7)
SYSTEM = {"preset": "dgx1-v100", "nodes": 1, "devices_per_node": 1,
          "software": {"kernels": {"gemm_library": "cublas-11", "host_dispatch": "eager"}}}
#: rows where the measured forward + backward time stays flat while the work doubles
#: (within this fraction): the host sets the time
FLAT = 0.02


def rows() -> list[dict]:
    """The measured rows, each with its per-layer times in seconds (``fwd_s``,
    ``fwd_bwd_s``: the printed FLOP count over the printed TFLOP/s)."""
    out = []
    for r in read_csv(TABLE):
        s, b, h = int(r["seq"]), int(r["batch"]), 1024
        flops = 24 * b * s * h * h + 4 * b * h * s * s
        out.append(dict(seq=s, batch=b, fwd_s=flops / (float(r["fwd_tflops"]) * 1e12),
                        fwd_bwd_s=3 * flops / (float(r["fwd_bwd_tflops"]) * 1e12)))
    return out


def host_bound(out: list[dict]) -> set[tuple[int, int]]:
    """(seq, batch) of the rows whose forward + backward time is within :data:`FLAT` of the
    next-larger batch's at the same length though that does twice the work."""
    by = {(r["seq"], r["batch"]): r["fwd_bwd_s"] for r in out}
    return {k for k, t in by.items()
            if (k[0], 2 * k[1]) in by and abs(by[(k[0], 2 * k[1])] / t - 1) < FLAT}


def _measured_layer(model, b: int, s: int, backward: bool):
    """ddlsim's layer kernels (dense, core, element-wise) without what the measured layer
    does not run (module docstring)."""
    from ddlsim.workloads.bert.kernels import layer_kernels
    dense, core, passes = layer_kernels(model, b, s, 2.0, "fp16", backward)
    if backward:                    # dgrad, wgrad per GEMM: drop Q, K, V's data gradients
        dense = tuple(k for i, k in enumerate(dense) if i not in (0, 2, 4))
        gemms = 4                   # two per batched GEMM
    else:
        gemms = 2
    core = core[:gemms + 1] + core[gemms + 2:]     # scale, [mask], softmax, dropout
    return dense, core, passes


def layer_config(b: int, s: int):
    """The run config whose model and device time the layer: ``bert-large`` on
    :data:`SYSTEM`, ``b`` sequences of ``s`` tokens in fp16."""
    import ddlsim
    return ddlsim.load_config({
        "model": {"preset": "bert-large"}, "parallel": {"data_parallel_size": 1},
        "train": {"micro_batch_size": b, "global_batch_size": b, "seq_length": s,
                  "dtype": "fp16"},
        "system": SYSTEM})


def predicted(b: int, s: int) -> dict:
    """ddlsim's per-layer seconds (``fwd_s``, ``fwd_bwd_s``), kernel count and host time of
    those kernels (``host_s``)."""
    from ddlsim.simulator.kernels import kernel_device, op_time
    from ddlsim.workloads.trace import Compute
    cfg = layer_config(b, s)
    dev = kernel_device(cfg.system)
    times, kernels = {}, 0
    for backward in (False, True):
        ops = _measured_layer(cfg.model, b, s, backward)
        times[backward] = sum(op_time(Compute("layer", 0.0, kernels=k), dev) for k in ops)
        kernels += sum(len(k) for k in ops)
    return dict(fwd_s=times[False], fwd_bwd_s=times[False] + times[True], kernels=kernels,
                host_s=kernels * dev.launch.host_s)


def evaluate() -> list[dict]:
    """Each measured row with ddlsim's figures, its regime and the error of ddlsim's
    forward + backward time (positive = ddlsim slower)."""
    out = rows()
    bound = host_bound(out)
    for r in out:
        r.update({f"pred_{k}": v for k, v in predicted(r["batch"], r["seq"]).items()})
        r["regime"] = "host" if (r["seq"], r["batch"]) in bound else "device"
        r["error"] = r["pred_fwd_bwd_s"] / r["fwd_bwd_s"] - 1
    return out


def summary(out: list[dict]) -> str:
    """Mean |error| of the device-bound rows, and the host-bound rows' measured time per
    kernel against the device preset's host time per kernel."""
    dev = [r for r in out if r["regime"] == "device"]
    host = [r for r in out if r["regime"] == "host"]
    line = (f"device-bound rows ({len(dev)}): mean |error| "
            f"{100 * sum(abs(r['error']) for r in dev) / len(dev):.1f} %, signed "
            f"{100 * sum(r['error'] for r in dev) / len(dev):+.1f} %")
    if host:
        per = sum(r["fwd_bwd_s"] / r["pred_kernels"] for r in host) / len(host)
        line += (f"; host-bound rows ({len(host)}): measured {1e6 * per:.0f} µs per kernel "
                 f"of ddlsim's list, the preset's host time "
                 f"{1e6 * host[0]['pred_host_s'] / host[0]['pred_kernels']:.1f} µs")
    return line


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("ignore")
    out = evaluate()
    print(f"{'seq':>4} {'batch':>5} {'regime':>6} {'measured fwd+bwd (ms)':>22} "
          f"{'ddlsim (ms)':>11} {'error':>7} {'ddlsim fwd (ms)':>15} {'measured fwd':>12}")
    for r in out:
        print(f"{r['seq']:>4} {r['batch']:>5} {r['regime']:>6} {1e3 * r['fwd_bwd_s']:>22.3f} "
              f"{1e3 * r['pred_fwd_bwd_s']:>11.3f} {100 * r['error']:>+6.1f}% "
              f"{1e3 * r['pred_fwd_s']:>15.3f} {1e3 * r['fwd_s']:>12.3f}")
    print()
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
