"""Place the ops of a Kineto trace without module events by FSDP2's per-unit ranges.

A trace taken without ``with_stack`` has no ``nn.Module: …`` events, but FSDP2 (torch's
``fully_shard``) records ``record_function`` ranges around its hooks, one set per sharded
unit: ``FSDP::pre_forward (layers.3)`` before block 3's forward and ``FSDP::post_forward
(layers.3)`` after it, ``FSDP::pre_backward (layers.3)`` (the unshard of its backward) and
``FSDP::post_backward_accumulate/reshard/reduce (layers.3)`` after it; the root unit's have no
name (``FSDP::pre_forward``), and ``FSDP::root_post_backward_callback`` holds the root's reduce
(``torch/distributed/fsdp/_fully_shard/_fsdp_state.py`` and ``_fsdp_param_group.py``, which
wrap each hook in ``torch.profiler.record_function``). :func:`place_by_fsdp` labels ops from
them (docs/traces.md, "Traces without module events"):

* ops inside ``FSDP::pre_forward``/``pre_backward`` ranges: FSDP2's unshard (the parameters'
  cast and copy), ``unshard``; inside ``post_backward_*`` and the root's post-backward
  callback: its gradient reduce, ``reduce``;
* a forward op between a block's ``pre_forward`` and ``post_forward``: in that layer; the
  attention core by its ATen name, GEMMs by their order in the block (those before the core
  and the first after it are attention's: ``wq wk wv [core] wo``; the later ones the MLP's:
  ``w1 w3 w2``), the ops from the block's first GEMM to ``wo`` attention's (RoPE, the heads'
  reshapes), from ``w1`` to the last GEMM the MLP's (SiLU, the gate's product), the rest
  (norms, residual adds) element-wise: the module boundaries of torchtitan's Llama block;
* a forward op before the first block: the embedding; after the last block: the final norm
  (a norm op), the logits (a GEMM), the loss (the rest);
* an op inside a backward node that carries an autograd ``Sequence number`` and is not itself
  a backward function: a checkpoint's recomputation (autograd numbers the ops it records a
  node for, which in the backward only a recomputation under grad mode does), ``recompute``.

Backward nodes keep :mod:`ddlsim.traces.kineto_labels`' rule (the label of the forward op with
their sequence number).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from types import MappingProxyType

from ..errors import ConfigError

__all__ = ["UnitPlacement", "place_by_fsdp", "enclosing_ops"]

#: FSDP2's per-unit hook ranges: ``FSDP::<hook> (<unit name>)``
_UNIT = re.compile(r"^FSDP::(pre_forward|post_forward|pre_backward|post_backward_\w+) "
                   r"\((.+)\)$")
_INDEX = re.compile(r"(?:^|\.)(\d+)$")           # ``layers.7`` -> 7
_UNSHARD = ("FSDP::pre_forward", "FSDP::pre_backward")
_REDUCE = ("FSDP::post_backward_", "FSDP::root_post_backward")
_BACKWARD = "autograd::engine::evaluate_function: "
#: ATen ops of the attention core (cuDNN, flash, memory-efficient SDPA and its dispatcher)
ATTENTION_CORE = re.compile(r"scaled_dot_product|_flash_attention|_cudnn_attention|"
                            r"_efficient_attention")
GEMM = re.compile(r"^aten::(linear|mm|addmm|matmul|bmm|baddbmm)$")
NORM = re.compile(r"norm", re.IGNORECASE)
#: without an attention core in a block, torchtitan's order: wq wk wv wo, then the MLP's
ATTENTION_GEMMS = 4


@dataclass(frozen=True)
class UnitPlacement:
    """Labels of the ops of a trace placed by FSDP2's ranges.

    Attributes
    ----------
    labels : ``id(event)`` -> :class:`~ddlsim.traces.kineto_labels.Label`: every forward op that is
        outermost on its thread, and every op inside an FSDP2 range or a recomputation.
    layers : the block indices the forward ran (from ``(layers.N)``).
    roots : forward passes (``FSDP::root_pre_forward`` ranges; at least 1).
    """

    labels: MappingProxyType
    layers: frozenset
    roots: int


def _unit_layer(name: str) -> tuple[str, int] | None:
    """``('pre_forward', 3)`` from ``FSDP::pre_forward (layers.3)``; None for other names."""
    m = _UNIT.match(name)
    idx = _INDEX.search(m.group(2)) if m else None
    return (m.group(1), int(idx.group(1))) if idx else None


def enclosing_ops(spans: list[dict]) -> list[tuple[dict, tuple[dict, ...]]]:
    """Each ``cpu_op`` with the ops and ranges enclosing it on its thread (outermost first,
    itself last)."""
    by_tid: dict = defaultdict(list)
    for e in spans:
        if e.get("cat") in ("cpu_op", "user_annotation"):
            by_tid[e.get("tid")].append(e)
    out = []
    for evs in by_tid.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[dict] = []
        for e in evs:
            end = float(e["ts"]) + float(e["dur"])
            while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) < end - 1e-3:
                stack.pop()
            stack.append(e)
            if e["cat"] == "cpu_op":
                out.append((e, tuple(stack)))
    return out


def _range_label(chain: tuple[dict, ...]):
    """The label of an op inside FSDP2's unshard or reduce ranges, or a recomputation."""
    from .kineto_labels import Label
    names = [str(a.get("name", "")) for a in chain]
    backward = any(n.startswith(_BACKWARD) for n in names)
    if any(n.startswith(_REDUCE) for n in names):
        return Label("backward", "reduce")
    if any(n.startswith(_UNSHARD) for n in names):
        return Label("backward" if backward or any(n.startswith("FSDP::pre_backward")
                                                   for n in names) else "forward", "unshard")
    if backward:
        at = next(i for i, n in enumerate(names) if n.startswith(_BACKWARD))
        for a, n in zip(chain[at + 1:], names[at + 1:]):
            seq = (a.get("args") or {}).get("Sequence number")
            if a.get("cat") == "cpu_op" and seq is not None and "Backward" not in n:
                return Label("backward", "recompute", True)
    return None


def _windows(spans: list[dict]) -> dict:
    """``{tid: {layer: (start, end)}}``: each block's forward, from its ``pre_forward``
    range's start to its ``post_forward`` range's end (µs)."""
    out: dict = defaultdict(dict)
    for e in spans:
        hook = _unit_layer(str(e.get("name", ""))) if e.get("cat") == "user_annotation" else None
        if hook and hook[0] in ("pre_forward", "post_forward"):
            ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            lo, hi = out[e.get("tid")].get(hook[1], (ts, end))
            out[e.get("tid")][hook[1]] = (min(lo, ts), max(hi, end))
    return out


def _block_parts(ops: list[dict]) -> list[str]:
    """The part (``attn``, ``attn_core``, ``mlp``, ``elementwise``) of each op of one block's
    forward, in time order (module docstring)."""
    names = [str(e.get("name", "")) for e in ops]
    gemms = [i for i, n in enumerate(names) if GEMM.match(n)]
    core = next((i for i, n in enumerate(names) if ATTENTION_CORE.search(n)), None)
    if core is not None:
        after = [i for i in gemms if i > core]
        attn = [i for i in gemms if i < core] + after[:1]
    else:
        attn = gemms[:ATTENTION_GEMMS]
    mlp = [i for i in gemms if i not in attn]
    parts = []
    for i, n in enumerate(names):
        if core is not None and ATTENTION_CORE.search(n):
            parts.append("attn_core")
        elif attn and attn[0] <= i <= attn[-1]:
            parts.append("attn")
        elif mlp and mlp[0] <= i <= mlp[-1]:
            parts.append("mlp")
        else:
            parts.append("elementwise")
    return parts


def _outside_part(name: str, before: bool) -> str:
    """A forward op outside the blocks: the embedding before them; after them the final
    norm, the logits (a GEMM) or the loss."""
    if before:
        return "embedding"
    return "final_norm" if NORM.search(name) else "logits" if GEMM.match(name) else "loss"


def place_by_fsdp(spans: list[dict], source: str) -> UnitPlacement:
    """Label the ops of a trace without module events by FSDP2's ranges.

    Parameters
    ----------
    spans : the trace's complete events (``ph: "X"``).
    source : how errors name the trace.

    Returns
    -------
    UnitPlacement

    Raises
    ------
    ConfigError
        When the trace has no FSDP2 per-block ranges either.
    """
    from .kineto_labels import Label
    windows = _windows(spans)
    if not windows:
        raise ConfigError(f"Kineto trace {source}: no module events (nn.Module: …) and no "
                          "FSDP2 per-block ranges (FSDP::pre_forward (layers.N)); profile with "
                          "torch.profiler.profile(with_stack=True) so ops can be placed in the "
                          "model, or shard each block with FSDP2's fully_shard")
    labels: dict = {}
    outer: dict = defaultdict(list)
    for e, chain in enclosing_ops(spans):
        ranged = _range_label(chain)
        if ranged is not None:
            labels[id(e)] = ranged
        elif chain[0] is e:
            outer[e.get("tid")].append(e)
    for tid, ops in outer.items():
        blocks = windows.get(tid)
        if not blocks:
            continue
        backward = min((float(e["ts"]) for e in ops
                        if str(e.get("name", "")).startswith(_BACKWARD)), default=float("inf"))
        ops = [e for e in ops if float(e["ts"]) < backward]   # the forward's, on this thread
        first = min(lo for lo, _ in blocks.values())
        last = max(hi for _, hi in blocks.values())
        inside: dict = defaultdict(list)
        for e in ops:
            ts = float(e["ts"])
            layer = next((k for k, (lo, hi) in blocks.items() if lo <= ts < hi), None)
            if layer is not None:
                inside[layer].append(e)
            elif ts < first or ts >= last:
                labels[id(e)] = Label("forward", _outside_part(str(e.get("name", "")),
                                                               ts < first))
            else:
                labels[id(e)] = Label("forward", "elementwise", True)  # between blocks
        for block in inside.values():
            block.sort(key=lambda e: float(e["ts"]))
            for e, part in zip(block, _block_parts(block)):
                labels[id(e)] = Label("forward", part, True)
    roots = sum(1 for e in spans if e.get("cat") == "user_annotation"
                and e.get("name") == "FSDP::root_pre_forward")
    layers = frozenset(k for blocks in windows.values() for k in blocks)
    return UnitPlacement(MappingProxyType(labels), layers, max(roots, 1))
