"""ZeRO-3 from module hooks (``zero3_gather: per_module`` or ``per_tensor``): what DeepSpeed
fetches and reduce-scatters per module of a dense layer, the elements it holds gathered when it
decides whether to prefetch, the host's cost of PyTorch 1.8's list-form collectives, and of
DeepSpeed 2021's regather of the persistent parameters after every optimizer step.
:mod:`.zero3` builds the passes from these; the module docstring there says why each holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Collective, Compute, Op, Wait

__all__ = ["FETCH_PASSES", "FETCH_FILL_PASSES", "REDUCE_PASSES", "GATHER_HOST_OPS",
           "REDUCE_HOST_OPS", "GATHER_COPY_OUT_OPS", "ModuleFetch", "gather_host_split",
           "module_fetches", "list_host_seconds", "reduce_host_split", "unit_live_elements",
           "PERSISTENT_HOST_OPS",
           "persistent_tensors", "persistent_gather_seconds", "persistent_gather_ops"]

#: memory passes over a gathered tensor: zero-filled flat buffer (write), then PyTorch 1.8's
#: list all-gather copies each rank's chunk out of its own flat buffer (read + write)
#: (ProcessGroupNCCL::allgather; DeepSpeed v0.3.13 partition_parameters.py _allgather_param)
FETCH_PASSES = 3
#: of which before the gather is issued: the zero-fill (``_allgather_param`` calls
#: ``torch.zeros`` and then ``torch.cuda.synchronize()`` before its Python loop), so the host
#: waits for it with the device otherwise idle
FETCH_FILL_PASSES = 1
#: memory passes over a reduce-scattered gradient: copy into the contiguous bucket, ``div_``
#: by the data-parallel size, list reduce-scatter's copy into its flat input (read + write
#: each; stage3.py reduce_independent_p_g_buckets_and_remove_grads and average_tensor,
#: ProcessGroupNCCL::reduce_scatter)
REDUCE_PASSES = 6

#: host operations of one list-form collective under ``per_tensor`` (DeepSpeed v0.3.13 on
#: PyTorch 1.8), as (Python tensor ops, ``copy_``-class launches), per rank and per call:
#: a gather builds one ``narrow`` view per rank in Python and calls
#: ``torch.distributed.get_rank(group)`` once per rank (``_allgather_param``, v0.3.13
#: partition_parameters.py line 626; PyTorch 1.8's ``get_rank`` is four Python calls, dict
#: look-ups and a pybind call, priced as one Python op), and PyTorch
#: copies each rank's chunk out of its flat buffer with one ``copy_`` per rank
#: (``ProcessGroupNCCL::allgather``); per call the zero-filled buffer, the own partition's
#: ``copy_`` and the NCCL launch (three launches) and the final ``narrow`` + ``view``
GATHER_HOST_OPS = ((2, 1), (2, 3))
#: of :data:`GATHER_HOST_OPS`, the ``copy_``-class launches per rank that come after the
#: NCCL launch: PyTorch 1.8's ``ProcessGroupNCCL::collective`` runs ``pre``, then the NCCL
#: call between ``ncclGroupStart``/``ncclGroupEnd``, then ``post``, and ``allgather``'s
#: copy-out loop is its ``post`` (torch/lib/c10d/ProcessGroupNCCL.cpp of v1.8.0), so the host
#: issues those copies while the device runs the all-gather
GATHER_COPY_OUT_OPS = 1
#: a reduce-scatter builds ``view`` + ``narrow`` per rank in Python
#: (``_reduce_scatter_gradient``) and PyTorch copies each input into its flat buffer, one
#: ``copy_`` per rank (``flattenForScatterGather``); per call the NCCL launch
REDUCE_HOST_OPS = ((2, 1), (0, 1))
#: host operations of the gather of the persistent parameters after every optimizer step
#: (DeepSpeed v0.3.13 stage3.py ``_post_step``: ``persistent_parameters[0].all_gather(...)``,
#: synchronous, so partition_parameters.py ``_allgather_params``), as (Python tensor ops,
#: ``copy_``-class launches): per tensor and rank whose slice holds elements, ``narrow``,
#: ``view`` and ``narrow`` in Python and a ``copy_`` into the tensor; per tensor the
#: ``torch.empty`` it is copied into and its own slice's ``narrow`` + ``copy_`` into the flat
#: buffer; per rank the flat buffer's ``narrow`` and PyTorch 1.8's ``copy_`` out of its own
#: flat buffer (``ProcessGroupNCCL::allgather``)
PERSISTENT_HOST_OPS = ((3, 1), (2, 1), (1, 1))


@dataclass(frozen=True)
class ModuleFetch:
    """One GEMM module of a dense layer under ZeRO-3 from module hooks (elements on a rank,
    TP-sharded): what it gathers before its forward, before its recomputed forward (full
    recomputation) and before its backward, and what it reduce-scatters after its backward.
    ``module`` indexes :meth:`~ddlsim.workloads.models.decoder.DecoderShape.layer_modules`;
    a norm's tensors go with the GEMM module after it."""

    module: int
    forward: tuple[float, ...]
    recompute: tuple[float, ...]
    backward: tuple[float, ...]
    reduce: tuple[float, ...]


#: the GEMM modules of a dense layer (layer_modules indices) and the norm folded into each
_GEMM_MODULES = ((1, 0), (2, None), (4, 3), (5, None))


def module_fetches(shape, tp: int, sw, full_recompute: bool) -> tuple[ModuleFetch, ...]:
    """DeepSpeed's fetches of one dense layer from its leaf modules' hooks (the module
    docstring): one collective per tensor (``per_tensor``) or per module (``per_module``,
    coalesced), tensors under the persistence threshold never gathered, and under full
    recomputation a module's backward re-gathers it unless it is reused within the reuse
    distance (the modules after it, visited by the recomputed forward and again by the
    backward: twice their elements)."""
    modules = shape.layer_modules(tp)
    threshold, reuse = sw.zero3_persistence_threshold, sw.zero3_max_reuse_distance
    sizes = [sum(m) for m in modules]
    out = []
    for gemm, norm in _GEMM_MODULES:
        own = [i for i in (norm, gemm) if i is not None]
        tensors = [n for i in own for n in modules[i]]
        fetched = [n for n in tensors if n >= threshold]
        reduce = tensors
        if sw.zero3_gather == "per_module":   # one coalesced collective per module
            fetched = [sum(fetched)] if fetched else []
            reduce = [sum(tensors)]
        kept = full_recompute and 2 * sum(sizes[gemm + 1:]) < reuse
        out.append(ModuleFetch(gemm, tuple(fetched), tuple(fetched) if full_recompute else (),
                               () if kept else tuple(fetched), tuple(reduce)))
    return tuple(out)


def list_host_seconds(sw, ranks, calls: int, gather: bool) -> float:
    """Host seconds to issue ``calls`` list-form all-gathers (``gather``) or reduce-scatters
    over ``ranks`` ranks (a number or an array): their counted operations
    (:data:`GATHER_HOST_OPS`, :data:`REDUCE_HOST_OPS`) at the stack's
    ``zero3_host_python_op`` and ``zero3_host_copy`` seconds, and for a gather the stack's
    ``zero3_host_gather_call``."""
    (py_rank, cp_rank), (py_call, cp_call) = GATHER_HOST_OPS if gather else REDUCE_HOST_OPS
    call = sw.zero3_host_gather_call if gather else 0.0
    return calls * ((ranks * py_rank + py_call) * sw.zero3_host_python_op
                    + (ranks * cp_rank + cp_call) * sw.zero3_host_copy + call)


def reduce_host_split(sw, ranks, tensors) -> tuple:
    """(beside, after) a module's backward: host seconds of the list-form reduce-scatters of
    its gradients ``tensors`` (elements each) over ``ranks`` ranks (:func:`list_host_seconds`)
    split by DeepSpeed v0.3.13's gradient hooks. A gradient of more elements than the stack's
    ``zero3_reduce_bucket_size`` stays out of the contiguous bucket and is reduce-scattered
    from the next gradient hook (``stage3.py`` ``extra_large_param_to_reduce``), which runs
    after the module's post-backward hook has released its parameters with a blocking
    host-to-device copy (``_partition_param``: ``torch.ones(1).half().to(param.device)``;
    PyTorch 1.8 synchronises the compute stream after it): its issue comes after the
    module's backward. The others are issued from hooks while it computes. A bucket size of
    0 issues every one beside it.

    Parameters
    ----------
    sw : the resolved software stack (``zero3_host_*`` seconds, ``zero3_reduce_bucket_size``
        elements).
    ranks : int or numpy.ndarray
        Data-parallel ranks each reduce-scatter spans.
    tensors : sequence of float
        Elements of each gradient reduce-scattered.

    Returns
    -------
    tuple
        Host seconds issued beside the module's backward, and after it.
    """
    bucket = sw.zero3_reduce_bucket_size or 0.0
    large = sum(1 for n in tensors if bucket and n > bucket)
    return (list_host_seconds(sw, ranks, len(tensors) - large, gather=False),
            list_host_seconds(sw, ranks, large, gather=False))


def gather_host_split(sw, ranks, calls: int) -> tuple:
    """(before, after) the NCCL launch: host seconds of ``calls`` list-form all-gathers over
    ``ranks`` ranks (:func:`list_host_seconds` with ``gather``) split at the launch. After it
    come the :data:`GATHER_COPY_OUT_OPS` copy-out launches per rank, which the host issues
    while the device runs the all-gather; everything else comes before it (Python's loop
    over the ranks, the zero-filled buffer, the own partition's copy, the per-call cost).

    Parameters
    ----------
    sw : the resolved software stack (its ``zero3_host_*`` seconds).
    ranks : ranks of the data-parallel group (a number or an array).
    calls : all-gathers issued together.

    Returns
    -------
    tuple
        (seconds before the launch, seconds after it), each a float or an array like
        ``ranks``; both 0 for stacks without per-tensor gathers.

    References
    ----------
    PyTorch v1.8.0 ``torch/lib/c10d/ProcessGroupNCCL.cpp``: ``collective`` (``pre``, the
    NCCL call, ``post``) and ``allgather`` (copy-out in ``post``).
    """
    after = calls * ranks * GATHER_COPY_OUT_OPS * sw.zero3_host_copy
    return list_host_seconds(sw, ranks, calls, gather=True) - after, after


def _live_elements(units: list, fetch: dict[int, ModuleFetch], backward: bool) -> None:
    """Set each unit's ``live``: the elements DeepSpeed counts as gathered when the unit's
    pre-hook decides whether to prefetch (v0.3.13 stage3.py ``total_available_parameter_numel``:
    ``fetch_sub_module`` adds a module's gathered tensors, ``release_sub_module`` subtracts
    them unless kept for reuse). The module's own tensors, and in the backward those of the
    modules whose recomputed forward kept them (:attr:`ModuleFetch.backward` empty) until
    their backward has run; persistent tensors are never fetched, so never counted."""
    held: dict[int, float] = {}
    for i, u in enumerate(units):
        f = fetch[u.module]
        own = sum(f.forward)
        u.live = own + sum(n for m, n in held.items() if m != u.module)
        if not backward:
            continue
        later = any(v.module == u.module for v in units[i + 1:])
        if later and f.recompute and not f.backward:
            held[u.module] = own
        elif not later:
            held.pop(u.module, None)


def unit_live_elements(shape, tp: int, sw, full_recompute: bool) -> dict[tuple[str, int], float]:
    """:func:`_live_elements` of one dense layer's units by ``(visit, module)``: visit ``f``
    (the forward), ``r`` (the recomputed forward) or ``b`` (the backward) — the search
    tier's form."""
    fetch = {f.module: f for f in module_fetches(shape, tp, sw, full_recompute)}
    order = [m for m, _ in _GEMM_MODULES]
    forward = [_Visit(m) for m in order]
    _live_elements(forward, fetch, backward=False)
    visits = ["r"] * len(order) if full_recompute else []
    backward = [_Visit(m) for m in (order if full_recompute else []) + order[::-1]]
    _live_elements(backward, fetch, backward=True)
    out = {("f", u.module): u.live for u in forward}
    out.update(((v, u.module), u.live) for v, u in zip(visits + ["b"] * len(order), backward))
    return out


@dataclass
class _Visit:
    """One visit of a module in a pass, for :func:`unit_live_elements`."""

    module: int
    live: float = 0.0


def persistent_tensors(shape, tp: int, sw, layers: int, last: bool) -> dict[float, int]:
    """The persistent tensors of a stage of ``layers`` dense layers (and, on the ``last``
    stage, the final norm, shaped as the layer's input norm): elements on a rank (TP-sharded)
    → how many, for those under ``zero3_persistence_threshold`` (v0.3.13 stage3.py
    ``persistent_parameters``: ``ds_numel < persistence_threshold``)."""
    threshold = sw.zero3_persistence_threshold
    modules = shape.layer_modules(tp)
    count: dict[float, int] = {}
    for n in [n for m in modules for n in m] * layers + list(modules[0] if last else ()):
        if n < threshold:
            count[n] = count.get(n, 0) + 1
    return count


def persistent_gather_seconds(sw, tensors: dict[float, int], ranks):
    """Host seconds of DeepSpeed v0.3.13's gather of the persistent ``tensors``
    (:func:`persistent_tensors`) over ``ranks`` ranks (a number or an array) after each
    optimizer step: the counted operations (:data:`PERSISTENT_HOST_OPS`) at the stack's
    ``zero3_host_python_op`` and ``zero3_host_copy`` seconds, and one
    ``zero3_host_gather_call``; 0 unless ``zero3_gather`` is ``per_tensor``.

    A tensor of ``n`` elements is split into slices of ``⌈n / ranks⌉`` (the partition padded
    to a multiple of the ranks, ``_aligned_size``), of which ``⌈n / ⌈n / ranks⌉⌉`` hold
    elements: those ranks' slices are copied into it one by one (``_allgather_params``:
    ``if param_start < param_size``). The collective itself (the persistent partitions, a
    few tens of MB) runs on the device beside this loop and is not counted."""
    if sw.zero3_gather != "per_tensor" or not tensors:
        return 0.0
    ranks = np.asarray(ranks, dtype=float)
    (py_slice, cp_slice), (py_tensor, cp_tensor), (py_rank, cp_rank) = PERSISTENT_HOST_OPS
    slices = sum(count * np.ceil(n / np.ceil(n / ranks)) for n, count in tensors.items())
    total = sum(tensors.values())
    python = slices * py_slice + total * py_tensor + ranks * py_rank
    copies = slices * cp_slice + total * cp_tensor + ranks * cp_rank
    out = python * sw.zero3_host_python_op + copies * sw.zero3_host_copy + sw.zero3_host_gather_call
    return float(out) if out.ndim == 0 else out


def persistent_gather_ops(b, stage: int, after: int) -> list:
    """The update block's ops after the optimizer step (op ``after``) under ``per_tensor``:
    the host's gather of the stage's persistent parameters
    (:func:`persistent_gather_seconds`) on the ``host`` stream, which the compute stream
    then waits for (the next iteration's forward starts after it); none otherwise.

    With ``m > 1`` micro-batches the forwards after the first also fetch every persistent
    tensor on its own: ``backward`` releases them at each micro-batch
    (``_partition_all_parameters``) and only the step regathers them, so each later forward's
    hooks gather them one list-form all-gather at a time, each after a device
    synchronisation (``_allgather_param``) with the device idle. Their host issue
    (:func:`list_host_seconds`) and their collectives are serial, so the ``m − 1`` forwards'
    worth is charged here, after the regather: the iteration's length is the same."""
    tensors = persistent_tensors(b.shape, b.tp, b.sw, sum(b.split[stage]), stage == b.pp - 1)
    seconds = persistent_gather_seconds(b.sw, tensors, b.dp)
    if not seconds:
        return []
    ops = [Op(Compute("zero3.persistent_gather", 0.0, kind="elementwise", dtype=b.dtype,
                      seconds=seconds), "host", deps=(after,))]
    later = b.plan.microbatches - 1
    if later > 0:
        issue = later * list_host_seconds(b.sw, b.dp, sum(tensors.values()), gather=True)
        ops.append(Op(Compute("zero3.persistent_fetch", 0.0, kind="elementwise",
                              dtype=b.dtype, seconds=issue), "host", deps=(after + 1,)))
        host = after + len(ops)
        ops += [Op(Collective("persistent.all_gather", "all_gather", "dp", n * b.dt), "dp",
                   deps=(host,), repeat=later * count) for n, count in tensors.items()]
        ops.append(Op(Wait("zero3.persistent_fetch", "dp")))
    return ops + [Op(Wait("zero3.persistent_gather", "host"))]
