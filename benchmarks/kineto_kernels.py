"""Device kernels of a PyTorch profiler (Kineto) trace placed by the host ops that launched
them: the reading half of ``benchmarks/kineto_vs_ddlsim.py`` (issues 29/30).

The trace of ``benchmarks/device/llama_step.py`` has no module stack and no shapes
(``with_stack`` and ``record_shapes`` off), so :mod:`ddlsim.traces.kineto` (which places ops by
their ``nn.Module`` events) does not serve. Each ``kernel``, ``gpu_memcpy`` and ``gpu_memset``
event is tied to the CPU op with its ``External id``, and that op to the ops and
``record_function`` ranges open around it on its thread (:func:`device_kernels`); transformer
layers are FSDP2's ranges (``FSDP::pre_forward (layers.3)`` … ``FSDP::post_forward``,
``FSDP::pre_backward (layers.3)`` … ``FSDP::post_backward_reduce``: :func:`layer_windows`).

* **row** (:func:`classify`): GEMM (forward, recomputed, backward, the output head), attention
  (cuDNN SDPA and its helpers), FSDP2's parameter cast, its unshard copy, the ``chunk_cat`` of
  the gradients into the fp32 reduce-scatter input and the reduce's copies, element-wise by
  phase, the final norm, the embedding, the cross-entropy and the optimizer;
* **GEMM identity** (:func:`name_gemms`): a layer's forward ``aten::mm`` calls in order are
  ``wq wk wv wo w1 w3 w2`` (the model's call order); the recomputed ones are every second of
  them (torchtitan's policy: ``_apply_ac_to_transformer_block``, ``wk wo w3``); a backward
  ``MmBackward0`` takes the weight of the forward ``aten::mm`` with its sequence number, its
  first ``aten::mm`` the weight gradient and its second the input gradient. The order is read
  off the trace: for ``wk`` and ``wv`` the first kernel's grid is 128 CTAs, the 1024x4096
  weight gradient's 128 tiles of 256x128 (nvjet's persistent kernels launch min(tiles, SMs)),
  the second's 132, over the 8192x4096 input gradient's 1024 tiles;
* **busy share** (:func:`busy_shares`): each instant split among the kernels running then
  (streams overlap), so the shares add up to the time the device was busy.
"""

from __future__ import annotations

import gzip
import math
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from ddlsim.traces.kineto_fsdp import enclosing_ops

#: a block's forward aten::mm calls in order (llama_step.py Attention, FeedForward)
FORWARD_GEMMS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
#: torchtitan's op-level policy saves every second mm's output: the others are recomputed
RECOMPUTED_GEMMS = FORWARD_GEMMS[1::2]
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm")
#: ops that run only in a forward: in the backward they are a checkpoint's recomputation
#: (``PythonDispatchMode``: torch.utils.checkpoint's selective-checkpoint dispatch mode)
FORWARD_ONLY = ("PythonDispatchMode", "aten::linear", "aten::rms_norm", "aten::silu",
                "aten::scaled_dot_product_attention", "aten::embedding")
_LAYER = re.compile(r"^FSDP::(pre_forward|post_forward|pre_backward|post_backward_reduce) "
                    r"\(layers\.(\d+)\)$")
_BACKWARD = "autograd::engine::evaluate_function: "

#: the rows a kernel lands in (:func:`classify`), in the order kineto_vs_ddlsim prints them
ROWS = ("GEMM forward", "GEMM recomputed", "GEMM backward", "output head GEMM", "attention",
        "element-wise forward", "element-wise recomputed", "element-wise backward",
        "final norm", "embedding", "cross-entropy", "optimizer",
        "FSDP2 parameter cast fp32->bf16", "FSDP2 unshard copy", "FSDP2 chunk_cat bf16->fp32",
        "FSDP2 reduce copies", "other")


class DeviceKernel(NamedTuple):
    """One device activity (kernel, memcpy, memset) of the trace and where it came from.

    Attributes
    ----------
    name : the kernel's name.
    start_us, dur_us : its start and duration on the device (µs).
    ops : the CPU ops and ``record_function`` ranges open when it was launched, outermost
        first (the launching op last).
    seqs : the autograd sequence number of each of ``ops`` (None where it has none).
    tid : the host thread that launched it.
    launch_us : the launching op's start on the host (µs).
    """

    name: str
    start_us: float
    dur_us: float
    ops: tuple[str, ...]
    seqs: tuple[int | None, ...]
    tid: int
    launch_us: float

    @property
    def phase(self) -> str:
        """``optimizer``, ``backward`` (inside an autograd node or FSDP's post-backward) or
        ``forward``."""
        if any(o.startswith("Optimizer.") for o in self.ops):
            return "optimizer"
        if any(o.startswith((_BACKWARD, "FSDP::root_post_backward", "FSDP::post_backward"))
               for o in self.ops):
            return "backward"
        return "forward"

    @property
    def recomputed(self) -> bool:
        """A backward kernel launched under a forward-only op (a checkpoint's recompute)."""
        return self.phase == "backward" and any(o in FORWARD_ONLY for o in self.ops)

    @property
    def is_gemm(self) -> bool:
        """Launched by a GEMM op, and not the memset of its workspace."""
        return bool(self.ops) and self.ops[-1] in GEMM_OPS \
            and not self.name.startswith(("Memset", "Memcpy"))


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a Kineto JSON file (``.json`` or ``.json.gz``); ValueError
    naming the file when it has none."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"Kineto trace {str(path)!r}: no 'traceEvents' list; expected the "
                         "JSON that torch.profiler's export_chrome_trace writes")
    return events


def device_kernels(events: list[dict]) -> list[DeviceKernel]:
    """Every ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` event with the host ops open at its
    launch (the CPU op with its ``External id``, and the ops and ranges enclosing that op on
    its thread), in device start order."""
    host = [e for e in events if e.get("ph") == "X"]
    stacks = {op["args"].get("External id"): (chain, op) for op, chain in enclosing_ops(host)}
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        chain, op = stacks.get(e.get("args", {}).get("External id"), ((), None))
        out.append(DeviceKernel(
            e["name"], float(e["ts"]), float(e["dur"]), tuple(o["name"] for o in chain),
            tuple(o.get("args", {}).get("Sequence number") for o in chain),
            op["tid"] if op else -1, float(op["ts"]) if op else math.nan))
    return sorted(out, key=lambda k: k.start_us)


def layer_windows(events: list[dict]) -> list[tuple[int, float, float, int]]:
    """``(layer, start, end, tid)`` host windows of each transformer layer: from FSDP2's
    ``pre_forward (layers.i)`` to its ``post_forward``, and from ``pre_backward (layers.i)``
    to the end of its ``post_backward_reduce``."""
    marks: dict = defaultdict(list)
    for e in events:
        m = _LAYER.match(str(e.get("name", ""))) if e.get("cat") == "user_annotation" else None
        if m:
            marks[(int(m.group(2)), m.group(1).startswith(("pre_f", "post_f")), e["tid"])] \
                .append(e)
    out = []
    for (layer, _, tid), evs in marks.items():
        out.append((layer, min(e["ts"] for e in evs),
                    max(e["ts"] + e["dur"] for e in evs), tid))
    return sorted(out, key=lambda w: w[1])


def layer_of(k: DeviceKernel, windows) -> int | None:
    """The layer whose host window holds ``k``'s launch, or None (the head, the embedding)."""
    for layer, start, end, tid in windows:
        if tid == k.tid and start <= k.launch_us <= end:
            return layer
    return None


def classify(k: DeviceKernel, layer: int | None) -> str:
    """The row of :data:`ROWS` that kernel ``k`` (in transformer ``layer``, or None) counts in."""
    ops, name, phase = " > ".join(k.ops), k.name, k.phase
    if phase == "optimizer":
        return "optimizer"
    if "FSDP::post_backward_reduce" in ops:
        return "FSDP2 chunk_cat bf16->fp32" if "chunk_cat" in name and "HtoD" not in name \
            else "FSDP2 reduce copies"
    if "FSDP::pre_forward" in ops or "FSDP::pre_backward" in ops:
        return "FSDP2 unshard copy" if name.startswith("Memcpy") else \
            "FSDP2 parameter cast fp32->bf16"
    if name.startswith("Memset"):
        return "other"
    if "sdpa" in name or "cudnn" in name or "scaled_dot_product" in ops \
            or "ScaledDotProduct" in ops or "attention" in ops:
        return "attention"
    if k.is_gemm:
        if layer is None:
            return "output head GEMM"
        return "GEMM recomputed" if k.recomputed else f"GEMM {phase}"
    if "mbedding" in ops:
        return "embedding"
    if layer is None:
        return "final norm" if re.search(r"rms_norm|RmsNorm|layer_norm", ops) else \
            "cross-entropy"
    if k.recomputed:
        return "element-wise recomputed"
    return f"element-wise {phase}"


def op_label(k: DeviceKernel) -> str:
    """What launched ``k``, for the element-wise breakdown: a backward node's name, else the
    outermost ATen op under it (FSDP's ranges and the dispatch mode skipped)."""
    ops = [o for o in k.ops if not o.startswith(("FSDP", "PythonDispatch", "fsdp::"))]
    if ops and ops[0].startswith(_BACKWARD) and not k.recomputed:
        return ops[0][len(_BACKWARD):]
    ops = [o for o in ops if not o.startswith(_BACKWARD) and not o.endswith("Backward0")]
    return ops[0] if ops else "?"


#: the element-wise ops of a block (:func:`ew_op`), as ddlsim names its parts
#: (``layer_elementwise_parts``; ``repeat_kv`` and ``grad sums`` from its layer kernels)
EW_OPS = ("norm", "residual", "activation", "rope", "repeat_kv", "grad sums", "other")


def ew_op(k: DeviceKernel) -> str:
    """The op of a block's element-wise kernel ``k`` (:data:`EW_OPS`), from its launching op
    (:func:`op_label`) and name, for llama_step.py's block (torchtitan's: ``nn.RMSNorm``,
    complex RoPE, ``repeat_kv``, SwiGLU): the norm's kernels but the residual's gradient sum
    its backward node launches (an ``add``); the SwiGLU's SiLU and its 16-bit vectorised
    ``mul``; RoPE's casts (``to``, ``type_as``) and its complex ``mul`` (strided, with the
    ``conj`` of the frequencies in the backward); ``repeat_kv``'s expand-and-reshape copy and
    its gradient's sum (``ExpandBackward0``); the sums of the input gradients of ``wq``/``wk``/
    ``wv`` and ``w1``/``w3`` (``ViewBackward0``'s adds)."""
    op, name = op_label(k), k.name
    add = "CUDAFunctor_add" in name
    if op in ("aten::add",) or (add and op.startswith("FusedRmsNorm")):
        return "residual"
    if add and op == "ViewBackward0":
        return "grad sums"
    if op in ("aten::rms_norm", "FusedRmsNormBackward0"):
        return "norm"
    if op in ("aten::silu", "SiluBackward0"):
        return "activation"
    if op in ("aten::mul", "MulBackward0"):
        return "activation" if "vectorized_elementwise_kernel<8" in name else "rope"
    if op in ("aten::to", "aten::type_as", "ToCopyBackward0"):
        return "rope"
    if op in ("aten::reshape", "ExpandBackward0"):
        return "repeat_kv"
    return "other"


def busy_shares(kernels: list[DeviceKernel]) -> list[float]:
    """Each kernel's share of the device's busy time (µs): every instant split equally among
    the kernels running then; the shares add up to the union of the kernels' intervals."""
    points = sorted({p for k in kernels for p in (k.start_us, k.start_us + k.dur_us)})
    share = [0.0] * len(kernels)
    order = sorted(range(len(kernels)), key=lambda i: kernels[i].start_us)
    active: list[int] = []
    j = 0
    for a, b in zip(points, points[1:]):
        while j < len(order) and kernels[order[j]].start_us <= a:
            active.append(order[j])
            j += 1
        active = [i for i in active if kernels[i].start_us + kernels[i].dur_us > a]
        for i in active:
            share[i] += (b - a) / len(active)
    return share


def name_gemms(kernels: list[DeviceKernel], windows) -> list[tuple[str, int | None, str, str]]:
    """``(phase, layer, weight, grad)`` of each GEMM of ``kernels`` in order (module
    docstring): phase ``forward``/``recomputed``/``backward``; weight ``wq`` … ``w2`` or
    ``output`` (``mm<i>`` where a layer's calls are not the model's seven, ``?`` for a
    backward GEMM whose forward was not seen); grad ``-``, ``dgrad`` or ``wgrad``."""
    gemms = [(k, layer_of(k, windows)) for k in kernels if k.is_gemm]
    count: Counter = Counter()
    for k, layer in gemms:
        if k.phase == "forward" or k.recomputed:
            count[(k.recomputed, layer)] += 1
    seen: Counter = Counter()
    weight_of_seq: dict = {}
    out: list = []
    for k, layer in gemms:
        if k.phase == "forward" or k.recomputed:
            i = seen[(k.recomputed, layer)]
            seen[(k.recomputed, layer)] += 1
            names = RECOMPUTED_GEMMS if k.recomputed else FORWARD_GEMMS
            weight = "output" if layer is None else \
                names[i] if count[(k.recomputed, layer)] == len(names) else f"mm{i}"
            if not k.recomputed:
                weight_of_seq[_gemm_seq(k)] = (layer, weight)
            out.append(("recomputed" if k.recomputed else "forward", layer, weight, "-"))
            continue
        node = next((s for o, s in zip(k.ops, k.seqs) if o.startswith(_BACKWARD)), None)
        fl, weight = weight_of_seq.get(node, (layer, "?"))
        seen[("node", node)] += 1
        out.append(("backward", fl, weight, "wgrad" if seen[("node", node)] == 1 else "dgrad"))
    return out


def _gemm_seq(k: DeviceKernel) -> int | None:
    """The autograd sequence number of the GEMM op that launched ``k`` (the outermost GEMM
    op with one: the op the autograd node was recorded on)."""
    return next((s for o, s in zip(k.ops, k.seqs) if o in GEMM_OPS and s is not None), None)
