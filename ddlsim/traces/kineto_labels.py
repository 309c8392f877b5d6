"""Label the outermost ops of a Kineto trace: one pass over the events in time order.

:func:`visit` keeps, per thread, the open ``nn.Module`` stack and the open outermost op, and
gives each outermost op of the step's thread a :class:`Label` (phase, part of the model,
whether it lies inside a transformer layer) from its module stack, by the regular expressions
of :class:`ModuleRules`. A backward op (``autograd::engine::evaluate_function: …``) takes the
label of the forward op that created it, matched by the autograd ``Sequence number`` both
carry; a device kernel takes the label of the CPU op that launched it (``External id``).
:mod:`.kineto` reads the trace and charges the labelled ops; docs/traces.md describes the rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = ["Label", "ModuleRules", "LabelSweep", "visit", "event_args", "EPS_US"]

Phase = Literal["forward", "backward", "optimizer"]


@dataclass(frozen=True, order=True)
class Label:
    """What a measured op was: ``phase``, ``part`` of the model (``embedding``, ``attn``,
    ``attn_core``, ``mlp``, ``elementwise``, ``final_norm``, ``logits``, ``loss``,
    ``grad_accumulate``, ``step``, ``zero_grad``; where FSDP2's ranges place the ops also
    ``unshard``, ``reduce`` and ``recompute``) and whether it ran inside a transformer
    layer."""

    phase: Phase
    part: str
    in_layer: bool = False


@dataclass(frozen=True)
class ModuleRules:
    """Regular expressions on module class names (``nn.Module: LlamaDecoderLayer_7`` gives
    ``LlamaDecoderLayer``) that place an op; matched with :func:`re.search`, case-blind.

    The defaults name the classes of nanoGPT, HuggingFace GPT-2/Llama/Mistral/Qwen2 and
    Megatron-Core (``TransformerLayer``, ``SelfAttention``, ``MLP``).
    """

    layer: str = r"block$|layer$|decoderlayer|transformerlayer"
    attention: str = r"attention|attn"
    mlp: str = r"mlp|feedforward|ffn"
    embedding: str = r"embedding"
    head: str = r"linear|norm|head"
    final_norm: str = r"norm"
    attention_core: str = r"scaled_dot_product|flash|efficient_attention|softmax|bmm|matmul"
    communication: str = (r"^(nccl|gloo|mpi|c10d)|allreduce|all_reduce|allgather|all_gather|"
                          r"reduce_scatter|reducescatter|broadcast_|sendrecv")

    def match(self, rule: str, text: str) -> bool:
        return re.search(getattr(self, rule), text, re.IGNORECASE) is not None


_BACKWARD = "autograd::engine::evaluate_function: "
_FSDP_PASSES = ("unshard", "reduce")   # FSDP2's own ops (kineto_fsdp.py)
EPS_US = 1e-3  # Kineto rounds to nanoseconds: ends closer than this touch


@dataclass
class LabelSweep:
    """State of one pass over the events in time order."""

    rules: ModuleRules
    modules: list = field(default_factory=list)      # open module events: (end, class, id)
    outer_end: float = float("-inf")                 # end of the open outermost op
    outer_label: Label | None = None
    seq_label: dict = field(default_factory=dict)    # autograd sequence number -> label
    layers: set = field(default_factory=set)
    roots: int = 0
    shape: tuple[int, int] | None = None
    seen_layer: bool = False
    backward: bool = False
    units: list = field(default_factory=list)        # (start, end, label | "comm" | None)
    ext_label: dict = field(default_factory=dict)    # External id -> its outermost op's label
    main: object = None                              # the thread whose ops are the step
    threads: dict = field(default_factory=dict)      # tid -> (modules, outer_end, outer_label)
    placed: MappingProxyType | None = None           # id(op) -> label, without module events


def event_args(event: dict) -> dict:
    """An event's ``args`` mapping (empty when absent or not a mapping)."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _class_of(event: dict) -> tuple[str, str]:
    """``('Block', 'Block_3')`` from ``nn.Module: Block_3``."""
    name = str(event["name"]).removeprefix("nn.Module: ")
    return re.sub(r"_\d+$", "", name), name


def _forward_label(sw: LabelSweep, op_name: str) -> Label:
    """The label of a forward op from the open module stack (outermost first)."""
    chain = [c for _, c, _ in sw.modules]
    ids = [i for _, _, i in sw.modules]
    r = sw.rules
    at = next((k for k, c in enumerate(chain) if r.match("layer", c)), None)
    if at is not None:
        sw.layers.add(ids[at])
        sw.seen_layer = True
        inner = chain[at + 1:]
        if any(r.match("attention", c) for c in inner):
            core = r.match("attention_core", op_name)
            return Label("forward", "attn_core" if core else "attn", True)
        if any(r.match("mlp", c) for c in inner):
            return Label("forward", "mlp", True)
        return Label("forward", "elementwise", True)
    if any(r.match("embedding", c) for c in chain) or not sw.seen_layer:
        return Label("forward", "embedding")
    if len(chain) > 1 and r.match("head", chain[-1]):
        return Label("forward", "final_norm" if r.match("final_norm", chain[-1]) else "logits")
    return Label("forward", "loss")


def _label(sw: LabelSweep, e: dict) -> Label | str | None:
    """An outermost op's label, ``"comm"`` for communication, None when it fits none."""
    name, args = str(e.get("name", "")), event_args(e)
    if sw.rules.match("communication", name):
        return "comm"
    if e.get("cat") == "user_annotation":
        if name.startswith("Optimizer."):
            return Label("optimizer", "step" if ".step" in name else "zero_grad")
        return None
    if name.startswith(_BACKWARD):
        sw.backward = True
        if "AccumulateGrad" in name:
            return Label("backward", "grad_accumulate")
        fwd = sw.seq_label.get(args.get("Sequence number"))
        return None if fwd is None else Label("backward", fwd.part, fwd.in_layer)
    if sw.placed is not None:
        return sw.placed.get(id(e))
    if sw.modules:
        return _forward_label(sw, name)
    if sw.seen_layer and not sw.backward:
        return Label("forward", "loss")  # a loss computed outside the model
    return None


def visit(sw: LabelSweep, e: dict) -> None:
    """One event, on its thread's module stack and outermost op (the backward of a GPU run
    has its own thread); only the main thread's outermost ops are units of the step."""
    tid = e.get("tid")
    sw.modules, sw.outer_end, sw.outer_label = sw.threads.get(tid, ([], float("-inf"), None))
    _visit_thread(sw, e, tid == sw.main)
    sw.threads[tid] = (sw.modules, sw.outer_end, sw.outer_label)


def _visit_thread(sw: LabelSweep, e: dict, main: bool) -> None:
    ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
    while sw.modules and sw.modules[-1][0] <= ts + EPS_US:
        sw.modules.pop()
    if e.get("cat") == "python_function":
        if not sw.modules and main:
            sw.roots += 1
        sw.modules.append((end, *_class_of(e)))
        return
    if ts >= sw.outer_end - EPS_US:  # an outermost op
        sw.outer_end, sw.outer_label = end, _label(sw, e)
        if main:
            sw.units.append((ts, end, sw.outer_label))
    args = event_args(e)
    own = sw.outer_label if sw.placed is None else sw.placed.get(id(e), sw.outer_label)
    if "External id" in args:  # device kernels launched from this op take its label
        sw.ext_label.setdefault(args["External id"], own)
    seq = args.get("Sequence number")
    if isinstance(own, Label) and own.phase == "forward" and own.part not in _FSDP_PASSES \
            and seq is not None:   # FSDP2's casts share the next op's number: not theirs
        sw.seq_label.setdefault(seq, own)
    if sw.shape is None and e.get("name") == "aten::embedding":
        dims = args.get("Input Dims")
        if isinstance(dims, list) and len(dims) > 1 and isinstance(dims[1], list) \
                and len(dims[1]) == 2:
            sw.shape = (int(dims[1][0]), int(dims[1][1]))
