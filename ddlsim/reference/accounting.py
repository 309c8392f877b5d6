"""Op by op: what the numpy trainer pays in one iteration against what ddlsim's trace charges.

The reference model marks, after each step of its forward and backward, the op of ddlsim's
trace that charges that work (:attr:`~.gpt2.GPT2.mark`: ``embedding``, ``fwd.attn``,
``fwd.mlp``, ``fwd.elementwise``, ``final_norm``, ``logits``, ``loss``, their ``bwd.*``
counterparts, ``bwd.grad_accumulate``), and the Adam step is the trace's ``optimizer``. Each op's CPU time
is summed over the iteration (both layers), and its least over the iterations is set against
the cost model's time for the same op of the same run config (every repeat of it), under
the same calibration profile the loop predicts with.

Where a numpy step has no kernel of its own in the trace, it is charged to the trace op
that holds its neighbours: the QKV bias add (a GEMM epilogue in Megatron-LM) and the layout
copies of the attention core to ``fwd.attn``/``bwd.attn``, zeroing the gradient buffer to
``bwd.grad_accumulate``; the embedding's scatter-add is ``bwd.embedding`` (the trace's input
embedding backward), the output layer's weight gradient added into the tied ``wte``
gradient ``bwd.grad_accumulate.embedding``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np

__all__ = ["OpTimer", "measured_ops", "least_ops", "predicted_ops", "account", "account_run"]


class OpTimer:
    """The ``mark`` of :class:`~.gpt2.GPT2` and :class:`~.gpt2.Adam`: each call charges the
    CPU time since the previous call (or :meth:`start`) to the op it names, in
    :attr:`spent` (seconds by name)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._last = time.process_time()

    def start(self) -> None:
        """Charge nothing for the time so far (a barrier, another op's work)."""
        self._last = time.process_time()

    def __call__(self, name: str) -> None:
        now = time.process_time()
        self.spent[name] += now - self._last
        self._last = now


def measured_ops(shape, iters: int = 10, warmup: int = 2, seed: int = 0) -> dict[str, float]:
    """Least CPU time (s) over ``iters`` iterations of each trace op's numpy work, in this
    process alone (the loop measures the same in its interleaved job, on every rank).

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
        Trace op name → seconds (``time.process_time``), ``optimizer`` the Adam step, and
        ``iteration``: the least of the whole forward and backward (the sum of its marks;
        the least of a sum is at least the sum of the least parts).
    """
    from .gpt2 import GPT2, Adam
    model, opt = GPT2(shape, seed=seed), Adam(shape.padded)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    best: dict[str, float] = defaultdict(lambda: np.inf)
    for it in range(warmup + iters):
        model.mark = opt.mark = timer = OpTimer()
        _, acts = model.forward(idx, tgt)
        model.backward(acts)
        timer.spent["iteration"] = sum(timer.spent.values())
        timer.start()
        opt.step(model.p, model.g)
        timer.spent.pop("exchange")  # none here: the step alone
        if it >= warmup:
            for name, value in timer.spent.items():
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


def least_ops(ops_cpu_s: dict[str, list[float]], statistic: str = "min") -> dict[str, float]:
    """Each compute op's ``statistic`` (``min`` or ``median``) over the rounds of the
    interleaved job's ``ops_cpu_s`` (seconds per round, the most over ranks), without the
    ``exchange`` (collectives: no compute op of the trace)."""
    reduce = {"median": np.median, "min": np.min}[statistic]
    return {name: float(reduce(times)) for name, times in ops_cpu_s.items()
            if name != "exchange"}


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


def account_run(cfg_path, profile_path, run: dict, statistic: str = "min",
                system: dict | None = None) -> list[dict]:
    """A loop run's op-by-op account: :func:`account` of each trace op's ``statistic`` over
    the interleaved job's rounds (``run``: one config's entry of ``interleaved{N}.json``)
    against the cost model's time for the run config with the loop's profile.

    The ops are timed in CPU time, a core's own time, so ranks sharing cores are accounted
    against ``system``, a section of one device per rank at a whole core's rates (the run
    config's own system when None)."""
    import yaml

    from ..calibration import CalibrationProfile
    from ..config import load_config
    doc = yaml.safe_load(Path(cfg_path).read_text())
    if system is not None:
        doc["system"] = system
    predicted = predicted_ops(load_config(doc), CalibrationProfile.load(profile_path))
    return account(least_ops(run["ops_cpu_s"], statistic), predicted)
