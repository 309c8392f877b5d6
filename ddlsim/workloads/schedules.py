"""Pipeline schedules: the order in which one stage issues forward and backward passes.

Each schedule returns, for stage ``s`` of ``p`` (``v`` model chunks per stage, ``m``
micro-batches), the list of ``(kind, microbatch, chunk)`` with kind ``"F"`` or ``"B"``.

* GPipe (Huang et al. 2019): all forwards, then all backwards.
* 1F1B / PipeDream-Flush (Narayanan et al. 2021, §2.2.1): ``p − s − 1`` warm-up forwards, then
  alternate one forward and one backward, then drain the backwards.
* Interleaved 1F1B (Narayanan et al. 2021, §2.2.2; Megatron-LM ``schedules.py``): each stage
  holds ``v`` chunks; micro-batches advance in groups of ``g`` (``p`` unless the stack groups
  them otherwise: :func:`microbatch_group`); warm-up ``2(p − s − 1) + (v − 1)g`` forwards.

Bubble fractions: GPipe and 1F1B ``(p − 1)/m``; interleaved ``(p − 1)/(v·m)`` of the ideal time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from ..errors import ConfigError

__all__ = ["schedule", "SCHEDULES", "warmup", "peak_inflight", "schedule_arrays",
           "combined_schedule", "microbatch_group", "group_refusal", "groups_refused"]

Order = list[tuple[str, int, int]]
SCHEDULES: dict[str, Callable[[int, int, int, int, int], Order]] = {}


def _register(name: str):
    def wrap(fn):
        SCHEDULES[name] = fn
        return fn
    return wrap


def schedule(name: str, stage: int, p: int, m: int, v: int = 1,
             group: int | None = None) -> tuple[tuple[str, int, int], ...]:
    """The issue order of stage ``stage`` (``group``: the interleaved schedule's micro-batches
    per group, :func:`microbatch_group`; None: ``p``); raises ConfigError for an unknown
    schedule."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
    return _cached(name, stage, p, m, v, p if group is None else group)


@lru_cache(maxsize=4096)
def _cached(name: str, stage: int, p: int, m: int, v: int,
            g: int) -> tuple[tuple[str, int, int], ...]:
    return tuple(SCHEDULES[name](stage, p, m, v, g))


# --------------------------------------------------------------- interleaved groups
def microbatch_group(rule: str, p, m, given: int | None = None):
    """Micro-batches per group of the interleaved schedule for ``p`` stages and ``m``
    micro-batches (arrays allowed) under the stack's ``rule`` (its
    ``kernels.interleaved_groups``, each value's source in ``data/software.yaml``), with the
    plan's ``microbatch_group_size_per_vp_stage`` (``given``, None if unset):

    * ``pipeline_size``: groups of PP, the micro-batches a multiple of PP, no option
      (Megatron-LM of 2021, Megatron-Core of 2024);
    * ``megatron_core``: groups of ``given`` (PP unless given), each but the last whole and
      the last one whole or at least PP (Megatron-Core's ``get_schedule_table`` and its checks
      in ``forward_backward_pipelining_with_interleaving``);
    * ``torch_rounds``: ``torch.distributed.pipelining``'s ``ScheduleInterleaved1F1B``,
      ``max(1, m // PP)`` rounds of ``m / rounds`` micro-batches, the micro-batches a
      multiple of the rounds, no option."""
    if rule == "torch_rounds":
        return m // _max1(m // p)
    return p if given is None else given


def _max1(a):
    return np.maximum(a, 1) if isinstance(a, np.ndarray) else max(a, 1)


def groups_refused(rule: str, p, m, given: int | None = None):
    """Whether the stack's interleaved schedule refuses ``m`` micro-batches on ``p`` stages
    (arrays allowed): the checks :func:`group_refusal` words."""
    if rule == "torch_rounds":
        return m % _max1(m // p) != 0
    if rule == "pipeline_size":
        return m % p != 0
    g = microbatch_group(rule, p, m, given)
    last = m % g
    return (g > m) | (g < p) | ((last > 0) & (last < p))


def group_refusal(rule: str, p: int, m: int, given: int | None = None) -> str | None:
    """Why the stack's interleaved schedule (``rule``, :func:`microbatch_group`) cannot run ``m``
    micro-batches on ``p`` stages with the plan's ``microbatch_group_size_per_vp_stage``
    ``given``, or None where it runs them."""
    if given is not None and rule != "megatron_core":
        return (f"microbatch_group_size_per_vp_stage = {given}: this stack's interleaved "
                f"schedule has no such option (kernels.interleaved_groups = {rule!r}: "
                + ("torch.distributed.pipelining groups them itself" if rule == "torch_rounds"
                   else "groups of pipeline_model_parallel_size") + ")")
    if not groups_refused(rule, p, m, given):
        return None
    if rule == "torch_rounds":
        rounds = max(1, m // p)
        return (f"schedule = 'interleaved' needs the number of micro-batches ({m}) to be a "
                f"multiple of the rounds max(1, micro-batches // pipeline_model_parallel_size)"
                f" = {rounds} (torch.distributed.pipelining's ScheduleInterleaved1F1B)")
    if rule == "pipeline_size" or given is None:
        return (f"schedule = 'interleaved' needs the number of micro-batches ({m}) to be a "
                f"multiple of pipeline_model_parallel_size = {p}" + (
                    "" if rule == "pipeline_size" else
                    " (Megatron-Core's groups of PP; parallel.microbatch_group_size_per_vp_stage"
                    " between PP and the micro-batches groups them otherwise)"))
    g = microbatch_group(rule, p, m, given)
    name = "microbatch_group_size_per_vp_stage"
    if g > m or g < p:
        return (f"{name} = {g} must lie between pipeline_model_parallel_size = {p} and the "
                f"number of micro-batches = {m} (Megatron-Core's interleaved schedule)")
    return (f"schedule = 'interleaved': the last group of micro-batches has {m % g} "
            f"(micro-batches {m} mod {name} {g}); Megatron-Core needs it to be 0 or at least "
            f"pipeline_model_parallel_size = {p}")


@_register("gpipe")
def _gpipe(stage: int, p: int, m: int, v: int, g: int) -> Order:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


@_register("1f1b")
def _one_f_one_b(stage: int, p: int, m: int, v: int, g: int) -> Order:
    warm = min(p - stage - 1, m)
    order: Order = [("F", i, 0) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order += [("F", f, 0), ("B", b, 0)]
        f, b = f + 1, b + 1
    order += [("B", i, 0) for i in range(b, m)]
    return order


def _interleaved_id(k: np.ndarray, v: int, g: int, m: int,
                    forward: bool) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batch and chunk of each k-th forward (or backward) of a stage (``k`` an array):
    Megatron-Core's schedule table (``get_schedule_table``), groups of ``g``
    micro-batches each run through the ``v`` chunks in turn, the last group the ``r`` left
    (``0 < r ≤ g``); a backward runs the chunks in reverse."""
    last = (-(-m // g) - 1) * g          # the last group's first micro-batch
    r = m - last
    group, within = np.divmod(k, g * v)
    tail = k - last * v                  # position in the last group
    in_last = tail >= 0
    chunk = np.where(in_last, np.maximum(tail, 0) // r, within // g)
    mb = np.where(in_last, last + np.maximum(tail, 0) % r, group * g + within % g)
    return mb, chunk if forward else v - 1 - chunk


@_register("interleaved")
def _interleaved(stage: int, p: int, m: int, v: int, g: int) -> Order:
    total = m * v
    warm = min((p - stage - 1) * 2 + (v - 1) * g, total)
    mb_f, c_f = _interleaved_id(np.arange(total), v, g, m, True)
    mb_b, c_b = _interleaved_id(np.arange(total), v, g, m, False)
    fwd = list(zip(mb_f.tolist(), c_f.tolist()))
    bwd = list(zip(mb_b.tolist(), c_b.tolist()))
    order: Order = [("F", *fwd[k]) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order += [("F", *fwd[f]), ("B", *bwd[b])]
        f, b = f + 1, b + 1
    order += [("B", *bwd[k]) for k in range(b, total)]
    return order


def warmup(name: str, stage: int, p: int, m: int, v: int = 1, combined: bool = False,
           group=None) -> int:
    """Forwards a stage issues before its first backward; ``combined``: Megatron-Core's
    combined 1F1B (:func:`combined_schedule`), one more (at most all of them); ``group``:
    the interleaved schedule's micro-batches per group (None: ``p``)."""
    if combined:
        total = m * (v if name == "interleaved" else 1)
        return _min(warmup(name, stage, p, m, v, group=group) + 1, total)
    if name == "gpipe":
        return m
    if name == "1f1b":
        return _min(p - stage - 1, m)
    return _min((p - stage - 1) * 2 + (v - 1) * (p if group is None else group), m * v)


def _min(a, b):
    """``min`` of two counts, element-wise when either is an array of plans."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def peak_inflight(name: str, stage: int, p: int, m: int, v: int = 1,
                  combined: bool = False, group=None) -> int:
    """Most (micro-batch, chunk) forwards whose activations a stage holds at once: the warm-up
    forwards plus the first steady-state one, or all of them when warm-up covers everything.

    Interleaved: Megatron-Core's warm-up is ``2(p − s − 1) + (v − 1)·g`` with ``g =
    microbatch_group_size_per_vp_stage``, which defaults to ``p`` (Megatron-LM
    core_v0.14.0rc7 ``pipeline_parallel/schedules.py`` lines 730-731,
    ``model_parallel_config.py`` lines 392-393; Megatron-Bridge v0.1.0rc3 sets no other):
    the ``(v − 1)·p`` of :func:`warmup`. Its steady state runs forward ``k + warm-up``
    before backward ``k`` (lines 1462-1554: ``forward_step_helper`` at 1495, then
    ``backward_step_helper`` at 1554), hence the one more.

    ``combined`` (Megatron-Core's combined 1F1B, :func:`combined_schedule`): the warm-up has
    one forward more, and each steady step pairs a forward with a backward **layer by layer**
    (forward layer ``i`` beside backward layer ``N − 1 − i``, the backward layer's state
    released after each pair: Megatron-LM d7288711
    ``megatron/core/models/common/model_chunk_schedule_plan.py``
    ``TransformerModelChunkSchedulePlan.run``, ``get_layer(i)`` / ``pop_layer()`` /
    ``release_state()``), so the forward's chunk fills as the backward's empties: the stage
    holds the warm-up's chunks, plus at most one layer of the two in flight
    (:func:`combined_extra_layer`, the caller's bytes), not one chunk more.
    ``stage``, ``p``, ``m`` and ``v`` may be arrays over plans; ``group``: the interleaved
    schedule's micro-batches per group (:func:`microbatch_group`; None: ``p``)."""
    total = m * (v if name == "interleaved" else 1)
    return _min(warmup(name, stage, p, m, v, combined, group) + (0 if combined else 1), total)


def combined_extra_layer(name: str, stage: int, p: int, m: int, v: int = 1,
                         group=None) -> bool:
    """Whether a stage under the combined 1F1B holds one layer beyond :func:`peak_inflight`'s
    chunks at its peak: where it runs a combined step at all (a forward and a backward paired
    in one step: more chunks than its warm-up covers), the pair's forward layer is alive
    before the backward layer beside it is released."""
    total = m * (v if name == "interleaved" else 1)
    return warmup(name, stage, p, m, v, combined=True, group=group) < total


def combined_schedule(name: str, stage: int, p: int, m: int,
                      v: int = 1, group: int | None = None) -> tuple[tuple, ...]:
    """Megatron-Core's combined 1F1B order of stage ``stage`` (``overlap_moe_expert_parallel_
    comm``): the schedule's warm-up plus one forward, then each steady-state forward and the
    backward issued after it as one combined step ``("FB", mb_f, chunk_f, mb_b, chunk_b)``,
    then the remaining backwards; other entries are ``(kind, microbatch, chunk)`` as in
    :func:`schedule`. With PP = 1: ``F(0)``, ``B(i) + F(i + 1)`` for ``i < m − 1``,
    ``B(m − 1)``.

    References
    ----------
    NVIDIA/Megatron-LM d7288711 ``megatron/core/pipeline_parallel/schedules.py`` lines 966-970
    (``num_warmup_microbatches + 1`` "to ensure the forward and backward computations are
    independent in all 1f1b steps"), 778 (PP = 1: ``combined_1f1b_schedule_for_no_pipelining``
    in ``combined_1f1b.py``) and 1485 (interleaved: ``combined_1f1b_schedule_for_interleaved_
    pipelining``); the steady state pairs forward ``k + warm-up`` with backward ``k``.
    """
    if name not in ("1f1b", "interleaved"):
        raise ConfigError(f"pipeline schedule {name!r} has no combined 1F1B form (Megatron-Core "
                          "runs it in the 1F1B and interleaved schedules only)")
    v = v if name == "interleaved" else 1
    total = m * v
    g = p if group is None else group
    k = np.arange(total)
    fwd, bwd = ((_interleaved_id(k, v, g, m, True), _interleaved_id(k, v, g, m, False))
                if name == "interleaved" else ((k, 0 * k), (k, 0 * k)))
    fwd, bwd = (list(zip(a.tolist(), c.tolist())) for a, c in (fwd, bwd))
    w = warmup(name, stage, p, m, v, combined=True, group=g)
    order: list[tuple] = [("F", *fwd[k]) for k in range(w)]
    order += [("FB", *fwd[w + k], *bwd[k]) for k in range(total - w)]
    order += [("B", *bwd[k]) for k in range(total - w, total)]
    return tuple(order)


def schedule_arrays(name: str, p: int, m: int, v: int = 1, group: int | None = None):
    """Every stage's order at once, as arrays (the same orders as :func:`schedule`).

    All three schedules are "``w_s`` warm-up forwards, then one forward and one backward
    alternately, then the remaining backwards" (GPipe: ``w_s = m``), so with ``T`` forwards
    per stage the k-th forward of stage s sits at ``k`` if ``k < w_s`` else ``2k − w_s``, and
    the i-th backward at ``w_s + 2i + 1`` if ``i < T − w_s`` else ``T + i``.

    Returns ``(backward, ordinal, microbatch, chunk, warm)``: ``backward[s, j]`` is true where
    step j of stage s is a backward, ``ordinal[s, j]`` its index among the stage's forwards
    (or backwards), ``microbatch[s, j]`` and ``chunk[s, j]`` what it processes, ``warm[s]`` the
    warm-up forwards. ``group``: the interleaved schedule's micro-batches per group (None:
    ``p``).
    """
    if name not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
    v = v if name == "interleaved" else 1
    g = p if group is None else group
    T = m * v
    warm = np.array([warmup(name, s, p, m, v, group=g) for s in range(p)], dtype=np.int64)
    k = np.arange(T, dtype=np.int64)
    mb_of, chunk_f, chunk_b = _processes(name, k, v, g, m)
    backward = np.empty((p, 2 * T), dtype=bool)
    ordinal, microbatch, chunk = (np.empty((p, 2 * T), dtype=np.int64) for _ in range(3))
    no, yes = np.zeros(T, dtype=bool), np.ones(T, dtype=bool)
    by = ((ordinal, k, k), (microbatch, mb_of, mb_of), (chunk, chunk_f, chunk_b),
          (backward, no, yes))
    for s, w in enumerate(warm.tolist()):   # row by row, in slices (faster than gathers)
        for out, fwd, bwd in by:            # (what the i-th forward and backward process)
            _interleave(out[s], w, fwd, bwd)
    return backward, ordinal, microbatch, chunk, warm


def _processes(name: str, k: np.ndarray, v: int, g: int, m: int):
    """(micro-batch, forward chunk, backward chunk) of each stage's k-th forward and k-th
    backward (:func:`_interleaved_id`'s order under ``interleaved``; else micro-batch k)."""
    if name != "interleaved":
        return k, np.zeros_like(k), np.zeros_like(k)
    mb, chunk_f = _interleaved_id(k, v, g, m, True)
    return mb, chunk_f, v - 1 - chunk_f


def _interleave(row: np.ndarray, w: int, fwd: np.ndarray, bwd: np.ndarray) -> None:
    """Fill one stage's ``row`` (``2T`` steps, in place) with the values of its ``w`` warm-up
    forwards (``fwd[:w]``), then of forward ``w + i`` and backward ``i`` alternately for
    ``i < T − w``, then of the remaining backwards."""
    n = len(fwd) - w
    row[:w] = fwd[:w]
    pairs = row[w:w + 2 * n].reshape(n, 2)
    pairs[:, 0], pairs[:, 1] = fwd[w:], bwd[:n]
    row[w + 2 * n:] = bwd[n:]
