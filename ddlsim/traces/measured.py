"""Put measured compute times into a workload trace: "profile one node, predict the cluster".

A :class:`~ddlsim.traces.kineto.MeasuredStep` gives seconds per :class:`Label` of the
profiled step. Each label is bound to an op name of ddlsim's trace (:data:`DECODER_BINDING`);
for every op name, the ratio of its measured seconds to ddlsim's modelled seconds over the
*profiled plan's* iteration (rank 0's program) is the name's factor ``k``, and every op of
that name in the *target plan* takes ``k ×`` its modelled duration as its given duration
(``Compute.seconds``). When the target runs each op as the profiled plan did (more
data-parallel ranks, another network) ``k ×`` model is the measured time exactly; an op the
target shapes differently (a ZeRO shard of the optimizer, another pipeline split) is scaled by
ddlsim's own ratio of the two. docs/traces.md gives the rules.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from types import MappingProxyType

from ..errors import ConfigError
from ..workloads.trace import Block, Compute, Loop, Op, Program, Workload
from .kineto import MeasuredStep
from .kineto_labels import Label

__all__ = ["DECODER_BINDING", "Binding", "bind_measured", "apply_measured",
           "check_profiled_plan"]

#: label (phase, part) -> ddlsim op names, first present wins (the decoder families' names,
#: ddlsim/workloads/decoder/: a separate attention core when the trace has one); a tuple of
#: names binds them together, sharing the label's time as the model shares it
DECODER_BINDING: MappingProxyType = MappingProxyType({
    ("forward", "embedding"): ("embedding",),
    ("forward", "attn"): ("fwd.attn",),
    ("forward", "attn_core"): ("fwd.attn_core", "fwd.attn"),
    ("forward", "mlp"): ("fwd.mlp",),
    ("forward", "elementwise"): ("fwd.elementwise",),
    ("forward", "final_norm"): ("final_norm", "logits"),
    ("forward", "logits"): ("logits",),
    ("forward", "loss"): ("loss",),
    ("backward", "loss"): ("bwd.loss",),
    ("backward", "final_norm"): ("bwd.final_norm", "bwd.logits"),
    ("backward", "logits"): ("bwd.logits",),
    ("backward", "embedding"): ("bwd.embedding", "bwd.grad_accumulate.embedding"),
    ("backward", "attn"): ("bwd.attn",),
    ("backward", "attn_core"): ("bwd.attn_core", "bwd.attn"),
    ("backward", "mlp"): ("bwd.mlp",),
    ("backward", "elementwise"): ("bwd.elementwise",),
    # torch's AccumulateGrad of every parameter, the embedding's (tied: the output layer's) too
    ("backward", "grad_accumulate"): (("bwd.grad_accumulate", "bwd.grad_accumulate.embedding"),),
    ("optimizer", "step"): ("optimizer",),
    ("optimizer", "zero_grad"): ("optimizer",),
    # FSDP2's passes and a checkpoint's recomputation, labelled where FSDP2's ranges place the
    # ops (kineto_fsdp.py): its unshard (the cast of the fp32 shard, the copy out of the
    # gathered buffer), its reduce (chunk_cat into the fp32 reduce input, the copies after it)
    ("forward", "unshard"): (("zero3.cast", "zero3.copy_out"),),
    ("backward", "unshard"): (("zero3.cast", "zero3.copy_out"),),
    ("backward", "reduce"): (("zero3.chunk_cat", "zero3.after_reduce"),),
    ("backward", "recompute"): (("recompute.sac", "recompute.modules", "recompute.attn",
                                 "recompute.attn_core", "recompute.mlp",
                                 "recompute.elementwise"),),
})


@dataclass(frozen=True)
class Binding:
    """Measured seconds bound to ddlsim op names.

    Attributes
    ----------
    factor : op name -> measured seconds / modelled seconds in the profiled plan (a ratio),
        or None where the model gives the op no time (then ``each`` applies).
    each : op name -> measured seconds per occurrence (s), for ops the model gives no time.
    measured_s : op name -> measured seconds over the profiled iteration (s).
    modelled_s : op name -> ddlsim's modelled seconds for the same occurrences (s).
    unbound : label -> seconds of measured labels no op of the trace takes (s).
    unmeasured : op names of the profiled plan's trace that no label measured (modelled).
    """

    factor: MappingProxyType
    each: MappingProxyType
    measured_s: MappingProxyType
    modelled_s: MappingProxyType
    unbound: MappingProxyType
    unmeasured: tuple[str, ...]


def _compute_ops(ops, times: int = 1):
    """(Compute, occurrences) for every compute op of ``ops``, loops unrolled by count."""
    for op in ops:
        p = op.payload
        if type(p) is Compute:
            yield p, times * op.repeat
        elif type(p) is Loop:
            yield from _compute_ops(p.body, times * op.repeat * p.count)


def _occurrences(workload: Workload, rank: int = 0) -> list[tuple[Compute, int]]:
    """The compute ops ``rank`` issues in one iteration, each with its occurrences."""
    cls = next(c for c in workload.classes if rank in c.ranks)
    steps = cls.program.steps
    uses = Counter(steps.names[i] for i in steps.block) if hasattr(steps, "block") \
        else Counter(s.block for s in steps)
    return [(p, n * k) for name, n in uses.items()
            for p, k in _compute_ops(cls.program.blocks[name].ops)]


def bind_measured(measured: MeasuredStep, reference: Workload, cost,
                  binding=DECODER_BINDING) -> Binding:
    """Bind a measured step to the op names of the profiled plan's trace.

    Parameters
    ----------
    measured : the profile (:func:`ddlsim.traces.kineto.read_kineto`).
    reference : the trace of the plan that was profiled.
    cost : a cost model of ``reference`` (its ``compute(op)`` gives modelled seconds).
    binding : label (phase, part) -> candidate op names, first present wins.

    Returns
    -------
    Binding
    """
    occ = _occurrences(reference)
    present = {p.name for p, _ in occ}
    modelled: dict[str, float] = defaultdict(float)
    count: Counter = Counter()
    for p, n in occ:
        if type(p) is Compute:
            modelled[p.name] += n * cost.compute(replace(p, seconds=None))
            count[p.name] += n
    measured_s: dict[str, float] = defaultdict(float)
    unbound: dict[Label, float] = {}
    for label, seconds in measured.seconds.items():
        names = _bound_names(binding.get((label.phase, label.part), ()), present)
        if not names:
            unbound[label] = seconds
            continue
        total = sum(modelled[n] for n in names)
        for n in names:   # a group shares the label's time as the model shares it
            measured_s[n] += seconds * (modelled[n] / total if total > 0 else 1 / len(names))
    if not measured_s:
        raise ConfigError(f"the profile {measured.source}: none of its labels names an op of "
                          f"the trace of {reference.meta.architecture or reference.name!r} "
                          f"(ops such as {sorted(present)[:4]}); measured compute binds to the "
                          "decoder families' ops (gpt, llama)")
    factor = {k: (measured_s[k] / modelled[k] if modelled[k] > 0 else None) for k in measured_s}
    each = {k: measured_s[k] / count[k] for k in measured_s if factor[k] is None}
    return Binding(MappingProxyType(factor), MappingProxyType(each),
                   MappingProxyType(dict(measured_s)), MappingProxyType(dict(modelled)),
                   MappingProxyType(unbound), tuple(sorted(present - set(measured_s))))


def _bound_names(candidates: tuple, present: set[str]) -> tuple[str, ...]:
    """The op names a label binds to: the first candidate present, where a candidate is one
    name or a tuple of names bound together (the present ones among them)."""
    for c in candidates:
        group = tuple(n for n in ((c,) if isinstance(c, str) else c) if n in present)
        if group:
            return group
    return ()


def _measured_ops(ops: tuple[Op, ...], binding: Binding, cost) -> tuple[Op, ...]:
    out = []
    for op in ops:
        p = op.payload
        if type(p) is Compute and p.name in binding.factor:
            k = binding.factor[p.name]
            given = binding.each[p.name] if k is None else k * cost.compute(replace(p, seconds=None))
            op = replace(op, payload=replace(p, seconds=given))
        elif type(p) is Loop:
            op = replace(op, payload=replace(p, body=_measured_ops(p.body, binding, cost)))
        out.append(op)
    return tuple(out)


def apply_measured(target: Workload, binding: Binding, cost) -> Workload:
    """``target`` with every bound compute op's duration given.

    Parameters
    ----------
    target : the trace of the plan to predict.
    binding : :func:`bind_measured`'s, from the profiled plan.
    cost : a cost model of ``target``.

    Returns
    -------
    Workload
        Each bound op with ``seconds = factor ×`` its modelled seconds under ``cost``, or the
        measured seconds per occurrence for ops the model gives no time; blocks shared by
        rank classes stay shared.
    """
    done: dict[int, Block] = {}

    def block(b: Block) -> Block:
        if id(b) not in done:
            done[id(b)] = Block(b.name, b.phase, _measured_ops(b.ops, binding, cost))
        return done[id(b)]

    classes = tuple(replace(c, program=Program({k: block(b) for k, b in c.program.blocks.items()},
                                               c.program.steps)) for c in target.classes)
    return replace(target, classes=classes)


def check_profiled_plan(measured: MeasuredStep, cfg) -> None:
    """Refuse a profiled plan that cannot be the one profiled.

    Parameters
    ----------
    measured : the profile.
    cfg : the run config said to describe the profiled run.

    Raises
    ------
    ConfigError
        When the config's transformer layers per rank differ from the layers the trace ran,
        or (with recorded shapes) its micro-batch size or sequence length differ from the
        token embedding's input.
    """
    layers = getattr(cfg.model, "num_hidden_layers", None)
    pp = getattr(cfg.parallel, "pipeline_model_parallel_size", 1) or 1
    if layers is not None and measured.layers != layers // pp:
        raise ConfigError(f"model.num_hidden_layers = {layers} (over {pp} pipeline stage(s)): "
                          f"the profile {measured.source} ran {measured.layers} transformer "
                          "layer(s) per rank; the config must describe the profiled run")
    if measured.input_shape is not None:
        b, s = measured.input_shape
        mb, seq = cfg.train.micro_batch_size, cfg.train.seq_length
        if (b, s) != (mb, seq):
            raise ConfigError(f"train.micro_batch_size = {mb}, train.seq_length = {seq}: the "
                              f"profile {measured.source} embedded tokens of shape ({b}, {s}); "
                              "the config must describe the profiled run")
