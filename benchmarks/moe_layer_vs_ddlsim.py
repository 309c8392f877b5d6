"""Megatron-Core's MoE layer measured on one H200 against ddlsim's ops of the same layer
(issues 28-30: ground truth measured here for the MoE layer).

The measurements are ``benchmarks/data/device_h200_2026-11-30/run7/moe``, ``run8/moe``, ``run9/moe``
and ``run13/moe`` (``benchmarks/device/moe_layer_step.py``, four calls on four machine starts; the
README there gives the commands): Megatron-LM d7288711's ``MoELayer`` with the local spec
(``SequentialMLP`` experts, unfused router and permutation, eager), expert parallelism 1, at a
rank's share of the validated Qwen3 rows. Per case this prints what was measured, the forward +
backward wall time between synchronisations (median of 20 passes, each run), the device time of
the forward's kernels (Kineto, per pass, run9) and of the backward (queued behind a
sleep: no host gaps), the host's own time of the router's forward, the experts' forward and the
backward (issued behind a sleep; run8 / run9 / run13: the host's speed differs between machine
starts),
beside ddlsim's ops for the same layer:

* ddlsim's config (:func:`config`): the model's preset with one layer of ``E`` experts and
  top-``k``, sequence ``T``, micro-batch 1, one ``dgx-h200`` GPU, the ``megatron-core-2025``
  stack with the run's MoE options (``alltoall``, no grouped GEMM, no permute or router fusion,
  forced balance, aux-loss coefficient 1e-3, the router's dtype) and no
  gradient-accumulation fusion;
* its device time of the layer's ops on the compute stream (:data:`FWD_OPS`, :data:`BWD_OPS`:
  router to un-permutation; the residual add and the weight-gradient accumulation pass are not
  the layer's and are left out) and its host ops of the layer (the DES's spans): forward, the
  host stream's ``fwd.*`` ops but ``fwd.moe.host.te`` (the next layer's attention linears);
  backward, ``bwd.*`` host ops.

ddlsim has no setting for Megatron's local spec: its ``megatron-core-2025`` stack times the
linear modules as Transformer Engine's, so the host columns compare ddlsim's TE-spec charges
with a local-spec run, named as such. Nothing is fitted.

Run: ``python benchmarks/moe_layer_vs_ddlsim.py [--markdown]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

from public_runs import DATA, print_table

RUNS = DATA / "device_h200_2026-11-30"
#: the calls of benchmarks/device/moe_layer_step.py, in order (run8, run9 and run13 have the
#: host-issue timing, run9 the cases e2 and e32 besides, run13 six of the cases)
MOE_RUNS = ("run7", "run8", "run9", "run13")
#: the calls with the host-issue timing
HOST_RUNS = ("run8", "run9", "run13")
#: the call with every case (the table's rows and its forward kernels)
CASE_RUN = "run9"
#: ddlsim's compute-stream ops of the MoE layer's forward and backward, by name prefix
FWD_OPS = ("fwd.router", "fwd.dispatch", "fwd.permute", "fwd.sort", "fwd.experts",
           "fwd.unsort", "fwd.unpermute")
BWD_OPS = tuple("bwd." + p.split(".", 1)[1] for p in FWD_OPS)
#: the host ops of the forward that are not this layer's (the next layer's attention linears)
NOT_THIS_LAYER = ("fwd.moe.host.te",)
#: the Qwen3 model each case's shape is (benchmarks/device/moe_layer_step.py CASES)
MODEL = {4096: "qwen3-235b-a22b", 2048: "qwen3-30b-a3b"}


def load(run: str) -> dict:
    """One call's ``moe_layer.json``, its cases by name."""
    d = json.loads((RUNS / run / "moe" / "moe_layer.json").read_text())
    return {c["case"]: c for c in d["cases"] if "error" not in c}


def kineto_forward_ms(run: str, case: str) -> float:
    """Device ms per pass of the kernels launched in the layer's forward (every range but the
    backward's), from the run's trace of two passes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "device"))
    from moe_layer_step import kernel_parts
    trace = json.loads(gzip.open(RUNS / run / "moe" / f"{case}_trace.json.gz", "rt").read())
    parts = kernel_parts(trace)["parts"]
    return sum(v["us"] for k, v in parts.items() if k not in ("backward", "other")) / 2e3


def config(case: dict) -> dict:
    """ddlsim's config of one measured case (module docstring)."""
    moe = {"token_dispatcher_type": "alltoall", "grouped_gemm": False, "permute_fusion": False,
           "router_force_load_balancing": True, "aux_loss_coeff": 1e-3, "router_fusion": False}
    if case["router_dtype"]:
        moe["router_dtype"] = case["router_dtype"]
    return {"model": {"preset": MODEL[case["hidden"]], "num_hidden_layers": 1,
                      "num_local_experts": case["experts"],
                      "num_experts_per_tok": case["topk"]},
            "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                         "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1,
                         "moe": moe},
            "train": {"micro_batch_size": 1, "global_batch_size": 1,
                      "seq_length": case["tokens"], "dtype": "bf16", "recompute": "none"},
            "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 1,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"gradient_accumulation_fusion": False}}}}


def ddlsim_parts(case: dict) -> dict:
    """ddlsim's ms of the layer: device forward and backward, host forward and backward
    (module docstring), from the DES's spans of one iteration."""
    import ddlsim
    spans = ddlsim.predict(ddlsim.load_config(config(case)), engine="des").spans
    out = dict.fromkeys(("fwd_device", "bwd_device", "fwd_host", "bwd_host"), 0.0)
    for s in spans:
        ms = (s.end_s - s.start_s) * 1e3
        if s.stream == "compute":
            key = "fwd_device" if s.name.startswith(FWD_OPS) else \
                "bwd_device" if s.name.startswith(BWD_OPS) else None
        elif s.stream == "host":
            key = None if s.name in NOT_THIS_LAYER else \
                "fwd_host" if s.name.startswith("fwd.") else \
                "bwd_host" if s.name.startswith("bwd.") else None
        else:
            key = None
        if key:
            out[key] += ms
    return out


def rows() -> list[dict]:
    """Per case of the last run: the measured figures (each run's wall; the host-issue runs'
    host and backward device figures; the last run's forward kernels) and ddlsim's."""
    runs = {r: load(r) for r in MOE_RUNS}
    out = []
    for name, c in runs[CASE_RUN].items():
        hosts = [runs[r][name]["host_issue"] if name in runs[r] else None for r in HOST_RUNS]

        def ms(f) -> list[float | None]:
            return [None if h is None else 1e3 * f(h) for h in hosts]
        out.append({
            "case": name, "experts": c["experts"], "tokens_per_expert": c["tokens_per_expert"],
            "wall_ms": [1e3 * runs[r][name]["fwd_bwd_s"] if name in runs[r] else None
                        for r in MOE_RUNS],
            "fwd_device_ms": kineto_forward_ms(CASE_RUN, name),
            "bwd_device_ms": ms(lambda h: h["backward_device_s"]),
            "fwd_host_ms": ms(lambda h: h["router_fwd_s"] + h["experts_fwd_s"]),
            "bwd_host_ms": ms(lambda h: h["backward_s"]),
            "device_busy": all(h["device_busy"] for h in hosts if h is not None),
            "ddlsim": ddlsim_parts(c)})
    return out


def _ms(values: list[float | None], sep: str = " / ") -> str:
    """The figures of the runs, ``–`` where a run lacks the case."""
    return sep.join("–" if v is None else f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    head = ["case", "local experts", "tokens/expert", "wall ms (run7, 8, 9, 13)",
            "fwd device ms", "ddlsim", "bwd device ms (run8 / 9 / 13)", "ddlsim",
            "fwd host ms (router+experts; run8 / 9 / 13)", "ddlsim (all fwd host)",
            "bwd host ms (run8 / 9 / 13)", "ddlsim"]
    lines = []
    for r in rows():
        d = r["ddlsim"]
        lines.append([r["case"], str(r["experts"]), str(r["tokens_per_expert"]),
                      _ms(r["wall_ms"], ", "),
                      f"{r['fwd_device_ms']:.2f}", f"{d['fwd_device']:.2f}",
                      _ms(r["bwd_device_ms"]), f"{d['bwd_device']:.2f}",
                      _ms(r["fwd_host_ms"]), f"{d['fwd_host']:.2f}",
                      _ms(r["bwd_host_ms"]) + ("" if r["device_busy"] else " *"),
                      f"{d['bwd_host']:.2f}"])
    print_table(head, lines, args.markdown)
    print("* a timed issue outlasted the queued sleep in at least one pass (the median stands)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
