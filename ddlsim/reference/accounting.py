"""Op by op: what the numpy trainer pays in one iteration against what ddlsim's trace charges.

The reference model marks, after each step of its forward and backward, the op of ddlsim's
trace that charges that work (:attr:`~.gpt2.GPT2.mark`: ``embedding``, ``fwd.attn``,
``fwd.mlp``, ``fwd.elementwise``, ``logits``, ``loss``, their ``bwd.*`` counterparts,
``bwd.grad_accumulate``), and the Adam step is the trace's ``optimizer``. Each op's CPU time
is summed over the iteration (both layers), and its least over the iterations is set against
the cost model's time for the same op of the same run config (every repeat of it), under
the same calibration profile the loop predicts with.

Where a numpy step has no kernel of its own in the trace, it is charged to the trace op
that holds its neighbours: the QKV bias add (a GEMM epilogue in Megatron-LM) and the layout
copies of the attention core to ``fwd.attn``/``bwd.attn``, the final LayerNorm to
``logits`` (forward) and ``bwd.logits``, zeroing the gradient buffer to
``bwd.grad_accumulate``, the embedding's scatter-add to ``bwd.grad_accumulate.embedding``.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

__all__ = ["measured_ops", "predicted_ops", "account"]


def measured_ops(shape, iters: int = 10, warmup: int = 2, seed: int = 0) -> dict[str, float]:
    """Least CPU time (s) over ``iters`` iterations of each trace op's numpy work.

    Parameters
    ----------
    shape : GPTShape
        The reference model and micro-batch.
    iters, warmup : int
        Timed and untimed iterations.
    seed : int
        Seed of the parameters and the batch.

    Returns
    -------
    dict
        Trace op name → seconds (``time.process_time``), plus ``optimizer`` (the Adam step)
        and ``iteration`` (the least of the whole forward and backward, timed as a sum of the
        marks: the least of a sum is at least the sum of the least parts).
    """
    from .gpt2 import GPT2, Adam
    model, opt = GPT2(shape, seed=seed), Adam(shape.padded)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    best: dict[str, float] = defaultdict(lambda: np.inf)
    for it in range(warmup + iters):
        spent: dict[str, float] = defaultdict(float)
        last = [time.process_time()]

        def mark(name: str) -> None:
            now = time.process_time()
            spent[name] += now - last[0]
            last[0] = now

        model.mark = mark
        _, acts = model.forward(idx, tgt)
        model.backward(acts)
        spent["iteration"] = sum(spent.values())
        c = time.process_time()
        opt.step(model.p, model.g)
        spent["optimizer"] = time.process_time() - c
        if it >= warmup:
            for name, value in spent.items():
                best[name] = min(best[name], value)
    return dict(best)


def predicted_ops(cfg, profile=None) -> dict[str, float]:
    """Seconds the cost model charges each compute op of ``cfg``'s trace (summed over its
    repeats and blocks, the first rank class), with ``profile``'s measured GEMM rates.

    Parameters
    ----------
    cfg : RunConfig
        The run config (one rank class: data parallel).
    profile : CalibrationProfile, optional
        The calibration the loop predicts with.

    Returns
    -------
    dict
        Trace op name → seconds.
    """
    from ..api import build_workload
    from ..simulator.costs import CostModel
    from ..workloads.trace import Compute
    workload = build_workload(cfg)
    costs = CostModel(cfg.system, workload, profile=profile)
    out: dict[str, float] = defaultdict(float)
    for block in workload.classes[0].program.blocks.values():
        for op in block.flat.ops:
            if isinstance(op.payload, Compute):
                out[op.payload.name] += costs.compute(op.payload) * op.repeat
    return dict(out)


def account(measured: dict[str, float], predicted: dict[str, float]) -> list[dict]:
    """One row per trace op: measured and predicted seconds and ``predicted / measured − 1``,
    in the trace's order of the forward, backward and update; a last row ``total``."""
    rows = []
    for name in [*predicted, *(n for n in measured if n not in predicted)]:
        if name == "iteration":
            continue
        got, want = measured.get(name, 0.0), predicted.get(name, 0.0)
        rows.append({"op": name, "measured_s": got, "predicted_s": want,
                     "error": want / got - 1 if got else float("nan")})
    got = sum(r["measured_s"] for r in rows)
    want = sum(r["predicted_s"] for r in rows)
    rows.append({"op": "total", "measured_s": got, "predicted_s": want,
                 "error": want / got - 1})
    return rows
